#!/usr/bin/env bash
# The quality table of docs/moefy.md: held-out perplexity of a dense model and of MoEfied copies
# of it (`sluice moefy`), one markdown row each, on the held-out text of
# scripts/fetch_eval_texts.sh (JFK's 1961 State of the Union address, first 12000 characters).
#
# Usage: bash scripts/moefy_quality.sh DENSE.gguf SPEC...
#   SPEC = E:K[:GROUPING[:CALIB_TOKENS]]   e.g. 16:12  64:32:gate  16:12:activation:4096
# Environment: KEEP=DIR keeps the MoEfied files in DIR (default: a temporary directory);
#              ROUTE=1 also reports the routing's locality of each K < E file (`sluice analyze
#              route` over a one-token-per-pass scoring: slow).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 DENSE.gguf E:K[:GROUPING[:CALIB_TOKENS]]..." >&2; exit 2; }
dense=$1
shift
texts=$(bash "$root/scripts/fetch_eval_texts.sh")
held=$texts/heldout-sotu-1961-kennedy.txt
cargo build --release --quiet --manifest-path "$root/Cargo.toml"
sluice=$root/target/release/sluice
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT

ppl() { # MODEL -> "ppl hit%"
    "$sluice" run -m "$1" --ppl "$held" -c 4096 --no-usage 2>&1 |
        sed -n 's/^perplexity: \([0-9.]*\) over \([0-9]*\) tokens.*next-token hit \([0-9.]*\)%.*/\1 \2 \3/p'
}
read -r base n hit < <(ppl "$dense")
echo "| model | experts E | top-K | grouping | calibration tokens | held-out perplexity | vs dense | next-token hit |"
echo "|---|---|---|---|---|---|---|---|"
echo "| $(basename "$dense") (dense) | – | – | – | – | $base | – | $hit% |"
for spec in "$@"; do
    IFS=: read -r e k grouping calib <<< "$spec"
    grouping=${grouping:-activation}
    calib=${calib:-2048}
    out=$work/$(basename "$dense" .gguf)-moefied-${e}x${k}-$grouping-$calib.gguf
    [ -f "$out" ] || "$sluice" moefy "$dense" --experts "$e" --top-k "$k" --grouping "$grouping" \
        --calib-tokens "$calib" --out "$out" --quiet >&2
    read -r p _ h < <(ppl "$out")
    rel=$(python3 -c "print(f'{100 * ($p / $base - 1):+.2f}%')")
    echo "| moefied | $e | $k | $grouping | $calib | $p | $rel | $h% |"
    if [ "${ROUTE:-0}" = 1 ] && [ "$k" != "$e" ]; then
        "$sluice" run -m "$out" --ppl "$held" --ppl-step -c 4096 --no-usage \
            --route-trace "$work/route-${e}x${k}.csv" > /dev/null 2>&1
        "$sluice" analyze route "$work/route-${e}x${k}.csv" --phase all --json > "$work/route-${e}x${k}.json"
        python3 "$root/scripts/route_locality_row.py" "$work/route-${e}x${k}.json" \
            "moefied ${e}x${k}" "$work/route-${e}x${k}.csv" >> "$work/locality.md"
    fi
done
if [ -f "$work/locality.md" ]; then
    echo
    python3 "$root/scripts/route_locality_row.py" --header
    cat "$work/locality.md"
    rm -f "$work/locality.md"
fi
echo "(held-out: $n tokens of $(basename "$held"); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
