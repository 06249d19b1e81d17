#!/usr/bin/env bash
# Regenerate crates/engine/tests/fixtures/ggml_ops_aarch64.json: the cases of ggml_ops.json
# (scripts/gen_engine_refs.c, the same inputs) computed by ggml's ARM CPU backend.
#
# llama.cpp release v0.4.0 is built from source for aarch64 with -march=armv8.2-a+dotprod+fp16
# (scripts/llamacpp-aarch64.sh) and the generator runs under qemu-aarch64 emulating a Cortex-A76
# (NEON, dotprod, FP16; no I8MM, no SVE), inside the Debian root of scripts/aarch64.sh. Needs
# root (or password-less sudo), npm and git; a few minutes the first time (the ggml build).
#
# Usage (from the repository root):
#     scripts/gen_engine_refs_aarch64.sh [OUT.json]   (OUT inside the checkout)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/crates/engine/tests/fixtures/ggml_ops_aarch64.json}
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
case "$out" in
    "$root"/*) rel=${out#"$root"/} ;;
    *) echo "error: $out is outside the checkout (the root sees only the checkout)" >&2; exit 2 ;;
esac

# shellcheck source=llamacpp-aarch64.sh
. "$root/scripts/llamacpp-aarch64.sh"
llamacpp_aarch64_build ggml
b=$LLAMACPP_AARCH64_BUILD/bin
inc="-I$LLAMACPP_AARCH64_SRC/ggml/include"
bash "$root/scripts/aarch64.sh" sh "
    set -e
    mkdir -p /llama-aarch64/refs
    aarch64-linux-gnu-gcc -O2 -std=c11 -Wall -Wextra -Wno-unused-function \
        -o /llama-aarch64/refs/gen_engine_refs /src/scripts/gen_engine_refs.c -I/src/scripts $inc \
        $b/libggml.so $b/libggml-cpu.so $b/libggml-base.so -Wl,-rpath,$b -lm
    qemu-aarch64 -cpu cortex-a76 /llama-aarch64/refs/gen_engine_refs /src/$rel
"
echo "wrote $out"
