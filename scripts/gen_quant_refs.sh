#!/usr/bin/env bash
# Regenerate crates/quant/tests/fixtures/quant_ggml.gguf: reference (de)quantization data
# computed by ggml itself (scripts/gen_quant_refs.c).
#
# Needs: npm (Node 18+), git, a C compiler. Takes about a minute; downloads about 80 MB.
# ggml comes prebuilt from the npm package node-llama-cpp 3.21.1 (llama.cpp release
# v0.4.0, linux-x64 binaries built on Ubuntu 22.04); the matching headers come from the
# llama.cpp source bundle shipped in the same package.
#
# Usage (from the repository root):
#     scripts/gen_quant_refs.sh [OUT.gguf]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/crates/quant/tests/fixtures/quant_ggml.gguf}
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# shellcheck source=llamacpp-npm.sh
. "$root/scripts/llamacpp-npm.sh"
llamacpp_npm_install "$work"
cd "$work"
# shellcheck disable=SC2086 # LLAMACPP_INC holds two -I flags
cc -O2 -std=c11 -Wall -Wextra -o gen_quant_refs "$root/scripts/gen_quant_refs.c" $LLAMACPP_INC \
    "$LLAMACPP_LIB/libggml-base.so" -Wl,-rpath,"$LLAMACPP_LIB"
./gen_quant_refs "$out"
echo "wrote $out"
