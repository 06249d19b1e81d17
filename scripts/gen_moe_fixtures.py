#!/usr/bin/env python3
"""Writes the tiny mixture-of-experts GGUF models that the MoE forward-pass tests run.

One model shape per architecture (random weights from fixed seeds), each written in several
weight types:

    qwen3moe  16 experts, top-4, q/k RMSNorm per head                   vocabulary: qwen2.5
    qwen2moe   8 experts, top-4, sigmoid-gated shared expert, qkv bias  vocabulary: qwen2.5
    olmoe      8 experts, top-2, q/k RMSNorm over the projection        vocabulary: smollm2
    llama      8 experts, top-2 (the Mixtral layout)                    vocabulary: llama SPM
    gpt-oss    8 experts, top-4, biased router, clamped SwiGLU with      vocabulary: qwen2.5 +
               expert biases, attention sinks, sliding window (8) on      harmony specials
               every other layer, YaRN RoPE
    glm4moe    16 experts, top-4, sigmoid routing with a selection bias,  vocabulary: qwen2.5 +
               renormalised and scaled by 2.5, one ungated shared         GLM's specials
               expert, a leading dense layer, qkv bias, NEOX rope over
               half of each head, q/k RMSNorm per head in the last
               layer only (GLM-4.5 has it, GLM-4.5-Air not: both paths
               run), and one NextN layer after the trunk; glm4moe-grouped
               is the same model with group-limited routing (4 groups of 4,
               the best 2), in F32 and Q8_0
    deepseek2  16 experts, top-4: DeepSeek V3's layout at a small size:   vocabulary: qwen2.5 +
               multi-head latent attention in the absorbed form           DeepSeek's specials
               (attn_k_b/attn_v_b, low-rank query, one cached head),      (BOS added)
               NORM rope, YaRN with a log multiplier, a leading dense
               layer, sigmoid routing with a selection bias and expert
               groups, a shared expert and a NextN layer;
               deepseek2-lite is DeepSeek-V2-Lite's: legacy attn_kv_b,
               one query projection, softmax routing, two shared
               experts; deepseek2-fused is deepseek2 with each layer's
               gate and up experts in one ffn_gate_up_exps tensor
    gemma4      8 experts, top-2: Gemma 4's MoE layout: two sliding-window   vocabulary: qwen2.5
               layers with heads of 64 and a full layer with heads of
               128 whose values are its keys, q/k/v norms, proportional
               rope, a dense GEGLU MLP beside fused experts with a
               per-expert down scale, soft-capped logits; F32 and Q8_0
    qwen35moe  16 experts, top-4: Qwen3.6's hybrid layout: three Gated       vocabulary: qwen2.5
               DeltaNet linear-attention layers (short convolution,
               recurrent state, gated output norm) and a full-attention
               layer with a sigmoid output gate and interleaved M-RoPE,
               post-attention norm, a sigmoid-gated shared expert; F32
               and Q8_0
    qwen3vlmoe 16 experts, top-4: Qwen3-VL-MoE's text model: qwen3moe's  vocabulary: qwen2.5
               layers with interleaved M-RoPE over whole heads in
               sections 20/6/6/0 (9 of 32 pairs on the fourth position
               stream, 0 for text) and 2 deepstack layers (no vision
               input: they add zeros); F32 and Q8_0
    granitemoe 12 experts, top-3: Granite 3.x MoE: llama-like layers     vocabulary: refact
               (NORM rope, no biases) with the four Granite multipliers   (StarCoder BPE, as
               (embedding 5, attention 0.3, residual 0.35, logits 1/6);   Granite's) + Granite's
               F32 and Q8_0                                               role tokens
    minimax    16 experts, top-4: MiniMax-M2's layout: q/k RMSNorm over   vocabulary: qwen2.5 +
               the whole projection (512 query and 256 key values, wider   MiniMax's specials
               than n_embd), NEOX rope over 64 of 128 dims per head,
               sigmoid routing with a selection bias, renormalised; F32
               and Q8_0
    smallthinker 16 experts, top-4: SmallThinker's layout: the router   vocabulary: qwen2.5
               reads each layer's input before the attention norm,
               ReLU-gated experts, sigmoid routing renormalised; a
               sliding window (4096 in llama.cpp) on layers 1-2, layer 0
               full attention without rope (NoPE); F32 and Q8_0
    llama4     16 experts, top-1: Llama 4's layout: every other layer   vocabulary: qwen2.5
               MoE (raw-logit choice, the sigmoid weight applied to the
               expert's input, an ungated shared expert), the others
               dense; chunked attention with a weightless q/k norm after
               NORM rope (with rope_freqs) on layers 0-2, layer 3 NoPE
               with the attention temperature; F32 and Q8_0
    bailingmoe2 16 experts, top-4: Ling 2.0's layout: q/k/v in one fused   vocabulary: qwen2.5 +
               attn_qkv, q/k RMSNorm per head, NEOX rope over half of     Ling's specials
               each head, a leading dense layer, sigmoid routing with a
               selection bias and expert groups (4 of 4, the best 2),
               renormalised and scaled by 2.5, one ungated shared
               expert, and a NextN layer with its own output norm; F32
               and Q8_0
    qwen3next  16 experts, top-4: Qwen3-Next's hybrid layout: three      vocabulary: qwen2.5
               Gated DeltaNet layers whose value heads are grouped by key
               head, beta and alpha in one ssm_ba, a full-attention layer
               with a sigmoid output gate and NEOX rope over 16 of 64
               dims, a sigmoid-gated shared expert and one NextN layer;
               qwen3next-legacy is the same model with each linear
               layer's attn_qkv and attn_gate in the first converter's
               ssm_in (rows grouped by key head); F32 and Q8_0
    lfm2moe    16 experts, top-4: LFM2-8B-A1B's layout: LFM2 short-       vocabulary: qwen2.5 +
               convolution layers (0 and 3: in_proj into B, C, x, a       LFM2's specials
               causal convolution of B·x over 3 positions, times C)       (BOS added)
               and attention layers (1 and 2: q/k RMSNorm per head,
               NEOX rope), told apart by a per-layer head_count_kv (0:
               short convolution); a leading dense layer, sigmoid
               routing with a selection bias, renormalised; the output
               tied to the embedding, the final norm named
               token_embd_norm; F32 and Q8_0
    nemotron_h_moe 16 experts, top-4: Nemotron 3's hybrid layout:       vocabulary: qwen2.5 +
               six single-block layers M E M * E M (Mamba-2: in_proj     Nemotron 3's specials
               into z, x, B, C and dt, a causal convolution over 4
               positions, 8 heads of 64 in 2 groups of B/C with a state
               of 64, a gated RMSNorm per group; E: sigmoid routing with
               a selection bias, renormalised and scaled by 2.5, ReLU²
               experts without gate and an ungated ReLU² shared expert;
               *: attention without rope), told apart by per-layer
               head_count_kv and feed_forward_length; expert width 128;
               nemotron_h_moe-latent is the same with the experts in a
               latent space of 128 (ffn_latent_down / ffn_latent_up, as
               Nemotron 3 Super's); F32 and Q8_0

Every model is 256 wide (n_embd 256, expert width 256) so that llama.cpp can also make K-quant
versions of the F32 file (K-quants need rows of a multiple of 256); nemotron_h_moe's experts are
128 wide, so that its Q4_K_M has the quantizer's fallbacks for rows of 128 (ffn_down_exps).

Seeds: where a seed's model put an activation of the first (BOS) position on a rounding boundary
of ggml's activation quantization in some weight type (checked with an independent float64
forward pass), the next seed was taken, since every prompt of that model would carry the outlier.
gpt-oss and nemotron_h_moe add no BOS, so the rule has no shared position to check: each has
the next unused seed.

Weight types written here: F32, BF16, Q8_0, Q4_0, Q4_1 (gguf-py's own quantizers, which are
byte-identical to llama.cpp's); qwen3moe-ternary is qwen3moe's model in TQ1_0 and TQ2_0
(gguf-py's quantizers; the references are computed on these very files). The router (ffn_gate_inp), the shared-expert gate, every bias
and every 1-D tensor stay F32, as llama.cpp's quantizer leaves them. gpt-oss is written in F32,
BF16, Q8_0 and MXFP4 instead: MXFP4 is the type mix of llama.cpp's MOSTLY_MXFP4_MOE (expert
tensors MXFP4, every other quantizable 2-D weight Q8_0), which the released gpt-oss files use.

Vocabularies are real ones, trimmed so that the logits of the references stay small: the first
N tokens of the source vocabulary (for the SentencePiece one: <unk>, <s>, </s>, the 256 byte
tokens and then the best-scored pieces, which is its id order), the BPE merges whose two parts and
result are all kept, and the special tokens the model needs appended after them. The gpt-oss
vocabulary is the trimmed qwen2.5 one with the harmony format's special tokens added after it
as new control tokens (the source vocabulary has none of them), <|return|> as end of sequence,
and llama.cpp's copy of the gpt-oss chat template (models/templates/openai-gpt-oss-120b.jinja,
from the text fixtures' template directory). The Granite vocabulary is llama.cpp's refact one
(StarCoder's BPE, which Granite 3.x uses) with its first token renamed <|end_of_text|> as in
Granite's files, Granite's role tokens added as new control tokens and Granite 3.3's chat
template.

The output is byte-for-byte deterministic for a given gguf (0.19.0) and numpy (2.x) version.

    python3 scripts/gen_moe_fixtures.py VOCAB_DIR TEMPLATE_DIR OUT_DIR
"""

import os
import sys

import numpy as np
import gguf

QT = gguf.GGMLQuantizationType
FT = gguf.LlamaFileType

# weight type name -> (tensor type for 2-D/3-D weights, file type)
WTYPES = {
    "f32": (QT.F32, FT.ALL_F32),
    "bf16": (QT.BF16, FT.MOSTLY_BF16),
    "q8_0": (QT.Q8_0, FT.MOSTLY_Q8_0),
    "q4_0": (QT.Q4_0, FT.MOSTLY_Q4_0),
    "q4_1": (QT.Q4_1, FT.MOSTLY_Q4_1),
    # expert tensors MXFP4, every other quantized weight Q8_0 (llama.cpp's MOSTLY_MXFP4_MOE)
    "mxfp4": (QT.MXFP4, FT.MOSTLY_MXFP4_MOE),
    # ternary: every quantized weight in the type (gguf-py's quantizers)
    "tq1_0": (QT.TQ1_0, FT.MOSTLY_TQ1_0),
    "tq2_0": (QT.TQ2_0, FT.MOSTLY_TQ2_0),
}
DEFAULT_WTYPES = ("f32", "bf16", "q8_0", "q4_0", "q4_1")

# Trimmed vocabularies: source file (in the text fixture vocab directory), number of leading
# tokens kept, and the special tokens appended after them (looked up by text in the source).
VOCABS = {
    "qwen2.5": {
        "file": "qwen2.5-coder-1.5b.gguf",
        "keep": 1024,
        "extra": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    },
    "smollm2": {
        "file": "smollm2-135m.gguf",
        "keep": 1024,  # ids 0..16 are its special tokens, so nothing is appended
        "extra": [],
    },
    "llama-spm": {
        "file": "ggml-vocab-llama-spm.gguf",
        "keep": 1024,
        "extra": [],
    },
    # qwen2.5's trimmed vocabulary plus the harmony format's special tokens, which are new
    # tokens ("new", written as CONTROL tokens after the kept ones); end of sequence <|return|>
    # (as in the released gpt-oss files); the chat template is llama.cpp's gpt-oss one.
    "qwen2.5-harmony": {
        "file": "qwen2.5-coder-1.5b.gguf",
        "keep": 1024,
        "extra": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "new": [
            "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
            "<|return|>", "<|call|>",
        ],
        "eos": "<|return|>",
        "template": "openai-gpt-oss-120b.jinja",
    },
    # qwen2.5's trimmed vocabulary plus the special tokens GLM-4.5's chat template writes, as new
    # control tokens; the template is llama.cpp's copy of GLM-4.6's (GLM-4.5's own differs only
    # in tool-call details).
    "qwen2.5-glm": {
        "file": "qwen2.5-coder-1.5b.gguf",
        "keep": 1024,
        "extra": ["<|endoftext|>"],
        "new": [
            "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
            "<think>", "</think>",
        ],
        "eos": "<|endoftext|>",
        "template": "GLM-4.6.jinja",
    },
    # qwen2.5's trimmed vocabulary plus the special tokens DeepSeek V3.1's chat template writes,
    # as new control tokens, with its begin-of-sentence token added in front of every prompt
    # as DeepSeek's files do; the template is DeepSeek-V3.1's own.
    "qwen2.5-deepseek": {
        "file": "qwen2.5-coder-1.5b.gguf",
        "keep": 1024,
        "extra": [],
        "new": [
            "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
            "<think>", "</think>",
        ],
        "bos": "<｜begin▁of▁sentence｜>",
        "add_bos": True,
        "eos": "<｜end▁of▁sentence｜>",
        "template": "deepseek-ai-DeepSeek-V3.1.jinja",
    },
    # qwen2.5's trimmed vocabulary plus the special tokens MiniMax-M2's chat template writes,
    # as new control tokens (]~!b[ begins the text, ]~b] a turn, [e~[ ends one, as in the
    # released files, whose template writes ]~!b[ itself); the template is llama.cpp's copy of
    # MiniMax-M2's.
    "qwen2.5-minimax": {
        "file": "qwen2.5-coder-1.5b.gguf",
        "keep": 1024,
        "extra": ["<|endoftext|>"],
        "new": [
            "]~!b[", "]~b]", "[e~[", "<think>", "</think>", "<minimax:tool_call>",
            "</minimax:tool_call>",
        ],
        "bos": "]~!b[",
        "add_bos": False,
        "eos": "[e~[",
        "template": "MiniMax-M2.jinja",
    },
    # qwen2.5's trimmed vocabulary plus the special tokens of Ling's chat templates as new
    # control tokens, <|role_end|> as end of sequence (as the released Ling 2.0 files); the
    # template is llama.cpp's copy of Ling 3.0's (the same role markers as Ling 2.0's own, which
    # the template directory does not have).
    "qwen2.5-ling": {
        "file": "qwen2.5-coder-1.5b.gguf",
        "keep": 1024,
        "extra": ["<|endoftext|>"],
        "new": ["<|startoftext|>", "<role>", "</role>", "<|role_end|>", "<think>", "</think>"],
        "eos": "<|role_end|>",
        "template": "inclusionai-ling-3.0-flash.jinja",
    },
    # qwen2.5's trimmed vocabulary plus the special tokens LFM2's chat template writes, as new
    # control tokens, with <|startoftext|> added in front of every prompt and <|im_end|> as end
    # of sequence, as LFM2's files do; the template is llama.cpp's copy of LFM2-8B-A1B's.
    "qwen2.5-lfm2": {
        "file": "qwen2.5-coder-1.5b.gguf",
        "keep": 1024,
        "extra": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "new": [
            "<|startoftext|>", "<|tool_list_start|>", "<|tool_list_end|>",
            "<|tool_response_start|>", "<|tool_response_end|>",
        ],
        "bos": "<|startoftext|>",
        "add_bos": True,
        "eos": "<|im_end|>",
        "template": "LFM2-8B-A1B.jinja",
    },
    # qwen2.5's trimmed vocabulary plus the special tokens Nemotron 3 Nano's chat template
    # writes (those qwen2.5 lacks as new control tokens), <|im_end|> as end of sequence and no
    # BOS added (the template writes none); the template is llama.cpp's copy of
    # Nemotron-3-Nano-30B-A3B's.
    "qwen2.5-nemotron": {
        "file": "qwen2.5-coder-1.5b.gguf",
        "keep": 1024,
        "extra": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"],
        "new": ["<think>", "</think>", "<tool_response>", "</tool_response>"],
        "add_bos": False,
        "eos": "<|im_end|>",
        "template": "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
    },
    # Granite 3.x's tokenizer: StarCoder's BPE with the refact pre-tokenizer (llama.cpp's
    # ggml-vocab-refact has Granite's 48891 merges), its first token renamed <|end_of_text|>
    # (BOS, EOS, UNK and PAD, no BOS added, as in the released Granite files), and the role
    # tokens of Granite's chat template as new control tokens; the template is llama.cpp's
    # copy of Granite 3.3's.
    "refact-granite": {
        "file": "ggml-vocab-refact.gguf",
        "keep": 1024,  # ids 0..18 are its special tokens
        "extra": [],
        "rename": {"<|endoftext|>": "<|end_of_text|>"},
        "new": ["<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"],
        "pad": "<|end_of_text|>",
        "add_bos": False,
        "template": "ibm-granite-granite-3.3-2B-Instruct.jinja",
    },
}

# Model shapes. head_dim * n_head is 256 for every model but gptoss (512).
MODELS = {
    "qwen3moe": dict(
        arch="qwen3moe", vocab="qwen2.5", seed=1001, n_layer=2, n_embd=256, n_head=4,
        n_head_kv=2, head_dim=64, n_expert=16, n_expert_used=4, n_ff_exp=256, tied=False,
        rope_base=1_000_000.0, rms_eps=1e-6,
    ),
    # qwen3moe's model (same seed, same weights) in the ternary types, whose dot kernels
    # follow ggml's x86 order only so far (no aarch64 references).
    "qwen3moe-ternary": dict(
        arch="qwen3moe", vocab="qwen2.5", seed=1001, n_layer=2, n_embd=256, n_head=4,
        n_head_kv=2, head_dim=64, n_expert=16, n_expert_used=4, n_ff_exp=256, tied=False,
        rope_base=1_000_000.0, rms_eps=1e-6, wtypes=("tq1_0", "tq2_0"),
    ),
    "qwen2moe": dict(
        arch="qwen2moe", vocab="qwen2.5", seed=1002, n_layer=2, n_embd=256, n_head=4,
        n_head_kv=2, head_dim=64, n_expert=8, n_expert_used=4, n_ff_exp=256, n_ff_shexp=256,
        tied=False, rope_base=1_000_000.0, rms_eps=1e-6,
    ),
    "olmoe": dict(
        arch="olmoe", vocab="smollm2", seed=1003, n_layer=2, n_embd=256, n_head=4,
        n_head_kv=4, head_dim=64, n_expert=8, n_expert_used=2, n_ff_exp=256, tied=False,
        rope_base=10_000.0, rms_eps=1e-5,
    ),
    "mixtral": dict(
        arch="llama", vocab="llama-spm", seed=1006, n_layer=2, n_embd=256, n_head=4,
        n_head_kv=2, head_dim=64, n_expert=8, n_expert_used=2, n_ff_exp=256, tied=False,
        rope_base=1_000_000.0, rms_eps=1e-5,
    ),
    # n_head * head_dim (512) differs from n_embd, as in the released models (64 x 64 vs 2880).
    # Layer 0 attends through a sliding window of 8 tokens, layer 1 to everything (llama.cpp's
    # default pattern for gpt-oss: every second layer full).
    "gptoss": dict(
        arch="gpt-oss", vocab="qwen2.5-harmony", seed=1007, n_layer=2, n_embd=256, n_head=8,
        n_head_kv=2, head_dim=64, n_expert=8, n_expert_used=4, n_ff_exp=256, tied=False,
        rope_base=150_000.0, rms_eps=1e-5, ctx=131_072, sliding_window=8,
        yarn_factor=32.0, yarn_orig_ctx=4096, wtypes=("f32", "bf16", "q8_0", "mxfp4"),
    ),
    # Three trunk layers (0 dense, 1-2 MoE) and NextN layer 3; rope over 32 of 64 dims per head.
    "glm4moe": dict(
        arch="glm4moe", vocab="qwen2.5-glm", seed=1008, n_layer=3, n_nextn=1, n_embd=256,
        n_head=4, n_head_kv=2, head_dim=64, n_rot=32, n_expert=16, n_expert_used=4,
        n_ff_exp=256, n_ff_dense=512, n_dense_lead=1, n_shared=1, weights_scale=2.5,
        qk_norm_layers=(2,), tied=False, rope_base=1_000_000.0, rms_eps=1e-5,
    ),
    # The same model with DeepSeek V3's group-limited routing switched on (llama.cpp reads
    # expert_group_count for every architecture): 4 groups of 4 experts, the best 2 groups
    # take part in each choice.
    "glm4moe-grouped": dict(
        arch="glm4moe", vocab="qwen2.5-glm", seed=1008, n_layer=3, n_nextn=1, n_embd=256,
        n_head=4, n_head_kv=2, head_dim=64, n_rot=32, n_expert=16, n_expert_used=4,
        n_ff_exp=256, n_ff_dense=512, n_dense_lead=1, n_shared=1, weights_scale=2.5,
        qk_norm_layers=(2,), tied=False, rope_base=1_000_000.0, rms_eps=1e-5,
        expert_groups=(4, 2), wtypes=("f32", "q8_0"),
    ),
    # DeepSeek V3's layout at a small size, in the absorbed MLA form that llama.cpp's converter
    # writes today (attn_k_b / attn_v_b): low-rank query (rank 256), compressed KV rank 256,
    # heads of 64 plain + 32 rotated query/key values and 64 value values, YaRN (x4, log
    # multiplier 0.1 as converted), one leading dense layer, then 16 experts top-4 by sigmoid
    # with a selection bias and group-limited routing (4 groups, best 2), renormalised and
    # scaled by 2.5, one shared expert, and a NextN layer.
    "deepseek2": dict(
        arch="deepseek2", vocab="qwen2.5-deepseek", seed=1009, n_layer=3, n_nextn=1,
        n_embd=256, n_head=4, q_lora=256, kv_lora=256, qk_nope=64, qk_rope=32, v_head=64,
        absorbed=True, n_expert=16, n_expert_used=4, n_ff_exp=256, n_ff_dense=512,
        n_dense_lead=1, n_shared=1, weights_scale=2.5, weights_norm=True, gating="sigmoid",
        selection_bias=True, expert_groups=(4, 2), tied=False, rope_base=10_000.0,
        rms_eps=1e-6, yarn_factor=4.0, yarn_orig_ctx=1024, yarn_log_mul=0.1,
        wtypes=("f32", "bf16", "q8_0", "q4_0"),
    ),
    # The same model with each MoE layer's gate and up experts in one ffn_gate_up_exps tensor
    # (per expert the 256 gate rows, then the 256 up rows), which llama.cpp takes for deepseek2.
    "deepseek2-fused": dict(
        arch="deepseek2", vocab="qwen2.5-deepseek", seed=1009, n_layer=3, n_nextn=1,
        n_embd=256, n_head=4, q_lora=256, kv_lora=256, qk_nope=64, qk_rope=32, v_head=64,
        absorbed=True, n_expert=16, n_expert_used=4, n_ff_exp=256, n_ff_dense=512,
        n_dense_lead=1, n_shared=1, weights_scale=2.5, weights_norm=True, gating="sigmoid",
        selection_bias=True, expert_groups=(4, 2), tied=False, rope_base=10_000.0,
        rms_eps=1e-6, yarn_factor=4.0, yarn_orig_ctx=1024, yarn_log_mul=0.1,
        fused_gate_up=True, wtypes=("f32", "q8_0"),
    ),
    # Gemma 4's MoE layout (the 26B-A4B's) at a small size: layers 0 and 1 attend through a
    # sliding window of 8 tokens with heads of 64 (rope over all 64, base 10^4), layer 2
    # attends fully with heads of 128 whose keys are also its values (no attn_v), rope over
    # all 128 with per-frequency divisors (rope_freqs, base 10^6); q/k RMSNorm per head and
    # a weightless RMSNorm of v; every layer has a dense GEGLU MLP (width 512) next to 8
    # experts (top-2, fused gate_up, a per-expert down scale), each with its own norms; the
    # router reads the attention output RMS-normalised, scaled by 1/16 and by its own scale
    # vector; layer 1 has a layer output scale; the logits are soft-capped at 30.
    "gemma4": dict(
        arch="gemma4", vocab="qwen2.5", seed=1011, n_layer=3, n_embd=256, n_head=4,
        n_head_kv=2, head_dim=128, head_dim_swa=64, swa_layers=(True, True, False),
        sliding_window=8, n_expert=8, n_expert_used=2, n_ff_exp=256, n_ff_dense=512,
        tied=False, rope_base=1_000_000.0, rope_base_swa=10_000.0, rms_eps=1e-6,
        softcap=30.0, wtypes=("f32", "q8_0"),
    ),
    # Qwen3.6's layout (qwen35moe) at a small size: layers 0-2 are Gated DeltaNet linear
    # attention (2 key heads and 4 value heads of 64, a causal convolution over 4 positions),
    # layer 3 full attention (the default interval of 4) with a sigmoid output gate from a
    # doubled q projection, q/k RMSNorm per head and interleaved M-RoPE over 16 of 64 dims in
    # sections of 2/2/2/2 pairs (the last section's pairs rotate by the fourth position, 0 for
    # text); 16 experts top-4 plus a sigmoid-gated shared expert after a post-attention norm.
    "qwen35moe": dict(
        arch="qwen35moe", vocab="qwen2.5", seed=1012, n_layer=4, n_embd=256, n_head=4,
        n_head_kv=2, head_dim=64, n_rot=16, rope_sections=(2, 2, 2, 2), n_expert=16,
        n_expert_used=4, n_ff_exp=256, n_ff_shexp=256, ssm_state=64, ssm_k_heads=2,
        ssm_v_heads=4, ssm_conv=4, full_attention_interval=4, tied=False,
        rope_base=10_000_000.0, rms_eps=1e-6, wtypes=("f32", "q8_0"),
    ),
    # Qwen3-Next-80B-A3B's layout (qwen3next) at a small size: qwen35moe's shape (layers 0-2
    # Gated DeltaNet with 2 key heads and 4 value heads of 64, layer 3 full attention with the
    # gated q projection and q/k RMSNorm per head) with what Qwen3-Next does otherwise: plain
    # NEOX rope over 16 of 64 dims (the real model's 64 of 256), beta and alpha in one ssm_ba
    # (per key head the betas of its value heads, then their alphas), each key head's two value
    # heads stored together (value head h reads key head h / 2), and one NextN layer after the
    # trunk (block_count 5), which decoding does not run. qwen3next-legacy: the same weights
    # with attn_qkv and attn_gate in one ssm_in, as the first converter wrote them.
    "qwen3next": dict(
        arch="qwen3next", vocab="qwen2.5", seed=1015, n_layer=4, n_nextn=1, n_embd=256,
        n_head=4, n_head_kv=2, head_dim=64, n_rot=16, n_expert=16, n_expert_used=4,
        n_ff_exp=256, n_ff_shexp=256, ssm_state=64, ssm_k_heads=2, ssm_v_heads=4, ssm_conv=4,
        full_attention_interval=4, tied=False, rope_base=10_000_000.0, rms_eps=1e-6,
        wtypes=("f32", "q8_0"),
    ),
    "qwen3next-legacy": dict(
        arch="qwen3next", vocab="qwen2.5", seed=1015, n_layer=4, n_nextn=1, n_embd=256,
        n_head=4, n_head_kv=2, head_dim=64, n_rot=16, n_expert=16, n_expert_used=4,
        n_ff_exp=256, n_ff_shexp=256, ssm_state=64, ssm_k_heads=2, ssm_v_heads=4, ssm_conv=4,
        full_attention_interval=4, tied=False, rope_base=10_000_000.0, rms_eps=1e-6,
        ssm_in=True, wtypes=("f32", "q8_0"),
    ),
    # DeepSeek-V2-Lite's layout: the legacy MLA form (attn_kv_b, from files converted before
    # the absorbed form), a single query projection (q_lora_rank 0), softmax routing (no
    # expert_gating_func key, as in V2 files) without selection bias or renormalisation, two
    # shared experts, no YaRN.
    "deepseek2-lite": dict(
        arch="deepseek2", vocab="qwen2.5-deepseek", seed=1010, n_layer=3, n_nextn=0,
        n_embd=256, n_head=4, q_lora=0, kv_lora=256, qk_nope=64, qk_rope=32, v_head=64,
        absorbed=False, n_expert=16, n_expert_used=4, n_ff_exp=256, n_ff_dense=512,
        n_dense_lead=1, n_shared=2, weights_scale=None, weights_norm=False, gating=None,
        selection_bias=False, tied=False, rope_base=10_000.0, rms_eps=1e-6,
        wtypes=("f32", "q8_0", "q4_0"),
    ),
    # Qwen3-VL-30B-A3B's text model (qwen3vlmoe) at a small size: qwen3moe's layers (q/k
    # RMSNorm per head, softmax routing renormalised over the top 4) with interleaved M-RoPE
    # over all 64 dims of a head (llama.cpp insists on rope over whole heads) in sections of
    # 20/6/6/0 pairs: for text the three first streams carry the token's position and the
    # fourth 0, and llama.cpp's interleaving puts pairs 19, 20, 22, 23, 25, 26, 28, 29 and 31
    # on the fourth stream, so they do not rotate (the real model's 24/20/20/0 over 64 pairs
    # leaves pairs 61 and 62 so); rope base 10^4 so that those pairs would turn noticeably.
    # Two deepstack layers: llama.cpp adds the zero-padded input columns of a text token
    # after layers 0 and 1.
    "qwen3vlmoe": dict(
        arch="qwen3vlmoe", vocab="qwen2.5", seed=1013, n_layer=3, n_embd=256, n_head=4,
        n_head_kv=2, head_dim=64, rope_sections=(20, 6, 6, 0), n_deepstack=2, n_expert=16,
        n_expert_used=4, n_ff_exp=256, tied=False, rope_base=10_000.0, rms_eps=1e-6,
        wtypes=("f32", "q8_0"),
    ),
    # Granite 3.x MoE (granite-3.1-3b-a800m's layout) at a small size: llama-like attention
    # with NORM rope, 12 experts top-3 whose width is feed_forward_length (llama.cpp reads no
    # expert_feed_forward_length for granitemoe), and the four Granite multipliers, each far
    # from its neutral value so that a missing one shows: input embeddings times 5, attention
    # scores times 0.3 (instead of 1/8), each attention and MoE output times 0.35 before its
    # residual add, logits times 1/6 (the output projection is drawn 6 times larger than the
    # other models' so that the logits spread alike).
    "granitemoe": dict(
        arch="granitemoe", vocab="refact-granite", seed=1014, n_layer=3, n_embd=256,
        n_head=4, n_head_kv=2, head_dim=64, n_expert=12, n_expert_used=3, n_ff_exp=256,
        tied=False, rope_base=10_000.0, rms_eps=1e-6, embedding_scale=5.0,
        attention_scale=0.3, residual_scale=0.35, logit_scale=6.0, output_scale=24.0,
        wtypes=("f32", "q8_0"),
    ),
    # MiniMax-M2's layout at a small size: heads of 128 (4 query, 2 key/value heads, so the
    # query projection is 512 wide where n_embd is 256, as the released model's 6144 against
    # 3072), RMSNorm over the whole query projection and over the whole key projection, NEOX
    # rope over the first 64 dims of each head; 16 experts top-4 by sigmoid with a selection
    # bias (exp_probs_b), renormalised; no shared expert, no dense layer.
    "minimax": dict(
        arch="minimax-m2", vocab="qwen2.5-minimax", seed=1015, n_layer=2, n_embd=256,
        n_head=4, n_head_kv=2, head_dim=128, n_rot=64, n_expert=16, n_expert_used=4,
        n_ff_exp=256, tied=False, rope_base=10_000.0, rms_eps=1e-6, wtypes=("f32", "q8_0"),
    ),
    # SmallThinker's layout (smallthinker) at a small size: three layers; the router of each
    # reads the layer's input (the residual stream before attn_norm), so its experts are known
    # before the attention; ReLU-gated experts (relu(gate) * up); 16 experts top-4 by sigmoid,
    # renormalised. attention.sliding_window is set, so llama.cpp attends through a window of
    # 4096 on every layer but each fourth from layer 0 (layers 1 and 2 here; the prompts are
    # shorter than the window) and drops rope on every fourth layer from 0 (layer 0: NoPE; a
    # model of exactly 4 layers would keep rope everywhere).
    "smallthinker": dict(
        arch="smallthinker", vocab="qwen2.5", seed=1016, n_layer=3, n_embd=256,
        n_head=4, n_head_kv=2, head_dim=64, n_expert=16, n_expert_used=4, n_ff_exp=256,
        tied=False, rope_base=1_000_000.0, rms_eps=1e-6, sliding_window=4096,
        wtypes=("f32", "q8_0"),
    ),
    # Ling 2.0's layout (bailingmoe2, Ling-mini-2.0's) at a small size: one attn_qkv tensor per
    # layer (256 query rows, then 128 key and 128 value rows), q/k RMSNorm per head, NEOX rope
    # over 32 of 64 dims per head, layer 0 dense, then 16 experts top-4 by sigmoid with a
    # selection bias and group-limited routing (4 groups, best 2), renormalised and scaled by
    # 2.5, one shared expert; NextN layer 3 with its layer_output_norm (llama.cpp keeps it
    # without running it).
    # Llama 4's layout (llama4, Llama-4-Scout's) at a small size: four layers, NORM rope with
    # rope_freqs divisors; llama.cpp runs layers 0-2 in chunks of 8192 positions (longer than
    # any prompt here) with a weightless RMS norm of the rotated q/k heads, and layer 3 (every
    # fourth from 3) without rope, attending fully, its queries scaled by the attention
    # temperature (1 below position 8191); interleave_moe_layer_step 2: layers 1 and 3 have 16
    # experts top-1 chosen on the raw logits, each expert's input times the sigmoid weight, and
    # an ungated shared expert as wide as the experts; layers 0 and 2 a dense FFN of 512.
    "llama4": dict(
        arch="llama4", vocab="qwen2.5", seed=1017, n_layer=4, n_embd=256,
        n_head=4, n_head_kv=2, head_dim=64, n_expert=16, n_expert_used=1, n_ff_exp=256,
        n_ff_dense=512, moe_step=2, tied=False, rope_base=500_000.0, rms_eps=1e-5,
        wtypes=("f32", "q8_0"),
    ),
    "bailingmoe2": dict(
        arch="bailingmoe2", vocab="qwen2.5-ling", seed=1015, n_layer=3, n_nextn=1, n_embd=256,
        n_head=4, n_head_kv=2, head_dim=64, n_rot=32, n_expert=16, n_expert_used=4,
        n_ff_exp=256, n_ff_dense=512, n_dense_lead=1, n_shared=1, weights_scale=2.5,
        expert_groups=(4, 2), tied=False, rope_base=600_000.0, rms_eps=1e-6,
        wtypes=("f32", "q8_0"),
    ),
    # LFM2-8B-A1B's layout (lfm2moe) at a small size: short-convolution layers 0 and 3 (the
    # published model's last layer is one too), attention layers 1 and 2 (head_count_kv 0 marks
    # the others), a leading dense layer of width 512, then 16 experts top-4 with sigmoid
    # routing and a selection bias; the output tied to the embedding, as the released files.
    "lfm2moe": dict(
        arch="lfm2moe", vocab="qwen2.5-lfm2", seed=1017, n_layer=4, n_embd=256, n_head=4,
        n_head_kv=2, head_dim=64, conv_layers=(0, 3), l_cache=3, n_expert=16,
        n_expert_used=4, n_ff_exp=256, n_ff_dense=512, n_dense_lead=1, tied=True,
        rope_base=1_000_000.0, rms_eps=1e-5, wtypes=("f32", "q8_0"),
    ),
    # Nemotron 3's layout (nemotron_h_moe, Nemotron-3-Nano-30B-A3B's) at a small size: six
    # layers, each one block after its attn_norm: Mamba-2 (M: 0, 2, 5), MoE (E: 1, 4) and
    # attention without rope (*: 3; 4 query and 2 key/value heads of 64). Mamba-2: d_inner
    # 512 in 8 heads of 64, B and C in 2 groups with a state of 64, a convolution over 4
    # positions with a bias; MoE: 16 experts top-4 of width 128, sigmoid routing with a
    # selection bias, renormalised and scaled by 2.5, one shared expert of width 256, all
    # ReLU² without gate. nemotron_h_moe-latent: the same with moe_latent_size 128 (the
    # experts read ffn_latent_down's projection of the input and their sum goes through
    # ffn_latent_up, as in Nemotron 3 Super).
    "nemotron_h_moe": dict(
        arch="nemotron_h_moe", vocab="qwen2.5-nemotron", seed=1018, n_layer=6,
        pattern="MEM*EM", n_embd=256, n_head=4, n_head_kv=2, head_dim=64, ssm_conv=4,
        ssm_inner=512, ssm_state=64, ssm_heads=8, ssm_groups=2, n_expert=16,
        n_expert_used=4, n_ff_exp=128, n_ff_shexp=256, n_shared=1, weights_scale=2.5,
        tied=False, rms_eps=1e-5, wtypes=("f32", "q8_0"),
    ),
    "nemotron_h_moe-latent": dict(
        arch="nemotron_h_moe", vocab="qwen2.5-nemotron", seed=1018, n_layer=6,
        pattern="MEM*EM", n_embd=256, n_head=4, n_head_kv=2, head_dim=64, ssm_conv=4,
        ssm_inner=512, ssm_state=64, ssm_heads=8, ssm_groups=2, n_expert=16,
        n_expert_used=4, n_ff_exp=128, n_ff_shexp=256, n_shared=1, weights_scale=2.5,
        moe_latent=128, tied=False, rms_eps=1e-5, wtypes=("f32", "q8_0"),
    ),
}

CTX = 4096
ROUTER_SCALE = 1.5
# gpt-oss: spread of the router bias (comparable to the router logits', so that it changes the
# choice), and the scales of the expert projections: gate and up values reach past the clamp
# limit 7 of the SwiGLU now and then, and down is scaled so the expert output stays near unit
# size.
GPTOSS_ROUTER_BIAS = 1.0
GPTOSS_GATE_UP_SCALE = 3.0
GPTOSS_DOWN_SCALE = 0.15
# glm4moe: spread of the expert selection bias (exp_probs_b), added to sigmoid probabilities.
GLM_SELECTION_BIAS = 0.1
# nemotron_h_moe's Mamba-2 layers: the spread of the dt rows of ssm_in, and the ranges of the
# dt bias and of A_log (A = -exp(A_log)): softplus(dt) stays near 0.3..1 and each head keeps
# between about 0.4 and 0.9 of its state per token.
NEMOTRON_DT_SCALE = 0.3
NEMOTRON_DT_BIAS = (-1.0, 0.5)
NEMOTRON_A_LOG = (-1.5, 0.0)


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def trimmed_vocab(vocab_dir, template_dir, name):
    """Returns a dict with the trimmed vocabulary's tokenizer metadata."""
    spec = VOCABS[name]
    r = gguf.GGUFReader(os.path.join(vocab_dir, spec["file"]))
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    scores = field(r, "tokenizer.ggml.scores")
    merges = field(r, "tokenizer.ggml.merges")
    n = spec["keep"]
    ids = list(range(n))
    index = {t: i for i, t in enumerate(tokens)}
    for t in spec["extra"]:
        ids.append(index[t])
    remap = {old: new for new, old in enumerate(ids)}
    rename = spec.get("rename", {})
    out = {
        "model": field(r, "tokenizer.ggml.model"),
        "pre": field(r, "tokenizer.ggml.pre"),
        "tokens": [rename.get(tokens[i], tokens[i]) for i in ids],
        "token_type": [int(types[i]) for i in ids],
        "source": spec["file"],
        "keep": n,
    }
    for t in spec.get("new", []):
        if t in index:
            sys.exit(f"{t} is already in {spec['file']}")
        out["tokens"].append(t)
        out["token_type"].append(int(gguf.TokenType.CONTROL))
    if scores is not None:
        out["scores"] = [float(scores[i]) for i in ids] + [0.0] * len(spec.get("new", []))
    if merges is not None:
        kept = set(out["tokens"])
        out["merges"] = []
        for m in merges:
            left, right = m.split(" ", 1)
            if left in kept and right in kept and left + right in kept:
                out["merges"].append(m)
    for key in ("bos", "eos", "unknown", "padding"):
        old = field(r, f"tokenizer.ggml.{key}_token_id")
        if old is not None and int(old) in remap:
            out[key] = remap[int(old)]
    for key in ("add_bos_token", "add_eos_token", "add_space_prefix"):
        v = field(r, f"tokenizer.ggml.{key}")
        if v is not None:
            out[key] = bool(v)
    tmpl = field(r, "tokenizer.chat_template")
    if tmpl is not None:
        out["chat_template"] = tmpl
    if "eos" in spec:
        out["eos"] = out["tokens"].index(spec["eos"])
    if "bos" in spec:
        out["bos"] = out["tokens"].index(spec["bos"])
    if "pad" in spec:
        out["padding"] = out["tokens"].index(spec["pad"])
    if "add_bos" in spec:
        out["add_bos_token"] = spec["add_bos"]
    if "template" in spec:
        with open(os.path.join(template_dir, spec["template"]), encoding="utf-8") as f:
            out["chat_template"] = f.read()
    return out


def draws(rng):
    """The random draws every layout uses: a projection (normal, standard deviation
    scale/sqrt(row length)), a norm weight (1 + 0.1 normal) and a bias (scale times normal)."""

    def lin(rows, cols, scale=1.0):
        return (rng.standard_normal((rows, cols)) * (scale / np.sqrt(cols))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(shape, scale=0.1):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    return lin, norm, bias


def make_weights(cfg, n_vocab):
    """Random weights in a fixed order: name -> float32 array (numpy shape, ggml's reversed)."""
    rng = np.random.default_rng(cfg["seed"])
    e, hd = cfg["n_embd"], cfg["head_dim"]
    nq, nkv = cfg["n_head"] * hd, cfg["n_head_kv"] * hd
    ne, ff = cfg["n_expert"], cfg["n_ff_exp"]

    lin, norm, _ = draws(rng)

    w = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, e)).astype(np.float32)
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(e)
        w[p + "attn_q.weight"] = lin(nq, e)
        w[p + "attn_k.weight"] = lin(nkv, e)
        w[p + "attn_v.weight"] = lin(nkv, e)
        if cfg["arch"] == "qwen2moe":
            w[p + "attn_q.bias"] = (0.1 * rng.standard_normal(nq)).astype(np.float32)
            w[p + "attn_k.bias"] = (0.1 * rng.standard_normal(nkv)).astype(np.float32)
            w[p + "attn_v.bias"] = (0.1 * rng.standard_normal(nkv)).astype(np.float32)
        w[p + "attn_output.weight"] = lin(e, nq)
        if cfg["arch"] in ("qwen3moe", "qwen3vlmoe"):
            w[p + "attn_q_norm.weight"] = norm(hd)
            w[p + "attn_k_norm.weight"] = norm(hd)
        elif cfg["arch"] in ("olmoe", "minimax-m2"):
            w[p + "attn_q_norm.weight"] = norm(nq)
            w[p + "attn_k_norm.weight"] = norm(nkv)
        w[p + "ffn_norm.weight"] = norm(e)
        # Router logits of about unit spread: the top-k choice is clear in probability terms
        # (a much larger spread leaves the k-th and (k+1)-th probabilities both near zero).
        w[p + "ffn_gate_inp.weight"] = lin(ne, e, ROUTER_SCALE)
        if cfg["arch"] == "minimax-m2":
            w[p + "exp_probs_b.bias"] = (
                GLM_SELECTION_BIAS * rng.standard_normal(ne)
            ).astype(np.float32)
        w[p + "ffn_gate_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
        w[p + "ffn_up_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
        w[p + "ffn_down_exps.weight"] = np.stack([lin(e, ff) for _ in range(ne)])
        if cfg["arch"] == "qwen2moe":
            sh = cfg["n_ff_shexp"]
            w[p + "ffn_gate_inp_shexp.weight"] = (rng.standard_normal(e) / np.sqrt(e)).astype(
                np.float32
            )
            w[p + "ffn_gate_shexp.weight"] = lin(sh, e)
            w[p + "ffn_up_shexp.weight"] = lin(sh, e)
            w[p + "ffn_down_shexp.weight"] = lin(e, sh)
    w["output_norm.weight"] = norm(e)
    if not cfg["tied"]:
        # Scaled up so that the logits spread widely and greedy choices are clear.
        w["output.weight"] = lin(n_vocab, e, cfg.get("output_scale", 4.0))
    return w


def make_weights_gptoss(cfg, n_vocab):
    """The gpt-oss layout (llama.cpp's LLM_ARCH_OPENAI_MOE), in a fixed order like make_weights."""
    rng = np.random.default_rng(cfg["seed"])
    e, hd = cfg["n_embd"], cfg["head_dim"]
    nq, nkv = cfg["n_head"] * hd, cfg["n_head_kv"] * hd
    ne, ff = cfg["n_expert"], cfg["n_ff_exp"]

    lin, norm, bias = draws(rng)

    w = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, e)).astype(np.float32)
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(e)
        w[p + "attn_q.weight"] = lin(nq, e)
        w[p + "attn_q.bias"] = bias(nq)
        w[p + "attn_k.weight"] = lin(nkv, e)
        w[p + "attn_k.bias"] = bias(nkv)
        w[p + "attn_v.weight"] = lin(nkv, e)
        w[p + "attn_v.bias"] = bias(nkv)
        w[p + "attn_output.weight"] = lin(e, nq)
        w[p + "attn_output.bias"] = bias(e)
        # One sink logit per query head, in the range of the attention scores.
        w[p + "attn_sinks.weight"] = rng.uniform(-1.0, 2.0, cfg["n_head"]).astype(np.float32)
        w[p + "post_attention_norm.weight"] = norm(e)
        w[p + "ffn_gate_inp.weight"] = lin(ne, e, ROUTER_SCALE)
        w[p + "ffn_gate_inp.bias"] = bias(ne, GPTOSS_ROUTER_BIAS)
        w[p + "ffn_gate_exps.weight"] = np.stack(
            [lin(ff, e, GPTOSS_GATE_UP_SCALE) for _ in range(ne)]
        )
        w[p + "ffn_gate_exps.bias"] = bias((ne, ff))
        w[p + "ffn_up_exps.weight"] = np.stack(
            [lin(ff, e, GPTOSS_GATE_UP_SCALE) for _ in range(ne)]
        )
        w[p + "ffn_up_exps.bias"] = bias((ne, ff))
        w[p + "ffn_down_exps.weight"] = np.stack(
            [lin(e, ff, GPTOSS_DOWN_SCALE) for _ in range(ne)]
        )
        w[p + "ffn_down_exps.bias"] = bias((ne, e))
    w["output_norm.weight"] = norm(e)
    w["output.weight"] = lin(n_vocab, e, 4.0)
    return w


def lead_moe_nextn(w, p, il, cfg, lin, norm, bias, selection_bias, nextn_out_norm=False):
    """The rest of a glm4moe, deepseek2 or bailingmoe2 layer after its FFN norm, in a fixed
    draw order: a dense FFN in the leading layers, else the router, the selection bias (when
    the model has one; comparable to the spread of the sigmoid probabilities, so that it
    changes choices), the experts and the shared experts; then, past the trunk, the NextN
    tensors (with layer_output_norm instead of nextn.shared_head_norm where nextn_out_norm)."""
    e, ne, ff = cfg["n_embd"], cfg["n_expert"], cfg["n_ff_exp"]
    sh = ff * cfg["n_shared"]
    if il < cfg["n_dense_lead"]:
        w[p + "ffn_gate.weight"] = lin(cfg["n_ff_dense"], e)
        w[p + "ffn_up.weight"] = lin(cfg["n_ff_dense"], e)
        w[p + "ffn_down.weight"] = lin(e, cfg["n_ff_dense"])
    else:
        w[p + "ffn_gate_inp.weight"] = lin(ne, e, ROUTER_SCALE)
        if selection_bias:
            w[p + "exp_probs_b.bias"] = bias(ne, GLM_SELECTION_BIAS)
        w[p + "ffn_gate_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
        w[p + "ffn_up_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
        w[p + "ffn_down_exps.weight"] = np.stack([lin(e, ff) for _ in range(ne)])
        w[p + "ffn_gate_shexp.weight"] = lin(sh, e)
        w[p + "ffn_up_shexp.weight"] = lin(sh, e)
        w[p + "ffn_down_shexp.weight"] = lin(e, sh)
    if il >= cfg["n_layer"]:
        w[p + "nextn.eh_proj.weight"] = lin(e, 2 * e)
        w[p + "nextn.enorm.weight"] = norm(e)
        w[p + "nextn.hnorm.weight"] = norm(e)
        if nextn_out_norm:
            w[p + "layer_output_norm.weight"] = norm(e)
        else:
            w[p + "nextn.shared_head_norm.weight"] = norm(e)


def make_weights_glm4moe(cfg, n_vocab):
    """The glm4moe layout (llama.cpp's LLM_ARCH_GLM4_MOE), in a fixed order like make_weights."""
    rng = np.random.default_rng(cfg["seed"])
    e, hd = cfg["n_embd"], cfg["head_dim"]
    nq, nkv = cfg["n_head"] * hd, cfg["n_head_kv"] * hd

    lin, norm, bias = draws(rng)

    w = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, e)).astype(np.float32)
    for il in range(cfg["n_layer"] + cfg["n_nextn"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(e)
        w[p + "attn_q.weight"] = lin(nq, e)
        w[p + "attn_q.bias"] = bias(nq)
        w[p + "attn_k.weight"] = lin(nkv, e)
        w[p + "attn_k.bias"] = bias(nkv)
        w[p + "attn_v.weight"] = lin(nkv, e)
        w[p + "attn_v.bias"] = bias(nkv)
        w[p + "attn_output.weight"] = lin(e, nq)
        if il in cfg["qk_norm_layers"]:
            w[p + "attn_q_norm.weight"] = norm(hd)
            w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "post_attention_norm.weight"] = norm(e)
        lead_moe_nextn(w, p, il, cfg, lin, norm, bias, selection_bias=True)
    w["output_norm.weight"] = norm(e)
    w["output.weight"] = lin(n_vocab, e, 4.0)
    return w


def make_weights_llama4(cfg, n_vocab):
    """The llama4 layout (llama.cpp's LLM_ARCH_LLAMA4), in a fixed order like
    make_weights: a global rope_freqs, then per layer attention, and a dense FFN or the
    router, the experts and the shared expert (every moe_step-th layer)."""
    rng = np.random.default_rng(cfg["seed"])
    e, hd = cfg["n_embd"], cfg["head_dim"]
    nq, nkv = cfg["n_head"] * hd, cfg["n_head_kv"] * hd
    ne, ff, fd = cfg["n_expert"], cfg["n_ff_exp"], cfg["n_ff_dense"]
    lin, norm, _ = draws(rng)
    w = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, e)).astype(np.float32)
    w["rope_freqs.weight"] = (1.0 + 3.0 * rng.random(hd // 2)).astype(np.float32)
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(e)
        w[p + "attn_q.weight"] = lin(nq, e)
        w[p + "attn_k.weight"] = lin(nkv, e)
        w[p + "attn_v.weight"] = lin(nkv, e)
        w[p + "attn_output.weight"] = lin(e, nq)
        w[p + "ffn_norm.weight"] = norm(e)
        if (il + 1) % cfg["moe_step"] != 0:
            w[p + "ffn_gate.weight"] = lin(fd, e)
            w[p + "ffn_up.weight"] = lin(fd, e)
            w[p + "ffn_down.weight"] = lin(e, fd)
            continue
        w[p + "ffn_gate_inp.weight"] = lin(ne, e, ROUTER_SCALE)
        w[p + "ffn_gate_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
        w[p + "ffn_up_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
        w[p + "ffn_down_exps.weight"] = np.stack([lin(e, ff) for _ in range(ne)])
        w[p + "ffn_gate_shexp.weight"] = lin(ff, e)
        w[p + "ffn_up_shexp.weight"] = lin(ff, e)
        w[p + "ffn_down_shexp.weight"] = lin(e, ff)
    w["output_norm.weight"] = norm(e)
    w["output.weight"] = lin(n_vocab, e, cfg.get("output_scale", 4.0))
    return w


def make_weights_bailingmoe2(cfg, n_vocab):
    """The bailingmoe2 layout (llama.cpp's LLM_ARCH_BAILINGMOE2), in a fixed order like
    make_weights; attn_qkv is the q, k and v projections one after the other."""
    rng = np.random.default_rng(cfg["seed"])
    e, hd = cfg["n_embd"], cfg["head_dim"]
    nq, nkv = cfg["n_head"] * hd, cfg["n_head_kv"] * hd

    lin, norm, bias = draws(rng)

    w = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, e)).astype(np.float32)
    for il in range(cfg["n_layer"] + cfg["n_nextn"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(e)
        w[p + "attn_qkv.weight"] = np.concatenate([lin(nq, e), lin(nkv, e), lin(nkv, e)])
        w[p + "attn_output.weight"] = lin(e, nq)
        w[p + "attn_q_norm.weight"] = norm(hd)
        w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "ffn_norm.weight"] = norm(e)
        lead_moe_nextn(w, p, il, cfg, lin, norm, bias, selection_bias=True, nextn_out_norm=True)
    w["output_norm.weight"] = norm(e)
    w["output.weight"] = lin(n_vocab, e, 4.0)
    return w


def make_weights_deepseek2(cfg, n_vocab):
    """The deepseek2 layout (llama.cpp's LLM_ARCH_DEEPSEEK2), in a fixed order like
    make_weights. attn_kv_b is drawn in both forms; the absorbed form splits it as llama.cpp's
    converter does (per head: the plain key rows, transposed, into attn_k_b; the value rows
    into attn_v_b)."""
    rng = np.random.default_rng(cfg["seed"])
    e, nh = cfg["n_embd"], cfg["n_head"]
    nope, rot, vh, r = cfg["qk_nope"], cfg["qk_rope"], cfg["v_head"], cfg["kv_lora"]

    lin, norm, bias = draws(rng)

    w = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, e)).astype(np.float32)
    for il in range(cfg["n_layer"] + cfg["n_nextn"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(e)
        if cfg["q_lora"]:
            w[p + "attn_q_a.weight"] = lin(cfg["q_lora"], e)
            w[p + "attn_q_a_norm.weight"] = norm(cfg["q_lora"])
            w[p + "attn_q_b.weight"] = lin(nh * (nope + rot), cfg["q_lora"])
        else:
            w[p + "attn_q.weight"] = lin(nh * (nope + rot), e)
        w[p + "attn_kv_a_mqa.weight"] = lin(r + rot, e)
        w[p + "attn_kv_a_norm.weight"] = norm(r)
        kv_b = lin(nh * (nope + vh), r)
        if cfg["absorbed"]:
            kv_b = kv_b.reshape(nh, nope + vh, r)
            w[p + "attn_k_b.weight"] = np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1))
            w[p + "attn_v_b.weight"] = np.ascontiguousarray(kv_b[:, nope:, :])
        else:
            w[p + "attn_kv_b.weight"] = kv_b
        w[p + "attn_output.weight"] = lin(e, nh * vh)
        w[p + "ffn_norm.weight"] = norm(e)
        lead_moe_nextn(w, p, il, cfg, lin, norm, bias, selection_bias=cfg["selection_bias"])
    w["output_norm.weight"] = norm(e)
    w["output.weight"] = lin(n_vocab, e, 4.0)
    return w


def fuse_gate_up(weights):
    """The same weights with every ffn_gate_exps / ffn_up_exps pair replaced by one
    ffn_gate_up_exps (per expert the gate rows, then the up rows), in the gate's place."""
    out = {}
    for name, arr in weights.items():
        if name.endswith("ffn_gate_exps.weight"):
            up = weights[name.replace("ffn_gate_exps", "ffn_up_exps")]
            out[name.replace("ffn_gate_exps", "ffn_gate_up_exps")] = np.concatenate(
                [arr, up], axis=1
            )
        elif not name.endswith("ffn_up_exps.weight"):
            out[name] = arr
    return out


def make_weights_gemma4(cfg, n_vocab):
    """The gemma4 layout (llama.cpp's LLM_ARCH_GEMMA4, MoE layers), in a fixed order like
    make_weights."""
    rng = np.random.default_rng(cfg["seed"])
    e, ne, ff, fd = cfg["n_embd"], cfg["n_expert"], cfg["n_ff_exp"], cfg["n_ff_dense"]

    lin, norm, _ = draws(rng)

    w = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, e)).astype(np.float32)
    full = [il for il, swa in enumerate(cfg["swa_layers"]) if not swa]
    # proportional rope: one divisor per rotated pair of the full-attention heads
    w["rope_freqs.weight"] = (1.0 + 3.0 * rng.random(cfg["head_dim"] // 2)).astype(np.float32)
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        hd = cfg["head_dim_swa"] if cfg["swa_layers"][il] else cfg["head_dim"]
        nq, nkv = cfg["n_head"] * hd, cfg["n_head_kv"] * hd
        w[p + "attn_norm.weight"] = norm(e)
        w[p + "attn_q.weight"] = lin(nq, e)
        w[p + "attn_k.weight"] = lin(nkv, e)
        if il not in full:
            w[p + "attn_v.weight"] = lin(nkv, e)
        w[p + "attn_output.weight"] = lin(e, nq)
        w[p + "attn_q_norm.weight"] = norm(hd)
        w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "post_attention_norm.weight"] = norm(e)
        if il == 1:
            w[p + "layer_output_scale.weight"] = np.array([0.75], dtype=np.float32)
        w[p + "ffn_norm.weight"] = norm(e)
        w[p + "ffn_gate.weight"] = lin(fd, e)
        w[p + "ffn_up.weight"] = lin(fd, e)
        w[p + "ffn_down.weight"] = lin(e, fd)
        w[p + "post_ffw_norm.weight"] = norm(e)
        w[p + "ffn_gate_inp.weight"] = lin(ne, e, ROUTER_SCALE)
        w[p + "ffn_gate_inp.scale"] = norm(e)
        w[p + "pre_ffw_norm_2.weight"] = norm(e)
        w[p + "post_ffw_norm_1.weight"] = norm(e)
        w[p + "post_ffw_norm_2.weight"] = norm(e)
        gate = np.stack([lin(ff, e) for _ in range(ne)])
        up = np.stack([lin(ff, e) for _ in range(ne)])
        w[p + "ffn_gate_up_exps.weight"] = np.concatenate([gate, up], axis=1)
        w[p + "ffn_down_exps.weight"] = np.stack([lin(e, ff) for _ in range(ne)])
        w[p + "ffn_down_exps.scale"] = (0.5 + rng.random(ne)).astype(np.float32)
    w["output_norm.weight"] = norm(e)
    w["output.weight"] = lin(n_vocab, e, 4.0)
    return w


def make_weights_qwen35moe(cfg, n_vocab):
    """The qwen35moe layout (llama.cpp's LLM_ARCH_QWEN35MOE), in a fixed order like
    make_weights."""
    rng = np.random.default_rng(cfg["seed"])
    e, hd = cfg["n_embd"], cfg["head_dim"]
    nq, nkv = cfg["n_head"] * hd, cfg["n_head_kv"] * hd
    ne, ff, sh = cfg["n_expert"], cfg["n_ff_exp"], cfg["n_ff_shexp"]
    sk, hk, hv = cfg["ssm_state"], cfg["ssm_k_heads"], cfg["ssm_v_heads"]
    key_dim, value_dim = sk * hk, sk * hv
    conv_dim = 2 * key_dim + value_dim

    lin, norm, bias = draws(rng)

    w = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, e)).astype(np.float32)
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(e)
        if (il + 1) % cfg["full_attention_interval"] != 0:
            w[p + "attn_qkv.weight"] = lin(conv_dim, e)
            w[p + "attn_gate.weight"] = lin(value_dim, e)
            w[p + "ssm_conv1d.weight"] = lin(conv_dim, cfg["ssm_conv"])
            # decay exp(softplus(alpha + dt) * a): about 0.8 per token for alpha near 0
            w[p + "ssm_dt.bias"] = bias(hv, 0.5) - 1.0
            w[p + "ssm_a"] = -(0.1 + rng.random(hv)).astype(np.float32)
            w[p + "ssm_beta.weight"] = lin(hv, e)
            w[p + "ssm_alpha.weight"] = lin(hv, e)
            w[p + "ssm_norm.weight"] = norm(sk)
            w[p + "ssm_out.weight"] = lin(e, value_dim)
        else:
            w[p + "attn_q.weight"] = lin(2 * nq, e)
            w[p + "attn_k.weight"] = lin(nkv, e)
            w[p + "attn_v.weight"] = lin(nkv, e)
            w[p + "attn_output.weight"] = lin(e, nq)
            w[p + "attn_q_norm.weight"] = norm(hd)
            w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "post_attention_norm.weight"] = norm(e)
        w[p + "ffn_gate_inp.weight"] = lin(ne, e, ROUTER_SCALE)
        w[p + "ffn_gate_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
        w[p + "ffn_up_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
        w[p + "ffn_down_exps.weight"] = np.stack([lin(e, ff) for _ in range(ne)])
        w[p + "ffn_gate_inp_shexp.weight"] = (rng.standard_normal(e) / np.sqrt(e)).astype(
            np.float32
        )
        w[p + "ffn_gate_shexp.weight"] = lin(sh, e)
        w[p + "ffn_up_shexp.weight"] = lin(sh, e)
        w[p + "ffn_down_shexp.weight"] = lin(e, sh)
    w["output_norm.weight"] = norm(e)
    w["output.weight"] = lin(n_vocab, e, 4.0)
    return w


def make_weights_qwen3next(cfg, n_vocab):
    """The qwen3next layout (llama.cpp's LLM_ARCH_QWEN3NEXT), in a fixed order like
    make_weights; with cfg["ssm_in"], each linear layer's attn_qkv and attn_gate rows are
    written as one ssm_in grouped by key head (the same model)."""
    rng = np.random.default_rng(cfg["seed"])
    e, hd = cfg["n_embd"], cfg["head_dim"]
    nq, nkv = cfg["n_head"] * hd, cfg["n_head_kv"] * hd
    ne, ff, sh = cfg["n_expert"], cfg["n_ff_exp"], cfg["n_ff_shexp"]
    sk, hk, hv = cfg["ssm_state"], cfg["ssm_k_heads"], cfg["ssm_v_heads"]
    key_dim, value_dim = sk * hk, sk * hv
    conv_dim = 2 * key_dim + value_dim
    vg = value_dim // hk  # the values (and gates) of one key head

    lin, norm, bias = draws(rng)

    w = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, e)).astype(np.float32)
    for il in range(cfg["n_layer"] + cfg["n_nextn"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(e)
        if il < cfg["n_layer"] and (il + 1) % cfg["full_attention_interval"] != 0:
            qkv = lin(conv_dim, e)
            gate = lin(value_dim, e)
            if cfg.get("ssm_in"):
                # per key head: its query, its key, its value heads' values, their gates
                rows = []
                for g in range(hk):
                    rows += [
                        qkv[g * sk:(g + 1) * sk],
                        qkv[key_dim + g * sk:key_dim + (g + 1) * sk],
                        qkv[2 * key_dim + g * vg:2 * key_dim + (g + 1) * vg],
                        gate[g * vg:(g + 1) * vg],
                    ]
                w[p + "ssm_in.weight"] = np.concatenate(rows)
            else:
                w[p + "attn_qkv.weight"] = qkv
                w[p + "attn_gate.weight"] = gate
            w[p + "ssm_conv1d.weight"] = lin(conv_dim, cfg["ssm_conv"])
            # decay exp(softplus(alpha + dt) * a): about 0.8 per token for alpha near 0
            w[p + "ssm_dt.bias"] = bias(hv, 0.5) - 1.0
            w[p + "ssm_a"] = -(0.1 + rng.random(hv)).astype(np.float32)
            # per key head: the betas of its value heads, then their alphas
            w[p + "ssm_ba.weight"] = lin(2 * hv, e)
            w[p + "ssm_norm.weight"] = norm(sk)
            w[p + "ssm_out.weight"] = lin(e, value_dim)
        else:
            w[p + "attn_q.weight"] = lin(2 * nq, e)
            w[p + "attn_k.weight"] = lin(nkv, e)
            w[p + "attn_v.weight"] = lin(nkv, e)
            w[p + "attn_output.weight"] = lin(e, nq)
            w[p + "attn_q_norm.weight"] = norm(hd)
            w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "post_attention_norm.weight"] = norm(e)
        w[p + "ffn_gate_inp.weight"] = lin(ne, e, ROUTER_SCALE)
        w[p + "ffn_gate_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
        w[p + "ffn_up_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
        w[p + "ffn_down_exps.weight"] = np.stack([lin(e, ff) for _ in range(ne)])
        w[p + "ffn_gate_inp_shexp.weight"] = (rng.standard_normal(e) / np.sqrt(e)).astype(
            np.float32
        )
        w[p + "ffn_gate_shexp.weight"] = lin(sh, e)
        w[p + "ffn_up_shexp.weight"] = lin(sh, e)
        w[p + "ffn_down_shexp.weight"] = lin(e, sh)
        if il >= cfg["n_layer"]:
            w[p + "nextn.eh_proj.weight"] = lin(e, 2 * e)
            w[p + "nextn.enorm.weight"] = norm(e)
            w[p + "nextn.hnorm.weight"] = norm(e)
            w[p + "nextn.shared_head_norm.weight"] = norm(e)
    w["output_norm.weight"] = norm(e)
    w["output.weight"] = lin(n_vocab, e, 4.0)
    return w


def make_weights_lfm2moe(cfg, n_vocab):
    """The lfm2moe layout (llama.cpp's LLM_ARCH_LFM2MOE), in a fixed order like make_weights;
    no output.weight (tied), the final norm as token_embd_norm."""
    rng = np.random.default_rng(cfg["seed"])
    e, hd = cfg["n_embd"], cfg["head_dim"]
    nq, nkv = cfg["n_head"] * hd, cfg["n_head_kv"] * hd
    ne, ff = cfg["n_expert"], cfg["n_ff_exp"]

    lin, norm, bias = draws(rng)

    w = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, e)).astype(np.float32)
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(e)
        if il in cfg["conv_layers"]:
            w[p + "shortconv.in_proj.weight"] = lin(3 * e, e)
            w[p + "shortconv.conv.weight"] = lin(e, cfg["l_cache"])
            w[p + "shortconv.out_proj.weight"] = lin(e, e)
        else:
            w[p + "attn_q.weight"] = lin(nq, e)
            w[p + "attn_k.weight"] = lin(nkv, e)
            w[p + "attn_v.weight"] = lin(nkv, e)
            w[p + "attn_output.weight"] = lin(e, nq)
            w[p + "attn_q_norm.weight"] = norm(hd)
            w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "ffn_norm.weight"] = norm(e)
        if il < cfg["n_dense_lead"]:
            w[p + "ffn_gate.weight"] = lin(cfg["n_ff_dense"], e)
            w[p + "ffn_up.weight"] = lin(cfg["n_ff_dense"], e)
            w[p + "ffn_down.weight"] = lin(e, cfg["n_ff_dense"])
        else:
            w[p + "ffn_gate_inp.weight"] = lin(ne, e, ROUTER_SCALE)
            w[p + "exp_probs_b.bias"] = bias(ne, GLM_SELECTION_BIAS)
            w[p + "ffn_gate_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
            w[p + "ffn_up_exps.weight"] = np.stack([lin(ff, e) for _ in range(ne)])
            w[p + "ffn_down_exps.weight"] = np.stack([lin(e, ff) for _ in range(ne)])
    w["token_embd_norm.weight"] = norm(e)
    return w


def make_weights_nemotron_h_moe(cfg, n_vocab):
    """The nemotron_h_moe layout (llama.cpp's LLM_ARCH_NEMOTRON_H_MOE), in a fixed order like
    make_weights; each layer holds the tensors of its block of cfg["pattern"]."""
    rng = np.random.default_rng(cfg["seed"])
    e, hd = cfg["n_embd"], cfg["head_dim"]
    nq, nkv = cfg["n_head"] * hd, cfg["n_head_kv"] * hd
    ne, ff, sh = cfg["n_expert"], cfg["n_ff_exp"], cfg["n_ff_shexp"]
    m = cfg.get("moe_latent", e)
    d_inner, d_state, nh, ng = (
        cfg["ssm_inner"], cfg["ssm_state"], cfg["ssm_heads"], cfg["ssm_groups"]
    )
    conv_dim = d_inner + 2 * ng * d_state

    lin, norm, bias = draws(rng)

    w = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, e)).astype(np.float32)
    for il, kind in enumerate(cfg["pattern"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(e)
        if kind == "M":
            # in_proj rows: z (the gate), x, B, C (the convolution's channels), dt
            w[p + "ssm_in.weight"] = np.concatenate(
                [lin(d_inner, e), lin(conv_dim, e), lin(nh, e, NEMOTRON_DT_SCALE)]
            )
            w[p + "ssm_conv1d.weight"] = lin(conv_dim, cfg["ssm_conv"])
            w[p + "ssm_conv1d.bias"] = bias(conv_dim)
            w[p + "ssm_dt.bias"] = rng.uniform(*NEMOTRON_DT_BIAS, nh).astype(np.float32)
            # as the converter writes them: -exp(A_log) and D, each as {1, n_head}
            w[p + "ssm_a"] = (-np.exp(rng.uniform(*NEMOTRON_A_LOG, (nh, 1)))).astype(np.float32)
            w[p + "ssm_d"] = (1.0 + 0.1 * rng.standard_normal((nh, 1))).astype(np.float32)
            w[p + "ssm_norm.weight"] = norm(d_inner).reshape(ng, d_inner // ng)
            w[p + "ssm_out.weight"] = lin(e, d_inner)
        elif kind == "*":
            w[p + "attn_q.weight"] = lin(nq, e)
            w[p + "attn_k.weight"] = lin(nkv, e)
            w[p + "attn_v.weight"] = lin(nkv, e)
            w[p + "attn_output.weight"] = lin(e, nq)
        else:
            w[p + "ffn_gate_inp.weight"] = lin(ne, e, ROUTER_SCALE)
            w[p + "exp_probs_b.bias"] = bias(ne, GLM_SELECTION_BIAS)
            if "moe_latent" in cfg:
                w[p + "ffn_latent_down.weight"] = lin(m, e)
                w[p + "ffn_latent_up.weight"] = lin(e, m)
            w[p + "ffn_up_exps.weight"] = np.stack([lin(ff, m) for _ in range(ne)])
            w[p + "ffn_down_exps.weight"] = np.stack([lin(m, ff) for _ in range(ne)])
            w[p + "ffn_up_shexp.weight"] = lin(sh, e)
            w[p + "ffn_down_shexp.weight"] = lin(e, sh)
    w["output_norm.weight"] = norm(e)
    w["output.weight"] = lin(n_vocab, e, 4.0)
    return w


def keep_f32(name, arr):
    # llama.cpp's quantizer leaves ssm_conv1d in F32 (and its rows of 4 fit no block), and
    # every tensor whose name does not end in "weight" (Mamba-2's {1, n_head} ssm_a and ssm_d)
    # or ends in "_norm.weight" (Mamba-2's grouped {d_inner/n_group, n_group} ssm_norm)
    return (
        arr.ndim < 2
        or not name.endswith("weight")
        or name.endswith("_norm.weight")
        or name.endswith("ssm_conv1d.weight")
        or name.endswith("shortconv.conv.weight")
        or name.endswith("ffn_gate_inp.weight")
        or name.endswith("ffn_gate_inp_shexp.weight")
        or name.endswith(".bias")
        or name.endswith(".scale")
    )


def tensor_type(name, arr, wtype):
    """The type a weight is written in for the weight type wtype."""
    qt = WTYPES[wtype][0]
    if qt == QT.F32 or keep_f32(name, arr):
        return QT.F32
    if qt == QT.MXFP4:
        return QT.MXFP4 if name.endswith("_exps.weight") else QT.Q8_0
    return qt


def write_model(path, key, cfg, vocab, weights, wtype):
    ftype = WTYPES[wtype][1]
    arch = cfg["arch"]
    w = gguf.GGUFWriter(path, arch)
    w.add_type("model")
    w.add_name(f"sluice-tiny-{key}-{wtype}")
    w.add_file_type(int(ftype))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    n_vocab = len(vocab["tokens"])
    w.add_vocab_size(n_vocab)
    w.add_context_length(cfg.get("ctx", CTX))
    w.add_embedding_length(cfg["n_embd"])
    w.add_block_count(cfg["n_layer"] + cfg.get("n_nextn", 0))
    if arch == "nemotron_h_moe":
        # per layer: the expert width on MoE layers, 0 elsewhere (as the converter writes it)
        w.add_feed_forward_length([cfg["n_ff_exp"] if k == "E" else 0 for k in cfg["pattern"]])
    else:
        w.add_feed_forward_length(cfg.get("n_ff_dense", cfg["n_ff_exp"]))
    w.add_head_count(cfg["n_head"])
    if arch == "gemma4":
        w.add_head_count_kv(cfg["n_head_kv"])
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_key_length_swa(cfg["head_dim_swa"])
        w.add_value_length_swa(cfg["head_dim_swa"])
        w.add_rope_dimension_count_swa(cfg["head_dim_swa"])
        w.add_rope_freq_base_swa(cfg["rope_base_swa"])
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern(list(cfg["swa_layers"]))
        w.add_embedding_length_per_layer_input(0)
        w.add_final_logit_softcapping(cfg["softcap"])
    elif arch in ("qwen35moe", "qwen3next"):
        w.add_head_count_kv(cfg["n_head_kv"])
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        if arch == "qwen35moe":
            w.add_rope_dimension_sections(list(cfg["rope_sections"]))
        else:
            w.add_nextn_predict_layers(cfg["n_nextn"])
        w.add_full_attention_interval(cfg["full_attention_interval"])
        w.add_ssm_conv_kernel(cfg["ssm_conv"])
        w.add_ssm_inner_size(cfg["ssm_state"] * cfg["ssm_v_heads"])
        w.add_ssm_state_size(cfg["ssm_state"])
        w.add_ssm_time_step_rank(cfg["ssm_v_heads"])
        w.add_ssm_group_count(cfg["ssm_k_heads"])
    elif arch == "nemotron_h_moe":
        # head_count_kv 0 with feed_forward_length 0 marks the Mamba-2 layers, with
        # feed_forward_length > 0 the MoE layers
        w.add_head_count_kv([cfg["n_head_kv"] if k == "*" else 0 for k in cfg["pattern"]])
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_ssm_conv_kernel(cfg["ssm_conv"])
        w.add_ssm_inner_size(cfg["ssm_inner"])
        w.add_ssm_state_size(cfg["ssm_state"])
        w.add_ssm_time_step_rank(cfg["ssm_heads"])
        w.add_ssm_group_count(cfg["ssm_groups"])
    elif arch == "lfm2moe":
        # head_count_kv 0 marks the short-convolution layers
        w.add_head_count_kv(
            [0 if il in cfg["conv_layers"] else cfg["n_head_kv"] for il in range(cfg["n_layer"])]
        )
        w.add_shortconv_l_cache(cfg["l_cache"])
    elif arch == "deepseek2":
        rot, r = cfg["qk_rope"], cfg["kv_lora"]
        # the converter's keys: the absorbed form caches one head of the compressed row and
        # the rotated part
        w.add_head_count_kv(1 if cfg["absorbed"] else cfg["n_head"])
        if cfg["absorbed"]:
            w.add_key_length(r + rot)
            w.add_value_length(r)
            w.add_key_length_mla(cfg["qk_nope"] + rot)
            w.add_value_length_mla(cfg["v_head"])
        else:
            w.add_key_length(cfg["qk_nope"] + rot)
            w.add_value_length(cfg["v_head"])
        w.add_q_lora_rank(cfg["q_lora"])
        w.add_kv_lora_rank(r)
    else:
        w.add_head_count_kv(cfg["n_head_kv"])
    if arch in ("qwen3moe", "gpt-oss", "glm4moe", "qwen3vlmoe", "minimax-m2", "bailingmoe2"):
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_eps"])
    if arch == "nemotron_h_moe":
        # llama.cpp reads both (the plain one for the MTP head's final LayerNorm); no rope
        w.add_layer_norm_eps(cfg["rms_eps"])
    else:
        w.add_rope_freq_base(cfg["rope_base"])
        w.add_rope_dimension_count(cfg.get("n_rot", cfg.get("qk_rope", cfg.get("head_dim"))))
    w.add_expert_count(cfg["n_expert"])
    w.add_expert_used_count(cfg["n_expert_used"])
    if arch in (
        "qwen3moe", "qwen2moe", "gpt-oss", "glm4moe", "deepseek2", "gemma4", "qwen35moe",
        "qwen3vlmoe", "minimax-m2", "smallthinker", "bailingmoe2", "qwen3next", "llama4",
        "lfm2moe",
    ):
        w.add_expert_feed_forward_length(cfg["n_ff_exp"])
    if arch == "smallthinker":
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_sliding_window(cfg["sliding_window"])
    if arch == "llama4":
        w.add_interleave_moe_layer_step(cfg["moe_step"])
    if arch == "minimax-m2":
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if arch == "nemotron_h_moe":
        # the converter's keys; llama.cpp routes by sigmoid with the selection bias whatever
        # they say (no expert_gating_func), and expert_group_count 1 is no grouping
        w.add_expert_feed_forward_length(cfg["n_ff_exp"])
        w.add_expert_shared_feed_forward_length(cfg["n_ff_shexp"])
        w.add_expert_shared_count(cfg["n_shared"])
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(cfg["weights_scale"])
        w.add_expert_group_count(1)
        if "moe_latent" in cfg:
            w.add_moe_latent_size(cfg["moe_latent"])
    if arch == "lfm2moe":
        w.add_leading_dense_block_count(cfg["n_dense_lead"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if arch == "qwen3vlmoe":
        w.add_rope_dimension_sections(list(cfg["rope_sections"]))
        w.add_num_deepstack_layers(cfg["n_deepstack"])
    if arch == "granitemoe":
        w.add_embedding_scale(cfg["embedding_scale"])
        w.add_attention_scale(cfg["attention_scale"])
        w.add_residual_scale(cfg["residual_scale"])
        w.add_logit_scale(cfg["logit_scale"])
    if arch == "deepseek2":
        w.add_leading_dense_block_count(cfg["n_dense_lead"])
        w.add_expert_shared_count(cfg["n_shared"])
        w.add_expert_weights_norm(cfg["weights_norm"])
        if cfg["weights_scale"] is not None:
            w.add_expert_weights_scale(cfg["weights_scale"])
        if cfg["gating"] == "sigmoid":
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        if cfg["n_nextn"]:
            w.add_nextn_predict_layers(cfg["n_nextn"])
        if "yarn_factor" in cfg:
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(cfg["yarn_factor"])
            w.add_rope_scaling_orig_ctx_len(cfg["yarn_orig_ctx"])
            w.add_rope_scaling_yarn_log_mul(cfg["yarn_log_mul"])
    if arch == "glm4moe":
        w.add_leading_dense_block_count(cfg["n_dense_lead"])
        w.add_expert_shared_count(cfg["n_shared"])
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(cfg["weights_scale"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_nextn_predict_layers(cfg["n_nextn"])
    if arch == "bailingmoe2":
        # the converter's keys (expert_shared_feed_forward_length: the shared experts' width)
        w.add_leading_dense_block_count(cfg["n_dense_lead"])
        w.add_expert_shared_feed_forward_length(cfg["n_ff_exp"] * cfg["n_shared"])
        w.add_expert_weights_scale(cfg["weights_scale"])
        w.add_expert_shared_count(cfg["n_shared"])
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_nextn_predict_layers(cfg["n_nextn"])
    if "expert_groups" in cfg:
        w.add_expert_group_count(cfg["expert_groups"][0])
        w.add_expert_group_used_count(cfg["expert_groups"][1])
    if arch in ("qwen2moe", "qwen35moe", "qwen3next"):
        w.add_expert_shared_feed_forward_length(cfg["n_ff_shexp"])
    if arch == "gpt-oss":
        w.add_sliding_window(cfg["sliding_window"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(cfg["yarn_factor"])
        w.add_rope_scaling_orig_ctx_len(cfg["yarn_orig_ctx"])

    w.add_tokenizer_model(vocab["model"])
    w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["token_type"])
    if "scores" in vocab:
        w.add_token_scores(vocab["scores"])
    if "merges" in vocab:
        w.add_token_merges(vocab["merges"])
    for k, add in (
        ("bos", w.add_bos_token_id),
        ("eos", w.add_eos_token_id),
        ("unknown", w.add_unk_token_id),
        ("padding", w.add_pad_token_id),
    ):
        if k in vocab:
            add(vocab[k])
    for k, add in (
        ("add_bos_token", w.add_add_bos_token),
        ("add_eos_token", w.add_add_eos_token),
        ("add_space_prefix", w.add_add_space_prefix),
    ):
        if k in vocab:
            add(vocab[k])
    if "chat_template" in vocab:
        w.add_chat_template(vocab["chat_template"])

    for name, arr in weights.items():
        qt = tensor_type(name, arr, wtype)
        if qt == QT.F32:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    vocab_dir, template_dir, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(out_dir, exist_ok=True)
    vocabs = {}
    for key, cfg in MODELS.items():
        if cfg["vocab"] not in vocabs:
            vocabs[cfg["vocab"]] = trimmed_vocab(vocab_dir, template_dir, cfg["vocab"])
        vocab = vocabs[cfg["vocab"]]
        make = {
            "gpt-oss": make_weights_gptoss,
            "glm4moe": make_weights_glm4moe,
            "deepseek2": make_weights_deepseek2,
            "gemma4": make_weights_gemma4,
            "qwen35moe": make_weights_qwen35moe,
            "qwen3next": make_weights_qwen3next,
            "bailingmoe2": make_weights_bailingmoe2,
            "llama4": make_weights_llama4,
            "lfm2moe": make_weights_lfm2moe,
            "nemotron_h_moe": make_weights_nemotron_h_moe,
        }.get(cfg["arch"], make_weights)
        weights = make(cfg, len(vocab["tokens"]))
        if cfg.get("fused_gate_up"):
            weights = fuse_gate_up(weights)
        for wtype in cfg.get("wtypes", DEFAULT_WTYPES):
            path = os.path.join(out_dir, f"{key}-{wtype}.gguf")
            tmp = path + ".tmp"
            write_model(tmp, key, cfg, vocab, weights, wtype)
            os.replace(tmp, path)
            print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
