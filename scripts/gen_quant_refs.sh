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

VERSION=3.21.1
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/crates/quant/tests/fixtures/quant_ggml.gguf}
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cd "$work"
npm init -y >/dev/null
npm install --silent -E --ignore-scripts --omit=optional \
    "node-llama-cpp@$VERSION" "@node-llama-cpp/linux-x64@$VERSION" >/dev/null
git -c init.defaultBranch=main clone -q --no-checkout node_modules/node-llama-cpp/llama/gitRelease.bundle llama-src
git -C llama-src checkout -q HEAD -- ggml/include

lib=$work/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
cc -O2 -std=c11 -Wall -Wextra -o gen_quant_refs "$root/scripts/gen_quant_refs.c" \
    -Illama-src/ggml/include "$lib/libggml-base.so" -Wl,-rpath,"$lib"
./gen_quant_refs "$out"
echo "wrote $out"
