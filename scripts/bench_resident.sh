#!/usr/bin/env bash
# Prefill and decode speed of `sluice run` against llama.cpp on the same model files, with the
# models resident in RAM (page cache warm), printed as a markdown table.
#
# For every model, thread count and round, in this order: sluice, llama.cpp with its default CPU
# library (the best one for this CPU), llama.cpp with its AVX2 ("haswell") library; the rounds
# repeat the whole sweep, so the engines alternate. Before the first round each engine runs every
# model once untimed, and the model file is read through the page cache again right before every
# timed run (nothing is measured cold).
#
#   sluice     target/release/sluice run -m MODEL -p PROMPT -t T -n N --temp 0 --ignore-eos
#              prefill: its `sluice: prompt P tokens (P new), prefill S s` line (the forward pass of the
#              prompt, logits of the last position only); decode: its `generation:` line (the N
#              forward passes of the generated tokens; sampling is not in the timed span).
#   llama.cpp  scripts/bench_llamacpp.cpp (same prompt text, same tokens, same spans; see there).
# Both: context 4096, KV cache F16, micro-batch 512, no flash attention (sluice has none), no
# chat template, BOS as the vocabulary asks, greedy, end-of-generation tokens ignored.
#
# Environment:
#   MODELS     model files (space separated); default: Qwen2.5-Coder-1.5B-Instruct Q4_K_M
#              (scripts/fetch_real_models.sh qwen2.5-coder) and the synthetic Qwen3-30B-A3B-shaped qwen3moe of
#              4 layers at Q8_0 and Q4_0 (scripts/gen_qwen3moe_shaped.py), both made if missing
#   THREADS    thread counts (default "1 2")
#   ROUNDS     rounds (default 2)
#   N_DECODE   decoded tokens (default 64)
#   LLAMACPP_DIR  an existing install directory of scripts/llamacpp-npm.sh (default: a scratch one)
#   OUT        also write the raw lines and the table into this directory
#
# Where sluice's kernel table has more than AVX2 (`+avx512vl` or `+bmi2` in its `kernels`
# notice), every round also times sluice with SLUICE_KERNELS=avx2 (the narrow table: AVX2's 16
# registers, no BMI2): the "sluice avx2" columns, which the ratio against llama.cpp's AVX2
# library uses.
#
# A cell of the table is the best (highest tok/s) of the rounds, the one least disturbed by other
# load; the raw lines keep every round. Needs cargo, g++, npm, git, python3 (gguf, numpy). Takes
# about 15 minutes with the defaults on a 2-core machine, when the models exist.
#
# Usage (from anywhere): bash scripts/bench_resident.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FIX=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}
THREADS=${THREADS:-"1 2"}
ROUNDS=${ROUNDS:-2}
N_DECODE=${N_DECODE:-64}
N_CTX=4096
UBATCH=512

# A fixed paragraph: 88 tokens with the Qwen2.5 tokenizer.
PROMPT="The river town woke slowly. Fishermen pulled their boats onto the gravel, a baker opened the shutters of a narrow shop, and the smell of bread drifted over the water. Children ran along the quay toward the old stone school, where a bell rang twice every morning. Nobody remembered who had cast the bell or why it rang twice, but the town kept the habit, the way towns keep most of their habits: without asking."

if [ -z "${MODELS:-}" ]; then
    bash "$root/scripts/fetch_real_models.sh" qwen2.5-coder
    MODELS="$FIX/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    for t in q8_0 q4_0; do
        m=$FIX/bench/qwen3moe-a3b-shaped-l4-$t.gguf
        if [ ! -f "$m" ]; then
            bash "$root/scripts/fetch_text_fixtures.sh"
            python3 "$root/scripts/gen_qwen3moe_shaped.py" "$FIX/text/vocab/qwen2.5-coder-1.5b.gguf" "$FIX/bench"
        fi
        MODELS="$MODELS $m"
    done
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

(cd "$root" && cargo build --release --bin sluice >&2)
SLUICE=$root/target/release/sluice
commit=$(git -C "$root" rev-parse --short=12 HEAD)
if ! git -C "$root" diff --quiet HEAD -- crates Cargo.toml Cargo.lock; then
    commit="$commit+dirty"
fi

# shellcheck source=llamacpp-npm.sh
. "$root/scripts/llamacpp-npm.sh"
llamacpp_npm_install "${LLAMACPP_DIR:-$work/npm}"
# shellcheck disable=SC2086 # LLAMACPP_INC holds two -I flags
g++ -O2 -std=c++17 -Wall -Wextra -o "$work/bench_llamacpp" "$root/scripts/bench_llamacpp.cpp" $LLAMACPP_INC \
    "$LLAMACPP_LIB/libllama.v0.4.0.so" "$LLAMACPP_LIB/libggml.v0.4.0.so" "$LLAMACPP_LIB/libggml-base.so" \
    -Wl,-rpath,"$LLAMACPP_LIB"
# ggml loads the best CPU library it finds in GGML_BACKEND_DIR: all of them ("default"), or only
# the AVX2 one ("haswell", the instruction set of sluice's kernels).
mkdir -p "$work/cpu-default" "$work/cpu-haswell"
cp "$LLAMACPP_LIB"/libggml-cpu-*.so "$work/cpu-default/"
cp "$LLAMACPP_LIB/libggml-cpu-haswell.so" "$work/cpu-haswell/"

raw=$work/raw.tsv
: > "$raw"

run_sluice() {  # model threads n_decode -> "sluice <n_prompt> <prefill_s> <n_decode> <decode_tps>"
    # (SLUICE_KERNELS from the caller's environment: "avx2" for the narrow table)
    "$SLUICE" run -m "$1" -p "$PROMPT" -t "$2" -n "$3" -c "$N_CTX" --ubatch "$UBATCH" --kv-type f16 \
        --temp 0 --ignore-eos > "$work/s.out" 2> "$work/s.err"
    local pre gen
    pre=$(grep -E '^sluice: prompt [0-9]+ tokens( \([0-9]+ new\))?, prefill' "$work/s.err")
    gen=$(grep -E '^generation: [0-9]+ tokens' "$work/s.out")
    # sluice: prompt 88 tokens (88 new), prefill 1.234 s (71.31 tok/s) / generation: 64 tokens, 0.100 s/token (9.99 tok/s)
    echo "$pre" "$gen" | sed -E 's/^sluice: prompt ([0-9]+) tokens( \([0-9]+ new\))?, prefill ([0-9.]+) s .* generation: ([0-9]+) tokens, [0-9.]+ s\/token \(([0-9.]+) tok\/s\)$/\1 \3 \4 \5/'
}

run_llama() {  # variant model threads n_decode -> the driver's line
    GGML_BACKEND_DIR=$work/cpu-$1 "$work/bench_llamacpp" -m "$2" -p "$PROMPT" -t "$3" -n "$4" -c "$N_CTX" \
        -b "$UBATCH" 2> "$work/l.err"
}

load_start=$(uptime | sed -E 's/.*load average: //')
echo "# warm-up: reading the models and one untimed run of each engine per model" >&2
narrow=
for m in $MODELS; do
    cat "$m" > /dev/null
    run_sluice "$m" 2 4 > /dev/null
    # A kernel table with wide builds (AVX-512 registers, `Kernels::wide`): also time the
    # narrow table (SLUICE_KERNELS=avx2), the one to set against llama.cpp's AVX2 library.
    kernels=$(sed -nE 's/^sluice: .*, kernels ([^ ]+)$/\1/p' "$work/s.err")
    if [ "${kernels#avx2+}" != "$kernels" ]; then
        narrow=1
    fi
    run_llama default "$m" 2 4 > /dev/null
    run_llama haswell "$m" 2 4 > /dev/null
done

for r in $(seq 1 "$ROUNDS"); do
    for m in $MODELS; do
        name=$(basename "$m" .gguf)
        for t in $THREADS; do
            # Re-read the file before each run: the page cache of this kind of machine may be
            # trimmed between runs (proactive reclaim), and a timed run must not read the disk.
            cat "$m" > /dev/null
            read -r np ps nd dt < <(run_sluice "$m" "$t" "$N_DECODE") || true
            if [ -z "${dt:-}" ]; then
                echo "bench_resident.sh: no timing lines from sluice run:" >&2
                tail -5 "$work/s.err" >&2
                exit 1
            fi
            printf 'sluice\t-\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$name" "$t" "$np" "$ps" "$nd" "$dt" >> "$raw"
            if [ -n "$narrow" ]; then
                cat "$m" > /dev/null
                read -r np ps nd dt < <(SLUICE_KERNELS=avx2 run_sluice "$m" "$t" "$N_DECODE") || true
                printf 'sluice\tavx2\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$name" "$t" "$np" "$ps" "$nd" "$dt" >> "$raw"
            fi
            for v in default haswell; do
                cat "$m" > /dev/null
                line=$(run_llama "$v" "$m" "$t" "$N_DECODE")
                # llamacpp cpu=... threads=T n_prompt=P prefill_s=S prefill_tps=X n_decode=N decode_s=S decode_tps=Y
                eval "$(echo "$line" | tr ' ' '\n' | grep -E '^(cpu|n_prompt|prefill_s|n_decode|decode_tps)=')"
                # shellcheck disable=SC2154 # set by the eval
                printf 'llamacpp\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$v" "$r" "$name" "$t" "$n_prompt" "$prefill_s" \
                    "$n_decode" "$decode_tps" "$cpu" >> "$raw"
            done
            echo "# round $r $name threads $t done" >&2
        done
    done
done
load_end=$(uptime | sed -E 's/.*load average: //')

python3 - "$raw" "$commit" "$load_start" "$load_end" "$ROUNDS" "${kernels:-?}" > "$work/table.md" <<'PY'
import sys
from collections import defaultdict

raw, commit, load_start, load_end, rounds, sluice_kernels = sys.argv[1:7]
best = defaultdict(lambda: [0.0, 0.0])  # (engine, model, threads) -> [prefill tps, decode tps]
n_prompt = defaultdict(set)
cpu = {}
order = []
for line in open(raw):
    f = line.rstrip("\n").split("\t")
    eng = ("sluice" if f[1] == "-" else f"sluice {f[1]}") if f[0] == "sluice" else f"llama.cpp {f[1]}"
    model, threads = f[3], int(f[4])
    np_, ps, nd, dt = int(f[5]), float(f[6]), int(f[7]), float(f[8])
    if len(f) > 9:
        cpu[f[1]] = f[9]
    key = (model, threads)
    if key not in order:
        order.append(key)
    n_prompt[key].add(np_)
    b = best[(eng,) + key]
    b[0] = max(b[0], np_ / ps)
    b[1] = max(b[1], dt)

print(f"Commit `{commit}`; best of {rounds} rounds; load average (1, 5, 15 min) {load_start} at the start, {load_end} at the end.")
print()
# "sluice avx2": the narrow kernel table (SLUICE_KERNELS=avx2), timed where the detected one has
# wide builds; the ratio against llama.cpp's AVX2 library uses it (else the detected table,
# which is then the narrow one).
print("| model | threads | prompt tokens | prefill tok/s: sluice | sluice avx2 | llama.cpp default | llama.cpp haswell "
      "| ratio vs default | ratio (avx2) vs haswell "
      "| decode tok/s: sluice | sluice avx2 | llama.cpp default | llama.cpp haswell | ratio vs default | ratio (avx2) vs haswell |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for model, t in order:
    s, d, h = (best[(e, model, t)] for e in ("sluice", "llama.cpp default", "llama.cpp haswell"))
    a = best[("sluice avx2", model, t)] if ("sluice avx2", model, t) in best else s
    toks = "/".join(str(x) for x in sorted(n_prompt[(model, t)]))
    print(f"| {model} | {t} | {toks} | {s[0]:.1f} | {a[0]:.1f} | {d[0]:.1f} | {h[0]:.1f} | {s[0] / d[0]:.2f} | {a[0] / h[0]:.2f} "
          f"| {s[1]:.2f} | {a[1]:.2f} | {d[1]:.2f} | {h[1]:.2f} | {s[1] / d[1]:.2f} | {a[1] / h[1]:.2f} |")
print()
print(f"sluice kernels: {sluice_kernels}")
for v, c in sorted(cpu.items()):
    print(f"llama.cpp {v}: CPU backend features {c}")
PY

cat "$work/table.md"
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$raw" "$work/table.md" "$OUT/"
fi
