//! The supported architectures and their fixed graph rules.

use crate::error::ModelError;

/// Names accepted in `general.architecture`, for messages.
pub const SUPPORTED_ARCHS: &str = "qwen3moe, qwen2moe, olmoe, gpt-oss, llama, qwen2, qwen3";

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
}

/// How a MoE layer turns router logits into expert weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertGating {
    /// Softmax over all experts, then the top-k probabilities.
    Softmax,
    /// Top-k of the raw logits, then a softmax over the k selected logits.
    SoftmaxSelected,
}

/// The gated activation of the feed-forward blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnAct {
    /// `silu(gate) * up`.
    Swiglu,
    /// gpt-oss: `g = min(gate, 7)`, `u = clamp(up, -7, 7)`, `g * sigmoid(1.702 g) * (u + 1)`.
    SwigluOai,
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
    pub const ALL: [Arch; 7] = [
        Arch::Qwen3Moe,
        Arch::Qwen2Moe,
        Arch::Olmoe,
        Arch::GptOss,
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
        }
    }

    /// Rotary embedding pairing.
    pub fn rope_type(self) -> RopeType {
        match self {
            Arch::Llama => RopeType::Norm,
            _ => RopeType::Neox,
        }
    }

    /// QK-norm kind.
    pub fn qk_norm(self) -> QkNorm {
        match self {
            Arch::Qwen3Moe | Arch::Qwen3 => QkNorm::PerHead,
            Arch::Olmoe => QkNorm::Whole,
            _ => QkNorm::None,
        }
    }

    /// Width of q / attn_output.
    pub fn q_dim(self) -> QDim {
        match self {
            Arch::Qwen3Moe | Arch::Qwen3 | Arch::Llama | Arch::GptOss => QDim::HeadDimTimesHeads,
            Arch::Qwen2Moe | Arch::Olmoe | Arch::Qwen2 => QDim::Embd,
        }
    }

    /// True when every layer's FFN is a mixture of experts (the arch has no dense form).
    pub fn requires_experts(self) -> bool {
        matches!(
            self,
            Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::Olmoe | Arch::GptOss
        )
    }

    /// True when the arch can have experts at all (llama: when `expert_count` > 0).
    pub fn allows_experts(self) -> bool {
        matches!(
            self,
            Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::Olmoe | Arch::Llama | Arch::GptOss
        )
    }

    /// Whether llama.cpp renormalises the top-k router weights to sum 1 for this arch
    /// (`norm_w` of its MoE graph). Used as the default of `{arch}.expert_weights_norm`.
    pub fn default_expert_weights_norm(self) -> bool {
        matches!(self, Arch::Qwen3Moe | Arch::Llama)
    }

    /// True when `output.weight` must be present; otherwise it falls back to `token_embd.weight`.
    pub fn output_required(self) -> bool {
        matches!(self, Arch::Qwen2Moe | Arch::Olmoe)
    }

    /// True when the MoE layers carry one always-on shared expert with a sigmoid gate.
    pub fn has_gated_shared_expert(self) -> bool {
        matches!(self, Arch::Qwen2Moe)
    }

    /// How router logits become expert weights.
    pub fn expert_gating(self) -> ExpertGating {
        match self {
            Arch::GptOss => ExpertGating::SoftmaxSelected,
            _ => ExpertGating::Softmax,
        }
    }

    /// The gated activation of the feed-forward blocks.
    pub fn ffn_act(self) -> FfnAct {
        match self {
            Arch::GptOss => FfnAct::SwigluOai,
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
            _ => 0,
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
