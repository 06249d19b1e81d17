#!/usr/bin/env bash
# Re-measures the speed comparisons README states, at the checkout's commit, with fixed commands,
# and writes them with the CPU (model string, family/model), the commit and the date.
#
#   bash scripts/claims.sh [OUT.md]        # default: docs/claims.md (replaced)
#
# The model is the 18.56 GB Qwen3-30B-A3B-shaped Q4_K_M file `sluice gen-model --like
# qwen3-30b-a3b --quant Q4_K_M` writes (made in $SLUICE_FIXTURES/bench when missing, ~20 s). Two
# `sluice bench` runs, 64 tokens, 2 threads (or $THREADS):
#
#   resident   --warm --rounds 3 --peer bmoe --with-llama: sluice against bmoe-cli 0.19's plain
#              mode (llama.cpp v0.4.0 on mmap, no repacking) and against llama.cpp v0.4.0 as
#              shipped (npm's prebuilt libraries, weights repacked), the file warm in the page
#              cache before every run;
#   6 GiB cap  --mem-cap-mb 6144 --rounds 2 --peer bmoe: sluice with expert caches of 4000, 2000
#              and 1500 MiB (its defaults otherwise) against bmoe-cli's expert streaming with
#              the same caches (`--moe-stream --io-threads 4 --overlap`), every run starting
#              with the file evicted from the page cache.
#
# The summary table at the top gives each comparison's median decode ratio (sluice variant
# against the peer run of the same round) and the time-to-first-token ranges; the bench reports
# follow in full. Needs root (the cgroup v1 memory group), bmoe-cli (scripts/build_bmoe.sh,
# about 13 minutes once), the llama.cpp driver (scripts/build_bench_llamacpp.sh, npm), about
# 20 GB of disk for the model, and about 15 minutes on 2 cores. Nothing else should run: these
# are timings.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$root/docs/claims.md}
FIX=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}
THREADS=${THREADS:-2}
N=64
MODEL=$FIX/bench/qwen3-30b-a3b-q4_k_m.gguf

(cd "$root" && cargo build --release --bin sluice >&2)
SLUICE=$root/target/release/sluice
bash "$root/scripts/build_bmoe.sh" > /dev/null
bash "$root/scripts/build_bench_llamacpp.sh" > /dev/null
if [ ! -f "$MODEL" ]; then
    mkdir -p "$FIX/bench"
    "$SLUICE" gen-model --like qwen3-30b-a3b --quant Q4_K_M --out "$MODEL" >&2
fi

commit=$(git -C "$root" rev-parse --short=12 HEAD)
if ! git -C "$root" diff --quiet HEAD -- crates Cargo.toml Cargo.lock scripts/bench_llamacpp.cpp; then
    echo "claims.sh: the checkout has changes under crates/; commit them first (a claim names a commit)" >&2
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "# claims: resident (about 5 minutes)" >&2
"$SLUICE" bench -m "$MODEL" -n "$N" -t "$THREADS" --rounds 3 --warm --peer bmoe --with-llama \
    --label "Resident, file warm: sluice vs bmoe-cli plain mode and llama.cpp v0.4.0 as shipped (commit $commit)" \
    --append "$work/resident.md" > /dev/null

echo "# claims: under a 6 GiB cap (about 10 minutes)" >&2
caps=(4000 2000 1500)
variants=()
peer_variants=()
for c in "${caps[@]}"; do
    variants+=(--variant "cache $c=--cache-mb $c")
    peer_variants+=(--peer-variant "cache $c=--moe-stream --io-threads 4 --overlap --cache-mb $c")
done
"$SLUICE" bench -m "$MODEL" -n "$N" -t "$THREADS" --rounds 2 --mem-cap-mb 6144 --peer bmoe \
    "${variants[@]}" "${peer_variants[@]}" \
    --label "Under a 6 GiB cap: sluice vs bmoe-cli expert streaming at equal caches (commit $commit)" \
    --append "$work/cap.md" > /dev/null

cpu=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: //')
family=$(grep -m1 '^cpu family' /proc/cpuinfo | sed 's/^[^:]*: //')
model=$(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | sed 's/^[^:]*: //')
python3 - "$work/resident.md" "$work/cap.md" "$commit" "$cpu" "$family" "$model" "$THREADS" "$N" > "$work/claims.md" <<'PY'
import datetime
import re
import sys

resident, cap, commit, cpu, family, model, threads, n = sys.argv[1:9]
res_md, cap_md = open(resident).read(), open(cap).read()


def rows(md):
    """The report table's rows as dicts by header."""
    lines = [l for l in md.splitlines() if l.startswith("| ")]
    head = [h.strip() for h in lines[0].strip("|").split("|")]
    out = []
    for l in lines[1:]:
        cells = [c.strip() for c in l.strip("|").split("|")]
        if cells[0] == "---" or len(cells) != len(head):
            continue
        out.append(dict(zip(head, cells)))
    return out


def medians(md):
    """{(ours, theirs): ratio} from the report's "Median decode ratio" line."""
    line = next(l for l in md.splitlines() if l.startswith("Median decode ratio"))
    return {(a, b): float(r) for a, b, r in re.findall(r"(sluice[^/;:]*?) / ([^;*]+?) \*\*([0-9.]+)\*\*", line)}


def span(vals, digits):
    vals = [float(v) for v in vals if v not in ("–", "")]
    if not vals:
        return "–"
    lo, hi = min(vals), max(vals)
    return f"{lo:.{digits}f}" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}" else f"{lo:.{digits}f}–{hi:.{digits}f}"


today = datetime.date.today().isoformat()
print("# Measured claims")
print()
print(f"Written by `bash scripts/claims.sh` on {today} at commit `{commit}`, on {cpu} (family {family}, "
      f"model {model}), {threads} threads, {n} tokens, the 18.56 GB Qwen3-30B-A3B-shaped Q4_K_M file "
      "(`sluice gen-model --like qwen3-30b-a3b --quant Q4_K_M`). These ratios are this CPU's at this "
      "commit; README quotes them from here. Each figure: the median over the rounds of sluice's decode "
      "rate over the reference's in the same round (time to first token: the range over the rounds).")
print()
print("| case | sluice decode tok/s | reference | reference decode tok/s | median ratio | sluice TTFT s | reference TTFT s |")
print("|---|---|---|---|---|---|---|")
r = rows(res_md)
m = medians(res_md)
ours = [x for x in r if x["engine"] == "sluice"]
for ref, name in (("bmoe-cli", "bmoe-cli 0.19 plain mode (llama.cpp v0.4.0 on mmap)"),
                  ("llama.cpp v0.4.0", "llama.cpp v0.4.0 as shipped (weights repacked)")):
    theirs = [x for x in r if x["engine"] == ref]
    print(f"| resident, file warm | {span([x['decode tok/s'] for x in ours], 2)} | {name} "
          f"| {span([x['decode tok/s'] for x in theirs], 2)} | **{m.get(('sluice', ref), float('nan')):.2f}** "
          f"| {span([x['TTFT s'] for x in ours], 2)} | {span([x['TTFT s'] for x in theirs], 2)} |")
r = rows(cap_md)
m = medians(cap_md)
for c in ("4000", "2000", "1500"):
    ours = [x for x in r if x["engine"] == f"sluice [cache {c}]"]
    theirs = [x for x in r if x["engine"] == f"bmoe-cli [cache {c}]"]
    ratio = m.get((f"sluice [cache {c}]", f"bmoe-cli [cache {c}]"), float("nan"))
    print(f"| 6 GiB cap, cache {c} MiB | {span([x['decode tok/s'] for x in ours], 2)} "
          f"| bmoe-cli 0.19 `--moe-stream --overlap --cache-mb {c}` | {span([x['decode tok/s'] for x in theirs], 2)} "
          f"| **{ratio:.2f}** | {span([x['TTFT s'] for x in ours], 1)} | {span([x['TTFT s'] for x in theirs], 1)} |")
print()
print("The two `sluice bench` reports in full (their commands, calibration, every run):")
print(res_md.replace("\n## ", "\n### "))
print(cap_md.replace("\n## ", "\n### "))
PY
mv "$work/claims.md" "$OUT"
echo "claims.sh: wrote $OUT" >&2
