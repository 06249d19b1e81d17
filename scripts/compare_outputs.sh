#!/usr/bin/env bash
# Compares what two builds of sluice write on the generated MoE fixtures: standard output of
# `run` (inline and --progress, resident and streamed, serial and --overlap, with --chatml), the
# --csv file, the route/io/compute traces and a session's protocol lines. Measured figures
# (times, memory, CPU, latencies, lanes) are masked; everything else must be the same byte for
# byte. For refactors that must not change any output.
#
#   bash scripts/compare_outputs.sh OLD_BIN NEW_BIN        # exit 0 when every output matches
#
# Needs python3 and the MoE fixtures (scripts/fetch_moe_fixtures.sh); exits 2 before running
# anything when a fixture is missing or empty. Every run must succeed in both builds (a run that
# fails is a failure, shown with its stderr, even when both builds fail alike), but for the one
# refusal compared on purpose (`--chatml` on a model without a chat template), which both
# builds must refuse with the same message.
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: bash scripts/compare_outputs.sh OLD_BIN NEW_BIN" >&2
    exit 2
fi
old=$1
new=$2
for bin in "$old" "$new"; do
    if [ ! -x "$bin" ] || [ -d "$bin" ]; then
        echo "compare_outputs.sh: $bin is not an executable" >&2
        exit 2
    fi
done
moe=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}/moe
models=(qwen3moe-q4_k_m mixtral-q8_0 gptoss-mxfp4)
missing=()
for m in "${models[@]}"; do
    [ -s "$moe/$m.gguf" ] || missing+=("$moe/$m.gguf")
done
if [ ${#missing[@]} -gt 0 ]; then
    {
        echo "compare_outputs.sh: missing or empty fixture(s), nothing compared:"
        printf '    %s\n' "${missing[@]}"
        echo "Make them with: bash scripts/fetch_moe_fixtures.sh"
        echo "(it fills \$SLUICE_FIXTURES/moe, default \${XDG_CACHE_HOME:-\$HOME/.cache}/sluice/fixtures/moe)"
    } >&2
    exit 2
fi
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
# A run that failed: its exit status and the end of its stderr.
failed() { # name, build (old|new), exit status, stderr file
    echo "FAILED: $1: the $2 build exited with status $3; its stderr ends:"
    tail -n 20 "$4" | sed 's/^/    /'
    status=1
}

# Both builds' runs, one of which failed unless both succeeded (exit statuses in $rc_old,
# $rc_new, stderr in $tmp/$name.{old,new}.stderr): says so and returns 1.
both_ran() { # name
    local ok=0
    [ "$rc_old" = 0 ] || { failed "$1" old "$rc_old" "$tmp/$1.old.stderr"; ok=1; }
    [ "$rc_new" = 0 ] || { failed "$1" new "$rc_new" "$tmp/$1.new.stderr"; ok=1; }
    return "$ok"
}

check() { # name, file-old, file-new[, sort: rows in any order]
    local f
    for f in "$2" "$3"; do
        if [ ! -f "$f" ]; then
            echo "MISSING: $1: no $f"
            status=1
            return
        fi
    done
    if [ ! -s "$2" ] && [ ! -s "$3" ]; then
        echo "EMPTY: $1: both builds wrote nothing"
        status=1
        return
    fi
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

run_case() { # name, expect (ok|refused), args...
    local name=$1 expect=$2
    shift 2
    for which in old new; do
        local bin=$old
        [ "$which" = new ] && bin=$new
        local d="$tmp/$name.$which"
        mkdir -p "$d"
        local rc=0
        "$bin" run "$@" --csv "$d/csv" >"$d/stdout" 2>"$d/stderr" || rc=$?
        printf -v "rc_$which" %s "$rc"
        if [ "$expect" = refused ] && [ "$rc" != 0 ]; then
            # The refusal compared: its exit status and message.
            echo "exit $rc: $(grep 'error:' "$d/stderr" || true)" >>"$d/stdout"
            touch "$d/csv"
        fi
    done
    if [ "$expect" = refused ]; then
        if [ "$rc_old" = 0 ] || [ "$rc_new" = 0 ]; then
            echo "FAILED: $name: expected a refusal, the builds exited with $rc_old (old) and $rc_new (new)"
            status=1
            return
        fi
        check "$name refusal" "$tmp/$name.old/stdout" "$tmp/$name.new/stdout"
        return
    fi
    [ "$rc_old" = 0 ] || failed "$name" old "$rc_old" "$tmp/$name.old/stderr"
    [ "$rc_new" = 0 ] || failed "$name" new "$rc_new" "$tmp/$name.new/stderr"
    if [ "$rc_old" = 0 ] && [ "$rc_new" = 0 ]; then
        check "$name stdout" "$tmp/$name.old/stdout" "$tmp/$name.new/stdout"
        check "$name csv" "$tmp/$name.old/csv" "$tmp/$name.new/csv"
    fi
}

common=(-n 12 --temp 0 --seed 1 -t 2 --no-usage)
for m in "${models[@]}"; do
    f="$moe/$m.gguf"
    run_case "$m resident" ok -m "$f" -p "The experts" "${common[@]}"
    run_case "$m progress" ok -m "$f" -p "The experts" "${common[@]}" --progress
    run_case "$m streamed" ok -m "$f" -p "The experts" "${common[@]}" --moe-stream on --cache-mb 0
    run_case "$m overlap" ok -m "$f" -p "The experts" "${common[@]}" --moe-stream on --overlap \
        --cache-mb 2 --force-cache --progress
    # The mixtral fixture has no chat template: --chatml is refused, the same way by both.
    chatml=ok
    [ "$m" = mixtral-q8_0 ] && chatml=refused
    run_case "$m chatml" "$chatml" -m "$f" -p "Say hi" "${common[@]}" --chatml --progress
done

# The traces of one streamed run.
f="$moe/qwen3moe-q4_k_m.gguf"
for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    d="$tmp/traces.$which"
    mkdir -p "$d"
    rc=0
    "$bin" run -m "$f" -p "The experts" "${common[@]}" --moe-stream on --cache-mb 2 --force-cache \
        --route-trace "$d/route" --io-trace "$d/io" --compute-trace "$d/compute" \
        >/dev/null 2>"$tmp/traces.$which.stderr" || rc=$?
    printf -v "rc_$which" %s "$rc"
done
if both_ran traces; then
    check "trace route" "$tmp/traces.old/route" "$tmp/traces.new/route"
    check "trace compute" "$tmp/traces.old/compute" "$tmp/traces.new/compute"
    # (The lanes finish their reads in no fixed order.)
    check "trace io" "$tmp/traces.old/io" "$tmp/traces.new/io" sort
fi

# A session: two turns of one chat, a new chat, a refused request.
requests='{"cmd":"generate","id":1,"prompt":"Hello","n_predict":4}
{"cmd":"generate","id":2,"prompt":"More","n_predict":4,"clear_kv":false}
{"cmd":"generate","id":3,"prompt":"Again","n_predict":3}
{"cmd":"generate","id":4}
{"cmd":"close"}'
for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    rc=0
    printf '%s\n' "$requests" | "$bin" run -m "$f" --session --chatml "${common[@]}" \
        --csv "$tmp/session.$which.csv" >"$tmp/session.$which" 2>"$tmp/session.$which.stderr" ||
        rc=$?
    printf -v "rc_$which" %s "$rc"
done
if both_ran session; then
    check "session" "$tmp/session.old" "$tmp/session.new"
    check "session csv" "$tmp/session.old.csv" "$tmp/session.new.csv"
fi
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
    rc=0
    printf '%s\n' "$requests" | "$bin" run -m "$f" --session --decide --chatml "${common[@]}" \
        >"$tmp/decide.$which" 2>"$tmp/decide.$which.stderr" || rc=$?
    printf -v "rc_$which" %s "$rc"
done
if both_ran decide; then
    check "decide" "$tmp/decide.old" "$tmp/decide.new"
fi

# Perplexity, as one prefill and one token per pass, streamed.
printf 'The experts of a mixture are chosen per token by a router.\n' >"$tmp/ppl.txt"
ppl=(-m "$f" --ppl "$tmp/ppl.txt" --moe-stream on --cache-mb 2 --force-cache --no-usage --seed 1)
run_case "ppl prefill" ok "${ppl[@]}"
run_case "ppl step" ok "${ppl[@]}" --ppl-step
if [ "$status" = 0 ]; then
    echo "every output matches"
else
    echo "compare_outputs.sh: some outputs differ or some runs failed (above)" >&2
fi
exit "$status"
