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
# shellcheck source=llamacpp-aarch64.sh
. "$root/scripts/llamacpp-aarch64.sh"
llamacpp_aarch64_generate gen_cpu_refs "${1:-$root/crates/quant/tests/fixtures/cpu_ggml_aarch64.gguf}"
