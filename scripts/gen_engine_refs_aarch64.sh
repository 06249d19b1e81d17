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
# shellcheck source=llamacpp-aarch64.sh
. "$root/scripts/llamacpp-aarch64.sh"
llamacpp_aarch64_generate gen_engine_refs "${1:-$root/crates/engine/tests/fixtures/ggml_ops_aarch64.json}" -Wno-unused-function
