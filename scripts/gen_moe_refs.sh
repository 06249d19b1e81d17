#!/usr/bin/env bash
# Regenerates the llama.cpp reference data of the MoE forward-pass fixtures
# (crates/engine/tests/fixtures/moe/refs/*.gguf).
#
#  1. scripts/fetch_moe_fixtures.sh writes the F32/BF16/Q8_0/Q4_0/Q4_1 models (gptoss:
#     F32/BF16/Q8_0/MXFP4) into the fixture cache ($SLUICE_FIXTURES/moe), and the Q4_K_M models
#     quantized from the F32 ones by `sluice quantize` (not checked against the references
#     there, since these are remade here).
#  2. scripts/gen_moe_refs.cpp is compiled against the prebuilt llama.cpp of node-llama-cpp
#     3.21.1 (llama.cpp release v0.4.0; see scripts/llamacpp-npm.sh). Cross-check (the archs of
#     KQUANT_ARCHS): llama.cpp's llama_model_quantize quantizes each F32 model to Q4_K_M too,
#     and the script fails unless the SHA-256 equals that of sluice's file. With
#     QUANT_CROSSCHECK=all, every file type `sluice quantize` supports is cross-checked that
#     way, on the F32 and BF16 models.
#  3. Prompt choice: every candidate prompt below (and the architecture's EXTRA ones) runs
#     through all models of an architecture (every weight type of TYPES); among those of at
#     least 4 tokens (MIN_LEN) and not in EXCLUDE, the three whose smallest routing margin over those
#     models is largest are kept (ties: earlier candidate first). Where LONG names a length, one of the three must have at least that
#     many tokens: if none has, the third is replaced by the best candidate that long.
#  4. For every model: the logits of every prompt position, 32 greedy tokens and the margins,
#     packed with gguf-py into refs/<model>.gguf (see crates/engine/tests/fixtures/moe/README.md).
#
# Needs npm (Node 18+), git, g++ and the python of step 1. About a minute once npm is cached.
# LLAMACPP_DIR reuses an existing install directory of scripts/llamacpp-npm.sh.
#
# Usage (from anywhere): bash scripts/gen_moe_refs.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FIX=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}
MODELS=$FIX/moe
REFS=$root/crates/engine/tests/fixtures/moe/refs
ARCHS="qwen3moe qwen3moe-ternary qwen3moe-iq qwen2moe olmoe mixtral gptoss glm4moe glm4moe-grouped deepseek2 deepseek2-lite deepseek2-fused gemma4 qwen35moe qwen3vlmoe granitemoe minimax smallthinker bailingmoe2 qwen3next qwen3next-legacy llama4 lfm2moe nemotron_h_moe nemotron_h_moe-latent"
# The architectures with Q4_0/Q4_1/Q4_K_M models, whose Q4_K_M is cross-checked with llama.cpp.
KQUANT_ARCHS="qwen3moe qwen2moe olmoe mixtral glm4moe deepseek2 deepseek2-lite deepseek2-fused qwen35moe qwen3vlmoe granitemoe minimax smallthinker bailingmoe2 qwen3next llama4 lfm2moe nemotron_h_moe"
# ONLY="a b" regenerates the references of those architectures alone (the others' files are
# left as they are).
if [ -n "${ONLY:-}" ]; then
    keep() { local out="" x; for x in $1; do case " $ONLY " in *" $x "*) out="$out $x" ;; esac; done; echo "$out"; }
    ARCHS=$(keep "$ARCHS")
    KQUANT_ARCHS=$(keep "$KQUANT_ARCHS")
fi
# Weight types per architecture.
declare -A TYPES=(
    [qwen3moe]="f32 bf16 q8_0 q4_0 q4_1 q4_k_m"
    [qwen3moe-ternary]="tq1_0 tq2_0"
    [qwen3moe-iq]="mix"
    [qwen2moe]="f32 bf16 q8_0 q4_0 q4_1 q4_k_m"
    [olmoe]="f32 bf16 q8_0 q4_0 q4_1 q4_k_m"
    [mixtral]="f32 bf16 q8_0 q4_0 q4_1 q4_k_m"
    [gptoss]="f32 bf16 q8_0 mxfp4"
    [glm4moe]="f32 bf16 q8_0 q4_0 q4_1 q4_k_m"
    [glm4moe-grouped]="f32 q8_0"
    [deepseek2]="f32 bf16 q8_0 q4_0 q4_k_m"
    [deepseek2-lite]="f32 q8_0 q4_0 q4_k_m"
    [deepseek2-fused]="f32 q8_0 q4_k_m"
    [gemma4]="f32 q8_0"
    [qwen35moe]="f32 q8_0 q4_k_m"
    [qwen3vlmoe]="f32 q8_0 q4_k_m"
    [granitemoe]="f32 q8_0 q4_k_m"
    [minimax]="f32 q8_0 q4_k_m"
    [smallthinker]="f32 q8_0 q4_k_m"
    [bailingmoe2]="f32 q8_0 q4_k_m"
    [qwen3next]="f32 q8_0 q4_k_m"
    [qwen3next-legacy]="f32 q8_0"
    [llama4]="f32 q8_0 q4_k_m"
    [lfm2moe]="f32 q8_0 q4_k_m"
    [nemotron_h_moe]="f32 q8_0 q4_k_m"
    [nemotron_h_moe-latent]="f32 q8_0"
)
# Smallest length (tokens) that one of the chosen prompts must have: gptoss's first layer
# attends through a sliding window of 8 tokens, and a prompt of 10 has two positions whose
# window leaves earlier tokens out, so the prompt logits themselves cross the window.
# qwen3moe-iq: a prompt of 32 tokens or more (routes 128 or more token-expert pairs over 16
# experts), so that some expert of an i-quant layer gets 8 tokens or more and llama.cpp
# multiplies it through its i-quant panel kernel (MUL_MAT_ID from GGML_IQP_MIN_BATCH_ID rows);
# the refs record the largest such count (max_expert_tokens) and the parity test checks it.
# nemotron_h_moe: 12, three micro-batches (UBATCH below) of the Mamba-2 layers.
declare -A LONG=([gptoss]=10 [gemma4]=10 [qwen35moe]=10 [qwen3next]=10 [qwen3next-legacy]=10 [lfm2moe]=10
    [nemotron_h_moe]=12 [nemotron_h_moe-latent]=12 [qwen3moe-iq]=32)
# Smallest length (tokens) of every chosen prompt, where it is not 4: longer than one
# micro-batch (UBATCH below), so that each prompt carries the recurrent state (the convolution's
# last positions and the scan's state) from one micro-batch into the next.
declare -A MIN_LEN=([nemotron_h_moe]=5 [nemotron_h_moe-latent]=5)
# Candidates of one architecture only, after those below.
declare -A EXTRA=(
    [qwen3moe-iq]="The old lighthouse keeper climbed the narrow stairs every evening, lit the great lamp, and watched the ships pass the rocks until morning came over the grey sea again."
)
# Micro-batch of the prompt runs, where it is not the whole prompt: qwen35moe's and
# qwen3next's recurrent layers (lfm2moe's short convolutions, nemotron_h_moe's Mamba-2 layers)
# carry their state from one micro-batch of 4 tokens to the next inside the prompt.
declare -A UBATCH=([qwen35moe]=4 [qwen3next]=4 [qwen3next-legacy]=4 [lfm2moe]=4
    [nemotron_h_moe]=4 [nemotron_h_moe-latent]=4)
N_GEN=32

CANDIDATES=(
    "Hello world! The quick brown fox"
    "def add(a, b):"
    "Once upon a time"
    "The capital of France is"
    "for i in range(10):"
    "I like green tea."
    "What is 2 + 2?"
    "Good morning, everyone."
    "print(x)"
    "A cat sat on the mat."
    "import numpy as np"
    "int main() {"
    "She said hello."
    "the end"
    "Water boils at 100 degrees."
    "Rain again today"
    "x = y * 3"
    "My name is Sam."
    "Open the door, please."
    "Blue sky, green grass"
    "return None"
    "It was late."
    "How are you?"
    "One, two, three, four"
    "The sun is hot."
    "Dogs like to run."
    "if (a > b) return a;"
    "Tea or coffee?"
    "Let me think about it."
    "We went home early."
    "The tree is tall."
    "See you soon!"
    "What time is it?"
    "print('hi')"
    "This is a test."
    "Birds can fly."
    "Please sit down."
    "List of items:"
    "He reads books."
    "x += 1"
    "Snow fell all night."
    "Call me tomorrow."
    "while True: pass"
    "The box is empty."
    "Red, green and blue"
    "Time to go home."
    "A new day begins."
    "Add salt and pepper."
    "Keep it simple."
    "Read the manual first."
    "Numbers: 1, 2, 3"
    "Thank you very much."
    "The train is late."
    "Turn left here."
    "Fish swim in water."
    "Write a short poem."
)

# Candidates left out per architecture, separated by "|": with them, an independent float64
# forward pass (ggml's activation quantization emulated) differed from llama.cpp by more than
# 1e-4 in the logits of some weight type (F32, BF16, Q8_0, Q4_0, Q4_K_M checked), because an
# activation sits on a rounding boundary of that quantization (bf16 rounding most often), so
# that llama.cpp's f32 arithmetic lands on one side and an exact one on the other: an outlier
# of 1e-3 to 2e-1 that no engine can be asked to reproduce. qwen2moe was not checked (no
# independent forward pass for it); qwen3moe's chosen prompts were checked and are clean.
# gptoss: every candidate checked in F32, BF16, Q8_0 and MXFP4; 41 of 56 left out (38 for BF16).
declare -A EXCLUDE=(
    [qwen3moe]=""
    [qwen2moe]=""
    [olmoe]="Hello world! The quick brown fox|Once upon a time|for i in range(10):|I like green tea.|What is 2 + 2?|Good morning, everyone.|print(x)|She said hello.|the end|Water boils at 100 degrees.|x = y * 3|My name is Sam.|Open the door, please.|Blue sky, green grass|It was late.|One, two, three, four|The sun is hot.|Dogs like to run.|Let me think about it.|We went home early.|The tree is tall.|What time is it?|print('hi')|This is a test.|List of items:|while True: pass|Red, green and blue|Time to go home.|Add salt and pepper.|Numbers: 1, 2, 3|Thank you very much.|Write a short poem."
    [mixtral]="Hello world! The quick brown fox|The capital of France is|I like green tea.|Good morning, everyone.|A cat sat on the mat.|import numpy as np|int main() {|She said hello.|Water boils at 100 degrees.|Rain again today|My name is Sam.|Open the door, please.|Blue sky, green grass|It was late.|The sun is hot.|if (a > b) return a;|Tea or coffee?|The tree is tall.|What time is it?|This is a test.|Please sit down.|He reads books.|Snow fell all night.|Call me tomorrow.|The box is empty.|Red, green and blue|A new day begins.|Keep it simple.|Read the manual first.|Numbers: 1, 2, 3|Thank you very much.|Fish swim in water.|Write a short poem."
    [gptoss]="Hello world! The quick brown fox|def add(a, b):|for i in range(10):|I like green tea.|Good morning, everyone.|print(x)|A cat sat on the mat.|import numpy as np|int main() {|She said hello.|Water boils at 100 degrees.|Rain again today|x = y * 3|My name is Sam.|Blue sky, green grass|It was late.|One, two, three, four|The sun is hot.|Dogs like to run.|if (a > b) return a;|Tea or coffee?|Let me think about it.|We went home early.|The tree is tall.|See you soon!|print('hi')|This is a test.|Birds can fly.|Please sit down.|Snow fell all night.|while True: pass|Red, green and blue|Time to go home.|A new day begins.|Add salt and pepper.|Read the manual first.|Numbers: 1, 2, 3|Thank you very much.|The train is late.|Fish swim in water.|Write a short poem."
)

SLUICE_MOE_NO_REF_CHECK=1 bash "$root/scripts/fetch_moe_fixtures.sh"
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
# sluice's x86 kernels reproduce the AVX2 ("haswell") build of ggml; on an AVX-512 machine
# llama.cpp would pick another CPU library whose sums run in another order, so only the haswell
# library is offered to it.
mkdir -p "$work/cpu"
cp "$LLAMACPP_LIB/libggml-cpu-haswell.so" "$work/cpu/"
export GGML_BACKEND_DIR=$work/cpu
run() { "$work/gen_moe_refs" "$@"; }

mkdir -p "$REFS" "$work/log"
# llama.cpp's quantizer must write exactly what sluice's wrote (llama_ftype numbers).
declare -A FTYPE=([Q4_0]=2 [Q4_1]=3 [Q8_0]=7 [Q5_0]=8 [Q5_1]=9 [Q2_K]=10 [Q3_K_S]=11 [Q3_K_M]=12
    [Q3_K_L]=13 [Q4_K_S]=14 [Q4_K_M]=15 [Q5_K_S]=16 [Q5_K_M]=17 [Q6_K]=18 [TQ1_0]=36 [TQ2_0]=37)
same_sha() {  # name, llama.cpp's file, sluice's file
    local l s
    l=$(sha256sum "$2" | cut -d' ' -f1)
    s=$(sha256sum "$3" | cut -d' ' -f1)
    if [ "$l" != "$s" ]; then
        echo "ERROR: $1: llama.cpp's quantizer wrote SHA-256 $l, sluice quantize $s" >&2
        exit 1
    fi
    echo "# $1: llama.cpp and sluice quantize agree ($l)" >&2
}
for a in $KQUANT_ARCHS; do
    run quantize "$MODELS/$a-f32.gguf" "$work/$a-q4_k_m.llama.gguf" 15 > "$work/log/quantize-$a.log" 2>&1
    same_sha "$a-q4_k_m" "$work/$a-q4_k_m.llama.gguf" "$MODELS/$a-q4_k_m.gguf"
done
if [ "${QUANT_CROSSCHECK:-}" = all ]; then
    for a in $KQUANT_ARCHS; do
        for src in f32 bf16; do
            if [ ! -f "$MODELS/$a-$src.gguf" ]; then
                echo "# $a has no ${src^^} model: its cross-check starts from the others" >&2
                continue
            fi
            for t in "${!FTYPE[@]}"; do
                run quantize "$MODELS/$a-$src.gguf" "$work/x.llama.gguf" "${FTYPE[$t]}" > "$work/log/x.log" 2>&1
                (cd "$root" && cargo run --profile test --locked --quiet -p sluice -- \
                    quantize "$MODELS/$a-$src.gguf" "$work/x.sluice.gguf" --type "$t" --quiet)
                same_sha "$a-$src -> $t" "$work/x.llama.gguf" "$work/x.sluice.gguf"
            done
        done
    done
fi

# qwen3moe-iq-mix: qwen3moe's F32 model quantized by llama.cpp's quantizer into the seven
# i-quants, each type in one expert tensor and one attention matrix (IQ3_S: the default, the
# embeddings and the output too), with a flat importance matrix (the quantizer refuses the
# types below 3 bits without one). gguf-py cannot write these types, so the model is committed
# (crates/engine/tests/fixtures/moe/models/) and fetch_moe_fixtures.sh copies it into the
# fixture cache.
case " $ARCHS " in *" qwen3moe-iq "*)
    run quantize "$MODELS/qwen3moe-f32.gguf" "$work/qwen3moe-iq-mix.gguf" 26 pure flat-imatrix \
        'tt:blk\.0\.ffn_gate_exps=iq1_s' 'tt:blk\.0\.ffn_up_exps=iq1_m' 'tt:blk\.0\.ffn_down_exps=iq2_xxs' \
        'tt:blk\.1\.ffn_gate_exps=iq2_xs' 'tt:blk\.1\.ffn_up_exps=iq2_s' 'tt:blk\.1\.ffn_down_exps=iq3_xxs' \
        'tt:blk\.0\.attn_q\.=iq3_xxs' 'tt:blk\.0\.attn_k\.=iq2_s' 'tt:blk\.0\.attn_v\.=iq2_xs' \
        'tt:blk\.0\.attn_output=iq2_xxs' 'tt:blk\.1\.attn_q\.=iq1_m' 'tt:blk\.1\.attn_k\.=iq1_s' \
        > "$work/log/quantize-qwen3moe-iq.log" 2>&1
    mkdir -p "$root/crates/engine/tests/fixtures/moe/models"
    cp "$work/qwen3moe-iq-mix.gguf" "$root/crates/engine/tests/fixtures/moe/models/"
    cp "$work/qwen3moe-iq-mix.gguf" "$MODELS/"
    ;;
esac

for a in $ARCHS; do
    cands=("${CANDIDATES[@]}")
    if [ -n "${EXTRA[$a]:-}" ]; then
        cands+=("${EXTRA[$a]}")
    fi
    cand_args=()
    for p in "${cands[@]}"; do cand_args+=(-p "$p"); done
    for t in ${TYPES[$a]}; do
        run ref "$MODELS/$a-$t.gguf" "$work/cand-$a-$t.json" -n "$N_GEN" -u "${UBATCH[$a]:-0}" "${cand_args[@]}" \
            > "$work/log/cand-$a-$t.log" 2>&1
    done
    mapfile -t chosen < <("$PY" - "$work" "$a" "${TYPES[$a]}" "${EXCLUDE[$a]:-}" "${LONG[$a]:-0}" "${MIN_LEN[$a]:-4}" "${cands[@]}" <<'PY'
import json, sys
work, arch, types, cands = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[7:]
excluded = set(x for x in sys.argv[4].split("|") if x)
long_len = int(sys.argv[5])
min_len = int(sys.argv[6])
worst = [float("inf")] * len(cands)
short = [False] * len(cands)
n_tok = [0] * len(cands)
for t in types:
    with open(f"{work}/cand-{arch}-{t}.json") as f:
        for i, p in enumerate(json.load(f)["prompts"]):
            worst[i] = min(worst[i], p["route_margin_prompt"])
            short[i] = len(p["tokens"]) < min_len or cands[i] in excluded
            n_tok[i] = len(p["tokens"])
ranked = sorted(range(len(cands)), key=lambda i: (short[i], -worst[i], i))
order = ranked[:3]
if long_len and not any(n_tok[i] >= long_len for i in order):
    order = order[:2] + [next(i for i in ranked if not short[i] and n_tok[i] >= long_len)]
for i in sorted(order):
    print(cands[i])
PY
)
    args=()
    for p in "${chosen[@]}"; do args+=(-p "$p"); done
    for t in ${TYPES[$a]}; do
        m=$a-$t
        ub=${UBATCH[$a]:-0}
        run ref "$MODELS/$m.gguf" "$work/$m.json" -n "$N_GEN" -u "$ub" "${args[@]}" > "$work/log/ref-$m.log" 2>&1
        "$PY" - "$MODELS/$m.gguf" "$work/$m.json" "$REFS/$m.gguf" "$N_GEN" "$ub" "${chosen[@]}" <<'PY'
import hashlib, json, os, sys
import numpy as np
import gguf

model, js, out, n_gen, ubatch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
prompts = sys.argv[6:]
with open(model, "rb") as f:
    sha = hashlib.sha256(f.read()).hexdigest()
with open(js) as f:
    ref = json.load(f)
n_vocab = ref["n_vocab"]
w = gguf.GGUFWriter(out + ".tmp", "sluice-ref")
w.add_string("sluice.ref.tool", "llama.cpp v0.4.0 (prebuilt libllama of npm node-llama-cpp 3.21.1, CPU backend)")
w.add_string("sluice.ref.generator", "scripts/gen_moe_refs.sh")
w.add_string("sluice.ref.model", os.path.basename(model))
w.add_string("sluice.ref.model_sha256", sha)
w.add_string("sluice.ref.kv_type", "f32")
w.add_bool("sluice.ref.flash_attn", False)
w.add_uint32("sluice.ref.threads", 1)
if ubatch:
    w.add_string("sluice.ref.batch_mode", f"prompt: one llama_decode of all tokens in micro-batches of {ubatch}; greedy: one llama_decode per token")
    w.add_uint32("sluice.ref.n_ubatch", ubatch)
else:
    w.add_string("sluice.ref.batch_mode", "prompt: one llama_decode of all tokens; greedy: one llama_decode per token")
w.add_uint32("sluice.ref.n_vocab", n_vocab)
w.add_uint32("sluice.ref.n_prompts", len(prompts))
for i, (text, p) in enumerate(zip(prompts, ref["prompts"])):
    toks = np.array(p["tokens"], dtype=np.int32)
    logits = np.array(p["logits"], dtype=np.float32).reshape(len(toks), n_vocab)
    greedy = np.array(p["greedy"], dtype=np.int32)
    gaps = np.array(p["greedy_gaps"], dtype=np.float32)
    rmargins = np.array(p["greedy_route_margins"], dtype=np.float32)
    assert len(rmargins) == n_gen
    assert len(greedy) == n_gen
    w.add_string(f"sluice.ref.p{i}.text", text)
    w.add_float32(f"sluice.ref.p{i}.route_margin", p["route_margin_prompt"])
    w.add_float32(f"sluice.ref.p{i}.route_margin_with_greedy", p["route_margin_all"])
    w.add_float32(f"sluice.ref.p{i}.min_greedy_gap", float(gaps.min()))
    w.add_uint32(f"sluice.ref.p{i}.max_expert_tokens", p["max_expert_tokens"])
    w.add_tensor(f"p{i}.tokens", toks)
    w.add_tensor(f"p{i}.logits", logits)
    w.add_tensor(f"p{i}.greedy", greedy)
    w.add_tensor(f"p{i}.greedy_gaps", gaps)
    w.add_tensor(f"p{i}.greedy_route_margins", rmargins)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
os.replace(out + ".tmp", out)
for i, p in enumerate(ref["prompts"]):
    print(f"{os.path.basename(model)}\tp{i}\t{len(p['tokens'])} tokens\troute margin {p['route_margin_prompt']:.3g}"
          f" (with greedy {p['route_margin_all']:.3g})\tmin greedy gap {min(p['greedy_gaps']):.3g}")
PY
    done
done | tee "$work/summary.tsv"
# llama.cpp's loading log of one model per architecture, for the record (gptoss: MXFP4; the
# ternary models: TQ2_0; the i-quant one: its mix).
for a in $ARCHS; do
    m=$a-f32
    [ "$a" = gptoss ] && m=$a-mxfp4
    [ "$a" = qwen3moe-ternary ] && m=$a-tq2_0
    [ "$a" = qwen3moe-iq ] && m=$a-mix
    echo "== $m.gguf"
    grep -iE "warn|error|special_eog_ids|setting token|SWA cache|is_swa =|print_info: (arch|file type|n_vocab|n_expert|vocab type|model type|n_swa|is_swa_any|m?rope|freq_|n_ctx_orig_yarn|n_ctx_train|n_embd_inp|f_(embedding|residual|attention|logit)_scale|[A-Z]+ token)" \
        "$work/log/ref-$m.log" | awk '!seen[$0]++' || true
done
echo "wrote $REFS"
