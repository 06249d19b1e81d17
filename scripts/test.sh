#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test of the workspace.
# Needs only the Rust toolchain (cargo fetches the crates); fixtures are committed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
