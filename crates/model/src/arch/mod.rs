//! The supported architectures: one module each, behind [`ArchDef`], over shared readers
//! ([`keys`]) and tensor builders ([`blocks`]). Each module defines a unit struct `Def`.
//!
//! An architecture's module says which keys it reads beyond the common ones (`hparams.rs`),
//! its per-layer tensor roles and shapes, and the [`Features`] it switches on: the graph rules
//! the forward pass reads, so that the engine never asks which architecture it runs. Adding one
//! is a new file here and its name in [`registry!`]'s list (`docs/adding-an-architecture.md`).

pub(crate) mod blocks;
pub(crate) mod keys;

use crate::error::ModelError;
use crate::kv::Kv;
use crate::model::Model;
use crate::params::HParams;
use crate::tensors::{LayerTensors, Loader, Tensor};
use blocks::LayerRules;
use keys::ExpertRules;

/// What an architecture defines: its name, its graph rules, its keys and its tensors. Only the
/// name, the features and the experts' rules have no default: a plain layer (multi-head
/// attention, the norms, a dense or routed-expert FFN) needs nothing more.
pub(crate) trait ArchDef: Sync {
    /// The GGUF name (`general.architecture`), also the prefix of its metadata keys.
    fn name(&self) -> &'static str;

    /// The graph rules it switches on.
    fn features(&self) -> Features;

    /// How it reads the expert keys ([`keys::experts`]), given the common ones.
    fn experts(&self, hp: &HParams) -> ExpertRules;

    /// Reads the keys that say which parts each layer has (a hybrid stack's layer types)
    /// before the experts' keys are read, which need to know the layers with an FFN.
    fn read_layer_types(&self, _kv: &Kv<'_>, _hp: &mut HParams) -> Result<(), ModelError> {
        Ok(())
    }

    /// Reads the keys beyond the common ones and the experts' (attention variants, windows,
    /// multipliers…) into `hp`, and checks them.
    fn read(&self, _kv: &Kv<'_>, _hp: &mut HParams) -> Result<(), ModelError> {
        Ok(())
    }

    /// True when `output.weight` must be present; otherwise the head falls back to
    /// `token_embd.weight`.
    fn output_required(&self) -> bool {
        false
    }

    /// The name of the final norm's weights (LFM2's converter names it `token_embd_norm`).
    fn output_norm_name(&self) -> &'static str {
        "output_norm.weight"
    }

    /// The model-wide tensors beyond the embedding, the output norm and the output.
    fn globals<'a>(&self, _ld: &mut Loader<'a>, _hp: &HParams) -> Result<Globals<'a>, ModelError> {
        Ok(Globals::default())
    }

    /// The tensors around a layer's attention projections (the FFN norm's name, biases,
    /// sinks, the experts' layout), for the default [`ArchDef::layer`].
    fn layer_rules(&self) -> LayerRules {
        LayerRules::BASE
    }

    /// The tensors of stored layer `il` (a trunk layer, or the block of a NextN layer): by
    /// default multi-head attention in the common layer of [`ArchDef::layer_rules`].
    fn layer<'a>(
        &self,
        ld: &mut Loader<'a>,
        hp: &HParams,
        il: usize,
    ) -> Result<LayerTensors<'a>, ModelError> {
        blocks::mha_layer(ld, hp, il, &self.layer_rules())
    }

    /// Lines of `sluice inspect` that only this architecture has (its layer types).
    fn describe(&self, _m: &Model<'_>, _out: &mut String) {}

    /// What a NextN layer holds beyond its block (where [`Features::nextn`] is on).
    fn nextn_rules(&self) -> NextnRules {
        NextnRules::GLM
    }
}

/// The NextN layers' rules beyond the block and the common `nextn.*` tensors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NextnRules {
    /// True when a file may hold the trunk alone (no `nextn.eh_proj` in the first NextN
    /// layer: then none of the NextN layers' tensors), as llama.cpp's glm4moe loader allows;
    /// where false every NextN layer is required.
    pub(crate) trunk_only: bool,
    /// `layer_output_norm.weight` `{n_embd}`: the layer's own norm of its output (required
    /// where true).
    pub(crate) out_norm: bool,
}

impl NextnRules {
    /// glm4moe's and deepseek2's: the trunk alone is allowed, no output norm of its own.
    pub(crate) const GLM: NextnRules = NextnRules {
        trunk_only: true,
        out_norm: false,
    };
}

/// Model-wide tensors an architecture may have.
#[derive(Debug, Default)]
pub(crate) struct Globals<'a> {
    /// `output.bias` `{n_vocab}`.
    pub(crate) output_bias: Option<Tensor<'a>>,
    /// `rope_freqs.weight`: per-frequency rope divisors shared by every layer.
    pub(crate) rope_freqs: Option<Tensor<'a>>,
}

impl<'a> Globals<'a> {
    /// An optional `rope_freqs.weight` `{n_rot/2}` (llama's and Granite's per-frequency rope
    /// divisors), nothing else.
    pub(crate) fn rope_freqs_optional(
        ld: &mut Loader<'a>,
        hp: &HParams,
    ) -> Result<Globals<'a>, ModelError> {
        Ok(Globals {
            rope_freqs: ld.opt("rope_freqs.weight", &[u64::from(hp.rope.n_rot / 2)])?,
            ..Globals::default()
        })
    }
}

/// Declares the architecture modules and the registry that lists them, in one list: adding
/// an architecture adds its module's name here.
macro_rules! registry {
    ($($m:ident),* $(,)?) => {
        $(mod $m;)*
        /// Every supported architecture, in the order messages list them.
        static REGISTRY: &[&dyn ArchDef] = &[$(&$m::Def),*];
    };
}

registry![
    qwen3moe,
    qwen2moe,
    olmoe,
    gpt_oss,
    glm4moe,
    deepseek2,
    gemma4,
    qwen35moe,
    llama,
    qwen2,
    qwen3,
    qwen3vlmoe,
    granitemoe,
    minimax_m2,
    smallthinker,
    bailingmoe2,
    qwen3next,
    llama4,
    lfm2moe,
    nemotron_h_moe,
];

/// A model architecture, from `general.architecture`: a handle on its module.
#[derive(Clone, Copy)]
pub struct Arch(&'static dyn ArchDef);

impl Arch {
    /// Every supported architecture.
    pub fn all() -> impl Iterator<Item = Arch> {
        REGISTRY.iter().map(|&d| Arch(d))
    }

    /// The architecture named `name` (the value of `general.architecture`).
    pub fn from_name(name: &str) -> Result<Arch, ModelError> {
        Arch::all()
            .find(|a| a.name() == name)
            .ok_or_else(|| ModelError::UnsupportedArch(name.to_owned()))
    }

    /// The GGUF name, which is also the prefix of its metadata keys.
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// The graph rules the architecture switches on.
    pub fn features(self) -> Features {
        self.0.features()
    }

    /// Its definition.
    pub(crate) fn def(self) -> &'static dyn ArchDef {
        self.0
    }
}

/// The names accepted in `general.architecture`, comma-separated, for messages.
pub fn supported_archs() -> String {
    Arch::all().map(Arch::name).collect::<Vec<_>>().join(", ")
}

impl PartialEq for Arch {
    fn eq(&self, other: &Arch) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Arch {}

impl std::hash::Hash for Arch {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl std::fmt::Debug for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Arch({})", self.name())
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The graph rules an architecture switches on, which the file does not store. The forward
/// pass reads these (and the rest of [`HParams`]), never the architecture's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// Rotary pairing.
    pub rope_type: RopeType,
    /// Where queries and keys are RMS-normalised.
    pub qk_norm: QkNorm,
    /// True when a layer's QK-norm weights may be absent (GLM-4.5-Air has none, GLM-4.5
    /// has them); each one present is applied.
    pub qk_norm_optional: bool,
    /// True when rope may rotate only the first `rope.dimension_count` elements of a head.
    pub partial_rope: bool,
    /// Width of q and `attn_output`.
    pub q_dim: QDim,
    /// True where the full-attention q projection also makes a per-head output gate
    /// (interleaved per head: the head's queries, then its gate), applied as a sigmoid to the
    /// attention output before `attn_output`.
    pub gated_q: bool,
    /// True where rope positions are interleaved multi-section (IMRoPE,
    /// `rope.dimension_sections`): text tokens rotate by their position in the first three
    /// sections and by 0 in the fourth.
    pub imrope: bool,
    /// True when the file may hold `nextn_predict_layers` NextN (multi-token prediction)
    /// layers after the trunk's, counted in `block_count`.
    pub nextn: bool,
    /// The gated activation of the feed-forward blocks.
    pub ffn_act: FfnAct,
    /// The shared experts of the MoE layers.
    pub shared_experts: SharedExperts,
    /// True where llama.cpp gates the shared expert with its sigmoid op (qwen35moe); qwen2moe's
    /// graph computes the same sigmoid as `silu(x) / x`, which rounds differently.
    pub shared_gate_sigmoid_op: bool,
    /// True when each value head is RMS-normalised without weights before attention.
    pub v_norm: bool,
    /// True when the sliding-window layers rotate with their own dims and base
    /// (`rope.dimension_count_swa`, `rope.freq_base_swa`), without divisors or scaling.
    pub swa_rope: bool,
    /// True when a layer with experts also runs a dense MLP beside them, each with its own
    /// norms (Gemma 4's layer: see [`crate::GemmaLayer`]).
    pub mlp_beside_experts: bool,
    /// True when llama.cpp's graph runs every row through the last layer and picks the
    /// wanted rows after the output norm (its other graphs pick them after the last
    /// attention).
    pub late_row_pick: bool,
    /// True when a MoE layer's router reads the layer's input (the residual stream before the
    /// attention norm) instead of the FFN's normed input (SmallThinker): the layer's experts
    /// are known before its attention runs.
    pub router_reads_layer_input: bool,
    /// Which query and key head a Gated DeltaNet value head reads when there are fewer key
    /// heads than value heads: true where each key head's value heads are stored together
    /// (Qwen3-Next: value head `h` reads key head `h / (n_v_heads / n_k_heads)`), false where
    /// they are stored tiled (Qwen3.5, whose converter reorders them: `h mod n_k_heads`).
    pub gdn_grouped_heads: bool,
    /// True when the sliding-window layers attend through chunks instead (llama.cpp's
    /// `LLAMA_SWA_TYPE_CHUNKED`, Llama 4): a query at position `p` sees the keys from
    /// `(p / n_swa) · n_swa` to `p`, its own chunk of `n_swa` positions.
    pub swa_chunked: bool,
    /// True when each routed expert's input is the FFN input times the expert's routing
    /// weight, and the experts' outputs are summed unweighted (Llama 4's `weight_before_ffn`).
    pub expert_weights_before_ffn: bool,
    /// True where a layer of 0 kv heads (`attention.head_count_kv`, per layer) is an LFM2
    /// short-convolution block (`shortconv.l_cache` wide) with a recurrent state instead of
    /// attention.
    pub shortconv: bool,
    /// True where a layer of 0 kv heads is a Mamba-2 mixer when its `feed_forward_length` is
    /// 0, and an FFN alone otherwise; a layer with kv heads is attention alone
    /// (nemotron_h_moe: every block is one norm, one part and the residual).
    pub mamba2: bool,
}

impl Features {
    /// The rules of a plain llama-style transformer: NEOX rope, no QK-norm, SwiGLU, nothing
    /// else; architectures state what they change.
    pub const BASE: Features = Features {
        rope_type: RopeType::Neox,
        qk_norm: QkNorm::None,
        qk_norm_optional: false,
        partial_rope: false,
        q_dim: QDim::HeadDimTimesHeads,
        gated_q: false,
        imrope: false,
        nextn: false,
        ffn_act: FfnAct::Swiglu,
        shared_experts: SharedExperts::None,
        shared_gate_sigmoid_op: false,
        v_norm: false,
        swa_rope: false,
        mlp_beside_experts: false,
        late_row_pick: false,
        router_reads_layer_input: false,
        gdn_grouped_heads: false,
        swa_chunked: false,
        expert_weights_before_ffn: false,
        shortconv: false,
        mamba2: false,
    };
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
    /// The top-k of the raw logits, weighted by their sigmoid (Llama 4: the same choice as
    /// [`ExpertGating::Sigmoid`] but for ties the sigmoid's rounding makes).
    SigmoidRankLogits,
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
            ExpertGating::SigmoidRankLogits => "top-k logits, sigmoid weights",
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
    /// `expert_shared_count` of them fused into one ungated SwiGLU of `count × w` rows, `w`
    /// being `expert_shared_feed_forward_length` where it is non-zero, else the routed
    /// experts' width; the same width in every MoE layer (bailingmoe2).
    CountedKeyed,
    /// One ungated SwiGLU as wide as the layer's routed experts (llama4).
    One,
    /// One ungated shared expert of width `expert_shared_feed_forward_length` (required),
    /// whatever `expert_shared_count` says (nemotron_h_moe, whose graph reads the width alone).
    Keyed,
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
    /// SmallThinker's experts: `relu(gate) * up` (ggml's `reglu`: `gate > 0 ? gate * up : 0`).
    Reglu,
    /// Experts without a gate (nemotron_h_moe): `relu(up)²` (ggml's `relu` then `sqr`).
    ReluSqr,
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
    /// RMSNorm over the whole q (and k) projection before the head split; weights as wide as
    /// the projection (`{n_embd}` for OLMoE; `{n_head * head_dim}` and `{n_head_kv *
    /// head_dim}` for MiniMax-M2).
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
