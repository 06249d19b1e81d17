#!/usr/bin/env bash
# Regenerate crates/quant/tests/fixtures/cpu_ggml.gguf: activation quantization and dot
# products computed by ggml's x86 CPU backend (scripts/gen_cpu_refs.c).
#
# Needs: npm (Node 18+), git, a C compiler, and an x86-64 CPU with AVX2, FMA and F16C.
# Takes about a minute; downloads about 80 MB. ggml comes prebuilt from the npm package
# node-llama-cpp 3.21.1 (llama.cpp release v0.4.0, linux-x64 binaries built on Ubuntu
# 22.04); the matching headers come from the llama.cpp source bundle in the same package.
#
# The package ships one CPU backend library per x86 feature level and normally loads the
# best one the CPU supports. This script links the "haswell" variant explicitly
# (SSE4.2, AVX, F16C, FMA, AVX2, BMI2; no AVX-512), the feature level the project's AVX2
# kernels target, so the reference does not depend on the generating machine.
#
# Usage (from the repository root):
#     scripts/gen_cpu_refs.sh [OUT.gguf]
set -euo pipefail

VARIANT=haswell
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/crates/quant/tests/fixtures/cpu_ggml.gguf}
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# shellcheck source=llamacpp-npm.sh
. "$root/scripts/llamacpp-npm.sh"
llamacpp_npm_install "$work"
cd "$work"
# shellcheck disable=SC2086 # LLAMACPP_INC holds two -I flags
cc -O2 -std=c11 -Wall -Wextra -o gen_cpu_refs "$root/scripts/gen_cpu_refs.c" $LLAMACPP_INC \
    "$LLAMACPP_LIB/libggml-cpu-$VARIANT.so" "$LLAMACPP_LIB/libggml-base.so" -Wl,-rpath,"$LLAMACPP_LIB"
./gen_cpu_refs "$out"
echo "wrote $out"
