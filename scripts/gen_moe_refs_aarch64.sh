#!/usr/bin/env bash
# Regenerates the aarch64 references of the MoE forward-pass fixtures
# (crates/engine/tests/fixtures/moe/refs-aarch64/*.gguf): what llama.cpp's ARM CPU backend
# computes for the models and prompts of the x86 references (refs/*.gguf).
#
# llama.cpp release v0.4.0 is built from source for aarch64 (-march=armv8.2-a+dotprod+fp16,
# scripts/llamacpp-aarch64.sh) and scripts/gen_moe_refs.cpp, the generator of the x86 references,
# runs under qemu-aarch64 as a Cortex-A76 inside the Debian root of scripts/aarch64.sh. For every
# x86 reference it is given the same model, the same prompt texts and the same micro-batch, and
# writes the logits of every prompt position, 32 greedy tokens and their margins in the x86
# references' format (crates/engine/tests/fixtures/moe/README.md), plus
# `sluice.ref.greedy_as_x86` per prompt: the number of leading greedy tokens equal to the x86
# reference's.
#
# Needs root (or password-less sudo), npm, git and the models of scripts/fetch_moe_fixtures.sh
# (with its python venv for gguf-py). About 25 minutes (qemu is slow; the models are tiny).
# ONLY="a b" regenerates those model files alone (names as in refs/, without .gguf).
#
# Usage (from the repository root): bash scripts/gen_moe_refs_aarch64.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FIX=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}
MODELS=$FIX/moe
REFS=$root/crates/engine/tests/fixtures/moe/refs
OUT=$root/crates/engine/tests/fixtures/moe/refs-aarch64
DIR=${SLUICE_AARCH64:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/aarch64}
N_GEN=32

bash "$root/scripts/fetch_moe_fixtures.sh"
PY=python3
if [ -x "$FIX/venv-moe/bin/python3" ]; then PY=$FIX/venv-moe/bin/python3; fi

# shellcheck source=llamacpp-aarch64.sh
. "$root/scripts/llamacpp-aarch64.sh"
llamacpp_aarch64_build llama
b=$LLAMACPP_AARCH64_BUILD/bin
work=/llama-aarch64/moe-refs # inside the root
host_work=$DIR/root$work
rm -rf "$host_work"
mkdir -p "$host_work" "$OUT"
bash "$root/scripts/aarch64.sh" sh "
    set -e
    aarch64-linux-gnu-g++ -O2 -std=c++17 -Wall -Wextra -o $work/gen_moe_refs \
        /src/scripts/gen_moe_refs.cpp -I$LLAMACPP_AARCH64_SRC/include \
        -I$LLAMACPP_AARCH64_SRC/ggml/include $b/libllama.so $b/libggml.so $b/libggml-base.so \
        -Wl,-rpath,$b
"

for ref in "$REFS"/*.gguf; do
    m=$(basename "$ref" .gguf)
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $m "* ]]; then
        continue
    fi
    # the model, micro-batch and prompt texts of the x86 reference
    mapfile -t spec < <("$PY" - "$ref" <<'PY'
import sys
import gguf
r = gguf.GGUFReader(sys.argv[1])
def val(k):
    f = r.fields.get(k)
    return None if f is None else f.contents()
print(val("sluice.ref.model"))
print(val("sluice.ref.n_ubatch") or 0)
for i in range(val("sluice.ref.n_prompts")):
    print(val(f"sluice.ref.p{i}.text"))
PY
)
    model=${spec[0]}
    ub=${spec[1]}
    args=""
    for p in "${spec[@]:2}"; do args="$args -p $(printf '%q' "$p")"; done
    bash "$root/scripts/aarch64.sh" sh "
        qemu-aarch64 $work/gen_moe_refs ref $(printf '%q' "$MODELS/$model") $work/$m.json \
            -n $N_GEN -u $ub $args > $work/$m.log 2>&1
    " || { echo "error: llama.cpp (aarch64) failed on $m; see $host_work/$m.log" >&2; exit 1; }
    "$PY" - "$MODELS/$model" "$host_work/$m.json" "$OUT/$m.gguf" "$ref" "$N_GEN" "$ub" "${spec[@]:2}" <<'PY'
import hashlib, json, os, sys
import numpy as np
import gguf

model, js, out, x86, n_gen, ubatch = sys.argv[1:4] + [sys.argv[4], int(sys.argv[5]), int(sys.argv[6])]
prompts = sys.argv[7:]
with open(model, "rb") as f:
    sha = hashlib.sha256(f.read()).hexdigest()
with open(js) as f:
    ref = json.load(f)
x = gguf.GGUFReader(x86)
xt = {t.name: t for t in x.tensors}
n_vocab = ref["n_vocab"]
w = gguf.GGUFWriter(out + ".tmp", "sluice-ref")
w.add_string("sluice.ref.tool", "llama.cpp v0.4.0 (source of npm node-llama-cpp 3.21.1) built for aarch64 -march=armv8.2-a+dotprod+fp16, CPU backend, run by qemu-aarch64 -cpu cortex-a76")
w.add_string("sluice.ref.generator", "scripts/gen_moe_refs_aarch64.sh")
w.add_string("sluice.ref.model", os.path.basename(model))
w.add_string("sluice.ref.model_sha256", sha)
w.add_string("sluice.ref.kv_type", "f32")
w.add_bool("sluice.ref.flash_attn", False)
w.add_uint32("sluice.ref.threads", 1)
if ubatch:
    w.add_uint32("sluice.ref.n_ubatch", ubatch)
w.add_uint32("sluice.ref.n_vocab", n_vocab)
w.add_uint32("sluice.ref.n_prompts", len(prompts))
for i, (text, p) in enumerate(zip(prompts, ref["prompts"])):
    toks = np.array(p["tokens"], dtype=np.int32)
    assert np.array_equal(toks, np.array(xt[f"p{i}.tokens"].data, dtype=np.int32)), "tokens differ from x86"
    logits = np.array(p["logits"], dtype=np.float32).reshape(len(toks), n_vocab)
    greedy = np.array(p["greedy"], dtype=np.int32)
    gaps = np.array(p["greedy_gaps"], dtype=np.float32)
    xg = np.array(xt[f"p{i}.greedy"].data, dtype=np.int32)
    same = 0
    while same < n_gen and greedy[same] == xg[same]:
        same += 1
    w.add_string(f"sluice.ref.p{i}.text", text)
    w.add_uint32(f"sluice.ref.p{i}.greedy_as_x86", same)
    w.add_float32(f"sluice.ref.p{i}.min_greedy_gap", float(gaps.min()))
    w.add_tensor(f"p{i}.tokens", toks)
    w.add_tensor(f"p{i}.logits", logits)
    w.add_tensor(f"p{i}.greedy", greedy)
    w.add_tensor(f"p{i}.greedy_gaps", gaps)
    print(f"{os.path.basename(out)}\tp{i}\tgreedy as x86: {same}/{n_gen}\tmin gap {gaps.min():.3g}")
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
os.replace(out + ".tmp", out)
PY
done
echo "wrote $OUT"
