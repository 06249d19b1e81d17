#!/usr/bin/env bash
# Decode speed of two builds of sluice side by side in one run, for changes that must not
# change speed: each round runs both builds on the same model and arguments, alternating which
# goes first (A B, B A, ...), and reads each run's `generation:` line (decode tok/s, the
# engine's own timing). Prints every run, each build's median and the median ratio NEW/OLD.
#
#   bash scripts/ab_decode.sh OLD_BIN NEW_BIN ROUNDS -- run ARGS...
#   bash scripts/ab_decode.sh old/sluice target/release/sluice 5 -- -m model.gguf -n 32 --temp 0
#
# The page cache is left as it is (run one warm-up of each first for resident cases).
set -euo pipefail
[ $# -ge 4 ] && [ "$4" = -- ] || {
    echo "usage: $0 OLD_BIN NEW_BIN ROUNDS -- RUN_ARGS..." >&2
    exit 2
}
old=$1
new=$2
rounds=$3
shift 4
tps() { # bin, args... -> decode tok/s of one run
    local bin=$1
    shift
    "$bin" run "$@" 2>/dev/null | sed -n 's/^generation: .*(\([0-9.]*\) tok\/s).*/\1/p'
}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "args: $*"
olds=()
news=()
for ((r = 1; r <= rounds; r++)); do
    if ((r % 2)); then
        a=$(tps "$old" "$@")
        b=$(tps "$new" "$@")
    else
        b=$(tps "$new" "$@")
        a=$(tps "$old" "$@")
    fi
    [ -n "$a" ] && [ -n "$b" ] || {
        echo "round $r: a run printed no generation: line" >&2
        exit 1
    }
    echo "round $r: old $a tok/s, new $b tok/s"
    olds+=("$a")
    news+=("$b")
done
python3 - "${olds[*]}" "${news[*]}" <<'PY'
import statistics, sys
o = [float(x) for x in sys.argv[1].split()]
n = [float(x) for x in sys.argv[2].split()]
ratios = [b / a for a, b in zip(o, n)]
print(f"median: old {statistics.median(o):.3f} tok/s, new {statistics.median(n):.3f} tok/s, "
      f"new/old {statistics.median(ratios):.3f} (per-round ratios "
      + ", ".join(f"{r:.3f}" for r in ratios) + ")")
PY
