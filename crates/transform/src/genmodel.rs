//! `sluice gen-model`: a synthetic model with a real model's architecture, tensor names, shapes
//! and per-tensor quantization types, filled with random but valid blocks, for benchmarks of
//! models that cannot be downloaded.
//!
//! * **Layout.** The tensor list is the real model's (names, ggml shapes), written in the order
//!   llama.cpp's quantizer writes (tensors outside `blk.N.` first, then layer by layer, by
//!   name), with the types llama.cpp's `llama_tensor_get_type` gives for the chosen file type
//!   (the same [`Planner`] `sluice quantize` uses). For Qwen3-30B-A3B at Q4_K_M that is the
//!   published file to the byte count of every tensor (docs/benchmarks.md).
//! * **Blocks.** Every quantized block is random bytes with its scale fields set: a scale from
//!   a small per-block spread around the value that gives weights of standard deviation 0.02
//!   (the order of trained transformer weights; the attention output projection's is
//!   `--attn-out-std`, see below), and for the types with a minimum, the minimum that makes the
//!   weights zero-mean (a weight mean would push every residual stream onto one direction and
//!   make every token route alike). Norm weights are 1.
//! * **Router.** `ffn_gate_inp` rows are normal noise of standard deviation 1/sqrt(n_embd)
//!   (logits of unit spread), expert e's row multiplied by exp(skew · z_e) with z_e standard
//!   normal per layer and expert: `--router-skew 0` makes every expert equally likely, larger
//!   values make some experts much more popular than others, as trained routers are.
//! * **Routing locality.** With random weights the attention output is an average over the
//!   context that changes little from token to token; its share of the residual stream decides
//!   how alike consecutive tokens route. `--attn-out-std` sets it; the default was chosen so
//!   that the hit-rate curves of a replayed cache match a real Qwen3-30B-A3B trace's
//!   (docs/benchmarks.md has the measurements).
//! * **Vocabulary.** Copied from a GGUF that holds one (`--vocab`, or the preset's tokenizer in
//!   the fixture cache), padded with `[PAD<i>]` tokens to the model's vocabulary size.
//! * **Cuts.** `--layers N` keeps the first N layers, and the metadata says exactly what the
//!   file holds, so that every cut loads: at most N - 1 leading dense layers (a cut keeps an
//!   MoE layer), per-layer patterns of N layers, no tensor no kept layer reads (`Shape::cut`,
//!   docs/benchmarks.md).
//! * **Streaming.** Bytes are generated while they are written (memory stays bounded), to
//!   `OUT.part`, synced to disk and renamed: an interrupted run never leaves a file that looks
//!   complete. The rate printed includes the sync, so it is the disk's.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use gguf::{ArrayValue, GgmlType, GgufFile, GgufWriter, TensorType, Value};
use half::f16;

use crate::error::{Context, Result, fail, reject};
use crate::quantize::{FileType, ModelFacts, Planner, tensor_order};
use crate::rng::{WyRand, f32_bytes};

/// The real models gen-model can imitate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Like {
    /// Qwen3-30B-A3B: qwen3moe, 48 layers, 128 experts (top-8) of width 768, n_embd 2048,
    /// 32 query / 4 KV heads of 128, vocabulary 151936 (Qwen2.5 tokenizer).
    Qwen3_30bA3b,
    /// OLMoE-1B-7B: olmoe, 16 layers, 64 experts (top-8) of width 1024, n_embd 2048, 16 heads
    /// of 128, q/k norms over the whole projection, GPT-NeoX tokenizer.
    Olmoe1b7b,
    /// Mixtral-8x7B: llama with experts, 32 layers, 8 experts (top-2) of width 14336, n_embd
    /// 4096, 32 query / 8 KV heads of 128, vocabulary 32000 (llama SentencePiece).
    Mixtral8x7b,
    /// gpt-oss-20b: gpt-oss, 24 layers, 32 experts (top-4) of width 2880, n_embd 2880, 64 query
    /// / 8 KV heads of 64, sliding window 128 on every other layer, attention sinks, biases,
    /// YaRN (factor 32 over 4096); MXFP4 experts (vocabulary 201088, o200k_harmony: the
    /// default fills it from the Qwen2.5 tokenizer, padded).
    GptOss20b,
    /// gpt-oss-120b: as gpt-oss-20b with 36 layers and 128 experts (about 61 GB at MXFP4).
    GptOss120b,
    /// GLM-4.5-Air: glm4moe, 46 layers (the first dense, of width 10944) and one NextN layer,
    /// 128 experts (top-8, sigmoid routing with a selection bias) of width 1408 plus one shared
    /// expert, n_embd 4096, 96 query / 8 KV heads of 128 with q/k/v biases, rope over half of
    /// each head, vocabulary 151552 (GLM-4.5 tokenizer: filled from Qwen2.5's, padded).
    Glm45Air,
    /// DeepSeek-V3 (and R1, the same shape): deepseek2, 61 layers (the first 3 dense, of width
    /// 18432), 256 experts (top-8 of the best 4 of 8 groups, sigmoid routing with a selection
    /// bias, scaled by 2.5) of width 2048 plus a shared expert, n_embd 7168, 128 heads of
    /// multi-head latent attention in the absorbed form (query rank 1536, KV rank 512, heads of
    /// 128 + 64 rotated, values of 128), YaRN (factor 40 over 4096), vocabulary 129280 (filled
    /// from the Qwen2.5 tokenizer, padded). No NextN layer, as the published GGUFs.
    DeepseekV3,
    /// Kimi-K2: DeepSeek-V3's architecture with 384 experts (no expert groups, x2.827), one
    /// leading dense layer, 64 heads, rope base 50000, YaRN x32, vocabulary 163840.
    KimiK2,
    /// Qwen3.6-35B-A3B (and Qwen3.5-35B-A3B, the same shape): qwen35moe, 40 layers of which
    /// every fourth attends fully (16 query / 2 KV heads of 256 with an output gate, IMRoPE over
    /// 64 dims) and the rest are Gated DeltaNet linear attention (16 key / 32 value heads of
    /// 128, convolution over 4), 256 experts (top-8) of width 512 plus a gated shared expert of
    /// 512, n_embd 2048, vocabulary 248320 (filled from the Qwen2.5 tokenizer, padded).
    Qwen36_35bA3b,
    /// Gemma-4-26B-A4B: gemma4, 30 layers: 25 sliding-window (1024; 16 query / 8 KV heads of
    /// 256) and every sixth full attention (16 query / 2 KV heads of 512, keys as values,
    /// proportional rope over a quarter), a dense GEGLU MLP of 2112 beside 128 fused experts
    /// (top-8) of width 704 in every layer, n_embd 2816, vocabulary 262144 (Gemma 4 tokenizer),
    /// tied embeddings, logits soft-capped at 30.
    Gemma4_26bA4b,
    /// Qwen3-VL-30B-A3B's text model: qwen3vlmoe, Qwen3-30B-A3B's layers with IMRoPE sections
    /// [24, 20, 20, 0] (rope base 5e6, context 262144) and 3 deepstack layers (vision input
    /// only; their features are the projector's, not in this file).
    Qwen3Vl30bA3b,
    /// Granite-3.1-3B-A800M: granitemoe, 32 layers, 40 experts (top-8) of width 512, n_embd
    /// 1536, 24 query / 8 KV heads of 64, NORM rope (base 1e7, context 131072), tied
    /// embeddings, vocabulary 49155 (StarCoder's tokenizer, padded); the Granite 3 MoE
    /// multipliers: embeddings x12, attention scale 1/64, residuals x0.22, logits / 6.
    Granite31_3bA800m,
    /// MiniMax-M2: minimax-m2, 62 layers, 256 experts (top-8, sigmoid routing with a selection
    /// bias) of width 1536, n_embd 3072, 48 query / 8 KV heads of 128 with q/k norms over the
    /// whole projections, rope over 64 of each head's 128 dims (base 5e6, context 196608),
    /// vocabulary 200064 (filled from the Qwen2.5 tokenizer, padded).
    MinimaxM2,
    /// SmallThinker-21B-A3B: smallthinker, 52 layers, 64 experts (top-6, sigmoid, ReLU-gated)
    /// of width 768 routed on each layer's input, n_embd 2560, 28 query / 4 KV heads of 128, a
    /// sliding window of 4096 on three layers of four and no rope on the fourth (from layer
    /// 0), tied embeddings, vocabulary 151936 (Qwen2.5 tokenizer).
    SmallThinker21bA3b,
    /// Ling-mini-2.0 (and Ring-mini-2.0, the same shape): bailingmoe2, 20 layers (the first
    /// dense, of width 5120), 256 experts (top-8 within the best 4 of 8 groups, sigmoid
    /// routing with a selection bias, renormalised, x2.5) of width 512 plus a shared expert of
    /// 512, n_embd 2048, 16 query / 4 KV heads of 128 in one fused `attn_qkv`, per-head q/k
    /// norms, rope over half of each head (base 600000), vocabulary 157184 (filled from the
    /// Qwen2.5 tokenizer, padded). 16.26B parameters, no NextN layer (as the published
    /// checkpoint's count).
    LingMini20,
    /// Ling-flash-2.0: as Ling-mini-2.0 with 32 layers (the first dense, of width 9216),
    /// experts of width 1024 (shared 1024), n_embd 4096, 32 query / 4 KV heads of 128
    /// (102,889,705,216 parameters, the published checkpoint's count to the last one).
    LingFlash20,
    /// Qwen3-Next-80B-A3B (and Qwen3-Coder-Next, the same shape): qwen3next, 48 layers of
    /// which every fourth attends fully (16 query / 2 KV heads of 256 with an output gate,
    /// NEOX rope over 64 dims) and the rest are Gated DeltaNet linear attention (16 key / 32
    /// value heads of 128 grouped by key head, convolution over 4, the published files'
    /// `ssm_in` and `ssm_ba`), 512 experts (top-10) of width 512 plus a gated shared expert of
    /// 512, n_embd 2048, vocabulary 151936 (Qwen2.5 tokenizer). 48.41 GB at Q4_K_M, as Qwen's
    /// own file (48.4 GB).
    Qwen3Next80bA3b,
    /// Llama-4-Scout-17B-16E: llama4, 48 layers, every one MoE (16 experts of width 8192,
    /// top-1 on the raw logits, the sigmoid weight on the expert's input, plus an ungated
    /// shared expert of 8192), n_embd 5120, 40 query / 8 KV heads of 128, chunked attention
    /// and rope with llama3 divisors on three layers of four, the fourth without rope,
    /// vocabulary 202048 (filled from the Qwen2.5 tokenizer, padded).
    Llama4Scout,
    /// Llama-4-Maverick-17B-128E: as Scout with 128 experts on every other layer (from layer
    /// 1), the others dense of width 16384, no rope divisors and no q/k norm.
    Llama4Maverick,
    /// LFM2-8B-A1B: lfm2moe, 24 layers: 18 LFM2 short convolutions (over 3 positions) and 6
    /// attention layers (2, 6, 10, 14, 18, 21; 32 query / 8 KV heads of 64, per-head q/k
    /// norms), the first 2 dense (width 7168), then 32 experts (top-4, sigmoid routing with a
    /// selection bias) of width 1792, n_embd 2048, tied embeddings, vocabulary 65536 (filled
    /// from the Qwen2.5 tokenizer, padded).
    Lfm2_8bA1b,
    /// NVIDIA-Nemotron-3-Nano-30B-A3B: nemotron_h_moe, 52 layers of one kind each, as its
    /// `hybrid_override_pattern` says: 23 Mamba-2 layers (64 heads of 64, state 128, 8
    /// groups, convolution over 4), 6 attention layers without rope (32 query / 2 KV heads of
    /// 128) and 23 MoE layers (128 gate-less ReLU² experts of width 1856, top-6, sigmoid
    /// routing with a selection bias, renormalised, x2.5, plus an ungated shared expert of
    /// 3712), n_embd 2688, vocabulary 131072 (filled from the Llama 3 tokenizer, padded).
    /// 31,577,939,808 parameters (the published 31.6B).
    Nemotron3Nano30bA3b,
    /// NVIDIA-Nemotron-3-Super-120B-A12B: nemotron_h_moe, 88 layers (40 Mamba-2 of 128 heads
    /// of 64, 8 attention, 40 MoE) of n_embd 4096, with latent experts: each MoE layer
    /// projects its input down to 1024 (`ffn_latent_down`), runs 512 ReLU² experts of width
    /// 2688 (top-22, x5) there and projects back up (`ffn_latent_up`); the shared expert
    /// (5376) reads the full width. The checkpoint's multi-token-prediction block is not
    /// written (as llama.cpp's converter with `--no-mtp`, and as the GGUFs llama.cpp's own
    /// benchmarks ran): 120,668,707,840 parameters, the checkpoint's less its MTP block.
    Nemotron3Super120bA12b,
}

/// What a preset has beyond the common shape that no other preset has.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Extra {
    None,
    /// qwen3vlmoe's IMRoPE sections and deepstack layers.
    Vision {
        sections: [u32; 4],
        deepstack: u32,
    },
    /// bailingmoe2's fused `attn_qkv`, per-head q/k norms, `ffn_norm`, optional NextN layers
    /// with `layer_output_norm`, and its expert groups (with `glm`'s dense lead, shared expert,
    /// selection bias, partial rope and scale).
    Bailing {
        groups: (u32, u32),
    },
    /// granitemoe's multipliers (tied embeddings).
    Granite {
        embedding: f32,
        attention: f32,
        residual: f32,
        logit: f32,
    },
    /// minimax-m2's partial rope and its router's selection bias (sigmoid routing).
    MiniMax {
        rope_dims: u64,
    },
    /// smallthinker's sliding window (which llama.cpp reads as 4096 on three layers of four,
    /// the fourth without rope), sigmoid routing, tied embeddings.
    SmallThinker {
        window: u32,
    },
    /// llama4's interleaved MoE layers (`interleave_moe_layer_step`; the others dense of width
    /// `n_ff`), each MoE layer's shared expert as wide as its experts, and the llama3 rope
    /// divisors where the model has them (Scout).
    Llama4 {
        moe_step: u32,
        rope_freqs: bool,
    },
    /// lfm2moe's short-convolution layers (all but `attn`, the attention layers, which hold
    /// KV heads), the convolution's width, the leading dense layers (of width `n_ff`), the
    /// selection bias (sigmoid routing), the final norm as `token_embd_norm`, tied embeddings.
    Lfm2 {
        attn: &'static [u32],
        l_cache: u64,
        dense_lead: u32,
    },
    /// nemotron_h_moe's layers of one kind each (Mamba-2, attention without rope, or MoE with
    /// gate-less ReLU² experts, a selection bias and an ungated shared expert).
    Nemotron(NemotronShape),
}

/// What a nemotron_h_moe model has beyond the common shape. Sources: the published
/// `config.json` of each checkpoint (Hugging Face, nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16
/// and nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16, as quoted by the public test suites of
/// several inference projects); the tensors and keys are those llama.cpp v0.4.0's converter
/// (`conversion/nemotron.py`, `NemotronHModel`) writes and its loader
/// (`src/models/nemotron-h.cpp`) reads.
#[derive(Clone, Copy, Debug, PartialEq)]
struct NemotronShape {
    /// `hybrid_override_pattern`: one letter per layer, `M` Mamba-2, `*` attention, `E` MoE.
    pattern: &'static str,
    /// Mamba-2: `conv_kernel`, `mamba_num_heads × mamba_head_dim`, `ssm_state_size`,
    /// `mamba_num_heads`, `n_groups`.
    d_conv: u64,
    d_inner: u64,
    d_state: u64,
    ssm_heads: u64,
    groups: u64,
    /// `moe_shared_expert_intermediate_size`.
    shexp: u64,
    /// `moe_latent_size`: the experts' width of input and output (0: none, n_embd).
    latent: u64,
    /// `routed_scaling_factor`.
    scale: f32,
}

impl NemotronShape {
    /// The kind of layer `il` (its letter of the pattern).
    fn kind(&self, il: u32) -> u8 {
        self.pattern
            .as_bytes()
            .get(il as usize)
            .copied()
            .unwrap_or(b'M')
    }
}

/// How a model normalizes queries and keys before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QkNorm {
    None,
    /// One RMSNorm weight of `head_dim` per projection, applied per head (qwen3moe).
    PerHead,
    /// One RMSNorm weight over the whole projection (olmoe, minimax-m2).
    Full,
}

/// A real model's shape.
#[derive(Clone, Debug)]
struct Shape {
    arch: &'static str,
    title: &'static str,
    n_layer: u32,
    n_embd: u64,
    n_head: u64,
    n_head_kv: u64,
    head_dim: u64,
    n_expert: u64,
    n_expert_used: u32,
    /// Width of one expert's FFN.
    n_ff_exp: u64,
    /// `<arch>.feed_forward_length` as the real file records it.
    n_ff: u64,
    n_vocab: u64,
    ctx_train: u32,
    rope_base: f32,
    rms_eps: f32,
    qk_norm: QkNorm,
    /// The real file records `<arch>.expert_feed_forward_length`.
    expert_ff_key: bool,
    /// The real file records `<arch>.rope.dimension_count`.
    rope_dims_key: bool,
    /// The file in the fixture cache's `text/vocab/` with the model family's tokenizer.
    vocab_fixture: &'static str,
    /// gpt-oss's extras: biases, sinks, `post_attention_norm`, the sliding window and YaRN.
    gpt_oss: bool,
    /// glm4moe's extras: a leading dense layer of width `n_ff`, q/k/v biases,
    /// `post_attention_norm`, the selection bias, a shared expert, NextN layers, partial rope.
    glm: Option<GlmExtras>,
    /// deepseek2's multi-head latent attention (with `glm`'s dense lead, shared expert and
    /// scale, but none of glm4moe's attention extras).
    mla: Option<MlaShape>,
    /// qwen35moe's linear-attention layers, gated attention and shared expert.
    hybrid: Option<HybridShape>,
    /// gemma4's layer types, norms, dense MLP and fused experts (`head_dim` and `n_head_kv`
    /// are the sliding-window layers').
    gemma: Option<GemmaShape>,
    /// What only this preset has.
    extra: Extra,
    /// The mix the released files use when `--quant` is not given.
    default_quant: FileType,
}

/// What a gemma4 model has beyond the common shape.
#[derive(Clone, Copy, Debug)]
struct GemmaShape {
    /// Every `period`-th layer attends fully, the others through the window.
    period: u32,
    window: u32,
    /// The full-attention layers' head size and KV heads (their keys are their values).
    head_full: u64,
    kv_full: u64,
    /// Rotated pairs of a full-attention head (the rest get `rope_freqs` of 1e30).
    rot_pairs_full: u64,
    rope_base_swa: f32,
    softcap: f32,
}

/// What a qwen35moe model has beyond the common shape.
#[derive(Clone, Copy, Debug)]
struct HybridShape {
    /// Every `interval`-th layer attends fully, the others are linear attention.
    interval: u32,
    /// Linear attention: key heads, value heads, head size, convolution width.
    k_heads: u64,
    v_heads: u64,
    head: u64,
    conv: u64,
    /// Rotated dims of the full-attention heads and the IMRoPE sections (qwen35moe; `None`:
    /// plain NEOX rope, qwen3next).
    rope_dims: u64,
    sections: Option<[u32; 4]>,
    /// Qwen3-Next's linear layers as its published files hold them: beta and alpha in one
    /// `ssm_ba`, queries, keys, values and gates in one `ssm_in` (both grouped
    /// by key head, the first converter's layout); else qwen35moe's `attn_qkv`, `attn_gate`,
    /// `ssm_beta` and `ssm_alpha`.
    grouped: bool,
    /// Width of the shared expert.
    shexp: u64,
}

/// What a glm4moe model has beyond the common shape.
#[derive(Clone, Copy, Debug)]
struct GlmExtras {
    /// Leading dense layers.
    dense_lead: u32,
    /// Shared experts (each of the experts' width).
    shared: u64,
    /// NextN layers after the trunk.
    nextn: u32,
    /// Rotated dimensions per head.
    rope_dims: u64,
    /// `expert_weights_scale` (`routed_scaling_factor`).
    weights_scale: f32,
}

/// deepseek2's attention and routing beyond the common shape.
#[derive(Clone, Copy, Debug)]
struct MlaShape {
    /// Rank of the low-rank query (`attn_q_a`, its norm, `attn_q_b`); 0: one `attn_q`.
    q_lora: u64,
    kv_lora: u64,
    /// Plain and rotated query/key values per head, and value values per head.
    nope: u64,
    rope: u64,
    v: u64,
    /// Expert groups and the groups used.
    groups: (u32, u32),
    /// YaRN: factor, original context, log multiplier as stored (0.1 × mscale_all_dim).
    yarn: (f32, u32, f32),
}

impl Like {
    /// Every preset, in the order `--help` lists them.
    pub const ALL: [Like; 22] = [
        Like::Qwen3_30bA3b,
        Like::Olmoe1b7b,
        Like::Mixtral8x7b,
        Like::GptOss20b,
        Like::GptOss120b,
        Like::Glm45Air,
        Like::DeepseekV3,
        Like::KimiK2,
        Like::Qwen36_35bA3b,
        Like::Gemma4_26bA4b,
        Like::Qwen3Vl30bA3b,
        Like::Granite31_3bA800m,
        Like::MinimaxM2,
        Like::SmallThinker21bA3b,
        Like::LingMini20,
        Like::LingFlash20,
        Like::Qwen3Next80bA3b,
        Like::Llama4Scout,
        Like::Llama4Maverick,
        Like::Lfm2_8bA1b,
        Like::Nemotron3Nano30bA3b,
        Like::Nemotron3Super120bA12b,
    ];

    /// The preset's name on the command line (recorded as `sluice.gen_model.like`).
    pub fn name(self) -> &'static str {
        match self {
            Like::Qwen3_30bA3b => "qwen3-30b-a3b",
            Like::Olmoe1b7b => "olmoe-1b-7b",
            Like::Mixtral8x7b => "mixtral-8x7b",
            Like::GptOss20b => "gpt-oss-20b",
            Like::GptOss120b => "gpt-oss-120b",
            Like::Glm45Air => "glm-4.5-air",
            Like::DeepseekV3 => "deepseek-v3",
            Like::KimiK2 => "kimi-k2",
            Like::Qwen36_35bA3b => "qwen3.6-35b-a3b",
            Like::Gemma4_26bA4b => "gemma-4-26b-a4b",
            Like::Qwen3Vl30bA3b => "qwen3-vl-30b-a3b",
            Like::Granite31_3bA800m => "granite-3.1-3b-a800m",
            Like::MinimaxM2 => "minimax-m2",
            Like::SmallThinker21bA3b => "smallthinker-21b-a3b",
            Like::LingMini20 => "ling-mini-2.0",
            Like::LingFlash20 => "ling-flash-2.0",
            Like::Qwen3Next80bA3b => "qwen3-next-80b-a3b",
            Like::Llama4Scout => "llama-4-scout-17b-16e",
            Like::Llama4Maverick => "llama-4-maverick-17b-128e",
            Like::Lfm2_8bA1b => "lfm2-8b-a1b",
            Like::Nemotron3Nano30bA3b => "nemotron-3-nano-30b-a3b",
            Like::Nemotron3Super120bA12b => "nemotron-3-super-120b-a12b",
        }
    }

    /// The preset called `name`.
    pub fn from_name(name: &str) -> Option<Like> {
        Like::ALL.into_iter().find(|l| l.name() == name)
    }

    /// The real model's shape, in a line (the `--help` text).
    pub fn about(self) -> &'static str {
        match self {
            Like::Qwen3_30bA3b => {
                "Qwen3-30B-A3B: qwen3moe, 48 layers, 128 experts (top-8) of width 768, n_embd \
                 2048, 32 query / 4 KV heads of 128, vocabulary 151936 (Qwen2.5 tokenizer)"
            }
            Like::Olmoe1b7b => {
                "OLMoE-1B-7B: olmoe, 16 layers, 64 experts (top-8) of width 1024, n_embd 2048, 16 \
                 heads of 128, q/k norms over the whole projection, GPT-NeoX tokenizer"
            }
            Like::Mixtral8x7b => {
                "Mixtral-8x7B: llama with experts, 32 layers, 8 experts (top-2) of width 14336, \
                 n_embd 4096, 32 query / 8 KV heads of 128, vocabulary 32000 (llama SentencePiece)"
            }
            Like::GptOss20b => {
                "gpt-oss-20b: gpt-oss, 24 layers, 32 experts (top-4) of width 2880, n_embd 2880, \
                 64 query / 8 KV heads of 64, sliding window 128 on every other layer, attention \
                 sinks, biases, YaRN (factor 32 over 4096); MXFP4 experts (vocabulary 201088, \
                 o200k_harmony: the default fills it from the Qwen2.5 tokenizer, padded)"
            }
            Like::GptOss120b => {
                "gpt-oss-120b: as gpt-oss-20b with 36 layers and 128 experts (about 61 GB at MXFP4)"
            }
            Like::Glm45Air => {
                "GLM-4.5-Air: glm4moe, 46 layers (the first dense, width 10944) and one NextN \
                 layer, 128 experts (top-8, sigmoid routing with a selection bias) of width 1408 \
                 plus a shared expert, n_embd 4096, 96 query / 8 KV heads of 128 with q/k/v \
                 biases, rope over half of each head, vocabulary 151552 (filled from the Qwen2.5 \
                 tokenizer, padded)"
            }
            Like::DeepseekV3 => {
                "DeepSeek-V3/R1: deepseek2, 61 layers (the first 3 dense, width 18432), 256 \
                 experts (top-8 within the best 4 of 8 groups, sigmoid routing with a selection \
                 bias, x2.5) of width 2048 plus a shared expert, n_embd 7168, 128 heads of \
                 multi-head latent attention (absorbed; query rank 1536, KV rank 512, heads of \
                 128 + 64 rotated, values of 128), YaRN x40, vocabulary 129280 (filled from the \
                 Qwen2.5 tokenizer, padded); about 400 GB at Q4_K_M: write a --layers cut"
            }
            Like::KimiK2 => {
                "Kimi-K2: deepseek2 as DeepSeek-V3 with 384 experts (top-8, no expert groups, \
                 x2.827), one leading dense layer, 64 heads, rope base 50000, YaRN x32 over 4096, \
                 vocabulary 163840 (filled from the Qwen2.5 tokenizer, padded); about 620 GB at \
                 Q4_K_M: write a --layers cut"
            }
            Like::Qwen36_35bA3b => {
                "Qwen3.6-35B-A3B: qwen35moe, 40 layers: 30 Gated DeltaNet linear-attention layers \
                 (16 key / 32 value heads of 128, convolution over 4) and every fourth full \
                 attention (16 query / 2 KV heads of 256, sigmoid output gate, IMRoPE over 64 \
                 dims), 256 experts (top-8) of width 512 plus a gated shared expert of 512, \
                 n_embd 2048, vocabulary 248320 (filled from the Qwen2.5 tokenizer, padded)"
            }
            Like::Gemma4_26bA4b => {
                "Gemma-4-26B-A4B: gemma4, 30 layers: 25 sliding-window (1024; 16 query / 8 KV \
                 heads of 256) and every sixth full attention (16 query / 2 KV heads of 512, \
                 keys as values, proportional rope), a dense GEGLU MLP of width 2112 beside 128 \
                 fused experts (top-8) of width 704 in every layer, n_embd 2816, vocabulary \
                 262144 (Gemma 4 tokenizer), tied embeddings, logits soft-capped at 30"
            }
            Like::Qwen3Vl30bA3b => {
                "Qwen3-VL-30B-A3B (text model): qwen3vlmoe, Qwen3-30B-A3B's 48 layers with \
                 IMRoPE sections [24, 20, 20, 0], rope base 5e6, 3 deepstack layers (vision \
                 input is not supported), vocabulary 151936 (Qwen2.5 tokenizer)"
            }
            Like::Granite31_3bA800m => {
                "Granite-3.1-3B-A800M: granitemoe, 32 layers, 40 experts (top-8) of width 512, \
                 n_embd 1536, 24 query / 8 KV heads of 64, NORM rope, tied embeddings, \
                 multipliers: embeddings x12, attention 1/64, residuals x0.22, logits / 6; \
                 vocabulary 49155 (the StarCoder tokenizer of llama.cpp's tests, padded)"
            }
            Like::MinimaxM2 => {
                "MiniMax-M2: minimax-m2, 62 layers, 256 experts (top-8, sigmoid routing with a \
                 selection bias) of width 1536, n_embd 3072, 48 query / 8 KV heads of 128, q/k \
                 norms over the whole projections, rope over 64 of 128 dims, vocabulary 200064 \
                 (filled from the Qwen2.5 tokenizer, padded); about 138 GB at Q4_K_M: write a \
                 --layers cut"
            }
            Like::SmallThinker21bA3b => {
                "SmallThinker-21B-A3B: smallthinker, 52 layers, 64 experts (top-6, sigmoid \
                 routing on each layer's input, ReLU-gated) of width 768, n_embd 2560, 28 query \
                 / 4 KV heads of 128, sliding window 4096 on three layers of four and no rope on \
                 the fourth, tied embeddings, vocabulary 151936 (Qwen2.5 tokenizer)"
            }
            Like::LingMini20 => {
                "Ling-mini-2.0 (and Ring-mini-2.0): bailingmoe2, 20 layers (the first dense, \
                 width 5120), 256 experts (top-8 within the best 4 of 8 groups, sigmoid routing \
                 with a selection bias, x2.5) of width 512 plus a shared expert, n_embd 2048, 16 \
                 query / 4 KV heads of 128 in one fused attn_qkv, q/k norms, rope over half of \
                 each head, vocabulary 157184 (filled from the Qwen2.5 tokenizer, padded)"
            }
            Like::LingFlash20 => {
                "Ling-flash-2.0: bailingmoe2 as Ling-mini-2.0 with 32 layers (the first dense, \
                 width 9216), experts of width 1024, n_embd 4096, 32 query / 4 KV heads of 128"
            }
            Like::Qwen3Next80bA3b => {
                "Qwen3-Next-80B-A3B / Qwen3-Coder-Next: qwen3next, 48 layers: 36 Gated DeltaNet \
                 linear-attention layers (16 key / 32 value heads of 128 grouped by key head, \
                 convolution over 4, the published files' ssm_in and ssm_ba) and every fourth \
                 full attention (16 query / 2 KV heads of 256, sigmoid output gate, NEOX rope \
                 over 64 dims), 512 experts (top-10) of width 512 plus a gated shared expert of 512, \
                 n_embd 2048, vocabulary 151936 (Qwen2.5 tokenizer)"
            }
            Like::Llama4Scout => {
                "Llama-4-Scout-17B-16E: llama4, 48 layers, 16 experts (top-1, sigmoid weight on \
                 the expert's input) of width 8192 plus a shared expert on every layer, n_embd \
                 5120, 40 query / 8 KV heads of 128, chunked attention with rope (llama3 \
                 divisors) on three layers of four, vocabulary 202048 (filled from the Qwen2.5 \
                 tokenizer, padded); about 65 GB at Q4_K_M: write a --layers cut"
            }
            Like::Llama4Maverick => {
                "Llama-4-Maverick-17B-128E: llama4 as Scout with 128 experts on every other \
                 layer, the others dense of width 16384; about 230 GB at Q4_K_M: write a \
                 --layers cut"
            }
            Like::Lfm2_8bA1b => {
                "LFM2-8B-A1B: lfm2moe, 24 layers: 18 short convolutions (over 3 positions) and 6 \
                 attention layers (32 query / 8 KV heads of 64, q/k norms), the first 2 dense \
                 (width 7168), 32 experts (top-4, sigmoid routing with a selection bias) of width \
                 1792, n_embd 2048, tied embeddings, vocabulary 65536 (filled from the Qwen2.5 \
                 tokenizer, padded)"
            }
            Like::Nemotron3Nano30bA3b => {
                "NVIDIA-Nemotron-3-Nano-30B-A3B: nemotron_h_moe, 52 layers of one kind each: 23 \
                 Mamba-2 (64 heads of 64, state 128, 8 groups), 6 attention without rope (32 \
                 query / 2 KV heads of 128) and 23 MoE (128 ReLU² experts of width 1856, top-6, \
                 sigmoid routing with a selection bias, x2.5, plus a shared expert of 3712), \
                 n_embd 2688, vocabulary 131072 (filled from the Llama 3 tokenizer, padded)"
            }
            Like::Nemotron3Super120bA12b => {
                "NVIDIA-Nemotron-3-Super-120B-A12B: nemotron_h_moe, 88 layers: 40 Mamba-2 (128 \
                 heads of 64), 8 attention without rope (32 query / 2 KV heads of 128) and 40 \
                 MoE with latent experts (n_embd 4096 projected to 1024 for 512 ReLU² experts \
                 of width 2688, top-22, x5, plus a shared expert of 5376), vocabulary 131072 \
                 (filled from the Llama 3 tokenizer, padded); no MTP block; about 86 GB at \
                 Q4_K_M: write a --layers cut"
            }
        }
    }

    /// The real model's name (`Qwen3-30B-A3B`, ...).
    pub fn title(self) -> &'static str {
        self.shape().title
    }

    /// The file in the fixture cache's `text/vocab/` that holds the model family's tokenizer.
    pub fn vocab_fixture(self) -> &'static str {
        self.shape().vocab_fixture
    }

    fn shape(self) -> Shape {
        match self {
            Like::Qwen3_30bA3b => Shape {
                arch: "qwen3moe",
                title: "Qwen3-30B-A3B",
                n_layer: 48,
                n_embd: 2048,
                n_head: 32,
                n_head_kv: 4,
                head_dim: 128,
                n_expert: 128,
                n_expert_used: 8,
                n_ff_exp: 768,
                n_ff: 6144,
                n_vocab: 151_936,
                ctx_train: 40960,
                rope_base: 1_000_000.0,
                rms_eps: 1e-6,
                qk_norm: QkNorm::PerHead,
                expert_ff_key: true,
                rope_dims_key: false,
                vocab_fixture: "qwen2.5-coder-1.5b.gguf",
                gpt_oss: false,
                glm: None,
                mla: None,
                hybrid: None,
                gemma: None,
                extra: Extra::None,
                default_quant: FileType::Q4_K_M,
            },
            Like::Olmoe1b7b => Shape {
                arch: "olmoe",
                title: "OLMoE-1B-7B",
                n_layer: 16,
                n_embd: 2048,
                n_head: 16,
                n_head_kv: 16,
                head_dim: 128,
                n_expert: 64,
                n_expert_used: 8,
                n_ff_exp: 1024,
                n_ff: 1024,
                n_vocab: 50_304,
                ctx_train: 4096,
                rope_base: 10_000.0,
                rms_eps: 1e-5,
                qk_norm: QkNorm::Full,
                expert_ff_key: false,
                rope_dims_key: true,
                vocab_fixture: "ggml-vocab-gpt-neox.gguf",
                gpt_oss: false,
                glm: None,
                mla: None,
                hybrid: None,
                gemma: None,
                extra: Extra::None,
                default_quant: FileType::Q4_K_M,
            },
            Like::Mixtral8x7b => Shape {
                arch: "llama",
                title: "Mixtral-8x7B",
                n_layer: 32,
                n_embd: 4096,
                n_head: 32,
                n_head_kv: 8,
                head_dim: 128,
                n_expert: 8,
                n_expert_used: 2,
                n_ff_exp: 14336,
                n_ff: 14336,
                n_vocab: 32_000,
                ctx_train: 32768,
                rope_base: 1_000_000.0,
                rms_eps: 1e-5,
                qk_norm: QkNorm::None,
                expert_ff_key: false,
                rope_dims_key: true,
                vocab_fixture: "ggml-vocab-llama-spm.gguf",
                gpt_oss: false,
                glm: None,
                mla: None,
                hybrid: None,
                gemma: None,
                extra: Extra::None,
                default_quant: FileType::Q4_K_M,
            },
            Like::GptOss20b | Like::GptOss120b => {
                let big = self == Like::GptOss120b;
                Shape {
                    arch: "gpt-oss",
                    title: if big { "gpt-oss-120b" } else { "gpt-oss-20b" },
                    n_layer: if big { 36 } else { 24 },
                    n_embd: 2880,
                    n_head: 64,
                    n_head_kv: 8,
                    head_dim: 64,
                    n_expert: if big { 128 } else { 32 },
                    n_expert_used: 4,
                    n_ff_exp: 2880,
                    n_ff: 2880,
                    n_vocab: 201_088,
                    ctx_train: 131_072,
                    rope_base: 150_000.0,
                    rms_eps: 1e-5,
                    qk_norm: QkNorm::None,
                    expert_ff_key: true,
                    rope_dims_key: false,
                    vocab_fixture: "qwen2.5-coder-1.5b.gguf",
                    gpt_oss: true,
                    glm: None,
                    mla: None,
                    hybrid: None,
                    gemma: None,
                    extra: Extra::None,
                    default_quant: FileType::Mxfp4Moe,
                }
            }
            Like::Glm45Air => Shape {
                arch: "glm4moe",
                title: "GLM-4.5-Air",
                n_layer: 46,
                n_embd: 4096,
                n_head: 96,
                n_head_kv: 8,
                head_dim: 128,
                n_expert: 128,
                n_expert_used: 8,
                n_ff_exp: 1408,
                n_ff: 10944,
                n_vocab: 151_552,
                ctx_train: 131_072,
                rope_base: 1_000_000.0,
                rms_eps: 1e-5,
                qk_norm: QkNorm::None,
                expert_ff_key: true,
                rope_dims_key: true,
                vocab_fixture: "qwen2.5-coder-1.5b.gguf",
                gpt_oss: false,
                glm: Some(GlmExtras {
                    dense_lead: 1,
                    shared: 1,
                    nextn: 1,
                    rope_dims: 64,
                    weights_scale: 1.0,
                }),
                mla: None,
                hybrid: None,
                gemma: None,
                extra: Extra::None,
                default_quant: FileType::Q4_K_M,
            },
            Like::DeepseekV3 | Like::KimiK2 => {
                let kimi = self == Like::KimiK2;
                Shape {
                    arch: "deepseek2",
                    title: if kimi { "Kimi-K2" } else { "DeepSeek-V3" },
                    n_layer: 61,
                    n_embd: 7168,
                    n_head: if kimi { 64 } else { 128 },
                    // the absorbed form caches one head of kv_lora + rope values
                    n_head_kv: 1,
                    head_dim: 512 + 64,
                    n_expert: if kimi { 384 } else { 256 },
                    n_expert_used: 8,
                    n_ff_exp: 2048,
                    n_ff: 18432,
                    n_vocab: if kimi { 163_840 } else { 129_280 },
                    ctx_train: if kimi { 131_072 } else { 163_840 },
                    rope_base: if kimi { 50_000.0 } else { 10_000.0 },
                    rms_eps: 1e-6,
                    qk_norm: QkNorm::None,
                    expert_ff_key: true,
                    rope_dims_key: true,
                    vocab_fixture: "qwen2.5-coder-1.5b.gguf",
                    gpt_oss: false,
                    glm: Some(GlmExtras {
                        dense_lead: if kimi { 1 } else { 3 },
                        shared: 1,
                        nextn: 0,
                        rope_dims: 64,
                        weights_scale: if kimi { 2.827 } else { 2.5 },
                    }),
                    mla: Some(MlaShape {
                        q_lora: 1536,
                        kv_lora: 512,
                        nope: 128,
                        rope: 64,
                        v: 128,
                        groups: if kimi { (1, 1) } else { (8, 4) },
                        yarn: (if kimi { 32.0 } else { 40.0 }, 4096, 0.1),
                    }),
                    hybrid: None,
                    gemma: None,
                    extra: Extra::None,
                    default_quant: FileType::Q4_K_M,
                }
            }
            Like::Qwen36_35bA3b => Shape {
                arch: "qwen35moe",
                title: "Qwen3.6-35B-A3B",
                n_layer: 40,
                n_embd: 2048,
                n_head: 16,
                n_head_kv: 2,
                head_dim: 256,
                n_expert: 256,
                n_expert_used: 8,
                n_ff_exp: 512,
                n_ff: 512,
                n_vocab: 248_320,
                ctx_train: 262_144,
                rope_base: 10_000_000.0,
                rms_eps: 1e-6,
                qk_norm: QkNorm::PerHead,
                expert_ff_key: true,
                rope_dims_key: true,
                vocab_fixture: "qwen2.5-coder-1.5b.gguf",
                gpt_oss: false,
                glm: None,
                mla: None,
                hybrid: Some(HybridShape {
                    interval: 4,
                    k_heads: 16,
                    v_heads: 32,
                    head: 128,
                    conv: 4,
                    rope_dims: 64,
                    sections: Some([11, 11, 10, 0]),
                    grouped: false,
                    shexp: 512,
                }),
                gemma: None,
                extra: Extra::None,
                default_quant: FileType::Q4_K_M,
            },
            Like::Gemma4_26bA4b => Shape {
                arch: "gemma4",
                title: "Gemma-4-26B-A4B",
                n_layer: 30,
                n_embd: 2816,
                n_head: 16,
                n_head_kv: 8,
                head_dim: 256,
                n_expert: 128,
                n_expert_used: 8,
                n_ff_exp: 704,
                n_ff: 2112,
                n_vocab: 262_144,
                ctx_train: 262_144,
                rope_base: 1_000_000.0,
                rms_eps: 1e-6,
                qk_norm: QkNorm::PerHead,
                expert_ff_key: true,
                rope_dims_key: true,
                vocab_fixture: "ggml-vocab-gemma-4.gguf",
                gpt_oss: false,
                glm: None,
                mla: None,
                hybrid: None,
                gemma: Some(GemmaShape {
                    period: 6,
                    window: 1024,
                    head_full: 512,
                    kv_full: 2,
                    rot_pairs_full: 64,
                    rope_base_swa: 10_000.0,
                    softcap: 30.0,
                }),
                extra: Extra::None,
                default_quant: FileType::Q4_K_M,
            },
            Like::Qwen3Vl30bA3b => Shape {
                arch: "qwen3vlmoe",
                title: "Qwen3-VL-30B-A3B",
                ctx_train: 262_144,
                rope_base: 5_000_000.0,
                extra: Extra::Vision {
                    sections: [24, 20, 20, 0],
                    deepstack: 3,
                },
                ..Like::Qwen3_30bA3b.shape()
            },
            Like::Granite31_3bA800m => Shape {
                arch: "granitemoe",
                title: "Granite-3.1-3B-A800M",
                n_layer: 32,
                n_embd: 1536,
                n_head: 24,
                n_head_kv: 8,
                head_dim: 64,
                n_expert: 40,
                n_expert_used: 8,
                n_ff_exp: 512,
                n_ff: 512,
                n_vocab: 49_155,
                ctx_train: 131_072,
                rope_base: 10_000_000.0,
                rms_eps: 1e-6,
                qk_norm: QkNorm::None,
                expert_ff_key: false,
                rope_dims_key: true,
                vocab_fixture: "ggml-vocab-starcoder.gguf",
                gpt_oss: false,
                glm: None,
                mla: None,
                hybrid: None,
                gemma: None,
                extra: Extra::Granite {
                    embedding: 12.0,
                    attention: 0.015625,
                    residual: 0.22,
                    logit: 6.0,
                },
                default_quant: FileType::Q4_K_M,
            },
            Like::MinimaxM2 => Shape {
                arch: "minimax-m2",
                title: "MiniMax-M2",
                n_layer: 62,
                n_embd: 3072,
                n_head: 48,
                n_head_kv: 8,
                head_dim: 128,
                n_expert: 256,
                n_expert_used: 8,
                n_ff_exp: 1536,
                n_ff: 1536,
                n_vocab: 200_064,
                ctx_train: 196_608,
                rope_base: 5_000_000.0,
                rms_eps: 1e-6,
                qk_norm: QkNorm::Full,
                expert_ff_key: true,
                rope_dims_key: true,
                vocab_fixture: "qwen2.5-coder-1.5b.gguf",
                gpt_oss: false,
                glm: None,
                mla: None,
                hybrid: None,
                gemma: None,
                extra: Extra::MiniMax { rope_dims: 64 },
                default_quant: FileType::Q4_K_M,
            },
            Like::SmallThinker21bA3b => Shape {
                arch: "smallthinker",
                title: "SmallThinker-21B-A3B",
                n_layer: 52,
                n_embd: 2560,
                n_head: 28,
                n_head_kv: 4,
                head_dim: 128,
                n_expert: 64,
                n_expert_used: 6,
                n_ff_exp: 768,
                n_ff: 768,
                n_vocab: 151_936,
                ctx_train: 16_384,
                rope_base: 1_500_000.0,
                rms_eps: 1e-6,
                qk_norm: QkNorm::None,
                expert_ff_key: true,
                rope_dims_key: false,
                vocab_fixture: "qwen2.5-coder-1.5b.gguf",
                gpt_oss: false,
                glm: None,
                mla: None,
                hybrid: None,
                gemma: None,
                extra: Extra::SmallThinker { window: 4096 },
                default_quant: FileType::Q4_K_M,
            },
            Like::LingMini20 => Shape {
                arch: "bailingmoe2",
                title: "Ling-mini-2.0",
                n_layer: 20,
                n_embd: 2048,
                n_head: 16,
                n_head_kv: 4,
                head_dim: 128,
                n_expert: 256,
                n_expert_used: 8,
                n_ff_exp: 512,
                n_ff: 5120,
                n_vocab: 157_184,
                ctx_train: 32_768,
                rope_base: 600_000.0,
                rms_eps: 1e-6,
                qk_norm: QkNorm::PerHead,
                expert_ff_key: true,
                rope_dims_key: true,
                vocab_fixture: "qwen2.5-coder-1.5b.gguf",
                gpt_oss: false,
                glm: Some(GlmExtras {
                    dense_lead: 1,
                    shared: 1,
                    nextn: 0,
                    rope_dims: 64,
                    weights_scale: 2.5,
                }),
                mla: None,
                hybrid: None,
                gemma: None,
                extra: Extra::Bailing { groups: (8, 4) },
                default_quant: FileType::Q4_K_M,
            },
            Like::LingFlash20 => Shape {
                title: "Ling-flash-2.0",
                n_layer: 32,
                n_embd: 4096,
                n_head: 32,
                n_ff_exp: 1024,
                n_ff: 9216,
                ..Like::LingMini20.shape()
            },
            Like::Qwen3Next80bA3b => Shape {
                arch: "qwen3next",
                title: "Qwen3-Next-80B-A3B",
                n_layer: 48,
                n_expert: 512,
                n_expert_used: 10,
                n_ff: 5120,
                n_vocab: 151_936,
                vocab_fixture: "qwen2.5-coder-1.5b.gguf",
                hybrid: Some(HybridShape {
                    interval: 4,
                    k_heads: 16,
                    v_heads: 32,
                    head: 128,
                    conv: 4,
                    rope_dims: 64,
                    sections: None,
                    grouped: true,
                    shexp: 512,
                }),
                ..Like::Qwen36_35bA3b.shape()
            },
            Like::Llama4Scout => Shape {
                arch: "llama4",
                title: "Llama-4-Scout-17B-16E",
                n_layer: 48,
                n_embd: 5120,
                n_head: 40,
                n_head_kv: 8,
                head_dim: 128,
                n_expert: 16,
                n_expert_used: 1,
                n_ff_exp: 8192,
                n_ff: 16_384,
                n_vocab: 202_048,
                ctx_train: 10_485_760,
                rope_base: 500_000.0,
                rms_eps: 1e-5,
                qk_norm: QkNorm::None,
                expert_ff_key: true,
                rope_dims_key: true,
                vocab_fixture: "qwen2.5-coder-1.5b.gguf",
                gpt_oss: false,
                glm: None,
                mla: None,
                hybrid: None,
                gemma: None,
                extra: Extra::Llama4 {
                    moe_step: 1,
                    rope_freqs: true,
                },
                default_quant: FileType::Q4_K_M,
            },
            Like::Llama4Maverick => Shape {
                title: "Llama-4-Maverick-17B-128E",
                n_expert: 128,
                ctx_train: 1_048_576,
                extra: Extra::Llama4 {
                    moe_step: 2,
                    rope_freqs: false,
                },
                ..Like::Llama4Scout.shape()
            },
            Like::Lfm2_8bA1b => Shape {
                arch: "lfm2moe",
                title: "LFM2-8B-A1B",
                n_layer: 24,
                n_embd: 2048,
                n_head: 32,
                n_head_kv: 8,
                head_dim: 64,
                n_expert: 32,
                n_expert_used: 4,
                n_ff_exp: 1792,
                n_ff: 7168,
                n_vocab: 65_536,
                ctx_train: 128_000,
                rope_base: 1_000_000.0,
                rms_eps: 1e-5,
                qk_norm: QkNorm::PerHead,
                expert_ff_key: true,
                rope_dims_key: false,
                vocab_fixture: "qwen2.5-coder-1.5b.gguf",
                gpt_oss: false,
                glm: None,
                mla: None,
                hybrid: None,
                gemma: None,
                extra: Extra::Lfm2 {
                    attn: &[2, 6, 10, 14, 18, 21],
                    l_cache: 3,
                    dense_lead: 2,
                },
                default_quant: FileType::Q4_K_M,
            },
            // config.json of nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16: hidden_size 2688,
            // num_attention_heads 32, num_key_value_heads 2, head_dim 128, n_routed_experts
            // 128, num_experts_per_tok 6, moe_intermediate_size 1856,
            // moe_shared_expert_intermediate_size 3712, routed_scaling_factor 2.5, mamba_num_heads
            // 64, mamba_head_dim 64, ssm_state_size 128, n_groups 8, conv_kernel 4,
            // vocab_size 131072, max_position_embeddings 262144, norm_eps 1e-5, rope_theta
            // 10000, tie_word_embeddings false, no MTP layer
            Like::Nemotron3Nano30bA3b => Shape {
                arch: "nemotron_h_moe",
                title: "NVIDIA-Nemotron-3-Nano-30B-A3B",
                n_layer: 52,
                n_embd: 2688,
                n_head: 32,
                n_head_kv: 2,
                head_dim: 128,
                n_expert: 128,
                n_expert_used: 6,
                n_ff_exp: 1856,
                n_ff: 1856,
                n_vocab: 131_072,
                ctx_train: 262_144,
                rope_base: 10_000.0,
                rms_eps: 1e-5,
                qk_norm: QkNorm::None,
                expert_ff_key: true,
                rope_dims_key: false,
                vocab_fixture: "ggml-vocab-llama-bpe.gguf",
                gpt_oss: false,
                glm: None,
                mla: None,
                hybrid: None,
                gemma: None,
                extra: Extra::Nemotron(NemotronShape {
                    pattern: "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
                    d_conv: 4,
                    d_inner: 64 * 64,
                    d_state: 128,
                    ssm_heads: 64,
                    groups: 8,
                    shexp: 3712,
                    latent: 0,
                    scale: 2.5,
                }),
                default_quant: FileType::Q4_K_M,
            },
            // config.json of nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 (the NVFP4 and FP8
            // checkpoints' is the same): hidden_size 4096, num_attention_heads 32,
            // num_key_value_heads 2, head_dim 128, n_routed_experts 512, num_experts_per_tok
            // 22, moe_intermediate_size 2688, moe_latent_size 1024,
            // moe_shared_expert_intermediate_size 5376, routed_scaling_factor 5.0,
            // mamba_num_heads 128, mamba_head_dim 64, ssm_state_size 128, n_groups 8,
            // conv_kernel 4, vocab_size 131072, num_nextn_predict_layers 1 (its MTP block, not
            // written here)
            Like::Nemotron3Super120bA12b => Shape {
                title: "NVIDIA-Nemotron-3-Super-120B-A12B",
                n_layer: 88,
                n_embd: 4096,
                n_expert: 512,
                n_expert_used: 22,
                n_ff_exp: 2688,
                n_ff: 2688,
                extra: Extra::Nemotron(NemotronShape {
                    pattern: "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*\
                              EMEMEMEMEM*EMEMEMEM*EMEMEMEME",
                    d_conv: 4,
                    d_inner: 128 * 64,
                    d_state: 128,
                    ssm_heads: 128,
                    groups: 8,
                    shexp: 5376,
                    latent: 1024,
                    scale: 5.0,
                }),
                ..Like::Nemotron3Nano30bA3b.shape()
            },
        }
    }
}

impl Shape {
    /// The first `n` layers of the model (`--layers`), described so that the file is
    /// consistent and loads: the leading dense layers are at most `n - 1`, so that a cut keeps
    /// at least one MoE layer (a 2-layer DeepSeek-V3 cut: one dense layer, one MoE layer); the
    /// per-layer patterns (sliding-window layers, KV heads, recurrent layers) follow from
    /// `n_layer`, and [`tensor_list`] drops what no kept layer uses (gemma4's `rope_freqs`
    /// without a full-attention layer); a nemotron_h_moe cut is the first `n` letters of its
    /// hybrid pattern (one letter: a Mamba-2 layer and no MoE layer). NextN layers stay after
    /// the cut trunk. A deepseek2 cut
    /// of 26 or 27 layers is read by llama.cpp (and sluice) as DeepSeek-V2-Lite, whose query is
    /// one projection: such a cut gets `attn_q` instead of the low-rank query.
    fn cut(&mut self, n: u32) {
        self.n_layer = n;
        if let Some(g) = &mut self.glm {
            g.dense_lead = g.dense_lead.min(n - 1);
        }
        if let Extra::Lfm2 { dense_lead, .. } = &mut self.extra {
            *dense_lead = (*dense_lead).min(n - 1);
        }
        if let Extra::Nemotron(h) = &mut self.extra {
            // the first n letters of the pattern (ASCII)
            h.pattern = h.pattern.get(..n as usize).unwrap_or(h.pattern);
        }
        if let Some(m) = &mut self.mla
            && deepseek2_reads_as_lite(n)
        {
            m.q_lora = 0;
        }
    }
}

/// True when llama.cpp's deepseek2 loader (and sluice's) takes a file of `n_layer` layers for
/// DeepSeek-V2-Lite's layout: no `attention.q_lora_rank`, the query one `attn_q` (its rule
/// also covers 48 layers with a vocabulary of 128256, which no preset's vocabulary is).
fn deepseek2_reads_as_lite(n_layer: u32) -> bool {
    matches!(n_layer, 26 | 27)
}

/// gpt-oss's sliding window (every other layer, starting with layer 0).
const GPT_OSS_SWA: u32 = 128;
/// gpt-oss's YaRN: factor 32 over an original context of 4096.
const GPT_OSS_YARN: (f32, u32) = (32.0, 4096);

/// What to generate.
#[derive(Debug, Clone)]
pub struct Options {
    /// The real model whose architecture, tensor names, shapes and types to reproduce.
    pub like: Like,
    /// The file type [default: the one the published files use].
    pub quant: Option<FileType>,
    /// Keep only the first N layers (1 to the real count; the cut keeps an MoE layer, see
    /// `Shape::cut`).
    pub layers: Option<u32>,
    /// A GGUF to copy the tokenizer (`tokenizer.*` metadata) from. Without one the plan has
    /// the preset's vocabulary size and cannot be written.
    pub vocab: Option<PathBuf>,
    /// How unequal the experts' popularity is (0 to 8; 0 routes uniformly at random).
    pub router_skew: f32,
    /// Experts used per token instead of the real model's.
    pub experts_used: Option<u32>,
    /// Standard deviation of the attention output projection's weights (0 to 1).
    pub attn_out_std: f32,
    /// Seed of every random byte.
    pub seed: u64,
    /// A chat template (a Jinja text file) for `tokenizer.chat_template`.
    pub chat_template: Option<PathBuf>,
    /// Types for the routed experts instead of the file type's (see [`ExpertTypes`]).
    pub expert_types: Option<ExpertTypes>,
}

/// Types for the routed expert stacks that replace the file type's choice, as Unsloth's
/// dynamic files of DeepSeek, Kimi and GLM pair very low-bit experts with higher types
/// elsewhere: `gate_up` for `ffn_gate_exps`, `ffn_up_exps` and a fused `ffn_gate_up_exps`,
/// `down` for `ffn_down_exps`. Shared experts, dense layers, attention, embeddings and the
/// output keep the file type's types. A stack whose row length is not a whole number of the
/// type's blocks keeps the file type's type too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertTypes {
    pub gate_up: GgmlType,
    pub down: GgmlType,
}

impl ExpertTypes {
    /// The type this override gives tensor `name` with row length `cols`, if any.
    fn for_tensor(&self, name: &str, cols: u64) -> Option<GgmlType> {
        let ty = if name.contains(".ffn_down_exps.") {
            self.down
        } else if name.contains(".ffn_gate_exps.")
            || name.contains(".ffn_up_exps.")
            || name.contains(".ffn_gate_up_exps.")
        {
            self.gate_up
        } else {
            return None;
        };
        (name.ends_with(".weight") && cols.is_multiple_of(ty.block_size() as u64)).then_some(ty)
    }
}

/// What [`plan`] and [`write`] report while they work.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    /// The vocabulary's token count differs from the real model's: the embedding and output
    /// matrices get `tokens` rows.
    VocabSize { tokens: u64, real: u64 },
    /// Tensor data written so far (after every chunk of a few MiB).
    Progress { done: u64, total: u64 },
}

/// What a tensor holds.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    /// A norm weight: all ones.
    Norm,
    /// The router of a layer.
    Router,
    /// A weight matrix (or a stack of expert matrices).
    Weight,
    /// A small F32 tensor (bias, attention sink) of normal values with this standard
    /// deviation.
    Small(f32),
    /// An F32 tensor of this one value (qwen35moe's decay rates, which must be negative).
    Fill(f32),
    /// gemma4's proportional rope divisors: 1 for the first `rotated` pairs, 1e30 (no
    /// rotation) for the rest, as llama.cpp's converter writes them.
    RopeFreqs { rotated: u64 },
}

/// Standard deviation of gpt-oss's synthetic biases.
const BIAS_STD: f32 = 0.02;
/// Standard deviation of gpt-oss's synthetic attention sinks (trained ones are logits of a
/// few units).
const SINK_STD: f32 = 1.0;

#[derive(Clone, Debug)]
struct Planned {
    name: String,
    /// ggml order: ne0 (the row length) first.
    dims: Vec<u64>,
    role: Role,
}

/// The real model's tensors, in any order.
fn tensor_list(s: &Shape, n_layer: u32) -> Vec<Planned> {
    let t = |name: String, dims: &[u64], role| Planned {
        name,
        dims: dims.to_vec(),
        role,
    };
    let e = s.n_embd;
    let nq = s.n_head * s.head_dim;
    let nkv = s.n_head_kv * s.head_dim;
    // (LFM2's converter names the final norm token_embd_norm)
    let out_norm = if matches!(s.extra, Extra::Lfm2 { .. }) {
        "token_embd_norm.weight"
    } else {
        "output_norm.weight"
    };
    let mut v = vec![
        t("token_embd.weight".into(), &[e, s.n_vocab], Role::Weight),
        t(out_norm.into(), &[e], Role::Norm),
    ];
    if let Some(g) = s.gemma {
        // tied embeddings, as the released files; the full-attention layers' rope divisors
        // only when the (cut) model has one, else no layer reads them
        if n_layer >= g.period {
            v.push(t(
                "rope_freqs.weight".into(),
                &[g.head_full / 2],
                Role::RopeFreqs {
                    rotated: g.rot_pairs_full,
                },
            ));
        }
    } else if !matches!(
        s.extra,
        Extra::Granite { .. } | Extra::SmallThinker { .. } | Extra::Lfm2 { .. }
    ) {
        // granitemoe's, SmallThinker's and LFM2's released files tie the output to the
        // embeddings
        v.push(t("output.weight".into(), &[e, s.n_vocab], Role::Weight));
    }
    if let Extra::Llama4 {
        rope_freqs: true, ..
    } = s.extra
    {
        // the llama3 rope divisors (ones here), one per rotated pair
        v.push(t(
            "rope_freqs.weight".into(),
            &[s.head_dim / 2],
            Role::RopeFreqs {
                rotated: s.head_dim / 2,
            },
        ));
    }
    let nextn = s.glm.map_or(0, |g| g.nextn);
    for il in 0..n_layer + nextn {
        let p = |n: &str| format!("blk.{il}.{n}.weight");
        v.push(t(p("attn_norm"), &[e], Role::Norm));
        if let (Some(m), Some(g)) = (s.mla, s.glm) {
            mla_layer(&mut v, s, m, g, il);
            continue;
        }
        if let Some(h) = s.hybrid {
            hybrid_layer(&mut v, s, h, il);
            continue;
        }
        if let Some(g) = s.gemma {
            gemma_layer(&mut v, s, g, il);
            continue;
        }
        if let (Extra::Bailing { .. }, Some(g)) = (s.extra, s.glm) {
            bailing_layer(&mut v, s, g, il, n_layer);
            continue;
        }
        if let Extra::Lfm2 {
            attn,
            l_cache,
            dense_lead,
        } = s.extra
        {
            lfm2_layer(&mut v, s, (attn.contains(&il), l_cache, dense_lead), il);
            continue;
        }
        if let Extra::Nemotron(h) = s.extra {
            nemotron_layer(&mut v, s, h, il);
            continue;
        }
        v.push(t(p("attn_q"), &[e, nq], Role::Weight));
        v.push(t(p("attn_k"), &[e, nkv], Role::Weight));
        v.push(t(p("attn_v"), &[e, nkv], Role::Weight));
        v.push(t(p("attn_output"), &[nq, e], Role::Weight));
        match s.qk_norm {
            QkNorm::None => {}
            QkNorm::PerHead => {
                v.push(t(p("attn_q_norm"), &[s.head_dim], Role::Norm));
                v.push(t(p("attn_k_norm"), &[s.head_dim], Role::Norm));
            }
            QkNorm::Full => {
                v.push(t(p("attn_q_norm"), &[nq], Role::Norm));
                v.push(t(p("attn_k_norm"), &[nkv], Role::Norm));
            }
        }
        let (f, x) = (s.n_ff_exp, s.n_expert);
        if s.gpt_oss {
            let b = |n: &str| format!("blk.{il}.{n}.bias");
            let bias = Role::Small(BIAS_STD);
            v.push(t(b("attn_q"), &[nq], bias));
            v.push(t(b("attn_k"), &[nkv], bias));
            v.push(t(b("attn_v"), &[nkv], bias));
            v.push(t(b("attn_output"), &[e], bias));
            v.push(t(p("attn_sinks"), &[s.n_head], Role::Small(SINK_STD)));
            v.push(t(p("post_attention_norm"), &[e], Role::Norm));
            v.push(t(b("ffn_gate_inp"), &[x], bias));
            v.push(t(b("ffn_gate_exps"), &[f, x], bias));
            v.push(t(b("ffn_up_exps"), &[f, x], bias));
            v.push(t(b("ffn_down_exps"), &[e, x], bias));
        } else if let Some(g) = s.glm {
            let b = |n: &str| format!("blk.{il}.{n}.bias");
            let bias = Role::Small(BIAS_STD);
            v.push(t(b("attn_q"), &[nq], bias));
            v.push(t(b("attn_k"), &[nkv], bias));
            v.push(t(b("attn_v"), &[nkv], bias));
            v.push(t(p("post_attention_norm"), &[e], Role::Norm));
            if il >= n_layer {
                v.push(t(p("nextn.eh_proj"), &[2 * e, e], Role::Weight));
                v.push(t(p("nextn.enorm"), &[e], Role::Norm));
                v.push(t(p("nextn.hnorm"), &[e], Role::Norm));
                v.push(t(p("nextn.shared_head_norm"), &[e], Role::Norm));
            }
            if il < g.dense_lead {
                v.push(t(p("ffn_gate"), &[e, s.n_ff], Role::Weight));
                v.push(t(p("ffn_up"), &[e, s.n_ff], Role::Weight));
                v.push(t(p("ffn_down"), &[s.n_ff, e], Role::Weight));
                continue;
            }
            let w = f * g.shared;
            v.push(t(b("exp_probs_b"), &[x], bias));
            v.push(t(p("ffn_gate_shexp"), &[e, w], Role::Weight));
            v.push(t(p("ffn_up_shexp"), &[e, w], Role::Weight));
            v.push(t(p("ffn_down_shexp"), &[w, e], Role::Weight));
        } else {
            v.push(t(p("ffn_norm"), &[e], Role::Norm));
            if let Extra::MiniMax { .. } = s.extra {
                v.push(t(
                    format!("blk.{il}.exp_probs_b.bias"),
                    &[x],
                    Role::Small(BIAS_STD),
                ));
            }
            if let Extra::Llama4 { moe_step, .. } = s.extra {
                if !(il + 1).is_multiple_of(moe_step) {
                    v.push(t(p("ffn_gate"), &[e, s.n_ff], Role::Weight));
                    v.push(t(p("ffn_up"), &[e, s.n_ff], Role::Weight));
                    v.push(t(p("ffn_down"), &[s.n_ff, e], Role::Weight));
                    continue;
                }
                v.push(t(p("ffn_gate_shexp"), &[e, f], Role::Weight));
                v.push(t(p("ffn_up_shexp"), &[e, f], Role::Weight));
                v.push(t(p("ffn_down_shexp"), &[f, e], Role::Weight));
            }
        }
        v.push(t(p("ffn_gate_inp"), &[e, s.n_expert], Role::Router));
        v.push(t(p("ffn_gate_exps"), &[e, f, x], Role::Weight));
        v.push(t(p("ffn_up_exps"), &[e, f, x], Role::Weight));
        v.push(t(p("ffn_down_exps"), &[f, e, x], Role::Weight));
    }
    v
}

/// A bailingmoe2 layer after its `attn_norm`: the fused q/k/v projection, the output
/// projection, the per-head q/k norms, the FFN norm, past the trunk the NextN tensors, then a
/// dense FFN (the leading layers) or the router with its selection bias, the shared expert and
/// the experts.
fn bailing_layer(v: &mut Vec<Planned>, s: &Shape, g: GlmExtras, il: u32, n_layer: u32) {
    let t = |name: String, dims: &[u64], role| Planned {
        name,
        dims: dims.to_vec(),
        role,
    };
    let p = |n: &str| format!("blk.{il}.{n}.weight");
    let e = s.n_embd;
    let (nq, nkv) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
    v.push(t(p("attn_qkv"), &[e, nq + 2 * nkv], Role::Weight));
    v.push(t(p("attn_output"), &[nq, e], Role::Weight));
    v.push(t(p("attn_q_norm"), &[s.head_dim], Role::Norm));
    v.push(t(p("attn_k_norm"), &[s.head_dim], Role::Norm));
    v.push(t(p("ffn_norm"), &[e], Role::Norm));
    if il >= n_layer {
        v.push(t(p("nextn.eh_proj"), &[2 * e, e], Role::Weight));
        v.push(t(p("nextn.enorm"), &[e], Role::Norm));
        v.push(t(p("nextn.hnorm"), &[e], Role::Norm));
        v.push(t(p("layer_output_norm"), &[e], Role::Norm));
    }
    if il < g.dense_lead {
        v.push(t(p("ffn_gate"), &[e, s.n_ff], Role::Weight));
        v.push(t(p("ffn_up"), &[e, s.n_ff], Role::Weight));
        v.push(t(p("ffn_down"), &[s.n_ff, e], Role::Weight));
        return;
    }
    let (f, x) = (s.n_ff_exp, s.n_expert);
    let w = f * g.shared;
    v.push(t(
        format!("blk.{il}.exp_probs_b.bias"),
        &[x],
        Role::Small(BIAS_STD),
    ));
    v.push(t(p("ffn_gate_shexp"), &[e, w], Role::Weight));
    v.push(t(p("ffn_up_shexp"), &[e, w], Role::Weight));
    v.push(t(p("ffn_down_shexp"), &[w, e], Role::Weight));
    v.push(t(p("ffn_gate_inp"), &[e, x], Role::Router));
    v.push(t(p("ffn_gate_exps"), &[e, f, x], Role::Weight));
    v.push(t(p("ffn_up_exps"), &[e, f, x], Role::Weight));
    v.push(t(p("ffn_down_exps"), &[f, e, x], Role::Weight));
}

/// An lfm2moe layer after its `attn_norm`: attention with per-head q/k norms (where `attn`)
/// or the short convolution (`in_proj`, the convolution over `l_cache` positions,
/// `out_proj`), the FFN norm, then a dense FFN (the first `dense_lead` layers) or the router
/// with its selection bias and the experts.
fn lfm2_layer(
    v: &mut Vec<Planned>,
    s: &Shape,
    (attn, l_cache, dense_lead): (bool, u64, u32),
    il: u32,
) {
    let t = |name: String, dims: &[u64], role| Planned {
        name,
        dims: dims.to_vec(),
        role,
    };
    let p = |n: &str| format!("blk.{il}.{n}.weight");
    let e = s.n_embd;
    if attn {
        let nq = s.n_head * s.head_dim;
        let nkv = s.n_head_kv * s.head_dim;
        v.push(t(p("attn_q"), &[e, nq], Role::Weight));
        v.push(t(p("attn_k"), &[e, nkv], Role::Weight));
        v.push(t(p("attn_v"), &[e, nkv], Role::Weight));
        v.push(t(p("attn_output"), &[nq, e], Role::Weight));
        v.push(t(p("attn_q_norm"), &[s.head_dim], Role::Norm));
        v.push(t(p("attn_k_norm"), &[s.head_dim], Role::Norm));
    } else {
        v.push(t(p("shortconv.in_proj"), &[e, 3 * e], Role::Weight));
        v.push(t(p("shortconv.conv"), &[l_cache, e], Role::Small(0.2)));
        v.push(t(p("shortconv.out_proj"), &[e, e], Role::Weight));
    }
    v.push(t(p("ffn_norm"), &[e], Role::Norm));
    if il < dense_lead {
        v.push(t(p("ffn_gate"), &[e, s.n_ff], Role::Weight));
        v.push(t(p("ffn_up"), &[e, s.n_ff], Role::Weight));
        v.push(t(p("ffn_down"), &[s.n_ff, e], Role::Weight));
        return;
    }
    let (f, x) = (s.n_ff_exp, s.n_expert);
    v.push(t(
        format!("blk.{il}.exp_probs_b.bias"),
        &[x],
        Role::Small(BIAS_STD),
    ));
    v.push(t(p("ffn_gate_inp"), &[e, x], Role::Router));
    v.push(t(p("ffn_gate_exps"), &[e, f, x], Role::Weight));
    v.push(t(p("ffn_up_exps"), &[e, f, x], Role::Weight));
    v.push(t(p("ffn_down_exps"), &[f, e, x], Role::Weight));
}

/// A nemotron_h_moe layer after its `attn_norm`, of the kind its letter of the pattern says:
/// a Mamba-2 mixer (`ssm_in` makes z, x, B, C and dt; the convolution over `d_conv` positions
/// with its bias; dt's bias, A and D per head; the grouped RMSNorm; `ssm_out`), attention
/// without rope or biases, or the MoE block (the router with its selection bias, the latent
/// projections when the model has them, the gate-less up and down expert stacks, the
/// ungated shared expert's up and down).
fn nemotron_layer(v: &mut Vec<Planned>, s: &Shape, h: NemotronShape, il: u32) {
    let t = |name: String, dims: &[u64], role| Planned {
        name,
        dims: dims.to_vec(),
        role,
    };
    let p = |n: &str| format!("blk.{il}.{n}.weight");
    let e = s.n_embd;
    match h.kind(il) {
        b'*' => {
            let nq = s.n_head * s.head_dim;
            let nkv = s.n_head_kv * s.head_dim;
            v.push(t(p("attn_q"), &[e, nq], Role::Weight));
            v.push(t(p("attn_k"), &[e, nkv], Role::Weight));
            v.push(t(p("attn_v"), &[e, nkv], Role::Weight));
            v.push(t(p("attn_output"), &[nq, e], Role::Weight));
        }
        b'E' => {
            let (f, x) = (s.n_ff_exp, s.n_expert);
            let m = if h.latent > 0 { h.latent } else { e };
            v.push(t(p("ffn_gate_inp"), &[e, x], Role::Router));
            v.push(t(
                format!("blk.{il}.exp_probs_b.bias"),
                &[x],
                Role::Small(BIAS_STD),
            ));
            if h.latent > 0 {
                v.push(t(p("ffn_latent_down"), &[e, m], Role::Weight));
                v.push(t(p("ffn_latent_up"), &[m, e], Role::Weight));
            }
            v.push(t(p("ffn_up_exps"), &[m, f, x], Role::Weight));
            v.push(t(p("ffn_down_exps"), &[f, m, x], Role::Weight));
            v.push(t(p("ffn_up_shexp"), &[e, h.shexp], Role::Weight));
            v.push(t(p("ffn_down_shexp"), &[h.shexp, e], Role::Weight));
        }
        _ => {
            let bc = 2 * h.groups * h.d_state;
            let conv = h.d_inner + bc;
            let heads = h.ssm_heads;
            v.push(t(
                p("ssm_in"),
                &[e, 2 * h.d_inner + bc + heads],
                Role::Weight,
            ));
            v.push(t(p("ssm_conv1d"), &[h.d_conv, conv], Role::Small(0.2)));
            v.push(t(
                format!("blk.{il}.ssm_conv1d.bias"),
                &[conv],
                Role::Small(BIAS_STD),
            ));
            // softplus(0) ≈ 0.69 per step; A = -1 decays the state by about a half a token
            v.push(t(
                format!("blk.{il}.ssm_dt.bias"),
                &[heads],
                Role::Fill(0.0),
            ));
            v.push(t(format!("blk.{il}.ssm_a"), &[1, heads], Role::Fill(-1.0)));
            v.push(t(format!("blk.{il}.ssm_d"), &[1, heads], Role::Fill(1.0)));
            v.push(t(
                p("ssm_norm"),
                &[h.d_inner / h.groups, h.groups],
                Role::Norm,
            ));
            v.push(t(p("ssm_out"), &[h.d_inner, e], Role::Weight));
        }
    }
}

/// A deepseek2 layer after its `attn_norm`: multi-head latent attention in the absorbed form,
/// the FFN norm, then a dense FFN (the leading layers) or the router with its selection bias,
/// the shared expert and the experts.
fn mla_layer(v: &mut Vec<Planned>, s: &Shape, m: MlaShape, g: GlmExtras, il: u32) {
    let t = |name: String, dims: &[u64], role| Planned {
        name,
        dims: dims.to_vec(),
        role,
    };
    let p = |n: &str| format!("blk.{il}.{n}.weight");
    let (e, h) = (s.n_embd, s.n_head);
    if m.q_lora == 0 {
        v.push(t(p("attn_q"), &[e, h * (m.nope + m.rope)], Role::Weight));
    } else {
        v.push(t(p("attn_q_a"), &[e, m.q_lora], Role::Weight));
        v.push(t(p("attn_q_a_norm"), &[m.q_lora], Role::Norm));
        v.push(t(
            p("attn_q_b"),
            &[m.q_lora, h * (m.nope + m.rope)],
            Role::Weight,
        ));
    }
    v.push(t(
        p("attn_kv_a_mqa"),
        &[e, m.kv_lora + m.rope],
        Role::Weight,
    ));
    v.push(t(p("attn_kv_a_norm"), &[m.kv_lora], Role::Norm));
    v.push(t(p("attn_k_b"), &[m.nope, m.kv_lora, h], Role::Weight));
    v.push(t(p("attn_v_b"), &[m.kv_lora, m.v, h], Role::Weight));
    v.push(t(p("attn_output"), &[h * m.v, e], Role::Weight));
    v.push(t(p("ffn_norm"), &[e], Role::Norm));
    if il < g.dense_lead {
        v.push(t(p("ffn_gate"), &[e, s.n_ff], Role::Weight));
        v.push(t(p("ffn_up"), &[e, s.n_ff], Role::Weight));
        v.push(t(p("ffn_down"), &[s.n_ff, e], Role::Weight));
        return;
    }
    let (f, x) = (s.n_ff_exp, s.n_expert);
    let w = f * g.shared;
    v.push(t(
        format!("blk.{il}.exp_probs_b.bias"),
        &[x],
        Role::Small(BIAS_STD),
    ));
    v.push(t(p("ffn_gate_shexp"), &[e, w], Role::Weight));
    v.push(t(p("ffn_up_shexp"), &[e, w], Role::Weight));
    v.push(t(p("ffn_down_shexp"), &[w, e], Role::Weight));
    v.push(t(p("ffn_gate_inp"), &[e, x], Role::Router));
    v.push(t(p("ffn_gate_exps"), &[e, f, x], Role::Weight));
    v.push(t(p("ffn_up_exps"), &[e, f, x], Role::Weight));
    v.push(t(p("ffn_down_exps"), &[f, e, x], Role::Weight));
}

/// A qwen35moe layer after its `attn_norm`: linear attention (Gated DeltaNet) or, every
/// `interval`-th layer, gated full attention; then the post-attention norm, the router, the
/// gated shared expert and the experts.
fn hybrid_layer(v: &mut Vec<Planned>, s: &Shape, h: HybridShape, il: u32) {
    let t = |name: String, dims: &[u64], role| Planned {
        name,
        dims: dims.to_vec(),
        role,
    };
    let p = |n: &str| format!("blk.{il}.{n}.weight");
    let e = s.n_embd;
    if !(il + 1).is_multiple_of(h.interval) {
        let (kd, vd) = (h.k_heads * h.head, h.v_heads * h.head);
        let ch = 2 * kd + vd;
        if h.grouped {
            v.push(t(p("ssm_in"), &[e, ch + vd], Role::Weight));
        } else {
            v.push(t(p("attn_qkv"), &[e, ch], Role::Weight));
            v.push(t(p("attn_gate"), &[e, vd], Role::Weight));
        }
        v.push(t(p("ssm_conv1d"), &[h.conv, ch], Role::Small(0.2)));
        v.push(t(
            format!("blk.{il}.ssm_dt.bias"),
            &[h.v_heads],
            Role::Fill(0.0),
        ));
        // decay exp(softplus(alpha) · a): about 0.7 per token for alpha near 0
        v.push(t(format!("blk.{il}.ssm_a"), &[h.v_heads], Role::Fill(-0.5)));
        if h.grouped {
            v.push(t(p("ssm_ba"), &[e, 2 * h.v_heads], Role::Weight));
        } else {
            v.push(t(p("ssm_beta"), &[e, h.v_heads], Role::Weight));
            v.push(t(p("ssm_alpha"), &[e, h.v_heads], Role::Weight));
        }
        v.push(t(p("ssm_norm"), &[h.head], Role::Norm));
        v.push(t(p("ssm_out"), &[vd, e], Role::Weight));
    } else {
        let nq = s.n_head * s.head_dim;
        let nkv = s.n_head_kv * s.head_dim;
        v.push(t(p("attn_q"), &[e, 2 * nq], Role::Weight));
        v.push(t(p("attn_k"), &[e, nkv], Role::Weight));
        v.push(t(p("attn_v"), &[e, nkv], Role::Weight));
        v.push(t(p("attn_output"), &[nq, e], Role::Weight));
        v.push(t(p("attn_q_norm"), &[s.head_dim], Role::Norm));
        v.push(t(p("attn_k_norm"), &[s.head_dim], Role::Norm));
    }
    v.push(t(p("post_attention_norm"), &[e], Role::Norm));
    let (f, x) = (s.n_ff_exp, s.n_expert);
    v.push(t(p("ffn_gate_inp"), &[e, x], Role::Router));
    v.push(t(p("ffn_gate_exps"), &[e, f, x], Role::Weight));
    v.push(t(p("ffn_up_exps"), &[e, f, x], Role::Weight));
    v.push(t(p("ffn_down_exps"), &[f, e, x], Role::Weight));
    v.push(t(p("ffn_gate_inp_shexp"), &[e], Role::Small(BIAS_STD)));
    v.push(t(p("ffn_gate_shexp"), &[e, h.shexp], Role::Weight));
    v.push(t(p("ffn_up_shexp"), &[e, h.shexp], Role::Weight));
    v.push(t(p("ffn_down_shexp"), &[h.shexp, e], Role::Weight));
}

/// A gemma4 layer after its `attn_norm`: attention through the window (or, every
/// `period`-th layer, full attention whose keys are its values), its post norm, the dense
/// GEGLU MLP with its norms, and the router, norms and fused experts of the MoE block.
fn gemma_layer(v: &mut Vec<Planned>, s: &Shape, g: GemmaShape, il: u32) {
    let t = |name: String, dims: &[u64], role| Planned {
        name,
        dims: dims.to_vec(),
        role,
    };
    let p = |n: &str| format!("blk.{il}.{n}.weight");
    let e = s.n_embd;
    let full = (il + 1).is_multiple_of(g.period);
    let (hd, kv) = if full {
        (g.head_full, g.kv_full)
    } else {
        (s.head_dim, s.n_head_kv)
    };
    let nq = s.n_head * hd;
    v.push(t(p("attn_q"), &[e, nq], Role::Weight));
    v.push(t(p("attn_k"), &[e, kv * hd], Role::Weight));
    if !full {
        v.push(t(p("attn_v"), &[e, kv * hd], Role::Weight));
    }
    v.push(t(p("attn_output"), &[nq, e], Role::Weight));
    v.push(t(p("attn_q_norm"), &[hd], Role::Norm));
    v.push(t(p("attn_k_norm"), &[hd], Role::Norm));
    v.push(t(p("post_attention_norm"), &[e], Role::Norm));
    v.push(t(p("layer_output_scale"), &[1], Role::Fill(1.0)));
    v.push(t(p("ffn_norm"), &[e], Role::Norm));
    v.push(t(p("ffn_gate"), &[e, s.n_ff], Role::Weight));
    v.push(t(p("ffn_up"), &[e, s.n_ff], Role::Weight));
    v.push(t(p("ffn_down"), &[s.n_ff, e], Role::Weight));
    v.push(t(p("post_ffw_norm"), &[e], Role::Norm));
    let (f, x) = (s.n_ff_exp, s.n_expert);
    v.push(t(p("ffn_gate_inp"), &[e, x], Role::Router));
    v.push(t(format!("blk.{il}.ffn_gate_inp.scale"), &[e], Role::Norm));
    v.push(t(p("pre_ffw_norm_2"), &[e], Role::Norm));
    v.push(t(p("post_ffw_norm_1"), &[e], Role::Norm));
    v.push(t(p("post_ffw_norm_2"), &[e], Role::Norm));
    v.push(t(p("ffn_gate_up_exps"), &[e, 2 * f, x], Role::Weight));
    v.push(t(p("ffn_down_exps"), &[f, e, x], Role::Weight));
    v.push(t(
        format!("blk.{il}.ffn_down_exps.scale"),
        &[x],
        Role::Fill(1.0),
    ));
}

/// FNV-1a of a tensor name, to give every tensor its own random stream.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Where a block type keeps its f16 scale fields, and how the weights scale with them.
#[derive(Clone, Copy, Debug)]
struct BlockProfile {
    /// Byte offset of the f16 scale `d`.
    d_at: usize,
    /// Byte offset of the f16 minimum and the minimum in units of `d` that makes random
    /// blocks zero-mean.
    min: Option<(usize, f32)>,
    /// Standard deviation of the weights of a random block, in units of `d`.
    spread: f32,
}

/// The scale layout of the block types gen-model fills; `None` for the others.
fn block_profile(ty: GgmlType) -> Option<BlockProfile> {
    let p = |d_at, min, spread| Some(BlockProfile { d_at, min, spread });
    // Spreads of the random quants (uniform over their range, and for the k-quants with
    // sub-block scales, uniform scale bits too); minimums cancel the quants' mean.
    match ty {
        // d·(q − 8), q in 0..16
        GgmlType::Q4_0 => p(0, None, 4.61),
        // d·q + m, q in 0..16
        GgmlType::Q4_1 => p(0, Some((2, -7.5)), 4.61),
        // d·(q − 16), q in 0..32
        GgmlType::Q5_0 => p(0, None, 9.23),
        GgmlType::Q5_1 => p(0, Some((2, -15.5)), 9.23),
        // d·q, q any i8
        GgmlType::Q8_0 => p(0, None, 73.9),
        // d·sc·q − dmin·m, 4-bit sc and m, q in 0..4
        GgmlType::Q2_K => p(80, Some((82, 1.5)), 13.9),
        // d·(sc − 32)·(q − 4), 6-bit sc, q in 0..8
        GgmlType::Q3_K => p(108, None, 42.5),
        // d·sc·q − dmin·m, 6-bit sc and m, q in 0..16
        GgmlType::Q4_K => p(0, Some((2, 7.5)), 258.0),
        // the same with q in 0..32
        GgmlType::Q5_K => p(0, Some((2, 15.5)), 527.0),
        // d·sc·(q − 32), sc any i8, q in 0..64
        GgmlType::Q6_K => p(208, None, 1367.0),
        // d·kvalues[q], the 16 non-linear levels (spread about 66)
        GgmlType::IQ4_NL => p(0, None, 66.0),
        // 2^(e-128)·kvalues[q], the 16 doubled e2m1 levels (spread 5.85); the scale is the
        // one E8M0 byte at 0 (see `write_blocks`)
        GgmlType::MXFP4 => p(0, None, 5.85),
        // The i-quants: signed grid magnitudes times 4-bit sub-block scales (IQ1_S: 3-bit,
        // grid values -1, 0, 1 shifted by ±1/8; IQ4_XS: 6-bit signed scales times the 16
        // levels). Spreads measured on random blocks with d = 1 (gguf-py 0.19's dequantizer,
        // 4000 blocks each).
        GgmlType::IQ2_XXS => p(0, None, 53.5),
        GgmlType::IQ2_XS => p(0, None, 55.9),
        GgmlType::IQ2_S => p(0, None, 56.4),
        GgmlType::IQ3_XXS => p(0, None, 142.4),
        GgmlType::IQ3_S => p(0, None, 140.0),
        GgmlType::IQ1_S => p(0, None, 7.2),
        GgmlType::IQ4_XS => p(0, None, 1247.0),
        _ => None,
    }
}

/// The block types [`block_profile`] knows.
fn filled() -> impl Iterator<Item = GgmlType> {
    GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| block_profile(t).is_some())
}

/// True when gen-model can write the file type `quant` for every preset: it has a
/// random-block generator for every type the mix gives a weight. That is every llama.cpp mix
/// `sluice quantize` writes but the ternary TQ1_0 and TQ2_0 (their blocks hold trits, which
/// random bytes are not); the CLI offers only these.
pub fn fills(quant: FileType) -> bool {
    !matches!(quant, FileType::TQ1_0 | FileType::TQ2_0)
}

/// Standard deviation of the synthetic weights.
const WEIGHT_STD: f32 = 0.02;

/// Standard deviation of a weight matrix's values: `attn_out_std` for the attention output
/// projection, [`WEIGHT_STD`] for every other.
fn weight_std(name: &str, attn_out_std: f32) -> f32 {
    if name.contains("attn_output.") {
        attn_out_std
    } else {
        WEIGHT_STD
    }
}

/// Bytes generated per write.
const CHUNK: usize = 4 << 20;

/// Streams one quantized tensor of `n_bytes` random blocks, weights of standard deviation
/// `weight_sd`, into `out`.
fn write_blocks(
    out: &mut dyn Write,
    ty: GgmlType,
    weight_sd: f32,
    n_bytes: u64,
    seed: u64,
    progress: &dyn Fn(u64),
) -> io::Result<()> {
    let Some(prof) = block_profile(ty) else {
        return Err(io::Error::other(format!(
            "no random-block generator for type {}",
            ty.name()
        )));
    };
    let block = ty.type_size();
    // 64 scales evenly spread over ±10% around the target, picked per block.
    let d0 = weight_sd / prof.spread;
    let table: Vec<([u8; 2], Option<[u8; 2]>)> = (0..64)
        .map(|i| {
            let d = d0 * (0.9 + 0.2 * i as f32 / 63.0);
            let m = prof.min.map(|(_, k)| f16::from_f32(k * d).to_le_bytes());
            (f16::from_f32(d).to_le_bytes(), m)
        })
        .collect();
    // MXFP4's scale is 2^(e - 128) (ggml's e8m0 "half" convention): the exponents just below
    // and above d0, the upper one taken by a share of the blocks (out of 256) that makes the
    // mixture's variance d0's.
    let lo = f64::from(d0).log2().floor();
    let e_lo = (lo + 128.0).clamp(2.0, 253.0) as u8;
    let (v_lo, v_hi) = ((2f64).powf(2.0 * lo), (2f64).powf(2.0 * (lo + 1.0)));
    let hi_share = ((f64::from(d0).powi(2) - v_lo) / (v_hi - v_lo) * 256.0).round() as u16;
    let per_chunk = (CHUNK / block).max(1) * block;
    // One thread generates while this one writes (the write's copy into the page cache costs
    // more than the generation): chunks go over a channel of two, and come back for reuse.
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(2);
    let (empty_tx, empty_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    for _ in 0..3 {
        let _ = empty_tx.send(vec![0u8; per_chunk]);
    }
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut rng = WyRand::new(seed);
            let mut left = n_bytes;
            while left > 0 {
                let Ok(mut buf) = empty_rx.recv() else { return };
                let len = per_chunk.min(usize::try_from(left).unwrap_or(per_chunk));
                buf.truncate(len);
                rng.fill(&mut buf);
                for b in buf.chunks_exact_mut(block) {
                    if ty == GgmlType::MXFP4 {
                        // one E8M0 exponent byte: the two powers of two around the target scale
                        b[0] = if u16::from(b[0]) < hi_share {
                            e_lo + 1
                        } else {
                            e_lo
                        };
                        continue;
                    }
                    let pick = b[prof.d_at];
                    let (mut d, m) = table[(pick & 63) as usize];
                    if let (Some((at, _)), Some(m)) = (prof.min, m) {
                        b[at..at + 2].copy_from_slice(&m);
                    } else if pick & 64 != 0 {
                        // Without a minimum, a random sign of the scale (as quantizers give:
                        // d is the signed extreme over a level) cancels the levels' own
                        // mean, e.g. the -0.5 of Q4_0's q - 8.
                        d[1] ^= 0x80;
                    }
                    b[prof.d_at..prof.d_at + 2].copy_from_slice(&d);
                }
                left -= len as u64;
                if full_tx.send(buf).is_err() {
                    return;
                }
            }
        });
        // Owned here, so that an early return drops it and ends a generator blocked on a full
        // channel before the scope joins it.
        let full_rx = full_rx;
        let mut left = n_bytes;
        while left > 0 {
            let mut buf = full_rx
                .recv()
                .map_err(|_| io::Error::other("the block generator stopped"))?;
            out.write_all(&buf)?;
            left -= buf.len() as u64;
            progress(buf.len() as u64);
            buf.resize(per_chunk, 0);
            // The generator may be done already.
            let _ = empty_tx.send(buf);
        }
        Ok(())
    })
}

/// Writes a file with O_DIRECT: bytes are gathered in a 4 KiB-aligned buffer and written in
/// whole aligned blocks straight to the device (no copy into the page cache, whose kernel-side
/// copy otherwise costs more CPU than generating the blocks); the tail is padded to a block
/// and the file cut back to its length by [`DirectWriter::finish`].
struct DirectWriter {
    file: File,
    raw: Vec<u8>,
    /// Start of the aligned window in `raw`.
    at: usize,
    /// Bytes gathered in the window.
    len: usize,
    /// Bytes written to the file so far (whole windows).
    written: u64,
}

/// Alignment of O_DIRECT offsets, lengths and buffers (covers 512- and 4096-byte sectors).
const DIRECT_ALIGN: usize = 4096;
/// Bytes per direct write.
const DIRECT_WINDOW: usize = 8 << 20;

impl DirectWriter {
    fn create(path: &Path) -> io::Result<DirectWriter> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        let raw = vec![0u8; DIRECT_WINDOW + DIRECT_ALIGN];
        let at = raw.as_ptr().align_offset(DIRECT_ALIGN);
        if at >= DIRECT_ALIGN {
            return Err(io::Error::other("cannot align the write buffer"));
        }
        Ok(DirectWriter {
            file,
            raw,
            at,
            len: 0,
            written: 0,
        })
    }

    /// Write the first `n` bytes of the window (a multiple of the alignment).
    fn write_window(&mut self, n: usize) -> io::Result<()> {
        let mut done = 0;
        while done < n {
            let k = self.file.write(&self.raw[self.at + done..self.at + n])?;
            if k == 0 || k % DIRECT_ALIGN != 0 {
                return Err(io::Error::other(format!(
                    "a direct write of {} bytes wrote {k}",
                    n - done
                )));
            }
            done += k;
        }
        self.written += n as u64;
        Ok(())
    }

    /// Write what is left (padded to a block), cut the file to its length, return it.
    fn finish(mut self) -> io::Result<File> {
        let tail = self.len;
        if tail > 0 {
            let padded = tail.next_multiple_of(DIRECT_ALIGN);
            self.raw[self.at + tail..self.at + padded].fill(0);
            self.write_window(padded)?;
        }
        let real = self.written - (tail.next_multiple_of(DIRECT_ALIGN) - tail) as u64;
        self.file.set_len(real)?;
        Ok(self.file)
    }
}

impl Write for DirectWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(DIRECT_WINDOW - self.len);
        self.raw[self.at + self.len..self.at + self.len + n].copy_from_slice(&data[..n]);
        self.len += n;
        if self.len == DIRECT_WINDOW {
            self.write_window(DIRECT_WINDOW)?;
            self.len = 0;
        }
        Ok(n)
    }

    /// Whole windows only; the tail waits for [`DirectWriter::finish`].
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The tokenizer metadata of `path` resized to `n_vocab` tokens (padded with `[PAD<i>]`
/// tokens as converters pad vocabularies, or with trailing `[PAD<i>]` tokens dropped); returns
/// it with the token count. A vocabulary longer than `n_vocab` whose tail is not padding is kept
/// whole (the embedding then grows).
fn vocabulary(path: &Path, n_vocab: u64) -> Result<(Vec<(String, Value)>, u64)> {
    let file = GgufFile::open(path)
        .with_context(|| format!("{}: cannot read the vocabulary", path.display()))?;
    let meta = file.metadata();
    let tokens = meta
        .get_array("tokenizer.ggml.tokens")
        .and_then(|a| a.as_strings())
        .with_context(|| format!("{}: no tokenizer.ggml.tokens", path.display()))?;
    let n_tok = tokens.len() as u64;
    let is_pad = |i: usize, t: &String| *t == format!("[PAD{i}]");
    let n = if n_tok > n_vocab
        && tokens
            .iter()
            .enumerate()
            .skip(n_vocab as usize)
            .all(|(i, t)| is_pad(i, t))
    {
        n_vocab
    } else {
        n_vocab.max(n_tok)
    };
    let len = n as usize;
    let mut out = Vec::new();
    for (key, value) in meta.iter() {
        if !key.starts_with("tokenizer.") {
            continue;
        }
        let value = match (key, value) {
            ("tokenizer.ggml.tokens", _) => {
                let mut all: Vec<String> = tokens.iter().take(len).cloned().collect();
                all.extend((n_tok..n).map(|i| format!("[PAD{i}]")));
                Value::Array(ArrayValue::String(all))
            }
            ("tokenizer.ggml.token_type", Value::Array(ArrayValue::I32(t))) => {
                // llama.cpp's LLAMA_TOKEN_TYPE_USER_DEFINED, as its converter marks padding.
                let mut t = t.clone();
                t.resize(len, 4);
                Value::Array(ArrayValue::I32(t))
            }
            ("tokenizer.ggml.scores", Value::Array(ArrayValue::F32(s))) => {
                let mut s = s.clone();
                s.resize(len, -1000.0);
                Value::Array(ArrayValue::F32(s))
            }
            (k, Value::Array(a)) if a.len() as u64 == n_tok && n != n_tok => {
                reject!(
                    "{}: cannot resize the per-token array {k} to {n} tokens",
                    path.display()
                )
            }
            _ => value.clone(),
        };
        out.push((key.to_owned(), value));
    }
    Ok((out, n))
}

/// One tensor of the plan.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub name: String,
    /// ggml order: ne0 (the row length) first.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset in the data section (32-byte aligned, as written) and size.
    pub offset: u64,
    pub bytes: u64,
    role: Role,
}

/// A layer's bytes: one expert's (of every stacked expert tensor) and the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerBytes {
    pub expert: u64,
    pub dense: u64,
}

/// Everything about the file but its random bytes: the metadata, and the tensors in the order
/// and with the types llama.cpp's quantizer gives them.
#[derive(Debug)]
pub struct Plan {
    pub title: &'static str,
    pub quant: FileType,
    pub n_layer: u32,
    pub n_expert: u64,
    /// Tensors in file order.
    pub tensors: Vec<PlannedTensor>,
    /// The size of the tensor data section.
    pub data_bytes: u64,
    /// The tokenizer was copied in (a plan without one cannot be written).
    pub has_vocab: bool,
    meta: Vec<(String, Value)>,
    seed: u64,
    router_skew: f32,
    attn_out_std: f32,
}

impl Plan {
    /// Bytes of tensor data (without the alignment padding).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes).sum()
    }

    /// Each layer's expert and dense bytes.
    pub fn layer_bytes(&self) -> Vec<LayerBytes> {
        (0..self.n_layer)
            .map(|il| {
                let prefix = format!("blk.{il}.");
                let mut l = LayerBytes {
                    expert: 0,
                    dense: 0,
                };
                for t in self.tensors.iter().filter(|t| t.name.starts_with(&prefix)) {
                    if t.name.contains("_exps.weight") {
                        l.expert += t.bytes / self.n_expert;
                    } else {
                        l.dense += t.bytes;
                    }
                }
                l
            })
            .collect()
    }
}

/// What [`write`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Bytes of the file.
    pub bytes: u64,
    /// Written with O_DIRECT (else through the page cache: the file system refused it).
    pub direct: bool,
}

/// The plan for `opts`: its options checked, the vocabulary read (when given), the tensors
/// typed. Tells `on` when the vocabulary changes the model's size.
pub fn plan(opts: &Options, on: &mut dyn FnMut(Event)) -> Result<Plan> {
    let mut shape = opts.like.shape();
    if let Some(n) = opts.layers {
        if n == 0 || n > shape.n_layer {
            reject!(
                "--layers must be between 1 and {} for {} (got {n})",
                shape.n_layer,
                shape.title
            );
        }
        shape.cut(n);
    }
    if let Some(k) = opts.experts_used {
        if k == 0 || u64::from(k) > shape.n_expert {
            reject!(
                "--experts-used must be between 1 and {} for {} (got {k})",
                shape.n_expert,
                shape.title
            );
        }
        shape.n_expert_used = k;
    }
    if let Some(x) = opts.expert_types {
        for ty in [x.gate_up, x.down] {
            if block_profile(ty).is_none() {
                reject!(
                    "--expert-types: gen-model cannot fill type {} (it fills {})",
                    ty.name(),
                    filled().map(|t| t.name()).collect::<Vec<_>>().join(", ")
                );
            }
        }
    }
    if !opts.attn_out_std.is_finite() || !(0.0..=1.0).contains(&opts.attn_out_std) {
        reject!(
            "--attn-out-std must be between 0 and 1 (got {})",
            opts.attn_out_std
        );
    }
    if !opts.router_skew.is_finite() || !(0.0..=8.0).contains(&opts.router_skew) {
        reject!(
            "--router-skew must be between 0 and 8 (got {})",
            opts.router_skew
        );
    }
    // Without a vocabulary the preset's size stands.
    let mut vocab = Vec::new();
    if let Some(path) = &opts.vocab {
        let (v, n_vocab) = vocabulary(path, shape.n_vocab)?;
        if n_vocab != shape.n_vocab {
            on(Event::VocabSize {
                tokens: n_vocab,
                real: shape.n_vocab,
            });
        }
        shape.n_vocab = n_vocab;
        vocab = v;
    }
    let has_vocab = opts.vocab.is_some();
    if let Some(path) = &opts.chat_template {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--chat-template: cannot read {}", path.display()))?;
        vocab.retain(|(k, _)| k != "tokenizer.chat_template");
        vocab.push(("tokenizer.chat_template".into(), Value::String(text)));
    }

    let s = &shape;
    let quant = opts.quant.unwrap_or(s.default_quant);
    let mut meta = metadata(s, opts.like, quant, opts);
    meta.extend(vocab);

    // Types: llama.cpp's rules, asked in llama.cpp's order (its counters depend on it).
    let mut tensors = tensor_list(s, s.n_layer);
    tensors.sort_by(|x, y| tensor_order(&x.name, &y.name));
    let facts = ModelFacts {
        arch: s.arch.into(),
        n_expert: s.n_expert,
        n_layer_all: u64::from(s.n_layer + s.glm.map_or(0, |g| g.nextn)),
        n_gqa: s.n_head / s.n_head_kv,
        is_70b: false,
    };
    let mut planner = Planner::new(
        &facts,
        quant,
        false,
        tensors.iter().map(|t| t.name.as_str()),
    );
    let mut typed = Vec::with_capacity(tensors.len());
    let mut offset = 0u64;
    for t in tensors {
        let d = planner.decide(&t.name, &t.dims, TensorType::Known(GgmlType::F32))?;
        let TensorType::Known(ty) = d.ty else {
            fail!("tensor {}: no known type chosen", t.name);
        };
        let ty = match (t.role, opts.expert_types) {
            (Role::Weight, Some(x)) => x.for_tensor(&t.name, t.dims[0]).unwrap_or(ty),
            _ => ty,
        };
        if t.role == Role::Weight && block_profile(ty).is_none() {
            reject!(
                "tensor {}: the {} mix gives it type {}, which gen-model cannot fill",
                t.name,
                quant.name(),
                ty.name()
            );
        }
        let bytes = gguf::tensor_bytes(&t.name, &t.dims, ty)?;
        typed.push(PlannedTensor {
            name: t.name,
            dims: t.dims,
            ty,
            offset,
            bytes,
            role: t.role,
        });
        offset = (offset + bytes).next_multiple_of(32);
    }
    Ok(Plan {
        title: s.title,
        quant,
        n_layer: s.n_layer,
        n_expert: s.n_expert,
        tensors: typed,
        data_bytes: offset,
        has_vocab,
        meta,
        seed: opts.seed,
        router_skew: opts.router_skew,
        attn_out_std: opts.attn_out_std,
    })
}

/// The model's metadata, tokenizer aside.
fn metadata(s: &Shape, like: Like, quant: FileType, opts: &Options) -> Vec<(String, Value)> {
    let arch = s.arch;
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.type".into(), Value::String("model".into())),
        (
            "general.name".into(),
            Value::String(format!(
                "sluice gen-model {} {} (random weights)",
                s.title,
                quant.name()
            )),
        ),
        ("general.file_type".into(), Value::U32(quant.id())),
        ("general.quantization_version".into(), Value::U32(2)),
    ];
    let a = |k: &str| format!("{arch}.{k}");
    meta.push((a("vocab_size"), Value::U32(s.n_vocab as u32)));
    meta.push((a("context_length"), Value::U32(s.ctx_train)));
    meta.push((a("embedding_length"), Value::U32(s.n_embd as u32)));
    meta.push((
        a("block_count"),
        Value::U32(s.n_layer + s.glm.map_or(0, |g| g.nextn)),
    ));
    match s.extra {
        // per layer, as the converter writes it: the experts' width on the MoE layers, 0 on
        // the others (0 KV heads and 0 width: a Mamba-2 layer)
        Extra::Nemotron(h) => {
            let ff: Vec<i32> = (0..s.n_layer)
                .map(|il| {
                    if h.kind(il) == b'E' {
                        s.n_ff_exp as i32
                    } else {
                        0
                    }
                })
                .collect();
            meta.push((a("feed_forward_length"), Value::Array(ArrayValue::I32(ff))));
        }
        _ => meta.push((a("feed_forward_length"), Value::U32(s.n_ff as u32))),
    }
    meta.push((a("attention.head_count"), Value::U32(s.n_head as u32)));
    match s.gemma {
        Some(g) => {
            let kv: Vec<i32> = (0..s.n_layer)
                .map(|il| {
                    if (il + 1).is_multiple_of(g.period) {
                        g.kv_full as i32
                    } else {
                        s.n_head_kv as i32
                    }
                })
                .collect();
            meta.push((
                a("attention.head_count_kv"),
                Value::Array(ArrayValue::I32(kv)),
            ));
        }
        None => match s.extra {
            // 0 KV heads: a short-convolution layer
            Extra::Lfm2 { attn, .. } => {
                let kv: Vec<i32> = (0..s.n_layer)
                    .map(|il| {
                        if attn.contains(&il) {
                            s.n_head_kv as i32
                        } else {
                            0
                        }
                    })
                    .collect();
                meta.push((
                    a("attention.head_count_kv"),
                    Value::Array(ArrayValue::I32(kv)),
                ));
            }
            // KV heads on the attention layers only
            Extra::Nemotron(h) => {
                let kv: Vec<i32> = (0..s.n_layer)
                    .map(|il| {
                        if h.kind(il) == b'*' {
                            s.n_head_kv as i32
                        } else {
                            0
                        }
                    })
                    .collect();
                meta.push((
                    a("attention.head_count_kv"),
                    Value::Array(ArrayValue::I32(kv)),
                ));
            }
            _ => meta.push((a("attention.head_count_kv"), Value::U32(s.n_head_kv as u32))),
        },
    }
    if let Some(m) = s.mla {
        // the absorbed form's keys, as llama.cpp's converter writes them
        meta.push((
            a("attention.key_length"),
            Value::U32((m.kv_lora + m.rope) as u32),
        ));
        meta.push((a("attention.value_length"), Value::U32(m.kv_lora as u32)));
        meta.push((
            a("attention.key_length_mla"),
            Value::U32((m.nope + m.rope) as u32),
        ));
        meta.push((a("attention.value_length_mla"), Value::U32(m.v as u32)));
        if m.q_lora > 0 {
            meta.push((a("attention.q_lora_rank"), Value::U32(m.q_lora as u32)));
        }
        meta.push((a("attention.kv_lora_rank"), Value::U32(m.kv_lora as u32)));
        if m.groups.0 > 1 {
            meta.push((a("expert_group_count"), Value::U32(m.groups.0)));
            meta.push((a("expert_group_used_count"), Value::U32(m.groups.1)));
        }
        meta.push((a("rope.scaling.type"), Value::String("yarn".into())));
        meta.push((a("rope.scaling.factor"), Value::F32(m.yarn.0)));
        meta.push((
            a("rope.scaling.original_context_length"),
            Value::U32(m.yarn.1),
        ));
        meta.push((a("rope.scaling.yarn_log_multiplier"), Value::F32(m.yarn.2)));
    } else if let Some(g) = s.gemma {
        let pattern: Vec<bool> = (0..s.n_layer)
            .map(|il| !(il + 1).is_multiple_of(g.period))
            .collect();
        let u = |v: u64| Value::U32(v as u32);
        meta.push((a("attention.key_length"), u(g.head_full)));
        meta.push((a("attention.value_length"), u(g.head_full)));
        meta.push((a("attention.key_length_swa"), u(s.head_dim)));
        meta.push((a("attention.value_length_swa"), u(s.head_dim)));
        meta.push((a("attention.sliding_window"), Value::U32(g.window)));
        meta.push((
            a("attention.sliding_window_pattern"),
            Value::Array(ArrayValue::Bool(pattern)),
        ));
        meta.push((a("attention.shared_kv_layers"), Value::U32(0)));
        meta.push((a("embedding_length_per_layer_input"), Value::U32(0)));
        meta.push((a("rope.dimension_count_swa"), u(s.head_dim)));
        meta.push((a("rope.freq_base_swa"), Value::F32(g.rope_base_swa)));
        meta.push((a("final_logit_softcapping"), Value::F32(g.softcap)));
    } else if s.head_dim * s.n_head != s.n_embd || matches!(s.extra, Extra::Nemotron(_)) {
        // (nemotron_h_moe's converter writes them always)
        meta.push((a("attention.key_length"), Value::U32(s.head_dim as u32)));
        meta.push((a("attention.value_length"), Value::U32(s.head_dim as u32)));
    }
    meta.push((a("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps)));
    meta.push((a("rope.freq_base"), Value::F32(s.rope_base)));
    if s.rope_dims_key {
        let dims = match (s.glm, s.hybrid, s.gemma) {
            (Some(g), _, _) => g.rope_dims,
            (None, Some(h), _) => h.rope_dims,
            // the full-attention heads, whole (rope_freqs leaves most pairs unrotated)
            (None, None, Some(g)) => g.head_full,
            (None, None, None) => match s.extra {
                Extra::MiniMax { rope_dims } => rope_dims,
                _ => s.head_dim,
            },
        };
        meta.push((a("rope.dimension_count"), Value::U32(dims as u32)));
    }
    if let Some(h) = s.hybrid {
        if let Some(sections) = h.sections {
            meta.push((
                a("rope.dimension_sections"),
                Value::Array(ArrayValue::I32(sections.map(|x| x as i32).to_vec())),
            ));
        }
        meta.push((a("full_attention_interval"), Value::U32(h.interval)));
        meta.push((a("ssm.conv_kernel"), Value::U32(h.conv as u32)));
        meta.push((a("ssm.state_size"), Value::U32(h.head as u32)));
        meta.push((a("ssm.group_count"), Value::U32(h.k_heads as u32)));
        meta.push((a("ssm.time_step_rank"), Value::U32(h.v_heads as u32)));
        meta.push((a("ssm.inner_size"), Value::U32((h.head * h.v_heads) as u32)));
        meta.push((
            a("expert_shared_feed_forward_length"),
            Value::U32(h.shexp as u32),
        ));
    }
    match s.extra {
        Extra::None => {}
        Extra::Vision {
            sections,
            deepstack,
        } => {
            meta.push((
                a("rope.dimension_sections"),
                Value::Array(ArrayValue::I32(sections.map(|x| x as i32).to_vec())),
            ));
            meta.push((a("n_deepstack_layers"), Value::U32(deepstack)));
        }
        Extra::Bailing { groups } => {
            // as llama.cpp's converter: the shared experts' width, and the groups
            let shared = s.glm.map_or(0, |g| g.shared);
            meta.push((
                a("expert_shared_feed_forward_length"),
                Value::U32((s.n_ff_exp * shared) as u32),
            ));
            meta.push((a("expert_group_count"), Value::U32(groups.0)));
            meta.push((a("expert_group_used_count"), Value::U32(groups.1)));
        }
        Extra::Granite {
            embedding,
            attention,
            residual,
            logit,
        } => {
            meta.push((a("embedding_scale"), Value::F32(embedding)));
            meta.push((a("attention.scale"), Value::F32(attention)));
            meta.push((a("residual_scale"), Value::F32(residual)));
            meta.push((a("logit_scale"), Value::F32(logit)));
        }
        // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
        Extra::MiniMax { .. } => meta.push((a("expert_gating_func"), Value::U32(2))),
        Extra::SmallThinker { window } => {
            meta.push((a("expert_gating_func"), Value::U32(2)));
            meta.push((a("attention.sliding_window"), Value::U32(window)));
        }
        Extra::Llama4 { moe_step, .. } => {
            meta.push((a("interleave_moe_layer_step"), Value::U32(moe_step)));
        }
        Extra::Lfm2 {
            l_cache,
            dense_lead,
            ..
        } => {
            meta.push((a("shortconv.l_cache"), Value::U32(l_cache as u32)));
            meta.push((a("leading_dense_block_count"), Value::U32(dense_lead)));
            meta.push((a("expert_gating_func"), Value::U32(2)));
        }
        Extra::Nemotron(h) => {
            // llama.cpp's loader reads both epsilons (the second for the MTP head's norm)
            meta.push((a("attention.layer_norm_epsilon"), Value::F32(s.rms_eps)));
            // unused (no rope), but written: the converter's Granite base drops head_dim and
            // its llama base writes hidden_size / num_attention_heads (84 in Nano's files)
            meta.push((
                a("rope.dimension_count"),
                Value::U32((s.n_embd / s.n_head) as u32),
            ));
            meta.push((a("ssm.conv_kernel"), Value::U32(h.d_conv as u32)));
            meta.push((a("ssm.state_size"), Value::U32(h.d_state as u32)));
            meta.push((a("ssm.group_count"), Value::U32(h.groups as u32)));
            meta.push((a("ssm.inner_size"), Value::U32(h.d_inner as u32)));
            meta.push((a("ssm.time_step_rank"), Value::U32(h.ssm_heads as u32)));
            meta.push((
                a("expert_shared_feed_forward_length"),
                Value::U32(h.shexp as u32),
            ));
            meta.push((a("expert_shared_count"), Value::U32(1)));
            meta.push((a("expert_weights_norm"), Value::Bool(true)));
            meta.push((a("expert_weights_scale"), Value::F32(h.scale)));
            meta.push((a("expert_group_count"), Value::U32(1)));
            if h.latent > 0 {
                meta.push((a("moe_latent_size"), Value::U32(h.latent as u32)));
            }
        }
    }
    meta.push((a("expert_count"), Value::U32(s.n_expert as u32)));
    meta.push((a("expert_used_count"), Value::U32(s.n_expert_used)));
    if s.expert_ff_key {
        meta.push((
            a("expert_feed_forward_length"),
            Value::U32(s.n_ff_exp as u32),
        ));
    }
    if let Some(g) = s.glm {
        meta.push((a("leading_dense_block_count"), Value::U32(g.dense_lead)));
        meta.push((a("expert_shared_count"), Value::U32(g.shared as u32)));
        meta.push((a("expert_weights_norm"), Value::Bool(true)));
        meta.push((a("expert_weights_scale"), Value::F32(g.weights_scale)));
        // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
        meta.push((a("expert_gating_func"), Value::U32(2)));
        if g.nextn > 0 || s.mla.is_none() {
            meta.push((a("nextn_predict_layers"), Value::U32(g.nextn)));
        }
    }
    if s.gpt_oss {
        meta.push((a("attention.sliding_window"), Value::U32(GPT_OSS_SWA)));
        meta.push((a("rope.scaling.type"), Value::String("yarn".into())));
        meta.push((a("rope.scaling.factor"), Value::F32(GPT_OSS_YARN.0)));
        meta.push((
            a("rope.scaling.original_context_length"),
            Value::U32(GPT_OSS_YARN.1),
        ));
    }
    meta.push((
        "sluice.gen_model.like".into(),
        Value::String(like.name().into()),
    ));
    meta.push(("sluice.gen_model.seed".into(), Value::U64(opts.seed)));
    meta.push((
        "sluice.gen_model.router_skew".into(),
        Value::F32(opts.router_skew),
    ));
    meta.push((
        "sluice.gen_model.attn_out_std".into(),
        Value::F32(opts.attn_out_std),
    ));
    meta
}

/// Write the planned model to `out`: bytes generated while they are written, to `OUT.part`,
/// synced and renamed. Tells `on` of the progress after every chunk of a few MiB.
pub fn write(plan: Plan, out: &Path, on: &mut dyn FnMut(Event)) -> Result<Written> {
    if !plan.has_vocab {
        reject!("the plan has no vocabulary: give one to write the model");
    }
    let w = model_writer(&plan, on)?;
    let part = PathBuf::from(format!("{}.part", out.display()));
    let (bytes, file, direct) = match DirectWriter::create(&part) {
        Ok(mut dw) => {
            let n = w
                .write_to(&mut dw)
                .with_context(|| format!("writing {}", part.display()))?;
            let file = dw
                .finish()
                .with_context(|| format!("writing {}", part.display()))?;
            (n, file, true)
        }
        // O_DIRECT refused (tmpfs, some network file systems): through the page cache.
        Err(_) => {
            let file =
                File::create(&part).with_context(|| format!("cannot create {}", part.display()))?;
            let mut bw = BufWriter::with_capacity(1 << 20, file);
            let n = w
                .write_to(&mut bw)
                .with_context(|| format!("writing {}", part.display()))?;
            let file = bw
                .into_inner()
                .map_err(|e| e.into_error())
                .with_context(|| format!("writing {}", part.display()))?;
            (n, file, false)
        }
    };
    file.sync_all()
        .with_context(|| format!("syncing {}", part.display()))?;
    drop(file);
    std::fs::rename(&part, out)
        .with_context(|| format!("renaming {} to {}", part.display(), out.display()))?;
    Ok(Written { bytes, direct })
}

/// The file's writer: the plan's metadata and every tensor with its bytes, the weights'
/// generated while they are written (telling `on` of the progress).
fn model_writer<'o>(plan: &Plan, on: &'o mut dyn FnMut(Event)) -> Result<GgufWriter<'o>> {
    let total = plan.tensor_bytes();
    let done = Rc::new(Cell::new(0u64));
    let on = Rc::new(std::cell::RefCell::new(on));
    let mut w = gguf_writer(plan)?;
    // The experts' popularity gains, one stream for the whole model.
    let mut gain_rng = WyRand::new(plan.seed ^ 0x5EED_0F5E_ED00);
    for t in &plan.tensors {
        let seed = plan.seed ^ name_hash(&t.name);
        let ty = t.ty;
        match t.role {
            Role::Norm => {
                let n: u64 = t.dims.iter().product();
                w.add_tensor(t.name.clone(), &t.dims, ty, f32_bytes((0..n).map(|_| 1.0)))?;
            }
            Role::Router => {
                let (cols, rows) = (t.dims[0], t.dims[1]);
                let sd = 1.0 / (cols as f64).sqrt();
                let mut rng = WyRand::new(seed);
                let mut vals = Vec::with_capacity((rows * cols) as usize);
                for _ in 0..rows {
                    let gain = (f64::from(plan.router_skew) * gain_rng.normal()).exp();
                    vals.extend((0..cols).map(|_| (rng.normal() * sd * gain) as f32));
                }
                w.add_tensor(t.name.clone(), &t.dims, ty, f32_bytes(vals))?;
            }
            Role::RopeFreqs { rotated } => {
                let n: u64 = t.dims.iter().product();
                let vals = (0..n).map(|i| if i < rotated { 1.0 } else { 1e30 });
                w.add_tensor(t.name.clone(), &t.dims, ty, f32_bytes(vals))?;
            }
            Role::Fill(x) => {
                let n: u64 = t.dims.iter().product();
                w.add_tensor(t.name.clone(), &t.dims, ty, f32_bytes((0..n).map(|_| x)))?;
            }
            Role::Small(sd) => {
                let n: u64 = t.dims.iter().product();
                let mut rng = WyRand::new(seed);
                let vals: Vec<f32> = (0..n)
                    .map(|_| (rng.normal() * f64::from(sd)) as f32)
                    .collect();
                w.add_tensor(t.name.clone(), &t.dims, ty, f32_bytes(vals))?;
            }
            Role::Weight => {
                let n_bytes = t.bytes;
                let sd = weight_std(&t.name, plan.attn_out_std);
                let (done, on) = (Rc::clone(&done), Rc::clone(&on));
                w.add_tensor_with(t.name.clone(), &t.dims, ty, move |out| {
                    let progress = |n: u64| {
                        done.set(done.get() + n);
                        let mut on = on.borrow_mut();
                        on(Event::Progress {
                            done: done.get(),
                            total,
                        });
                    };
                    write_blocks(out, ty, sd, n_bytes, seed, &progress)
                })?;
            }
        }
    }
    Ok(w)
}

/// A writer holding the plan's metadata, ready for its tensors.
fn gguf_writer(plan: &Plan) -> Result<GgufWriter<'static>> {
    let mut w = GgufWriter::new();
    for (k, v) in &plan.meta {
        w.add_metadata(k.clone(), v.clone())?;
    }
    Ok(w)
}

/// The bytes [`write`] writes before the tensor data: the header, the metadata, the tensor
/// table and the padding to the data section. The same writer is given the same tensor
/// entries (name, shape, type) and stopped where the first tensor's bytes would go.
#[cfg(test)]
fn header_bytes(plan: &Plan) -> Result<Vec<u8>> {
    /// The marker a tensor's writer returns to stop the writer at the data section.
    #[derive(Debug)]
    struct DataSection;
    impl std::fmt::Display for DataSection {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("the data section starts here")
        }
    }
    impl std::error::Error for DataSection {}

    let mut w = gguf_writer(plan)?;
    for t in &plan.tensors {
        w.add_tensor_with(t.name.clone(), &t.dims, t.ty, |_| {
            Err(io::Error::other(DataSection))
        })?;
    }
    let mut buf = Vec::new();
    match w.write_to(&mut buf) {
        Err(gguf::GgufError::Io { error, .. })
            if error.get_ref().is_some_and(|e| e.is::<DataSection>()) =>
        {
            Ok(buf)
        }
        Err(e) => Err(e.into()),
        Ok(_) => fail!("a plan without tensors"),
    }
}

/// For tests of what reads the file's header (the loader): the file [`write`] would write
/// with its tensor data left a hole. The header and tensor table are the real ones and the
/// file has its full length (sparse: a few KiB on disk whatever the model's size), its
/// weights all zero bytes. A plan without a vocabulary is written too (with the preset's
/// `vocab_size`). Returns the file's length.
#[cfg(test)]
fn write_hollow(plan: &Plan, out: &Path) -> Result<u64> {
    let header = header_bytes(plan)?;
    let len = header.len() as u64 + plan.data_bytes;
    let mut file = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    file.write_all(&header)
        .and_then(|()| file.set_len(len))
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_blocks_have_the_intended_spread_and_zero_mean() {
        for ty in filled() {
            let n_bytes = (ty.type_size() * 2048) as u64;
            let mut buf = Vec::new();
            let done = Cell::new(0);
            let progress = |n| done.set(done.get() + n);
            write_blocks(&mut buf, ty, WEIGHT_STD, n_bytes, 7, &progress).expect("write");
            assert_eq!(buf.len() as u64, n_bytes);
            assert_eq!(done.get(), n_bytes);
            let w = quant::dequantize_to_vec(ty, &buf).expect("dequantize");
            let n = w.len() as f64;
            let mean = w.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
            let sd = (w
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / n)
                .sqrt();
            assert!(w.iter().all(|v| v.is_finite()), "{ty:?}");
            // Within 12% of the target spread, and a mean far below it.
            assert!((sd / 0.02 - 1.0).abs() < 0.12, "{ty:?}: sd {sd}");
            assert!(mean.abs() < 0.05 * sd, "{ty:?}: mean {mean} sd {sd}");
        }
    }

    #[test]
    fn presets_are_found_by_name_and_plan_without_a_vocabulary() {
        for l in Like::ALL {
            assert_eq!(Like::from_name(l.name()), Some(l));
        }
        let opts = opts(Like::Olmoe1b7b, Some(2));
        let plan = plan(&opts, &mut |_| panic!("no vocabulary, no event")).expect("plan");
        assert_eq!(plan.quant, FileType::Q4_K_M);
        assert_eq!(plan.layer_bytes().len(), 2);
        // offsets are 32-aligned and the tensors do not overlap
        for w in plan.tensors.windows(2) {
            assert_eq!(w[1].offset, (w[0].offset + w[0].bytes).next_multiple_of(32));
        }
        let dir = std::env::temp_dir().join(format!("transform-plan-{}", std::process::id()));
        let err = write(plan, &dir, &mut |_| {}).expect_err("no vocabulary");
        assert!(err.is_rejected(), "{err}");
        assert!(!dir.exists());
        let bad = Options {
            layers: Some(17),
            ..opts
        };
        assert!(plan_err(&bad).contains("--layers must be between 1 and 16"));
    }

    /// `--expert-types`: the routed stacks get the override, everything else the file type's
    /// choice (a DeepSeek V3 plan: dense lead layers, shared experts, MLA attention).
    #[test]
    fn expert_types_replace_only_the_routed_stacks() {
        let base = Options {
            quant: Some(FileType::Q4_K_M),
            ..opts(Like::DeepseekV3, Some(5))
        };
        let x = ExpertTypes {
            gate_up: GgmlType::IQ2_XXS,
            down: GgmlType::IQ2_S,
        };
        let ud = Options {
            expert_types: Some(x),
            ..base.clone()
        };
        let (p0, p1) = (
            plan(&base, &mut |_| {}).unwrap(),
            plan(&ud, &mut |_| {}).unwrap(),
        );
        let mut routed = 0;
        for (a, b) in p0.tensors.iter().zip(&p1.tensors) {
            assert_eq!(a.name, b.name);
            let want = if a.name.contains("_exps.weight") {
                routed += 1;
                if a.name.contains("down") {
                    x.down
                } else {
                    x.gate_up
                }
            } else {
                a.ty
            };
            assert_eq!(b.ty, want, "{}", b.name);
        }
        assert!(routed >= 6, "{routed} routed stacks");
        assert!(p1.data_bytes < p0.data_bytes);
        let bad = Options {
            expert_types: Some(ExpertTypes {
                gate_up: GgmlType::IQ1_M,
                down: GgmlType::IQ2_S,
            }),
            ..base
        };
        assert!(
            plan_err(&bad).contains("cannot fill type iq1_m"),
            "{}",
            plan_err(&bad)
        );
    }

    /// The default options of a `like` plan cut to `layers`.
    fn opts(like: Like, layers: Option<u32>) -> Options {
        Options {
            like,
            quant: None,
            layers,
            vocab: None,
            router_skew: 0.0,
            experts_used: None,
            attn_out_std: 0.0045,
            seed: 0,
            chat_template: None,
            expert_types: None,
        }
    }

    /// The mixes [`fills`] offers are the ones every preset plans whole; every other mix is
    /// refused for some preset, naming the type gen-model cannot fill.
    #[test]
    fn the_offered_mixes_are_the_ones_every_preset_plans() {
        for quant in FileType::ALL {
            let mut refused = Vec::new();
            for like in Like::ALL {
                let o = Options {
                    quant: Some(quant),
                    ..opts(like, None)
                };
                match plan(&o, &mut |_| {}) {
                    Ok(_) => {}
                    Err(e) => {
                        assert!(e.is_rejected(), "{} {}: {e}", like.name(), quant.name());
                        assert!(e.to_string().contains("cannot fill"), "{e}");
                        refused.push(like.name());
                    }
                }
            }
            if fills(quant) {
                assert!(
                    refused.is_empty(),
                    "{} refused for {refused:?}",
                    quant.name()
                );
            } else {
                assert!(
                    !refused.is_empty(),
                    "{} plans for every preset",
                    quant.name()
                );
            }
        }
        assert!(!fills(FileType::TQ1_0) && !fills(FileType::TQ2_0));
        assert!(fills(FileType::Q4_K_M) && fills(FileType::Mxfp4Moe));
    }

    /// The header [`write_hollow`] writes is, byte for byte, the one [`write`]'s writer
    /// streams before the first tensor's data.
    #[test]
    fn the_hollow_files_header_is_the_written_files() {
        /// Keeps the first `cap` bytes, then refuses.
        struct Prefix {
            buf: Vec<u8>,
            cap: usize,
        }
        impl Write for Prefix {
            fn write(&mut self, data: &[u8]) -> io::Result<usize> {
                let n = data.len().min(self.cap - self.buf.len());
                if n == 0 && !data.is_empty() {
                    return Err(io::Error::other("enough"));
                }
                self.buf.extend_from_slice(&data[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        for like in Like::ALL {
            let p = plan(&opts(like, Some(2)), &mut |_| {}).expect("plan");
            let header = header_bytes(&p).expect("header");
            let mut sink = Prefix {
                buf: Vec::new(),
                cap: header.len(),
            };
            let mut quiet = |_| {};
            let w = model_writer(&p, &mut quiet).expect("writer");
            let err = w.write_to(&mut sink).expect_err("stopped at the data");
            assert!(err.to_string().contains("enough"), "{err}");
            assert_eq!(sink.buf.len(), header.len(), "{}", like.name());
            assert!(sink.buf == header, "{}: the headers differ", like.name());
            assert_eq!(header.len() % 32, 0);
        }
    }

    /// Every preset, whole and cut to every layer count, is a file the loader opens: the
    /// metadata and the tensor table agree (the cut rule of [`Shape::cut`]). Hollow files:
    /// the real header and tensor table, the data a hole of its full length.
    #[test]
    fn every_cut_of_every_preset_loads() {
        let dir = tempfile::tempdir().expect("temp dir");
        for like in Like::ALL {
            let full = like.shape();
            let cuts = (1..=full.n_layer).map(Some).chain([None]);
            for layers in cuts {
                let what = format!("{} --layers {layers:?}", like.name());
                let p = plan(&opts(like, layers), &mut |_| {}).expect(&what);
                let path = dir.path().join(format!("{}.gguf", like.name()));
                let len = write_hollow(&p, &path).expect(&what);
                let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(file.file_len(), len, "{what}");
                assert_eq!(file.tensors().len(), p.tensors.len(), "{what}");
                let m = model::Model::from_gguf(&file).unwrap_or_else(|e| panic!("{what}: {e}"));
                let hp = &m.hparams;
                let n = layers.unwrap_or(full.n_layer);
                assert_eq!(hp.n_layer, n, "{what}");
                // at least one MoE layer; the leading dense ones as many as the real model's,
                // at most all but one (llama4: every moe_step-th layer, none in a Maverick cut
                // of one layer)
                let dense = match full.extra {
                    Extra::Lfm2 { dense_lead, .. } => dense_lead.min(n - 1),
                    _ => full.glm.map_or(0, |g| g.dense_lead.min(n - 1)),
                };
                assert_eq!(hp.n_layer_dense_lead, dense, "{what}");
                let moe = match full.extra {
                    Extra::Llama4 { moe_step, .. } => n / moe_step,
                    // the cut's MoE letters (none in a one-layer cut: a Mamba-2 layer)
                    Extra::Nemotron(h) => h.pattern[..n as usize].matches('E').count() as u32,
                    _ => n - dense,
                };
                assert_eq!(hp.n_moe_layers(), moe, "{what}");
                assert_eq!(m.tensors.layers.len(), n as usize, "{what}");
                assert_eq!(
                    m.tensors.nextn.len(),
                    full.glm.map_or(0, |g| g.nextn) as usize,
                    "{what}"
                );
                if let Some(g) = full.gemma {
                    let n_full = n / g.period;
                    assert_eq!(
                        (0..n as usize).filter(|&il| !hp.is_swa_layer(il)).count(),
                        n_full as usize,
                        "{what}"
                    );
                    assert_eq!(m.tensors.rope_freqs.is_some(), n_full > 0, "{what}");
                }
                if let Some(h) = full.hybrid {
                    let recurrent = (0..n as usize).filter(|&il| hp.is_recurrent(il)).count();
                    assert_eq!(recurrent as u32, n - n / h.interval, "{what}");
                }
                if let Extra::Lfm2 { attn, .. } = full.extra {
                    for il in 0..n {
                        assert_eq!(hp.is_recurrent(il as usize), !attn.contains(&il), "{what}");
                    }
                }
                if let Extra::Nemotron(h) = full.extra {
                    for il in 0..n {
                        let kind = h.kind(il);
                        assert_eq!(hp.is_recurrent(il as usize), kind == b'M', "{what} {il}");
                        assert_eq!(hp.is_moe_layer(il as usize), kind == b'E', "{what} {il}");
                    }
                }
                if let Some(mla) = &hp.mla {
                    let lite = deepseek2_reads_as_lite(n);
                    assert_eq!(mla.q_lora_rank == 0, lite, "{what}");
                }
                drop(m);
                drop(file);
                std::fs::remove_file(&path).expect("remove");
            }
        }
    }

    /// The nemotron_h_moe presets: the published layer counts of each kind (NVIDIA's model
    /// cards: Nano 23 Mamba-2, 23 MoE and 6 attention layers; Super 40, 40 and 8), the
    /// per-layer arrays the converter writes, one kind of block per layer, no gate stacks,
    /// latent projections only in Super, and the published parameter counts: Nano's 31.6B
    /// (its model card, rounded), Super's 120,668,707,840 (the BF16 checkpoint's
    /// safetensors headers: 123,611,012,096 BF16 weights less the MTP block's 2,942,324,736,
    /// plus the 40 MoE layers' F32 selection biases of 512; llama.cpp's benchmark of
    /// ggml-org/Nemotron-3-Super-120B-GGUF prints 120.67 B).
    #[test]
    fn nemotron_presets_follow_their_hybrid_patterns() {
        for (like, counts, latent) in [
            (Like::Nemotron3Nano30bA3b, (23, 23, 6), 0),
            (Like::Nemotron3Super120bA12b, (40, 40, 8), 1024),
        ] {
            let shape = like.shape();
            let Extra::Nemotron(h) = shape.extra else {
                panic!("{}: not nemotron_h_moe", like.name())
            };
            let n = shape.n_layer;
            assert_eq!(h.pattern.len(), n as usize, "{}", like.name());
            let count = |c| h.pattern.matches(c).count();
            assert_eq!(
                (count('M'), count('E'), count('*')),
                counts,
                "{}",
                like.name()
            );
            let p = plan(&opts(like, None), &mut |_| {}).expect("plan");
            let has = |name: &str| p.tensors.iter().any(|t| t.name == name);
            for il in 0..n {
                let kind = h.kind(il);
                let w = |t: &str| has(&format!("blk.{il}.{t}.weight"));
                assert!(w("attn_norm"), "{il}");
                assert_eq!(w("ssm_in") && w("ssm_out") && w("ssm_norm"), kind == b'M');
                assert_eq!(has(&format!("blk.{il}.ssm_conv1d.bias")), kind == b'M');
                assert_eq!(has(&format!("blk.{il}.ssm_a")), kind == b'M');
                assert_eq!(w("attn_q") && w("attn_output"), kind == b'*', "{il}");
                assert_eq!(w("ffn_up_exps") && w("ffn_down_shexp"), kind == b'E');
                assert_eq!(has(&format!("blk.{il}.exp_probs_b.bias")), kind == b'E');
                assert_eq!(w("ffn_latent_down"), kind == b'E' && latent > 0, "{il}");
                assert!(!w("ffn_gate_exps") && !w("ffn_gate_shexp") && !w("attn_q_norm"));
            }
            assert!(
                !p.tensors
                    .iter()
                    .any(|t| t.name.starts_with(&format!("blk.{n}.")))
            );
            assert!(has("output.weight") && has("output_norm.weight"));
            // the arrays: KV heads on the attention layers, the experts' width on the MoE
            // layers, 0 elsewhere
            let arr = |k: &str| match p.meta.iter().find(|(key, _)| key == k) {
                Some((_, Value::Array(ArrayValue::I32(v)))) => v.clone(),
                other => panic!("{k}: {other:?}"),
            };
            let kv = arr("nemotron_h_moe.attention.head_count_kv");
            let ff = arr("nemotron_h_moe.feed_forward_length");
            for (il, c) in h.pattern.bytes().enumerate() {
                assert_eq!(kv[il], if c == b'*' { 2 } else { 0 }, "{il}");
                let width = if c == b'E' { shape.n_ff_exp as i32 } else { 0 };
                assert_eq!(ff[il], width, "{il}");
            }
            let key = |k: &str| p.meta.iter().any(|(key, _)| key == k);
            assert_eq!(key("nemotron_h_moe.moe_latent_size"), latent > 0);
            assert!(key("nemotron_h_moe.attention.layer_norm_epsilon"));
            // as the published Nano GGUFs record it (llama.cpp's loader prints
            // `rope.dimension_count u32 = 84` for them)
            let rope = p
                .meta
                .iter()
                .find(|(k, _)| k == "nemotron_h_moe.rope.dimension_count");
            let want = if latent > 0 { 128 } else { 84 };
            assert!(
                matches!(rope, Some((_, Value::U32(d))) if *d == want),
                "{rope:?}"
            );
            assert!(key("nemotron_h_moe.attention.layer_norm_rms_epsilon"));
            let params: u64 = p
                .tensors
                .iter()
                .map(|t| t.dims.iter().product::<u64>())
                .sum();
            if latent > 0 {
                assert_eq!(params, 123_611_012_096 - 2_942_324_736 + 40 * 512);
            } else {
                assert_eq!((params as f64 / 1e8).round(), 316.0, "{params}");
            }
        }
    }

    fn plan_err(opts: &Options) -> String {
        plan(opts, &mut |_| {}).expect_err("refused").to_string()
    }

    #[test]
    fn types_without_a_generator_are_refused() {
        let mut buf = Vec::new();
        let err = write_blocks(&mut buf, GgmlType::IQ1_M, WEIGHT_STD, 56, 1, &|_| {})
            .expect_err("refused");
        assert!(err.to_string().contains("iq1_m"), "{err}");
    }
}
