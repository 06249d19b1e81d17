#!/usr/bin/env bash
# Where a resident decode's time goes, in sluice and in bmoe-cli 0.19's plain mode (llama.cpp
# v0.4.0 on mmap), on the same model file, threads and prompt: a sampling profile of each run
# (`perf record -e cpu-clock`, a software clock, so it works in VMs without hardware counters),
# its samples grouped into the parts of a decode step, printed as a markdown table.
#
#   bash scripts/profile_decode.sh [MODEL]
#
# MODEL defaults to the 18.56 GB Qwen3-30B-A3B-shaped Q4_K_M file (`sluice gen-model --like
# qwen3-30b-a3b --quant Q4_K_M`, in $SLUICE_FIXTURES/bench). Each engine generates $N tokens
# (default 256, so that the decode outweighs the load and prefill in the samples) with $THREADS
# threads (default 2), the file read through the page cache first. Needs perf (Debian's
# linux-perf), bmoe-cli (scripts/build_bmoe.sh) and about 2 minutes beside the model's load.
#
# The groups, by symbol (what is not matched falls in "other"):
#   weights     the dot-product kernels of the weight matrices (sluice: quant::kernels::*, but
#               the activation quantizers; llama.cpp: ggml_vec_dot_*, ggml_gemv_*, ggml_gemm_*)
#   prefetch    sluice's software row prefetch (the loop in quant::matvec::rows_times_vector that
#               issues it; a prefetch stalls when the line-fill buffers are full, so these
#               samples are memory waits the kernels would otherwise take)
#   act quant   the activation quantizers (quantize_row_q8_*)
#   attention   attention (sluice: engine::ops::attn; llama.cpp: flash_attn, softmax, f16 dots)
#   pool        thread-pool work distribution and waiting (sluice: quant::pool, the workers'
#               loop; llama.cpp: libgomp, ggml_graph_compute_thread, barriers)
#   kernel      the operating system (page faults, reads, copies: mostly the load)
#   load        reading the model into memory and start-up measurements (sluice's synthetic
#               weights for the kernel choice, memmove)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FIX=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}
MODEL=${1:-$FIX/bench/qwen3-30b-a3b-q4_k_m.gguf}
N=${N:-256}
THREADS=${THREADS:-2}
PROMPT="Explain what a mixture of experts is."
[ -f "$MODEL" ] || { echo "profile_decode.sh: $MODEL not found (see the header)" >&2; exit 1; }
command -v perf > /dev/null || { echo "profile_decode.sh: perf not found (apt install linux-perf)" >&2; exit 1; }

(cd "$root" && cargo build --release --bin sluice >&2)
SLUICE=$root/target/release/sluice
BMOE=$(bash "$root/scripts/build_bmoe.sh")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

profile() {  # name argv...
    local name=$1
    shift
    cat "$MODEL" > /dev/null
    perf record -q -e cpu-clock -F 1000 -o "$work/$name.data" "$@" > "$work/$name.out" 2> "$work/$name.err"
    perf report -q -i "$work/$name.data" --no-children --sort dso,symbol --stdio 2> /dev/null \
        | grep -E '^ +[0-9]' > "$work/$name.txt"
    grep -h -E '^generation:' "$work/$name.out" "$work/$name.err" | head -1 | sed "s/^/$name: /" >&2
}
profile sluice "$SLUICE" run -m "$MODEL" -p "$PROMPT" -n "$N" --temp 0 --ignore-eos -t "$THREADS" -c 1024
profile bmoe-cli "$BMOE" -m "$MODEL" -p "$PROMPT" -n "$N" --temp 0 -t "$THREADS" -c 1024
# Where the prefetch samples fall inside rows_times_vector: the instructions of its loop.
perf annotate -i "$work/sluice.data" --stdio -s quant::matvec::rows_times_vector 2> /dev/null \
    | grep -E '^ +[0-9]+\.[0-9]+ +:' | sort -rn | head -4 > "$work/annotate.txt" || true

python3 - "$work/sluice.txt" "$work/bmoe-cli.txt" "$work/sluice.err" "$work/annotate.txt" <<'PY'
import re
import sys

GROUPS = [
    ("act quant", r"quantize_row_q8|quantize_q8|q8k::quantize|act::quantize"),
    ("prefetch", r"rows_times_vector"),
    ("weights", r"quant::kernels::|ggml_vec_dot_(q|iq|tq|mxfp)|ggml_gemv_|ggml_gemm_|repack"),
    ("attention", r"engine::ops::attn|flash_attn|soft_max|ggml_vec_dot_f16|ggml_vec_dot_f32|attend"),
    ("pool", r"quant::pool|begin_short_backtrace|libgomp|graph_compute_thread|barrier|sched_yield"),
    ("load", r"random_weights|synth::|memmove|memcpy|_IO_fread|read_into"),
    ("kernel", r"\[k\]"),
]


def groups(path):
    out = {g: 0.0 for g, _ in GROUPS}
    out["other"] = 0.0
    top = []
    for line in open(path):
        m = re.match(r"\s+([0-9.]+)%\s+(\S+)\s+(\[.\])\s+(.*?)\s*(-\s+-\s*)?$", line)
        if not m:
            continue
        pct, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4)
        text = f"{dso} {kind} {sym}"
        for g, pat in GROUPS:
            if re.search(pat, text):
                out[g] += pct
                break
        else:
            out["other"] += pct
        if len(top) < 6:
            top.append(f"{sym.strip()} {pct:.1f} %")
    return out, top


(s, s_top), (b, b_top) = groups(sys.argv[1]), groups(sys.argv[2])
print("| part of the run | sluice, % of samples | bmoe-cli plain (llama.cpp v0.4.0 mmap), % of samples |")
print("|---|---:|---:|")
for g in [g for g, _ in GROUPS] + ["other"]:
    print(f"| {g} | {s[g]:.1f} | {b[g]:.1f} |")
print()
print("sluice's largest symbols: " + "; ".join(s_top))
print()
print("bmoe-cli's largest symbols: " + "; ".join(b_top))
kern = [l.strip() for l in open(sys.argv[3]) if "decode kernels" in l or ", kernels " in l]
if kern:
    print()
    print("sluice's start-up lines: " + " / ".join(kern))
ann = [l.strip() for l in open(sys.argv[4])]
if ann:
    print()
    print("rows_times_vector's hottest instructions (the sample lands on the one after a stalled prefetch): "
          + "; ".join(re.sub(r"\s+", " ", a) for a in ann))
PY
