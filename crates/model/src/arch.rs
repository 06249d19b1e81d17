//! The supported architectures and their fixed graph rules.

use crate::error::ModelError;

/// Names accepted in `general.architecture`, for messages.
pub const SUPPORTED_ARCHS: &str = "qwen3moe, qwen2moe, olmoe, gpt-oss, glm4moe, deepseek2, gemma4, qwen35moe, llama, qwen2, qwen3";

/// A model architecture, from `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Qwen3 MoE: per-head QK-norm, NEOX rope, renormalised top-k.
    Qwen3Moe,
    /// Qwen2 MoE (Qwen1.5-MoE): q/k/v biases, NEOX rope, no renormalisation, one shared expert
    /// with a sigmoid gate.
    Qwen2Moe,
    /// OLMoE: QK-norm over the whole projection, NEOX rope, no renormalisation.
    Olmoe,
    /// Llama: dense, or Mixtral-style MoE when `llama.expert_count` > 0; NORM rope.
    Llama,
    /// Qwen2 dense: q/k/v biases, NEOX rope.
    Qwen2,
    /// Qwen3 dense: per-head QK-norm, NEOX rope.
    Qwen3,
    /// gpt-oss (llama.cpp's `LLM_ARCH_OPENAI_MOE`): biases on q/k/v/o, the router and every
    /// expert projection; attention sinks; sliding-window attention on alternate layers;
    /// softmax over the selected experts' logits; the clamped SwiGLU of gpt-oss; NEOX rope
    /// (YaRN in the released files).
    GptOss,
    /// GLM-4.5 (llama.cpp's `LLM_ARCH_GLM4_MOE`): leading dense layers, then MoE layers with
    /// sigmoid routing and a per-expert selection bias (`exp_probs_b`), an ungated shared
    /// expert, q/k/v biases, optional per-head QK-norm, NEOX rope over part of each head, and
    /// NextN (multi-token prediction) layers after the trunk that decoding does not run.
    Glm4Moe,
    /// DeepSeek V2/V3/R1 and Kimi K2 (llama.cpp's `LLM_ARCH_DEEPSEEK2`): multi-head latent
    /// attention (a low-rank query, one compressed key/value row per token shared by every
    /// head, stored in its absorbed or its legacy `attn_kv_b` form), NORM rope over a separate
    /// part of each head, leading dense layers, then MoE layers with softmax or sigmoid
    /// routing, an optional selection bias, group-limited top-k and ungated shared experts;
    /// NextN layers after the trunk that decoding does not run.
    Deepseek2,
    /// Gemma 4 (llama.cpp's `LLM_ARCH_GEMMA4`): sliding-window and full-attention layers with
    /// their own head sizes and rope (per-frequency divisors on the full ones), q/k RMSNorm per
    /// head and a weightless RMSNorm of v (v is k where `attn_v` is absent), attention scale
    /// 1, norms after the attention and the FFN, a dense GEGLU MLP in every layer and, with
    /// experts, a MoE block beside it with its own norms and router input; embeddings scaled
    /// by sqrt(n_embd), soft-capped logits.
    Gemma4,
    /// Qwen3.5/3.6 MoE (`qwen35moe`): Gated DeltaNet linear-attention layers between
    /// full-attention layers with a gated output, experts plus a gated shared expert.
    Qwen35Moe,
}

/// How a MoE layer turns router logits into expert weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertGating {
    /// Softmax over all experts, then the top-k probabilities.
    Softmax,
    /// Top-k of the raw logits, then a softmax over the k selected logits.
    SoftmaxSelected,
    /// Element-wise sigmoid of the logits, then the top-k probabilities.
    Sigmoid,
}

impl ExpertGating {
    /// The gating named by llama.cpp's `expert_gating_func` value (1 softmax, 2 sigmoid);
    /// `None` for a value it has no such meaning for here.
    pub fn from_func(v: u32) -> Option<ExpertGating> {
        match v {
            1 => Some(ExpertGating::Softmax),
            2 => Some(ExpertGating::Sigmoid),
            _ => None,
        }
    }

    /// A short name, for messages and `inspect`.
    pub fn name(self) -> &'static str {
        match self {
            ExpertGating::Softmax => "softmax",
            ExpertGating::SoftmaxSelected => "top-k logits, softmax over the selected",
            ExpertGating::Sigmoid => "sigmoid",
        }
    }
}

/// The always-on shared expert(s) of an architecture's MoE layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedExperts {
    /// None.
    None,
    /// Exactly one, of width `expert_shared_feed_forward_length`, its output multiplied by
    /// `sigmoid(ffn_gate_inp_shexp · x)` (qwen2moe).
    Gated,
    /// `expert_shared_count` of them fused into one SwiGLU of `count × n_ff_exp` rows,
    /// ungated (glm4moe, deepseek2).
    Counted,
}

/// The gated activation of the feed-forward blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnAct {
    /// `silu(gate) * up`.
    Swiglu,
    /// gpt-oss: `g = min(gate, 7)`, `u = clamp(up, -7, 7)`, `g * sigmoid(1.702 g) * (u + 1)`.
    SwigluOai,
    /// Gemma 4: `gelu(gate) * up` (ggml's tanh GELU through its f16 table).
    Geglu,
}

/// How rotary embeddings pair the elements of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeType {
    /// Adjacent pairs (2i, 2i+1) rotate together (ggml mode 0).
    Norm,
    /// Halves: element i rotates with i + n_rot/2 (ggml mode 2, GPT-NeoX).
    Neox,
}

/// Where RMS-normalisation of queries and keys happens (before RoPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// No QK-norm.
    None,
    /// RMSNorm of each head separately; weights `{head_dim}`.
    PerHead,
    /// RMSNorm over the whole q (and k) projection before the head split; weights `{n_embd}`.
    Whole,
}

/// Width of the attention projections, as llama.cpp's loader shapes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QDim {
    /// q has `n_head * head_dim` rows, `attn_output` has as many columns.
    HeadDimTimesHeads,
    /// q has `n_embd` rows and `attn_output` is `{n_embd, n_embd}` (requires
    /// `n_head * head_dim == n_embd`).
    Embd,
}

impl Arch {
    /// Every supported architecture.
    pub const ALL: [Arch; 11] = [
        Arch::Qwen3Moe,
        Arch::Qwen2Moe,
        Arch::Olmoe,
        Arch::GptOss,
        Arch::Glm4Moe,
        Arch::Deepseek2,
        Arch::Gemma4,
        Arch::Qwen35Moe,
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
    ];

    /// The architecture named `name` (the value of `general.architecture`).
    pub fn from_name(name: &str) -> Result<Arch, ModelError> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| ModelError::UnsupportedArch(name.to_owned()))
    }

    /// The GGUF name, which is also the prefix of its metadata keys.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Olmoe => "olmoe",
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::GptOss => "gpt-oss",
            Arch::Glm4Moe => "glm4moe",
            Arch::Deepseek2 => "deepseek2",
            Arch::Gemma4 => "gemma4",
            Arch::Qwen35Moe => "qwen35moe",
        }
    }

    /// Rotary embedding pairing.
    pub fn rope_type(self) -> RopeType {
        match self {
            Arch::Llama | Arch::Deepseek2 => RopeType::Norm,
            _ => RopeType::Neox,
        }
    }

    /// QK-norm kind.
    pub fn qk_norm(self) -> QkNorm {
        match self {
            Arch::Qwen3Moe | Arch::Qwen3 | Arch::Glm4Moe | Arch::Gemma4 | Arch::Qwen35Moe => {
                QkNorm::PerHead
            }
            Arch::Olmoe => QkNorm::Whole,
            _ => QkNorm::None,
        }
    }

    /// True when the QK-norm weights may be absent (GLM-4.5-Air has none, GLM-4.5 has them);
    /// each one present is applied.
    pub fn qk_norm_optional(self) -> bool {
        self == Arch::Glm4Moe
    }

    /// True when rope may rotate only the first `rope.dimension_count` elements of a head.
    pub fn partial_rope(self) -> bool {
        matches!(self, Arch::Glm4Moe | Arch::Gemma4 | Arch::Qwen35Moe)
    }

    /// True when the norm before the FFN is stored as `post_attention_norm.weight`.
    pub fn post_attention_norm(self) -> bool {
        matches!(self, Arch::GptOss | Arch::Glm4Moe | Arch::Qwen35Moe)
    }

    /// Whether each MoE layer carries `exp_probs_b.bias` `{n_expert}`, added to the gating
    /// probabilities to choose the experts while the weights stay the unbiased probabilities:
    /// `None` never, `Some(true)` always (glm4moe), `Some(false)` when the file has it
    /// (deepseek2: DeepSeek V3 has it, V2 not).
    pub fn selection_bias(self) -> Option<bool> {
        match self {
            Arch::Glm4Moe => Some(true),
            Arch::Deepseek2 => Some(false),
            _ => None,
        }
    }

    /// True when the file may hold `nextn_predict_layers` NextN (multi-token prediction)
    /// layers after the trunk's, counted in `block_count`.
    pub fn has_nextn(self) -> bool {
        matches!(self, Arch::Glm4Moe | Arch::Deepseek2 | Arch::Qwen35Moe)
    }

    /// True when llama.cpp reads `expert_gating_func` for this arch.
    pub fn reads_gating_func(self) -> bool {
        matches!(self, Arch::Glm4Moe | Arch::Deepseek2)
    }

    /// True when llama.cpp takes the experts' gate and up projections fused in one
    /// `ffn_gate_up_exps` tensor for this arch (else the tensor is refused as a fused layout).
    pub fn allows_fused_gate_up(self) -> bool {
        matches!(self, Arch::Deepseek2 | Arch::Gemma4 | Arch::Qwen35Moe)
    }

    /// True for Gemma 4's layer: see [`Arch::Gemma4`].
    pub fn is_gemma4(self) -> bool {
        self == Arch::Gemma4
    }

    /// True when attention is multi-head latent attention (see [`crate::Mla`]).
    pub fn is_mla(self) -> bool {
        self == Arch::Deepseek2
    }

    /// True for the hybrid stacks whose linear-attention layers carry a recurrent state
    /// (Gated DeltaNet) instead of KV cells.
    pub fn is_hybrid_recurrent(self) -> bool {
        self == Arch::Qwen35Moe
    }

    /// True where the full-attention q projection also makes a per-head output gate
    /// (interleaved per head: the head's queries, then its gate), applied as a sigmoid to the
    /// attention output before `attn_output`.
    pub fn gated_q(self) -> bool {
        self == Arch::Qwen35Moe
    }

    /// True where llama.cpp gates the shared expert with its sigmoid op (qwen35moe); qwen2moe's
    /// graph computes the same sigmoid as `silu(x) / x`, which rounds differently.
    pub fn shared_gate_sigmoid_op(self) -> bool {
        self == Arch::Qwen35Moe
    }

    /// True where rope positions are interleaved multi-section (IMRoPE): text tokens rotate
    /// by their position in the first three sections and by 0 in the fourth.
    pub fn imrope(self) -> bool {
        self == Arch::Qwen35Moe
    }

    /// Width of q / attn_output.
    pub fn q_dim(self) -> QDim {
        match self {
            Arch::Qwen3Moe
            | Arch::Qwen3
            | Arch::Llama
            | Arch::GptOss
            | Arch::Glm4Moe
            | Arch::Deepseek2
            | Arch::Gemma4
            | Arch::Qwen35Moe => QDim::HeadDimTimesHeads,
            Arch::Qwen2Moe | Arch::Olmoe | Arch::Qwen2 => QDim::Embd,
        }
    }

    /// True when every layer's FFN is a mixture of experts (the arch has no dense form).
    pub fn requires_experts(self) -> bool {
        matches!(
            self,
            Arch::Qwen3Moe
                | Arch::Qwen2Moe
                | Arch::Olmoe
                | Arch::GptOss
                | Arch::Glm4Moe
                | Arch::Deepseek2
                | Arch::Qwen35Moe
        )
    }

    /// True when the arch can have experts at all (llama: when `expert_count` > 0).
    pub fn allows_experts(self) -> bool {
        matches!(
            self,
            Arch::Qwen3Moe
                | Arch::Qwen2Moe
                | Arch::Olmoe
                | Arch::Llama
                | Arch::GptOss
                | Arch::Glm4Moe
                | Arch::Deepseek2
                | Arch::Gemma4
                | Arch::Qwen35Moe
        )
    }

    /// Whether llama.cpp renormalises the top-k router weights to sum 1 for this arch
    /// (`norm_w` of its MoE graph). Used as the default of `{arch}.expert_weights_norm`.
    pub fn default_expert_weights_norm(self) -> bool {
        matches!(
            self,
            Arch::Qwen3Moe | Arch::Llama | Arch::Gemma4 | Arch::Qwen35Moe
        )
    }

    /// True when `output.weight` must be present; otherwise it falls back to `token_embd.weight`.
    pub fn output_required(self) -> bool {
        matches!(self, Arch::Qwen2Moe | Arch::Olmoe)
    }

    /// The shared experts of the MoE layers.
    pub fn shared_experts(self) -> SharedExperts {
        match self {
            Arch::Qwen2Moe | Arch::Qwen35Moe => SharedExperts::Gated,
            Arch::Glm4Moe | Arch::Deepseek2 => SharedExperts::Counted,
            _ => SharedExperts::None,
        }
    }

    /// How router logits become expert weights when the file does not say
    /// (`expert_gating_func`, read where [`Arch::reads_gating_func`]).
    pub fn default_expert_gating(self) -> ExpertGating {
        match self {
            Arch::GptOss => ExpertGating::SoftmaxSelected,
            Arch::Glm4Moe => ExpertGating::Sigmoid,
            _ => ExpertGating::Softmax,
        }
    }

    /// The gated activation of the feed-forward blocks.
    pub fn ffn_act(self) -> FfnAct {
        match self {
            Arch::GptOss => FfnAct::SwigluOai,
            Arch::Gemma4 => FfnAct::Geglu,
            _ => FfnAct::Swiglu,
        }
    }

    /// True when the arch carries biases on the router, the expert projections and the
    /// attention output, and per-head attention sinks (all required).
    pub fn is_gpt_oss(self) -> bool {
        self == Arch::GptOss
    }

    /// llama.cpp's default sliding-window pattern when the file has none: every
    /// `n`-th layer (the last of each group of `n`) attends fully, the others through the
    /// window; 0 when the arch has no sliding window.
    pub fn default_swa_pattern(self) -> u32 {
        match self {
            Arch::GptOss => 2,
            // llama.cpp requires the pattern for gemma4 (see `sliding_window`)
            Arch::Gemma4 => u32::MAX,
            _ => 0,
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
