#!/usr/bin/env bash
# Regenerate crates/sampler/tests/fixtures/sampler_refs.json: tokens drawn by llama.cpp's
# default sampler chain and candidate orders left by its single stages
# (scripts/gen_sampler_refs.c), for crates/sampler/tests/llamacpp_refs.rs.
#
# Needs: npm (Node 18+), git and a C compiler. libllama comes prebuilt from the npm package
# node-llama-cpp 3.21.1 (llama.cpp release v0.4.0, linux-x64, built with GCC 11 on Ubuntu
# 22.04), see scripts/llamacpp-npm.sh; the sampler code is in libllama, not in the CPU
# backends, so the result does not depend on the CPU features.
#
# Usage (from anywhere):
#     scripts/gen_sampler_refs.sh [DIR]
# DIR: an existing install directory of the npm package to reuse (default: a temporary
# directory, downloading about 80 MB).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/crates/sampler/tests/fixtures/sampler_refs.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
npm_dir=${1:-$work/npm}

# shellcheck source=llamacpp-npm.sh
. "$root/scripts/llamacpp-npm.sh"
llamacpp_npm_install "$npm_dir"
# shellcheck disable=SC2086 # LLAMACPP_INC holds two -I flags
cc -O2 -std=c11 -Wall -Wextra -o "$work/gen_sampler_refs" "$root/scripts/gen_sampler_refs.c" \
    $LLAMACPP_INC "$LLAMACPP_LIB/libllama.v0.4.0.so" "$LLAMACPP_LIB/libggml.v0.4.0.so" \
    "$LLAMACPP_LIB/libggml-base.so" -Wl,-rpath,"$LLAMACPP_LIB"
"$work/gen_sampler_refs" > "$work/out.json"
mkdir -p "$(dirname "$out")"
mv "$work/out.json" "$out"
echo "wrote $out"
