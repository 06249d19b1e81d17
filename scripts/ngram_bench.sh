#!/usr/bin/env bash
# What `--ngram` speculation buys (docs/lossy.md, "Speculative decoding by prompt lookup"): greedy
# chat runs of MODEL with and without it, alternating (plain, ngram, plain, ngram, ...) for
# ROUNDS rounds on two prompts — a copy-heavy code edit and free prose — each run a fresh
# process. Prints a markdown table: the median decode tok/s of each, the ratio ngram ÷ plain
# (the ratio of each round's pair, then the median), the expert reads per token and hit rate
# when streamed, and the `ngram:` lines' acceptance, tokens per verify pass, coverage and
# drafting cost. Checks that both give the same answer.
#
# Usage: bash scripts/ngram_bench.sh MODEL.gguf [SLUICE FLAGS...]
#   the flags go to both runs, e.g. "--moe-stream on --cache-mb 32 --force-cache"
# Environment: ROUNDS (default 3), N (tokens, default 128), THREADS (default 2),
#   NGRAM (the speculation flags, default "--ngram --draft 3 --ngram-min-match 3").
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 MODEL.gguf [SLUICE FLAGS...]" >&2; exit 2; }
model=$1
shift
rounds=${ROUNDS:-3}
n=${N:-128}
threads=${THREADS:-2}
read -r -a ngram <<< "${NGRAM:---ngram --draft 3 --ngram-min-match 3}"
cargo build --release --quiet --manifest-path "$root/Cargo.toml"
sluice=$root/target/release/sluice
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

code='Repeat this C code unchanged, adding a one-line comment above each function:

static int clamp(int v, int lo, int hi) {
    if (v < lo) return lo;
    if (v > hi) return hi;
    return v;
}

static int sum(const int *a, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += a[i];
    return s;
}

static int max_of(const int *a, int n) {
    int m = a[0];
    for (int i = 1; i < n; i++) if (a[i] > m) m = a[i];
    return m;
}'
prose='Explain how a solid-state drive stores data, and why it wears out.'

run() { # OUT PROMPT [FLAGS...]
    local out=$1 prompt=$2
    shift 2
    "$sluice" run -m "$model" --chatml -p "$prompt" -n "$n" --temp 0 --ignore-eos --no-usage \
        -t "$threads" "$@" > "$out" 2> "$out.err" || { cat "$out.err" >&2; exit 1; }
}

for r in $(seq 1 "$rounds"); do
    for p in code prose; do
        run "$work/$p-plain-$r" "${!p}" "$@"
        run "$work/$p-ngram-$r" "${!p}" "$@" "${ngram[@]}"
    done
done

python3 - "$work" "$rounds" "${ngram[*]}" "$*" <<'EOF'
import re, statistics, sys
work, rounds, ngram, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def parse(path):
    text = open(path).read()
    answer = text.split("\ngeneration: ")[0]
    g = lambda pat: (m := re.search(pat, text)) and float(m.group(1))
    return {
        "answer": answer,
        "tps": g(r"\ngeneration: .*\(([0-9.]+) tok/s\)"),
        "mib": g(r"\nmoe-stream: read [0-9.]+ MiB \(([0-9.]+) MiB/token\)"),
        "hit": g(r"\nmoe-cache: ([0-9.]+)% hit"),
        "acc": g(r"\nngram: .*drafts accepted \(([0-9.]+)%\)"),
        "per": g(r"\nngram: .*, ([0-9.]+) tokens per verify decode"),
        "cov": g(r"\nngram: drafted on .*\(([0-9.]+)%\)"),
        "cost": g(r"\nngram: drafting costs ([0-9.]+) s/token"),
        "eff": g(r"\nngram: drafting costs .*→ ([0-9.]+) tok/s effective"),
    }

med = lambda xs: statistics.median(xs) if xs and None not in xs else None
fmt = lambda x, f="{:.2f}": "-" if x is None else f.format(x)
print(f"`sluice run {flags} --chatml -n N --temp 0 --ignore-eos` against the same with "
      f"`{ngram}`, {rounds} alternating rounds (median):\n")
print("| prompt | plain tok/s | ngram tok/s | effective | ngram ÷ plain | MiB/token plain → ngram "
      "| hit plain → ngram | acceptance | tokens/verify | coverage | drafting s/token |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for p in ["code", "prose"]:
    plain = [parse(f"{work}/{p}-plain-{r}") for r in range(1, rounds + 1)]
    spec = [parse(f"{work}/{p}-ngram-{r}") for r in range(1, rounds + 1)]
    for a, b in zip(plain, spec):
        if a["answer"] != b["answer"]:
            sys.exit(f"{p}: --ngram changed the answer")
    m = lambda runs, k: med([x[k] for x in runs])
    ratio = med([b["tps"] / a["tps"] for a, b in zip(plain, spec)])
    print(f"| {p} | {fmt(m(plain, 'tps'))} | {fmt(m(spec, 'tps'))} | {fmt(m(spec, 'eff'))} "
          f"| **{fmt(ratio, '{:.3f}')}** | {fmt(m(plain, 'mib'), '{:.1f}')} → {fmt(m(spec, 'mib'), '{:.1f}')} "
          f"| {fmt(m(plain, 'hit'), '{:.1f}')} → {fmt(m(spec, 'hit'), '{:.1f}')} "
          f"| {fmt(m(spec, 'acc'), '{:.1f}%')} | {fmt(m(spec, 'per'))} | {fmt(m(spec, 'cov'), '{:.1f}%')} "
          f"| {fmt(m(spec, 'cost'), '{:.4f}')} |")
print("\nAnswers identical with and without --ngram in every round.")
EOF
