#!/usr/bin/env bash
# Builds scripts/bench_llamacpp.cpp against llama.cpp v0.4.0 as npm ships it (node-llama-cpp
# 3.21.1's prebuilt linux-x64 libraries, scripts/llamacpp-npm.sh), outside the checkout: the
# "llama.cpp as shipped" reference of `sluice bench --with-llama` (its default settings: memory
# map, weights repacked where the CPU backend repacks them, the best CPU library for this CPU).
# Once per machine (downloads about 80 MB, compiles in seconds); later calls print the path at
# once.
#
#   bash scripts/build_bench_llamacpp.sh      # prints the path of bench_llamacpp on stdout
#
# Installs into ${SLUICE_LLAMACPP_NPM:-${XDG_CACHE_HOME:-~/.cache}/sluice/llamacpp-npm}:
#   bench_llamacpp  the program (its run path names the libraries' directory)
#   cpu/            every CPU backend library (libggml-cpu-<level>.so), for GGML_BACKEND_DIR
# Needs npm (Node 18+), git and g++.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${SLUICE_LLAMACPP_NPM:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/llamacpp-npm}
BIN="$DIR/bench_llamacpp"
if [ -x "$BIN" ] && [ "$BIN" -nt "$root/scripts/bench_llamacpp.cpp" ] && [ -d "$DIR/cpu" ]; then
    echo "$BIN"
    exit 0
fi
# shellcheck source=llamacpp-npm.sh
. "$root/scripts/llamacpp-npm.sh"
llamacpp_npm_install "$DIR"
# shellcheck disable=SC2086 # LLAMACPP_INC holds two -I flags
g++ -O2 -std=c++17 -Wall -Wextra -o "$BIN.tmp" "$root/scripts/bench_llamacpp.cpp" $LLAMACPP_INC \
    "$LLAMACPP_LIB/libllama.v0.4.0.so" "$LLAMACPP_LIB/libggml.v0.4.0.so" "$LLAMACPP_LIB/libggml-base.so" \
    -Wl,-rpath,"$LLAMACPP_LIB"
rm -rf "$DIR/cpu.tmp"
mkdir -p "$DIR/cpu.tmp"
cp "$LLAMACPP_LIB"/libggml-cpu-*.so "$DIR/cpu.tmp/"
rm -rf "$DIR/cpu"
mv "$DIR/cpu.tmp" "$DIR/cpu"
mv "$BIN.tmp" "$BIN"
echo "$BIN"
