#!/usr/bin/env bash
# Regenerates crates/cli/tests/fixtures/real/NAME.json: llama.cpp's prompt tokens and 32 greedy
# tokens (with the top-2 logit gap of each step) for three prompts on a real model fetched by
# scripts/fetch_real_models.sh. NAME (default: all):
#   smollm2        SmolLM2-135M-Instruct Q4_1 (llama)
#   qwen2.5-coder  Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2)
#   smollm2-moefied-16x12, smollm2-moefied-16x16
#                  SmolLM2 moefied into 16 experts, top-12 and top-16 (scripts/make_moefied_models.sh;
#                  the reference pins the file's SHA-256, so a change to moefy's output means
#                  running this again)
# llama.cpp release v0.4.0, the prebuilt libllama of npm's
# node-llama-cpp 3.21.1 (scripts/llamacpp-npm.sh) with its AVX2 ("haswell") CPU library, driven
# by scripts/gen_moe_refs.cpp's `ref` command: KV cache F32, flash attention off, 1 thread.
#
# LLAMACPP_DIR reuses an existing install directory of scripts/llamacpp-npm.sh.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FIX=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}
PROMPTS=("The capital of France is" "def fibonacci(n):" "Once upon a time, a small robot")
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(smollm2 qwen2.5-coder smollm2-moefied-16x12 smollm2-moefied-16x16)
for name in "${names[@]}"; do
    case $name in
        smollm2) ;;
        qwen2.5-coder) ;;
        smollm2-moefied-16x12|smollm2-moefied-16x16) ;;
        *) echo "unknown model name '$name' (smollm2, qwen2.5-coder, smollm2-moefied-16x12, smollm2-moefied-16x16)" >&2; exit 2 ;;
    esac
done

bash "$root/scripts/fetch_real_models.sh"
for name in "${names[@]}"; do
    case $name in smollm2-moefied-*) bash "$root/scripts/make_moefied_models.sh" smollm2 ;; esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=llamacpp-npm.sh
. "$root/scripts/llamacpp-npm.sh"
llamacpp_npm_install "${LLAMACPP_DIR:-$work/npm}"
# shellcheck disable=SC2086 # LLAMACPP_INC holds two -I flags
g++ -O2 -std=c++17 -Wall -Wextra -o "$work/gen_moe_refs" "$root/scripts/gen_moe_refs.cpp" $LLAMACPP_INC \
    "$LLAMACPP_LIB/libllama.v0.4.0.so" "$LLAMACPP_LIB/libggml.v0.4.0.so" "$LLAMACPP_LIB/libggml-base.so" \
    -Wl,-rpath,"$LLAMACPP_LIB"
# sluice's x86 kernels reproduce the AVX2 ("haswell") build of ggml; on an AVX-512 machine
# llama.cpp would pick another CPU library whose sums run in another order, so only the haswell
# library is offered to it.
mkdir -p "$work/cpu"
cp "$LLAMACPP_LIB/libggml-cpu-haswell.so" "$work/cpu/"
export GGML_BACKEND_DIR=$work/cpu
model_file() {
    case $1 in
        smollm2) echo "$FIX/models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
        qwen2.5-coder) echo "$FIX/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" ;;
        smollm2-moefied-16x12) echo "$FIX/models/SmolLM2-135M-Instruct-moefied-16x12.gguf" ;;
        smollm2-moefied-16x16) echo "$FIX/models/SmolLM2-135M-Instruct-moefied-16x16.gguf" ;;
    esac
}

for name in "${names[@]}"; do
MODEL=$(model_file "$name")
OUT=$root/crates/cli/tests/fixtures/real/$name.json
args=()
for p in "${PROMPTS[@]}"; do args+=(-p "$p"); done
"$work/gen_moe_refs" ref "$MODEL" "$work/ref.json" -n 32 "${args[@]}" > "$work/log" 2>&1 || {
    cat "$work/log" >&2
    exit 1
}
mkdir -p "$(dirname "$OUT")"
python3 - "$work/ref.json" "$MODEL" "$OUT" "${PROMPTS[@]}" <<'PY'
import hashlib, json, os, sys
ref, model, out, prompts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
d = json.load(open(ref))
sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
doc = {
    "tool": "llama.cpp v0.4.0 (prebuilt libllama of npm node-llama-cpp 3.21.1, AVX2 haswell CPU library); "
            "scripts/gen_real_refs.sh",
    "settings": "KV cache F32, flash attention off, 1 thread; prompt in one llama_decode (BOS as "
                "the model says, special text not parsed), then greedy argmax one token per decode",
    "model": os.path.basename(model),
    "model_sha256": sha,
    "prompts": [
        {"text": t, "tokens": p["tokens"], "greedy": p["greedy"],
         "greedy_gaps": p["greedy_gaps"]}
        for t, p in zip(prompts, d["prompts"])
    ],
}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
PY
echo "# wrote $OUT" >&2
done
