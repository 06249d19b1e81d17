#!/usr/bin/env bash
# Compares what two builds of sluice write on the generated MoE fixtures: standard output of
# `run` (inline and --progress, resident and streamed, serial and --overlap, with --chatml), the
# --csv file, the route/io/compute traces and a session's protocol lines. Measured figures
# (times, memory, CPU, latencies, lanes) are masked; everything else must be the same byte for
# byte. For refactors that must not change any output.
#
#   bash scripts/compare_outputs.sh OLD_BIN NEW_BIN        # exit 0 when every output matches
#
# Needs python3 and the MoE fixtures (scripts/fetch_moe_fixtures.sh).
set -euo pipefail
old=$1
new=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
moe=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}/moe
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mask() {
    python3 - "$1" <<'PY'
import re, sys, json
noisy = re.compile(r"(_ns|_ms|_s|ms|cpu|majflt|rss|swap|mem_|latency|lane|seq|wall|_pct|frac|tok_s|mib_s|occupancy|stall|mgmt|io|compute|gap|overhead|tps)", re.I)
def mask_json(v, key=""):
    if isinstance(v, dict):
        return {k: mask_json(x, k) for k, x in v.items()}
    if isinstance(v, list):
        return [mask_json(x, key) for x in v]
    if isinstance(v, (int, float)) and not isinstance(v, bool) and noisy.search(key):
        return "N"
    return v
def measured(line):
    """A text line with its measurements (decimals, rates) masked."""
    return re.sub(r"\d+ MiB/s", "N MiB/s", re.sub(r"\d+\.\d+", "F", line))
header = None
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    line = line.rstrip("\n")
    m = re.match(r"^(BMOE_[A-Z]+) (\{.*\})$", line)
    if m:
        print(m.group(1), json.dumps(mask_json(json.loads(m.group(2))), sort_keys=True))
        continue
    if line.startswith("#") or ":" in line and "," not in line:
        # Comment/preamble and summary lines: every decimal number is a measurement.
        print(measured(line))
        continue
    cells = line.split(",")
    if header is None and len(cells) > 3 and all(re.match(r"^[a-z_0-9]+$", c) for c in cells):
        header = cells
        print(line)
        continue
    if header and len(cells) == len(header):
        print(",".join("N" if noisy.search(h) else c for h, c in zip(header, cells)))
        continue
    print(measured(line))
PY
}

status=0
check() { # name, file-old, file-new[, sort: rows in any order]
    mask "$2" >"$2.m"
    mask "$3" >"$3.m"
    if [ "${4:-}" = sort ]; then
        sort -o "$2.m" "$2.m"
        sort -o "$3.m" "$3.m"
    fi
    if diff -q "$2.m" "$3.m" >/dev/null; then
        echo "same: $1"
    else
        echo "DIFFERENT: $1"
        { diff "$2.m" "$3.m" || true; } | head -20
        status=1
    fi
}

run_case() { # name, args...
    local name=$1
    shift
    for which in old new; do
        local bin=$old
        [ "$which" = new ] && bin=$new
        local d="$tmp/$name.$which"
        mkdir -p "$d"
        # A refusal must be the same refusal: its exit status and message are compared.
        local rc=0
        "$bin" run "$@" --csv "$d/csv" >"$d/stdout" 2>"$d/stderr" || rc=$?
        if [ "$rc" != 0 ]; then
            echo "exit $rc: $(grep 'error:' "$d/stderr")" >>"$d/stdout"
            touch "$d/csv"
        fi
    done
    check "$name stdout" "$tmp/$name.old/stdout" "$tmp/$name.new/stdout"
    check "$name csv" "$tmp/$name.old/csv" "$tmp/$name.new/csv"
}

common=(-n 12 --temp 0 --seed 1 -t 2 --no-usage)
for m in qwen3moe-q4_k_m mixtral-q8_0 gptoss-mxfp4; do
    f="$moe/$m.gguf"
    run_case "$m resident" -m "$f" -p "The experts" "${common[@]}"
    run_case "$m progress" -m "$f" -p "The experts" "${common[@]}" --progress
    run_case "$m streamed" -m "$f" -p "The experts" "${common[@]}" --moe-stream on --cache-mb 0
    run_case "$m overlap" -m "$f" -p "The experts" "${common[@]}" --moe-stream on --overlap \
        --cache-mb 2 --force-cache --progress
    run_case "$m chatml" -m "$f" -p "Say hi" "${common[@]}" --chatml --progress
done

# The traces of one streamed run.
f="$moe/qwen3moe-q4_k_m.gguf"
for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    d="$tmp/traces.$which"
    mkdir -p "$d"
    "$bin" run -m "$f" -p "The experts" "${common[@]}" --moe-stream on --cache-mb 2 --force-cache \
        --route-trace "$d/route" --io-trace "$d/io" --compute-trace "$d/compute" >/dev/null 2>&1
done
check "trace route" "$tmp/traces.old/route" "$tmp/traces.new/route"
check "trace compute" "$tmp/traces.old/compute" "$tmp/traces.new/compute"
# (The lanes finish their reads in no fixed order.)
check "trace io" "$tmp/traces.old/io" "$tmp/traces.new/io" sort

# A session: two turns of one chat, a new chat, a refused request.
requests='{"cmd":"generate","id":1,"prompt":"Hello","n_predict":4}
{"cmd":"generate","id":2,"prompt":"More","n_predict":4,"clear_kv":false}
{"cmd":"generate","id":3,"prompt":"Again","n_predict":3}
{"cmd":"generate","id":4}
{"cmd":"close"}'
for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    printf '%s\n' "$requests" | "$bin" run -m "$f" --session --chatml "${common[@]}" \
        --csv "$tmp/session.$which.csv" >"$tmp/session.$which" 2>/dev/null
done
check "session" "$tmp/session.old" "$tmp/session.new"
check "session csv" "$tmp/session.old.csv" "$tmp/session.new.csv"
# Decisions: a fresh prefix, the same prefix again (restored), a chat turn between, a refusal.
requests='{"cmd":"decide","id":1,"prefix":"Pick one: ","suffix":"A or B?","choices":["A","B"]}
{"cmd":"decide","id":2,"prefix":"Pick one: ","suffix":"yes or no?","choices":["yes","no"]}
{"cmd":"generate","id":3,"prompt":"Hello","n_predict":3}
{"cmd":"decide","id":4,"prefix":"Pick one: ","suffix":"A or B?","choices":["A","A"]}
{"cmd":"decide","id":5,"prefix":"Pick one: ","suffix":"A or B?","choices":["A","B"],"reuse_prefix":false}
{"cmd":"close"}'
for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    printf '%s\n' "$requests" | "$bin" run -m "$f" --session --decide --chatml "${common[@]}" \
        >"$tmp/decide.$which" 2>/dev/null
done
check "decide" "$tmp/decide.old" "$tmp/decide.new"

# Perplexity, as one prefill and one token per pass, streamed.
printf 'The experts of a mixture are chosen per token by a router.\n' >"$tmp/ppl.txt"
ppl=(-m "$f" --ppl "$tmp/ppl.txt" --moe-stream on --cache-mb 2 --force-cache --no-usage --seed 1)
run_case "ppl prefill" "${ppl[@]}"
run_case "ppl step" "${ppl[@]}" --ppl-step
[ "$status" = 0 ] && echo "every output matches"
exit "$status"
