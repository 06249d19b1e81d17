#!/usr/bin/env bash
# The quality and the reads of the cache-aware lossy levers (docs/lossy.md): the held-out text
# (scripts/fetch_eval_texts.sh, its first CHARS characters) scored one token per forward pass
# (`sluice run --ppl --ppl-step`, as decode runs), the experts streamed through a cache of
# CACHE_MB MiB, under the baseline and under each setting given. For each: the perplexity, the
# next-token hit rate, the share of positions whose most likely next token is the baseline's,
# what the lever changed (routings dropped or moved), the cache's hit rate and the expert
# reads per token.
#
# Usage: bash scripts/lossy_cache_aware.sh MODEL.gguf CACHE_MB [SETTING...]
#   a SETTING is one argument of sluice flags, e.g. "--drop-cold-experts 0.75"; default:
#   --drop-cold-experts 0.5 / 0.75 / 1, --expert-substitute 0.05 / 0.1 / 0.25.
# Environment: CHARS (default 6000), THREADS (default 2).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 MODEL.gguf CACHE_MB [SETTING...]" >&2; exit 2; }
model=$1
cache=$2
shift 2
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=(
    "--drop-cold-experts 0.5" "--drop-cold-experts 0.75" "--drop-cold-experts 1"
    "--expert-substitute 0.05" "--expert-substitute 0.1" "--expert-substitute 0.25"
)
chars=${CHARS:-6000}
threads=${THREADS:-2}
texts=$(bash "$root/scripts/fetch_eval_texts.sh")
cargo build --release --quiet --manifest-path "$root/Cargo.toml"
sluice=$root/target/release/sluice
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c "$chars" "$texts/heldout-sotu-1961-kennedy.txt" > "$work/text.txt"

# score NAME [FLAGS...]: the run's output in $work/NAME.out, its predictions in $work/NAME.ids
score() {
    local name=$1
    shift
    "$sluice" run -m "$model" --ppl "$work/text.txt" --ppl-step --no-usage -t "$threads" \
        --moe-stream on --cache-mb "$cache" --force-cache \
        --ppl-predictions "$work/$name.ids" "$@" > "$work/$name.out" 2> "$work/$name.err" \
        || { cat "$work/$name.err" >&2; exit 1; }
}

# the figure after PREFIX in a line starting with LINE, up to the next space or '%'
figure() { # NAME LINE PREFIX
    sed -n "/^$2/s/.*$3\([0-9.]*\).*/\1/p" "$work/$1.out" | head -1
}

row() { # NAME LABEL
    local name=$1 label=$2
    local ppl hit agree dropped moved cache_hit mib
    ppl=$(figure "$name" "perplexity: " "perplexity: ")
    hit=$(figure "$name" "perplexity: " "next-token hit ")
    agree=$(paste -d' ' "$work/base.ids" "$work/$name.ids" \
        | awk '{ n++; if ($1 == $2) a++ } END { printf "%.1f", 100 * a / n }')
    dropped=$(figure "$name" "moe-drop: " "dropped (")
    moved=$(figure "$name" "moe-substitute: " "expert (")
    cache_hit=$(figure "$name" "moe-cache: " "moe-cache: ")
    mib=$(figure "$name" "moe-stream: " "MiB (")
    echo "| $label | $ppl | $(awk -v a="$ppl" -v b="$base_ppl" 'BEGIN { printf "×%.3f", a / b }') | $hit% | $agree% | ${dropped:--} | ${moved:--} | $cache_hit% | $mib |"
}

score base
base_ppl=$(figure base "perplexity: " "perplexity: ")
n=$(wc -l < "$work/base.ids")
echo "# $(basename "$model"), cache $cache MiB, $n positions, one token per pass"
echo "| setting | perplexity | vs baseline | next-token hit | next token as the baseline's | routings dropped % | routings moved % | cache hit | MiB/token |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
row base "baseline"
i=0
for s in "${settings[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086 # a setting is several flags
    score "s$i" $s
    row "s$i" "\`$s\`"
done
