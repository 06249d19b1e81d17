#!/usr/bin/env bash
# SmallThinker's experts requested before the attention (the default) against after it
# (`--no-early-load`), serial and `--overlap`, alternating A B A B in each round, on a
# `gen-model --like smallthinker-21b-a3b` file: one line per run with sluice's own summary
# (`generation:`, `moe-stream:` with the flash I/O and, under --overlap, the stall per token,
# `moe-cache:`). The output is the same in every variant; what moves is the expert wait.
#
# Usage: bash scripts/early_load_bench.sh [MODEL.gguf] [ROUNDS]
#   MODEL  default: $SLUICE_FIXTURES/bench/smallthinker-21b-a3b-q4_k_m.gguf (written by
#          `sluice gen-model --like smallthinker-21b-a3b --out MODEL` when missing)
#   SLUICE the sluice binary (default: target/release/sluice, built here)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FIX=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}
M=${1:-$FIX/bench/smallthinker-21b-a3b-q4_k_m.gguf}
ROUNDS=${2:-3}
S=${SLUICE:-$root/target/release/sluice}
if [ -z "${SLUICE:-}" ]; then
    (cd "$root" && cargo build --release --locked -p sluice >&2)
fi
if [ ! -f "$M" ]; then
    mkdir -p "$(dirname "$M")"
    "$S" gen-model --like smallthinker-21b-a3b --out "$M" >&2
fi
usage=$(mktemp)
trap 'rm -f "$usage"' EXIT
for round in $(seq 1 "$ROUNDS"); do
    for v in "serial-early:" "serial-late:--no-early-load" "overlap-early:--overlap" \
        "overlap-late:--overlap --no-early-load"; do
        label=${v%%:*}
        # shellcheck disable=SC2206
        args=(${v#*:})
        out=$("$S" run -m "$M" -p "The history of the river begins" -n 32 --temp 0 \
            --moe-stream on --cache-mb 2000 -t 2 --usage-file "$usage" "${args[@]}" 2>&1)
        echo "$round $label | $(grep '^generation:' <<<"$out") | $(grep '^moe-stream:' <<<"$out") | $(grep '^moe-cache:' <<<"$out")"
    done
done
