#!/usr/bin/env bash
# Regenerate crates/quant/tests/fixtures/cpu_ggml_aarch64.gguf: activation quantization and dot
# products computed by ggml's ARM CPU backend (scripts/gen_cpu_refs.c, the generator of the x86
# fixture, built for aarch64).
#
# llama.cpp release v0.4.0 is built from source for aarch64 with -march=armv8.2-a+dotprod+fp16
# (scripts/llamacpp-aarch64.sh) and the generator runs under qemu-aarch64 emulating a Cortex-A76
# (NEON, dotprod, FP16; no I8MM, no SVE), inside the Debian root of scripts/aarch64.sh. Needs
# root (or password-less sudo), npm and git; about two minutes the first time.
#
# Usage (from the repository root):
#     scripts/gen_cpu_refs_aarch64.sh [OUT.gguf]   (OUT inside the checkout)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/crates/quant/tests/fixtures/cpu_ggml_aarch64.gguf}
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
    aarch64-linux-gnu-gcc -O2 -std=c11 -Wall -Wextra -o /llama-aarch64/refs/gen_cpu_refs \
        /src/scripts/gen_cpu_refs.c $inc $b/libggml.so $b/libggml-cpu.so $b/libggml-base.so -Wl,-rpath,$b
    qemu-aarch64 /llama-aarch64/refs/gen_cpu_refs /src/$rel
"
echo "wrote $out"
