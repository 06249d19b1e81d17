#!/usr/bin/env bash
# Regenerate crates/engine/tests/fixtures/ggml_ops.json: RoPE/YaRN, softmax, SiLU, SwiGLU, GELU, GEGLU,
# sigmoid, RMS norm and non-flash attention computed by ggml's x86 CPU backend (scripts/gen_engine_refs.c).
#
# Needs: npm (Node 18+), git, a C compiler, and an x86-64 CPU with AVX2, FMA and F16C.
# ggml comes prebuilt from the npm package node-llama-cpp 3.21.1 (llama.cpp release v0.4.0);
# the "haswell" CPU backend variant is linked explicitly, as in scripts/gen_cpu_refs.sh.
#
# Usage (from the repository root):
#     scripts/gen_engine_refs.sh [OUT.json]
# Set LLAMACPP_WORK=DIR to install into (or reuse) DIR instead of a temporary directory.
set -euo pipefail

VARIANT=haswell
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/crates/engine/tests/fixtures/ggml_ops.json}
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
if [ -n "${LLAMACPP_WORK:-}" ]; then
    work=$LLAMACPP_WORK # reuse an existing install
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi

# shellcheck source=llamacpp-npm.sh
. "$root/scripts/llamacpp-npm.sh"
llamacpp_npm_install "$work"
cd "$work"
# shellcheck disable=SC2086 # LLAMACPP_INC holds two -I flags
cc -O2 -std=c11 -Wall -Wextra -Wno-unused-function -o gen_engine_refs "$root/scripts/gen_engine_refs.c" -I"$root/scripts" \
    $LLAMACPP_INC "$LLAMACPP_LIB/libggml-cpu-$VARIANT.so" "$LLAMACPP_LIB/libggml-base.so" \
    -Wl,-rpath,"$LLAMACPP_LIB" -lm
./gen_engine_refs "$out"
echo "wrote $out"
