#!/usr/bin/env bash
# Matvec throughput: our quant crate against llama.cpp's CPU backend, interleaved.
#
#   bench/llamacpp/run.sh                 # full run (about 11 minutes)
#   TYPES=q4_K SHAPES=2048x4096 ROUNDS=1 bench/llamacpp/run.sh
#
# Installs the prebuilt llama.cpp libraries of the npm package node-llama-cpp 3.21.1
# (llama.cpp release v0.4.0, GGML_BACKEND_DL: one libggml-cpu-<arch>.so per x86 level) and the
# matching ggml headers into $WORK (outside the repository), compiles mul_mat_bench.c against
# them, builds our matvec_bench example, and then for every type and shape runs ours and
# llama.cpp's back to back, ROUNDS times. Raw lines go to $WORK/raw.tsv; summary tables
# (best of the per-round medians, hot and cold) are printed at the end.
#
# Environment:
#   WORK      scratch directory (default: ${TMPDIR:-/tmp}/sluice-llamacpp)
#   TYPES     comma-separated ggml type names (default: q4_K,q6_K,q8_0,mxfp4,f16)
#   SHAPES    comma-separated ROWSxCOLS (default: 2048x768,768x2048,2048x4096,4096x2048,151936x2048)
#   THREADS   comma-separated thread counts (default: 1,2)
#   ROUNDS    repetitions of the whole interleaved sweep (default: 2)
#   MIN_TIME  seconds per measurement, at least (default: 0.5)
#   VARIANTS  llama.cpp CPU variants: "best" (what it picks for this CPU) and/or a variant
#             name such as "haswell" (AVX2 only, the same ISA as our kernels)
#             (default: "best haswell")
#   MODES     llama.cpp modes for the "best" variant: weight placement plain / repack, hot
#             (one matrix reused) or -cold (rotating over 1 GiB of copies)
#             (default: plain,repack,plain-cold,repack-cold)
#   ALT_MODES llama.cpp modes for the other variants (default: plain,repack,plain-cold,repack-cold)
#   OURS_MODES     hot and/or cold (default: hot,cold)
#   OURS_PREFETCH  on and/or off: our software prefetch of weight rows (default: on,off)
#   OURS_MULTI_ROW on and/or off: our multi-row kernels where the kernel table has them
#                  (default: on; off computes every row with the single-row kernel)
#   OURS_ORDER     summation order of our kernels: vecdot, repacked or tinyblas
#                  (matvec_bench --order; default: vecdot)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
WORK="${WORK:-${TMPDIR:-/tmp}/sluice-llamacpp}"
TYPES="${TYPES:-q4_K,q6_K,q8_0,mxfp4,f16}"
SHAPES="${SHAPES:-2048x768,768x2048,2048x4096,4096x2048,151936x2048}"
THREADS="${THREADS:-1,2}"
ROUNDS="${ROUNDS:-2}"
MIN_TIME="${MIN_TIME:-0.5}"
VARIANTS="${VARIANTS:-best haswell}"
MODES="${MODES:-plain,repack,plain-cold,repack-cold}"
ALT_MODES="${ALT_MODES:-plain,repack,plain-cold,repack-cold}"
OURS_MODES="${OURS_MODES:-hot,cold}"
OURS_PREFETCH="${OURS_PREFETCH:-on,off}"
OURS_MULTI_ROW="${OURS_MULTI_ROW:-on}"
OURS_ORDER="${OURS_ORDER:-vecdot}"

# shellcheck source=../../scripts/llamacpp-npm.sh
. "$repo/scripts/llamacpp-npm.sh"
llamacpp_npm_install "$WORK"
cd "$WORK"
L="$LLAMACPP_LIB"
cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra "$here/mul_mat_bench.c" -Illama-src/ggml/include \
    "$L/libggml.v0.4.0.so" "$L/libggml-base.so" -Wl,-rpath,"$L" -o mul_mat_bench

(cd "$repo" && cargo build --release -q -p quant --example matvec_bench)
ours="$repo/target/release/examples/matvec_bench"

{
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')," \
        "$(nproc) cpus, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee raw.tsv >&2

IFS=, read -r -a types <<<"$TYPES"
IFS=, read -r -a shapes <<<"$SHAPES"
for round in $(seq 1 "$ROUNDS"); do
    for t in "${types[@]}"; do
        for s in "${shapes[@]}"; do
            rows="${s%x*}"
            cols="${s#*x}"
            "$ours" --types "$t" --shapes "$s" --threads "$THREADS" --min-time "$MIN_TIME" \
                --modes "$OURS_MODES" --prefetch "$OURS_PREFETCH" --multi-row "$OURS_MULTI_ROW" \
                --order "$OURS_ORDER" | tee -a raw.tsv ||
                echo "# ours: no result for $t $s" | tee -a raw.tsv >&2
            for v in $VARIANTS; do
                vopt=(--modes "$MODES")
                [ "$v" = best ] || vopt=(--variant "$v" --modes "$ALT_MODES")
                ./mul_mat_bench --backend-dir "$L" "${vopt[@]}" --type "$t" --rows "$rows" --cols "$cols" \
                    --threads "$THREADS" --min-time "$MIN_TIME" 2>/dev/null | tee -a raw.tsv ||
                    echo "# llama.cpp $v: no result for $t $s" | tee -a raw.tsv >&2
            done
        done
    done
    echo "# round $round done, load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a raw.tsv >&2
done

python3 "$here/summarize.py" raw.tsv
