#!/usr/bin/env bash
# Regenerates crates/transform/tests/fixtures/quantize_llama_sha256.tsv: the SHA-256 of the file
# llama.cpp's quantizer writes for each MoE fixture model (F32) and file type, which
# crates/transform/tests/quantize.rs compares `sluice quantize`'s output with.
#
# The quantizer is llama_model_quantize of llama.cpp release v0.4.0 (node-llama-cpp 3.21.1's
# prebuilt libraries, scripts/llamacpp-npm.sh), run by scripts/gen_moe_refs.cpp: default
# parameters, one thread, no importance matrix.
#
# It then builds sluice and checks that `sluice quantize` writes the same bytes for every
# line, and for the same file types on two synthetic dense llama models of 16 layers written
# here with gguf-py (grouped KV heads 4 and 1): the tiny MoE fixtures have at most 4 layers,
# too few for the rules that give the first eighth of the layers more bits. Those two models
# are not recorded (CI does not have them).
#
# Needs npm (Node 18+), git, g++, cargo, and the fixture models of
# scripts/fetch_moe_fixtures.sh (run first; its python has gguf-py and numpy).
# FILE_TYPES="NAME:ID ..." overrides the file types (default: every one sluice offers but
# MXFP4_MOE). LLAMACPP_DIR reuses an install directory of scripts/llamacpp-npm.sh.
#
# Usage (from anywhere): bash scripts/gen_quant_sha_refs.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FIX=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}
MODELS=$FIX/moe
OUT=$root/crates/transform/tests/fixtures/quantize_llama_sha256.tsv
ARCHS="qwen3moe qwen2moe olmoe mixtral gptoss glm4moe deepseek2 deepseek2-lite deepseek2-fused gemma4 qwen35moe"
FILE_TYPES=${FILE_TYPES:-"Q4_0:2 Q4_1:3 Q8_0:7 Q5_0:8 Q5_1:9 Q2_K:10 Q3_K_S:11 Q3_K_M:12 Q3_K_L:13 Q4_K_S:14 Q4_K_M:15 Q5_K_S:16 Q5_K_M:17 Q6_K:18 IQ4_NL:25 IQ3_S:26 IQ3_M:27 IQ4_XS:30 TQ1_0:36 TQ2_0:37"}
PY=python3
if [ -x "$FIX/venv-moe/bin/python3" ]; then PY=$FIX/venv-moe/bin/python3; fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=llamacpp-npm.sh
. "$root/scripts/llamacpp-npm.sh"
llamacpp_npm_install "${LLAMACPP_DIR:-$work/npm}"
# shellcheck disable=SC2086 # LLAMACPP_INC holds two -I flags
g++ -O2 -std=c++17 -Wall -Wextra -o "$work/gen_moe_refs" "$root/scripts/gen_moe_refs.cpp" $LLAMACPP_INC \
    "$LLAMACPP_LIB/libllama.v0.4.0.so" "$LLAMACPP_LIB/libggml.v0.4.0.so" "$LLAMACPP_LIB/libggml-base.so" \
    -Wl,-rpath,"$LLAMACPP_LIB"
(cd "$root" && cargo build --profile test --locked --quiet -p sluice)
sluice=$root/target/debug/sluice

# Two dense llama models of 16 layers (F32, random normal weights of a fixed seed).
"$PY" - "$work" <<'PYEOF'
import sys
import numpy as np
import gguf

out = sys.argv[1]
for kv in (1, 4):
    heads, n_embd, n_ff, n_layer, vocab = 4, 256, 512, 16, 320
    w = gguf.GGUFWriter(f"{out}/llama16-kv{kv}.gguf", "llama")
    w.add_name(f"llama16-kv{kv}")
    w.add_block_count(n_layer)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads // kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // heads)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    rng = np.random.default_rng(7 + kv)
    def t(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    t("token_embd.weight", vocab, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    t("output.weight", vocab, n_embd)
    kv_dim = n_embd // kv
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, np.float32))
        t(p + "attn_q.weight", n_embd, n_embd)
        t(p + "attn_k.weight", kv_dim, n_embd)
        t(p + "attn_v.weight", kv_dim, n_embd)
        t(p + "attn_output.weight", n_embd, n_embd)
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, np.float32))
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
PYEOF

same() {  # label, llama.cpp's file, sluice's file
    if ! cmp -s "$2" "$3"; then
        echo "ERROR: $1: sluice quantize differs from llama.cpp's quantizer" >&2
        exit 1
    fi
}
{
    echo "# SHA-256 of llama.cpp v0.4.0's llama_model_quantize output (node-llama-cpp 3.21.1,"
    echo "# default parameters, one thread, no importance matrix) for the F32 MoE fixture models"
    echo "# of scripts/fetch_moe_fixtures.sh. Written by scripts/gen_quant_sha_refs.sh."
    printf '# model\tmodel_sha256\tfile_type\tsha256\n'
} > "$work/out.tsv"
for a in $ARCHS; do
    in=$MODELS/$a-f32.gguf
    in_sha=$(sha256sum "$in" | cut -d' ' -f1)
    for ft in $FILE_TYPES; do
        name=${ft%%:*} id=${ft##*:}
        "$work/gen_moe_refs" quantize "$in" "$work/l.gguf" "$id" > "$work/log" 2>&1 || {
            cat "$work/log" >&2; exit 1; }
        "$sluice" quantize "$in" "$work/s.gguf" --type "$name" --quiet
        same "$a $name" "$work/l.gguf" "$work/s.gguf"
        printf '%s\t%s\t%s\t%s\n' "$a-f32.gguf" "$in_sha" "$name" "$(sha256sum "$work/l.gguf" | cut -d' ' -f1)" >> "$work/out.tsv"
    done
    echo "# $a: identical" >&2
done
for m in llama16-kv1 llama16-kv4; do
    for ft in $FILE_TYPES; do
        name=${ft%%:*} id=${ft##*:}
        "$work/gen_moe_refs" quantize "$work/$m.gguf" "$work/l.gguf" "$id" > "$work/log" 2>&1 || {
            cat "$work/log" >&2; exit 1; }
        "$sluice" quantize "$work/$m.gguf" "$work/s.gguf" --type "$name" --quiet
        same "$m $name" "$work/l.gguf" "$work/s.gguf"
    done
    echo "# $m: identical" >&2
done
mkdir -p "$(dirname "$OUT")"
cp "$work/out.tsv" "$OUT"
echo "wrote $OUT"
