#!/usr/bin/env bash
# Writes the tiny mixture-of-experts test models (scripts/gen_moe_fixtures.py: qwen3moe,
# qwen2moe, olmoe, Mixtral-layout llama and glm4moe, each in F32, BF16, Q8_0, Q4_0 and Q4_1;
# deepseek2 in F32, BF16, Q8_0 and Q4_0, deepseek2-lite in F32, Q8_0 and Q4_0, deepseek2-fused
# (fused gate_up experts), qwen35moe (Qwen3.5/3.6's hybrid of linear and full attention),
# qwen3vlmoe (Qwen3-VL-MoE's text model), granitemoe (Granite 3.x MoE), minimax (MiniMax-M2's
# layout), smallthinker (SmallThinker's), bailingmoe2 (Ling 2.0), qwen3next (Qwen3-Next's
# hybrid stack), llama4 (Llama 4's layout), lfm2moe (LFM2-8B-A1B's short convolutions and
# attention) and nemotron_h_moe (Nemotron 3's Mamba-2, MoE and attention layers) in F32 and
# Q8_0; all of these then in Q4_K_M quantized from the F32 model by `sluice quantize`;
# qwen3next-legacy (qwen3next's first-converter layout) in F32 and Q8_0; glm4moe-grouped,
# gemma4 and nemotron_h_moe-latent (Nemotron 3 Super's latent experts) in F32 and Q8_0;
# qwen3moe-ternary (qwen3moe's model) in TQ1_0 and TQ2_0;
# gptoss in F32, BF16, Q8_0 and MXFP4) into $SLUICE_FIXTURES/moe (default ${XDG_CACHE_HOME:-~/.cache}/sluice/fixtures/moe),
# where the tests look for them. The models are not committed: they are regenerated here, byte
# for byte, from fixed seeds and the real vocabularies and chat templates that
# scripts/fetch_text_fixtures.sh fetches (run first). The reference logits in
# crates/engine/tests/fixtures/moe/refs record each model's SHA-256, so a generator that wrote
# different bytes is caught by the tests; the Q4_K_M models are checked against them here.
#
# Exact bytes need exactly gguf 0.19.0 and numpy 2.4.6: where python3 does not have those, a
# private venv next to the data gets them from PyPI. The Q4_K_M step builds sluice with cargo
# (the `test` profile, so `cargo test` reuses the build).
# Idempotent: a finished run leaves moe/STAMP (naming the generator's hash); later runs return
# at once unless the generator or this script changed.
#
# SLUICE_MOE_NO_REF_CHECK=1 skips comparing the Q4_K_M models with the SHA-256 recorded in the
# references (scripts/gen_moe_refs.sh sets it: it regenerates the references and checks the
# Q4_K_M models against llama.cpp's quantizer instead).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FIX=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}
OUT=$FIX/moe
GEN=$root/scripts/gen_moe_fixtures.py
GGUF_VERSION=0.19.0
NUMPY_VERSION=2.4.6
REFS=$root/crates/engine/tests/fixtures/moe/refs
# The models that also get a Q4_K_M version (not gptoss, not glm4moe-grouped).
ARCHS="qwen3moe qwen2moe olmoe mixtral glm4moe deepseek2 deepseek2-lite deepseek2-fused qwen35moe qwen3vlmoe granitemoe minimax smallthinker bailingmoe2 qwen3next llama4 lfm2moe nemotron_h_moe"
# the generator's and this script's hashes (its ARCHS decide which Q4_K_M models exist)
STAMP_VERSION="moe-fixtures v3 $(cat "$GEN" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"

# The models gguf-py cannot write (qwen3moe-iq-mix: the i-quants, made by llama.cpp's quantizer
# in scripts/gen_moe_refs.sh) are committed and copied in as they are.
mkdir -p "$OUT"
for m in "$root"/crates/engine/tests/fixtures/moe/models/*.gguf; do
    [ -f "$m" ] || continue
    cmp -s "$m" "$OUT/$(basename "$m")" || cp "$m" "$OUT/"
done

if [ -f "$OUT/STAMP" ] && [ "$(cat "$OUT/STAMP")" = "$STAMP_VERSION" ]; then
    exit 0
fi

bash "$root/scripts/fetch_text_fixtures.sh"

pinned() {
    "$1" - "$GGUF_VERSION" "$NUMPY_VERSION" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(0 if (version("gguf"), version("numpy")) == (sys.argv[1], sys.argv[2]) else 1)
PY
}

PY=python3
if ! pinned python3; then
    VENV=$FIX/venv-moe
    if [ ! -x "$VENV/bin/python3" ] || ! pinned "$VENV/bin/python3"; then
        echo "# installing gguf $GGUF_VERSION and numpy $NUMPY_VERSION into $VENV" >&2
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install -q "gguf==$GGUF_VERSION" "numpy==$NUMPY_VERSION"
    fi
    PY=$VENV/bin/python3
fi

mkdir -p "$OUT"
rm -f "$OUT/STAMP"
"$PY" "$GEN" "$FIX/text/vocab" "$FIX/text/templates" "$OUT"

# Q4_K_M: sluice's quantizer, which writes what llama.cpp v0.4.0's llama_model_quantize writes
# (docs/quantize.md). The result must have the SHA-256 its reference records.
for a in $ARCHS; do
    m=$OUT/$a-q4_k_m.gguf
    (cd "$root" && cargo run --profile test --locked --quiet -p sluice -- \
        quantize "$OUT/$a-f32.gguf" "$m" --type Q4_K_M --quiet)
    [ "${SLUICE_MOE_NO_REF_CHECK:-0}" = 1 ] && continue
    want=$("$PY" - "$REFS/$a-q4_k_m.gguf" <<'PY'
import sys
import gguf
f = gguf.GGUFReader(sys.argv[1]).fields["sluice.ref.model_sha256"]
print(bytes(f.parts[f.data[0]]).decode())
PY
)
    got=$(sha256sum "$m" | cut -d' ' -f1)
    if [ "$got" != "$want" ]; then
        rm -f "$m"
        echo "ERROR: sluice quantize wrote $a-q4_k_m.gguf with SHA-256 $got, but" >&2
        echo "       $REFS/$a-q4_k_m.gguf records $want (llama.cpp's quantizer)" >&2
        exit 1
    fi
done
echo "$STAMP_VERSION" > "$OUT/STAMP"
echo "# moe fixtures ready in $OUT" >&2
