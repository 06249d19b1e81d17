#!/usr/bin/env bash
# Makes the MoEfied real models (docs/moefy.md) into $SLUICE_FIXTURES/models (default
# ${XDG_CACHE_HOME:-~/.cache}/sluice/fixtures/models, outside the checkout), with `sluice moefy`
# on its defaults (built-in calibration text: Moby-Dick ch. 1-2, 2048 tokens; activation
# grouping; seed 0), from the dense models of scripts/fetch_real_models.sh. Idempotent: a file
# that exists is kept (delete it to remake it; the file depends only on the dense model, the
# flags and sluice's code, never on the thread count).
#
#   SmolLM2-135M-Instruct-moefied-16x12.gguf   16 experts, top-12 (the demo's model)
#   SmolLM2-135M-Instruct-moefied-16x16.gguf   16 experts, top-16: K = E, the dense model's output
#   qwen2.5-coder-1.5b-moefied-64x16.gguf      64 experts, top-16 (qwen2moe; only with the
#                                              argument `qwen2.5-coder`: larger, for benchmarks)
#
# Arguments name the sets to make (smollm2, qwen2.5-coder); none: smollm2.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODELS=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}/models
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(smollm2)
for s in "${sets[@]}"; do
    case $s in
        smollm2|qwen2.5-coder) ;;
        *) echo "unknown set '$s' (smollm2, qwen2.5-coder)" >&2; exit 2 ;;
    esac
done
bash "$root/scripts/fetch_real_models.sh" "${sets[@]}"
cargo build --release --quiet --manifest-path "$root/Cargo.toml"
sluice=$root/target/release/sluice

make() { # DENSE OUT E K
    if [ ! -f "$2" ]; then
        echo "# moefying $(basename "$1") into $3 experts, top-$4 -> $2" >&2
        "$sluice" moefy "$1" --experts "$3" --top-k "$4" --out "$2" --quiet
    fi
}
for s in "${sets[@]}"; do
    case $s in
        smollm2)
            dense=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
            make "$dense" "$MODELS/SmolLM2-135M-Instruct-moefied-16x12.gguf" 16 12
            make "$dense" "$MODELS/SmolLM2-135M-Instruct-moefied-16x16.gguf" 16 16
            ;;
        qwen2.5-coder)
            make "$MODELS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" \
                "$MODELS/qwen2.5-coder-1.5b-moefied-64x16.gguf" 64 16
            ;;
    esac
done
