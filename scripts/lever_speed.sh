#!/usr/bin/env bash
# The decode speed of sluice's levers on one model (docs/lossy.md, "Every lever on one plot"):
# greedy chat generations of N tokens on one prompt, the experts streamed through a cache of
# CACHE_MB MiB, under the baseline and under each setting, every setting once per round for
# ROUNDS rounds (each run a fresh process). Prints a markdown table — the median decode tok/s,
# the median of each round's ratio to that round's baseline, the expert reads per token and the
# hit rate — and writes it as tab-separated values to OUT.tsv when OUT is set (for
# scripts/plot_levers.py).
#
# Usage: bash scripts/lever_speed.sh MODEL.gguf CACHE_MB SETTING...
#   a SETTING is one argument of sluice flags, e.g. "--drop-cold-experts 1".
# Environment: ROUNDS (default 3), N (default 128), THREADS (default 2), OUT, PROMPT (default:
#   "Explain how a solid-state drive stores data, and why it wears out.").
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 3 ] || { echo "usage: $0 MODEL.gguf CACHE_MB SETTING..." >&2; exit 2; }
model=$1
cache=$2
shift 2
settings=("" "$@")
rounds=${ROUNDS:-3}
n=${N:-128}
threads=${THREADS:-2}
prompt=${PROMPT:-Explain how a solid-state drive stores data, and why it wears out.}
cargo build --release --quiet --manifest-path "$root/Cargo.toml"
sluice=$root/target/release/sluice
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for r in $(seq 1 "$rounds"); do
    for i in "${!settings[@]}"; do
        read -r -a flags <<< "${settings[$i]}"
        "$sluice" run -m "$model" --chatml -p "$prompt" -n "$n" --temp 0 --ignore-eos --no-usage \
            -t "$threads" --moe-stream on --cache-mb "$cache" --force-cache "${flags[@]}" \
            > "$work/$i-$r" 2> "$work/$i-$r.err" || { cat "$work/$i-$r.err" >&2; exit 1; }
    done
done

printf '%s\n' "${settings[@]}" > "$work/settings"
python3 - "$work" "$rounds" "${OUT:-}" <<'EOF'
import re, statistics, sys
work, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
settings = open(f"{work}/settings").read().split("\n")[:-1]

def parse(path):
    text = open(path).read()
    g = lambda pat: float(re.search(pat, text).group(1))
    return {
        "tps": g(r"\ngeneration: .*\(([0-9.]+) tok/s\)"),
        "mib": g(r"\nmoe-stream: read [0-9.]+ MiB \(([0-9.]+) MiB/token\)"),
        "hit": g(r"\nmoe-cache: ([0-9.]+)% hit"),
    }

runs = [[parse(f"{work}/{i}-{r}") for r in range(1, rounds + 1)] for i in range(len(settings))]
rows = []
for i, s in enumerate(settings):
    med = lambda k: statistics.median(x[k] for x in runs[i])
    ratio = statistics.median(a["tps"] / b["tps"] for a, b in zip(runs[i], runs[0]))
    rows.append((s or "baseline", med("tps"), ratio, med("mib"), med("hit")))
print(f"{rounds} rounds (median):\n")
print("| setting | decode tok/s | vs baseline | MiB/token | cache hit |")
print("|---|---:|---:|---:|---:|")
for s, tps, ratio, mib, hit in rows:
    label = s if s == "baseline" else f"`{s}`"
    print(f"| {label} | {tps:.2f} | ×{ratio:.3f} | {mib:.1f} | {hit:.1f}% |")
if out:
    with open(out, "w") as f:
        f.write("setting\ttok_s\tratio\tmib_token\thit_pct\n")
        for r in rows:
            f.write("\t".join([r[0]] + [f"{x:.4f}" for x in r[1:]]) + "\n")
EOF
