#!/usr/bin/env bash
# Static throughput model of the decode kernels on CPUs we do not have: the hot loop of
# sluice's Q4_K and Q6_K multi-row AVX2 kernels and of llama.cpp v0.4.0's AVX2 vec_dot
# (node-llama-cpp's prebuilt "haswell" CPU backend, the one llama.cpp picks on AVX2 machines
# without AVX-512, such as first-generation Zen) through `llvm-mca` for several
# microarchitectures. Prints cycles per (row, 256-weight block) for each.
#
#   bash scripts/mca_kernels.sh [CPU ...]     # default: znver1 znver2 znver3 skylake icelake-server
#
# Needs llvm-mca (Debian's llvm-14 package), objdump, python3, npm and git (for the llama.cpp
# libraries, see llamacpp-npm.sh), and a release build of sluice (`cargo build --release`).
# The model knows nothing of memory: it answers "is the instruction schedule the bottleneck on
# that CPU", not "how fast is decode there".
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=llamacpp-npm.sh
. "$root/scripts/llamacpp-npm.sh"
MCA=$(command -v llvm-mca || command -v llvm-mca-14 || true)
[ -n "$MCA" ] || { echo "mca_kernels.sh: llvm-mca not found (apt-get install llvm-14)" >&2; exit 1; }
BIN="$root/target/release/sluice"
[ -x "$BIN" ] || { echo "mca_kernels.sh: $BIN not found (cargo build --release)" >&2; exit 1; }
npm_dir=${SLUICE_LLAMACPP_NPM:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/llamacpp-npm}
llamacpp_npm_install "$npm_dir"
GGML="$LLAMACPP_LIB/libggml-cpu-haswell.so"
[ -f "$GGML" ] || { echo "mca_kernels.sh: $GGML not found" >&2; exit 1; }
cpus=("$@")
[ ${#cpus[@]} -gt 0 ] || cpus=(znver1 znver2 znver3 skylake icelake-server)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The mangled name of a sluice function, from its demangled path.
mangled() {
    local addr
    addr=$(nm -C "$BIN" | awk -v f="$1" '$3 == f && !a { a = $1 } END { print a }')
    [ -n "$addr" ] || { echo "mca_kernels.sh: $1 not in $BIN" >&2; exit 1; }
    nm "$BIN" | awk -v a="$addr" '$1 == a && !m { m = $3 } END { print m }'
}

# The body of the largest loop of a function (its backward jump's range, jumps left out:
# llvm-mca repeats the block as if it were the loop).
loop_body() {
    objdump -d --no-show-raw-insn -M att "--disassemble=$2" "$1" | python3 -c '
import re, sys
ins = []
for line in sys.stdin:
    m = re.match(r"\s+([0-9a-f]+):\s+(.*)", line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2).split("#")[0].strip()))
loops = []
for at, text in ins:
    m = re.match(r"j\w+\s+([0-9a-f]+)\s*<", text)
    if m and int(m.group(1), 16) < at:
        loops.append((at - int(m.group(1), 16), int(m.group(1), 16), at))
if not loops:
    sys.exit("no loop found")
_, start, end = max(loops)
for at, text in ins:
    if start <= at < end and not text.startswith("j"):
        print(text)
'
}

# name, file, symbol, rows per loop iteration
kernels=(
    "sluice Q4_K|$BIN|$(mangled quant::kernels::kquants::x86_rows::q4k_rows)|8"
    "llama.cpp Q4_K|$GGML|ggml_vec_dot_q4_K_q8_K|1"
    "sluice Q6_K|$BIN|$(mangled quant::kernels::kquants::x86_rows::q6k_rows)|4"
    "llama.cpp Q6_K|$GGML|ggml_vec_dot_q6_K_q8_K|1"
)
i=0
for k in "${kernels[@]}"; do
    IFS='|' read -r _ file sym _ <<<"$k"
    loop_body "$file" "$sym" >"$tmp/$i.s"
    i=$((i + 1))
done

iters=200
printf '| CPU (llvm-mca -mcpu) |'
for k in "${kernels[@]}"; do printf ' %s |' "${k%%|*}"; done
printf '\n|---|'
for _ in "${kernels[@]}"; do printf -- '---:|'; done
printf '\n'
for cpu in "${cpus[@]}"; do
    printf '| %s |' "$cpu"
    i=0
    for k in "${kernels[@]}"; do
        rows=${k##*|}
        cycles=$("$MCA" -mcpu="$cpu" -iterations=$iters "$tmp/$i.s" 2>/dev/null |
            awk '/^Total Cycles:/ { print $3 }')
        awk -v c="$cycles" -v n=$iters -v r="$rows" 'BEGIN { printf " %.1f |", c / n / r }'
        i=$((i + 1))
    done
    printf '\n'
done
echo "# cycles per row and 256-weight block (lower is better), $(basename "$MCA") $("$MCA" --version | awk '/version/ && !v { v = $NF } END { print v }')"
