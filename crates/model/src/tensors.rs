//! Tensor roles: which tensor of the file plays which part in the forward pass, with shapes
//! checked against the hyperparameters the way llama.cpp's loader checks them.

use std::collections::HashSet;

use gguf::{GgufFile, TensorInfo};

use crate::arch::Globals;
use crate::error::ModelError;
use crate::params::HParams;

/// A tensor of the file: name, type, dims (ggml order, ne0 first), offset and shard. Its bytes
/// are borrowed from the mapped file with [`GgufFile::tensor_data`].
pub type Tensor<'a> = &'a TensorInfo;

/// The tensors of a whole model.
#[derive(Debug, Clone)]
pub struct ModelTensors<'a> {
    /// `token_embd.weight` `{n_embd, n_vocab}`.
    pub token_embd: Tensor<'a>,
    /// `output_norm.weight` `{n_embd}`.
    pub output_norm: Tensor<'a>,
    /// `output.weight` `{n_embd, n_vocab}`, or `token_embd.weight` when tied.
    pub output: Tensor<'a>,
    /// True when the file has no `output.weight` and the head reuses the embedding.
    pub output_tied: bool,
    /// `output.bias` `{n_vocab}` (qwen2 only, optional).
    pub output_bias: Option<Tensor<'a>>,
    /// `rope_freqs.weight` `{n_rot/2}` (llama only, optional): per-frequency divisors, as in
    /// Llama 3. Shared by every layer.
    pub rope_freqs: Option<Tensor<'a>>,
    /// One entry per layer.
    pub layers: Vec<LayerTensors<'a>>,
    /// The NextN (multi-token prediction) layers stored after the trunk, when the file has
    /// them: shape-checked and kept out of the decode path (and out of memory).
    pub nextn: Vec<NextNTensors<'a>>,
}

/// A NextN layer (glm4moe's multi-token prediction head): a transformer block of its own over
/// `eh_proj · [enorm(embedding); hnorm(hidden)]`.
#[derive(Debug, Clone)]
pub struct NextNTensors<'a> {
    /// The stored layer index (`blk.N`).
    pub layer: usize,
    /// The block (attention and FFN, as a trunk layer's).
    pub block: LayerTensors<'a>,
    /// `nextn.eh_proj.weight` `{2 n_embd, n_embd}`.
    pub eh_proj: Tensor<'a>,
    /// `nextn.enorm.weight` `{n_embd}`.
    pub enorm: Tensor<'a>,
    /// `nextn.hnorm.weight` `{n_embd}`.
    pub hnorm: Tensor<'a>,
    /// `nextn.embed_tokens.weight` `{n_embd, n_vocab}` (optional: the trunk's otherwise).
    pub embed_tokens: Option<Tensor<'a>>,
    /// `nextn.shared_head_head.weight` `{n_embd, n_vocab}` (optional: the trunk's output).
    pub shared_head_head: Option<Tensor<'a>>,
    /// `nextn.shared_head_norm.weight` `{n_embd}` (optional: the trunk's output norm).
    pub shared_head_norm: Option<Tensor<'a>>,
    /// `layer_output_norm.weight` `{n_embd}`: the layer's own norm of its output (bailingmoe2,
    /// required there; llama.cpp keeps it without running it).
    pub out_norm: Option<Tensor<'a>>,
}

impl NextNTensors<'_> {
    /// Every tensor of the layer.
    pub fn tensors(&self) -> Vec<&TensorInfo> {
        let mut v = self.block.tensors();
        v.extend([self.eh_proj, self.enorm, self.hnorm]);
        v.extend(
            [
                self.embed_tokens,
                self.shared_head_head,
                self.shared_head_norm,
                self.out_norm,
            ]
            .into_iter()
            .flatten(),
        );
        v
    }
}

/// The tensors of one layer.
#[derive(Debug, Clone)]
pub struct LayerTensors<'a> {
    /// `attn_norm.weight` `{n_embd}`; `None` in a layer without a mixer ([`Attn::None`]).
    pub attn_norm: Option<Tensor<'a>>,
    /// The projections that make queries, keys and values (or the layer's other mixer).
    pub attn: Attn<'a>,
    /// `attn_output.weight` `{n_embd_out, n_embd}` (see [`HParams::n_embd_out`]); `None` in a
    /// layer without a mixer.
    pub wo: Option<Tensor<'a>>,
    /// `attn_output.bias` `{n_embd}` (llama: optional; gpt-oss: required).
    pub bo: Option<Tensor<'a>>,
    /// `attn_sinks.weight` `{n_head}` (gpt-oss, required): one extra logit per head that takes
    /// part in the attention softmax's normalisation without a value.
    pub attn_sinks: Option<Tensor<'a>>,
    /// `ffn_norm.weight` `{n_embd}` (gpt-oss: `post_attention_norm.weight`, which plays the
    /// same part: the norm after the attention's residual, before the FFN; nemotron_h_moe's
    /// MoE layers: their `attn_norm.weight`, the one norm of a block that is its FFN alone);
    /// `None` in a layer without an FFN ([`Ffn::None`]).
    pub ffn_norm: Option<Tensor<'a>>,
    /// The feed-forward block.
    pub ffn: Ffn<'a>,
    /// Gemma 4's extras (see [`GemmaLayer`]).
    pub gemma: Option<GemmaLayer<'a>>,
}

/// What a Gemma 4 layer has beyond the common ones.
#[derive(Debug, Clone)]
pub struct GemmaLayer<'a> {
    /// `post_attention_norm.weight` `{n_embd}`: RMS norm of the attention output before the
    /// residual.
    pub post_attn_norm: Tensor<'a>,
    /// `post_ffw_norm.weight` `{n_embd}`: RMS norm of the FFN output before the residual.
    pub post_ffn_norm: Tensor<'a>,
    /// `layer_output_scale.weight` `{1}` (optional): the layer's output is multiplied by it.
    pub out_scale: Option<Tensor<'a>>,
    /// With experts: the MoE block beside the dense MLP (which is then in `ffn_gate`/`up`/
    /// `down` with `ffn_norm`).
    pub moe: Option<GemmaMoe<'a>>,
}

/// Gemma 4's MoE block: its norms, the router's input scale and the experts' down scale.
#[derive(Debug, Clone)]
pub struct GemmaMoe<'a> {
    /// The dense MLP (`ffn_gate`, `ffn_up`, `ffn_down`).
    pub mlp: DenseFfn<'a>,
    /// `post_ffw_norm_1.weight` `{n_embd}`: norm of the dense MLP's output.
    pub post_norm_1: Tensor<'a>,
    /// `pre_ffw_norm_2.weight` `{n_embd}`: norm of the experts' input.
    pub pre_norm_2: Tensor<'a>,
    /// `post_ffw_norm_2.weight` `{n_embd}`: norm of the experts' output.
    pub post_norm_2: Tensor<'a>,
    /// `ffn_gate_inp.scale` `{n_embd}`: multiplies the router's input.
    pub router_scale: Tensor<'a>,
    /// `ffn_down_exps.scale` `{n_expert}` (optional): multiplies each expert's output.
    pub down_scale: Option<Tensor<'a>>,
}

/// How a layer makes its queries, keys and values.
#[derive(Debug, Clone)]
pub enum Attn<'a> {
    /// Multi-head attention with grouped key/value heads: one projection each.
    Mha(MhaTensors<'a>),
    /// Multi-head latent attention (deepseek2; see [`crate::Mla`]).
    Mla(MlaTensors<'a>),
    /// Gated DeltaNet linear attention (qwen35moe's recurrent layers); the layer's `wo` is
    /// its `ssm_out`.
    Gdn(GdnTensors<'a>),
    /// LFM2's short convolution (its recurrent layers); the layer's `wo` is its `out_proj`.
    ShortConv(ShortConvTensors<'a>),
    /// A Mamba-2 mixer (nemotron_h_moe's recurrent layers); the layer's `wo` is its
    /// `ssm_out`.
    Mamba2(Mamba2Tensors<'a>),
    /// No mixer: the layer is its FFN alone (nemotron_h_moe's MoE layers).
    None,
}

/// The tensors of a Mamba-2 mixer, as llama.cpp's nemotron_h loader shapes them (ggml order:
/// columns first; see [`crate::Mamba2`] for the sizes).
#[derive(Debug, Clone, Copy)]
pub struct Mamba2Tensors<'a> {
    /// `ssm_in` {n_embd, 2 d_inner + 2 n_group d_state + n_head}: per token the gate z, the
    /// convolution's input (x, every group's B, every group's C) and the heads' time steps.
    pub in_proj: Tensor<'a>,
    /// `ssm_conv1d.weight` {d_conv, d_inner + 2 n_group d_state}: each channel's weights,
    /// oldest input first.
    pub conv1d: Tensor<'a>,
    /// `ssm_conv1d.bias` {channels} (optional, as llama.cpp reads it).
    pub conv1d_b: Option<Tensor<'a>>,
    /// `ssm_dt.bias` {n_head}: added to each head's time step before the softplus.
    pub dt_bias: Tensor<'a>,
    /// `ssm_a` {1, n_head}: each head's decay rate (-exp(A_log)).
    pub a: Tensor<'a>,
    /// `ssm_d` {1, n_head}: each head's skip connection from x.
    pub d: Tensor<'a>,
    /// `ssm_norm.weight` {d_inner / n_group, n_group}: the gated output's RMSNorm per group.
    pub norm: Tensor<'a>,
}

/// The tensors of an LFM2 short-convolution layer (ggml order: columns first).
#[derive(Debug, Clone, Copy)]
pub struct ShortConvTensors<'a> {
    /// `shortconv.in_proj` {n_embd, 3 n_embd}: the gate B, the gate C and the input x.
    pub in_proj: Tensor<'a>,
    /// `shortconv.conv` {l_cache, n_embd}: each channel's weights, oldest input first.
    pub conv: Tensor<'a>,
}

/// The tensors of a Gated DeltaNet linear-attention layer, as llama.cpp's qwen35moe and
/// qwen3next loaders shape them (ggml order: columns first).
#[derive(Debug, Clone, Copy)]
pub struct GdnTensors<'a> {
    /// The projection of the queries, keys and values before the convolution, and of the
    /// output gate (z).
    pub input: GdnInput<'a>,
    /// `ssm_conv1d` {d_conv, channels}: the causal convolution's weights.
    pub conv1d: Tensor<'a>,
    /// `ssm_dt.bias` {value heads}: added to alpha before the softplus.
    pub dt_bias: Tensor<'a>,
    /// `ssm_a` {value heads}: the decay rates (-exp(A_log)).
    pub a: Tensor<'a>,
    /// The projections of beta (the write strengths, through a sigmoid) and alpha (the decay
    /// inputs).
    pub beta_alpha: GdnBetaAlpha<'a>,
    /// `ssm_norm` {head size}: the output's RMSNorm weights.
    pub norm: Tensor<'a>,
}

/// How a Gated DeltaNet layer stores its input projections.
#[derive(Debug, Clone, Copy)]
pub enum GdnInput<'a> {
    /// `attn_qkv` {n_embd, 2 key_dim + value_dim} (all queries, all keys, all values) and
    /// `attn_gate` {n_embd, value_dim}.
    Split {
        /// `attn_qkv`.
        qkv: Tensor<'a>,
        /// `attn_gate`.
        gate: Tensor<'a>,
    },
    /// `ssm_in` {n_embd, 2 key_dim + 2 value_dim} (Qwen3-Next files of the first converter):
    /// for each key head in turn, its query, its key, the values and the gates of its value
    /// heads.
    Grouped(Tensor<'a>),
}

/// How a Gated DeltaNet layer stores its beta and alpha projections.
#[derive(Debug, Clone, Copy)]
pub enum GdnBetaAlpha<'a> {
    /// `ssm_beta` and `ssm_alpha`, each {n_embd, value heads}.
    Split {
        /// `ssm_beta`.
        beta: Tensor<'a>,
        /// `ssm_alpha`.
        alpha: Tensor<'a>,
    },
    /// `ssm_ba` {n_embd, 2 value heads} (Qwen3-Next): for each key head in turn, the betas of
    /// its value heads, then their alphas.
    Grouped(Tensor<'a>),
}

impl<'a> GdnInput<'a> {
    /// `attn_qkv`, or the grouped `ssm_in`.
    pub fn qkv_or_grouped(&self) -> Tensor<'a> {
        match *self {
            GdnInput::Split { qkv, .. } => qkv,
            GdnInput::Grouped(t) => t,
        }
    }

    /// `attn_gate` (`None` where the gates are in `ssm_in`).
    pub fn gate(&self) -> Option<Tensor<'a>> {
        match *self {
            GdnInput::Split { gate, .. } => Some(gate),
            GdnInput::Grouped(_) => None,
        }
    }
}

impl<'a> GdnBetaAlpha<'a> {
    /// `ssm_beta`, or the grouped `ssm_ba`.
    pub fn beta_or_grouped(&self) -> Tensor<'a> {
        match *self {
            GdnBetaAlpha::Split { beta, .. } => beta,
            GdnBetaAlpha::Grouped(t) => t,
        }
    }

    /// `ssm_alpha` (`None` where the alphas are in `ssm_ba`).
    pub fn alpha(&self) -> Option<Tensor<'a>> {
        match *self {
            GdnBetaAlpha::Split { alpha, .. } => Some(alpha),
            GdnBetaAlpha::Grouped(_) => None,
        }
    }
}

impl<'a> GdnTensors<'a> {
    /// Every tensor of the layer's linear attention (its output projection is the layer's).
    pub fn tensors(&self) -> Vec<Tensor<'a>> {
        let mut v = match self.input {
            GdnInput::Split { qkv, gate } => vec![qkv, gate],
            GdnInput::Grouped(t) => vec![t],
        };
        v.extend([self.conv1d, self.dt_bias, self.a]);
        match self.beta_alpha {
            GdnBetaAlpha::Split { beta, alpha } => v.extend([beta, alpha]),
            GdnBetaAlpha::Grouped(t) => v.push(t),
        }
        v.push(self.norm);
        v
    }
}

/// The q, k and v projections of multi-head attention.
#[derive(Debug, Clone)]
pub struct MhaTensors<'a> {
    /// `attn_q.weight` `{n_embd, n_embd_q}`.
    pub wq: Tensor<'a>,
    /// `attn_k.weight` `{n_embd, n_embd_k_gqa}`.
    pub wk: Tensor<'a>,
    /// `attn_v.weight` `{n_embd, n_embd_v_gqa}`; absent in Gemma 4's full-attention layers,
    /// whose values are their keys (before the key norm).
    pub wv: Option<Tensor<'a>>,
    /// True when `wq`, `wk` and `wv` are one `attn_qkv.weight` `{n_embd, n_embd_q +
    /// n_embd_k_gqa + n_embd_v_gqa}` (bailingmoe2): its first `n_embd_q` rows are the query
    /// projection, the next `n_embd_k_gqa` the key projection, the rest the value projection.
    pub fused_qkv: bool,
    /// `attn_q.bias` `{n_embd_q}` (optional; present in Qwen2 files).
    pub bq: Option<Tensor<'a>>,
    /// `attn_k.bias` `{n_embd_k_gqa}` (optional).
    pub bk: Option<Tensor<'a>>,
    /// `attn_v.bias` `{n_embd_v_gqa}` (optional).
    pub bv: Option<Tensor<'a>>,
    /// `attn_q_norm.weight`: `{head_dim}` per head, or `{n_embd}` over the whole projection
    /// (see [`crate::Features::qk_norm`]).
    pub q_norm: Option<Tensor<'a>>,
    /// `attn_k_norm.weight`, as `q_norm`.
    pub k_norm: Option<Tensor<'a>>,
}

/// The projections of multi-head latent attention (dims in ggml order; `k` and `v` are the
/// model's head sizes [`crate::Mla::head_dim_k`] / [`crate::Mla::head_dim_v`], `nope` is
/// `k - n_rot`, `r` is `kv_lora_rank`).
#[derive(Debug, Clone)]
pub struct MlaTensors<'a> {
    /// The query projection.
    pub q: MlaQuery<'a>,
    /// `attn_kv_a_mqa.weight` `{n_embd, r + n_rot}`: the compressed row and the rotated key
    /// part shared by every head.
    pub kv_a_mqa: Tensor<'a>,
    /// `attn_kv_a_norm.weight` `{r}`: RMS norm of the compressed row.
    pub kv_a_norm: Tensor<'a>,
    /// From the compressed row to keys and values.
    pub kv_b: MlaKvB<'a>,
}

/// The query projection of an MLA layer.
#[derive(Debug, Clone)]
pub enum MlaQuery<'a> {
    /// `attn_q.weight` `{n_embd, n_head · k}` (q_lora_rank 0).
    Direct(Tensor<'a>),
    /// `attn_q_a.weight` `{n_embd, q_lora_rank}`, its RMS norm `attn_q_a_norm.weight`
    /// `{q_lora_rank}`, then `attn_q_b.weight` `{q_lora_rank, n_head · k}`.
    LowRank {
        /// `attn_q_a.weight`.
        a: Tensor<'a>,
        /// `attn_q_a_norm.weight`.
        a_norm: Tensor<'a>,
        /// `attn_q_b.weight`.
        b: Tensor<'a>,
    },
}

/// How an MLA layer expands its compressed row.
#[derive(Debug, Clone)]
pub enum MlaKvB<'a> {
    /// `attn_k_b.weight` `{nope, r, n_head}` carries each query head into the compressed
    /// space; `attn_v_b.weight` `{r, v, n_head}` carries each head's attention output back.
    Absorbed {
        /// `attn_k_b.weight`.
        k_b: Tensor<'a>,
        /// `attn_v_b.weight`.
        v_b: Tensor<'a>,
    },
    /// `attn_kv_b.weight` `{r, n_head · (nope + v)}`: per head the plain key part, then the
    /// value.
    Legacy(Tensor<'a>),
}

impl Attn<'_> {
    /// Every tensor of the attention projections.
    pub fn tensors(&self) -> Vec<&TensorInfo> {
        match self {
            Attn::Mha(m) => {
                let mut v = if m.fused_qkv {
                    vec![m.wq]
                } else {
                    let mut v = vec![m.wq, m.wk];
                    v.extend(m.wv);
                    v
                };
                v.extend([m.bq, m.bk, m.bv, m.q_norm, m.k_norm].into_iter().flatten());
                v
            }
            Attn::Mla(m) => {
                let mut v = match &m.q {
                    MlaQuery::Direct(q) => vec![*q],
                    MlaQuery::LowRank { a, a_norm, b } => vec![*a, *a_norm, *b],
                };
                v.extend([m.kv_a_mqa, m.kv_a_norm]);
                match &m.kv_b {
                    MlaKvB::Absorbed { k_b, v_b } => v.extend([*k_b, *v_b]),
                    MlaKvB::Legacy(kv_b) => v.push(kv_b),
                }
                v
            }
            Attn::Gdn(g) => g.tensors(),
            Attn::ShortConv(c) => vec![c.in_proj, c.conv],
            Attn::Mamba2(m) => {
                let mut v = vec![m.in_proj, m.conv1d];
                v.extend(m.conv1d_b);
                v.extend([m.dt_bias, m.a, m.d, m.norm]);
                v
            }
            Attn::None => Vec::new(),
        }
    }
}

impl<'a> LayerTensors<'a> {
    /// The multi-head attention projections (`None` for an MLA layer).
    pub fn mha(&self) -> Option<&MhaTensors<'a>> {
        match &self.attn {
            Attn::Mha(m) => Some(m),
            _ => None,
        }
    }

    /// The multi-head latent attention projections (`None` for an MHA layer).
    pub fn mla(&self) -> Option<&MlaTensors<'a>> {
        match &self.attn {
            Attn::Mla(m) => Some(m),
            _ => None,
        }
    }

    /// Every tensor of the layer.
    pub fn tensors(&self) -> Vec<&TensorInfo> {
        let mut v: Vec<&TensorInfo> = self.attn_norm.into_iter().collect();
        v.extend(self.attn.tensors());
        v.extend([self.wo, self.ffn_norm].into_iter().flatten());
        v.extend([self.bo, self.attn_sinks].into_iter().flatten());
        if let Some(g) = &self.gemma {
            v.extend([g.post_attn_norm, g.post_ffn_norm]);
            v.extend(g.out_scale);
            if let Some(m) = &g.moe {
                v.extend([m.mlp.gate, m.mlp.up, m.mlp.down]);
                v.extend([m.post_norm_1, m.pre_norm_2, m.post_norm_2, m.router_scale]);
                v.extend(m.down_scale);
            }
        }
        match &self.ffn {
            Ffn::Dense(d) => {
                v.extend([d.gate, d.up, d.down]);
                v.extend([d.gate_b, d.up_b, d.down_b].into_iter().flatten());
            }
            Ffn::Moe(m) => {
                v.push(m.router);
                v.extend(m.expert_tensors());
                v.extend(m.selection_bias);
                v.extend(m.latent.iter().flat_map(|l| [l.down, l.up]));
                if let Some(sh) = &m.shared {
                    v.extend(sh.gate);
                    v.extend([sh.up, sh.down]);
                    v.extend(sh.gate_inp);
                }
                if let Some(b) = &m.biases {
                    v.extend([b.router, b.gate, b.up, b.down]);
                }
            }
            Ffn::None => {}
        }
        v
    }
}

/// A layer's feed-forward block.
#[derive(Debug, Clone)]
pub enum Ffn<'a> {
    /// One SwiGLU MLP: `down(silu(gate·x) * (up·x))`.
    Dense(DenseFfn<'a>),
    /// Routed experts (plus an optional shared expert).
    Moe(MoeFfn<'a>),
    /// No FFN: the layer is its mixer alone (nemotron_h_moe's attention and Mamba-2 layers).
    None,
}

/// A dense SwiGLU FFN.
#[derive(Debug, Clone)]
pub struct DenseFfn<'a> {
    /// `ffn_gate.weight` `{n_embd, n_ff}`.
    pub gate: Tensor<'a>,
    /// `ffn_up.weight` `{n_embd, n_ff}`.
    pub up: Tensor<'a>,
    /// `ffn_down.weight` `{n_ff, n_embd}`.
    pub down: Tensor<'a>,
    /// `ffn_gate.bias` `{n_ff}` (llama only, optional).
    pub gate_b: Option<Tensor<'a>>,
    /// `ffn_up.bias` `{n_ff}` (llama only, optional).
    pub up_b: Option<Tensor<'a>>,
    /// `ffn_down.bias` `{n_embd}` (llama only, optional).
    pub down_b: Option<Tensor<'a>>,
}

/// A mixture-of-experts FFN. Expert `e`'s slice of each stacked tensor is the `e`-th of
/// `n_expert` equal, contiguous parts of its bytes (see [`MoeFfn::expert_slice`]).
#[derive(Debug, Clone)]
pub struct MoeFfn<'a> {
    /// `ffn_gate_inp.weight` `{n_embd, n_expert}`: the router.
    pub router: Tensor<'a>,
    /// `ffn_gate_exps.weight` `{n_embd, n_ff_exp, n_expert}`; with a fused layout the
    /// `ffn_gate_up_exps.weight` tensor (see [`MoeFfn::fused_gate_up`]); `None` for experts
    /// without a gate (nemotron_h_moe's ReLU² experts: `down(relu(up · x)²)`).
    pub gate_exps: Option<Tensor<'a>>,
    /// `ffn_up_exps.weight` `{n_embd, n_ff_exp, n_expert}`; with a fused layout the same
    /// `ffn_gate_up_exps.weight` tensor as `gate_exps`.
    pub up_exps: Tensor<'a>,
    /// True when gate and up are one `ffn_gate_up_exps.weight` `{n_embd, 2 n_ff_exp,
    /// n_expert}` (deepseek2): each expert's first `n_ff_exp` rows are its gate projection, the
    /// next `n_ff_exp` its up projection.
    pub fused_gate_up: bool,
    /// `ffn_down_exps.weight` `{n_ff_exp, n_embd, n_expert}`.
    pub down_exps: Tensor<'a>,
    /// The projections into and out of the experts' latent space (Nemotron 3 Super; see
    /// [`crate::HParams::moe_latent`]); the experts then read and write `moe_latent` wide.
    pub latent: Option<MoeLatent<'a>>,
    /// Number of experts (ne2 of the stacked tensors).
    pub n_expert: u32,
    /// The always-on shared expert, if the arch has one.
    pub shared: Option<SharedExpert<'a>>,
    /// `exp_probs_b.bias` `{n_expert}` (glm4moe, required there): added to the gating
    /// probabilities for the choice of experts only.
    pub selection_bias: Option<Tensor<'a>>,
    /// Biases (gpt-oss, required there): router `ffn_gate_inp.bias` `{n_expert}`, and per
    /// expert `ffn_gate_exps.bias` / `ffn_up_exps.bias` `{n_ff_exp, n_expert}` and
    /// `ffn_down_exps.bias` `{n_embd, n_expert}`. They are small and stay resident; the
    /// streamed bytes of an expert are its three matrices only.
    pub biases: Option<MoeBiases<'a>>,
}

/// The latent projections around a layer's routed experts.
#[derive(Debug, Clone, Copy)]
pub struct MoeLatent<'a> {
    /// `ffn_latent_down.weight` `{n_embd, moe_latent}`: the experts' input (and the router
    /// still reads the full-width one).
    pub down: Tensor<'a>,
    /// `ffn_latent_up.weight` `{moe_latent, n_embd}`: the weighted sum of the experts' outputs.
    pub up: Tensor<'a>,
}

/// The bias tensors of a gpt-oss MoE layer.
#[derive(Debug, Clone)]
pub struct MoeBiases<'a> {
    /// `ffn_gate_inp.bias` `{n_expert}`.
    pub router: Tensor<'a>,
    /// `ffn_gate_exps.bias` `{n_ff_exp, n_expert}`.
    pub gate: Tensor<'a>,
    /// `ffn_up_exps.bias` `{n_ff_exp, n_expert}`.
    pub up: Tensor<'a>,
    /// `ffn_down_exps.bias` `{n_embd, n_expert}`.
    pub down: Tensor<'a>,
}

/// The shared expert of a MoE layer.
#[derive(Debug, Clone)]
pub struct SharedExpert<'a> {
    /// `ffn_gate_shexp.weight` `{n_embd, n_ff_shexp}`; `None` for a shared expert without a
    /// gate (nemotron_h_moe's: ReLU², as its routed experts).
    pub gate: Option<Tensor<'a>>,
    /// `ffn_up_shexp.weight` `{n_embd, n_ff_shexp}`.
    pub up: Tensor<'a>,
    /// `ffn_down_shexp.weight` `{n_ff_shexp, n_embd}`.
    pub down: Tensor<'a>,
    /// `ffn_gate_inp_shexp.weight` `{n_embd}`: the shared expert's output is multiplied by
    /// `sigmoid(gate_inp · x)` (qwen2moe, where it is required; glm4moe has no gate).
    pub gate_inp: Option<Tensor<'a>>,
}

/// Byte range of one expert inside a stacked expert tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertSlice {
    /// Offset from the start of the tensor's data.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl MoeFfn<'_> {
    /// The stacked expert tensors in the order gate, up, down (gate_up, down when fused; up,
    /// down without a gate).
    pub fn expert_tensors(&self) -> Vec<&TensorInfo> {
        match self.gate_exps {
            Some(_) if self.fused_gate_up => vec![self.up_exps, self.down_exps],
            Some(g) => vec![g, self.up_exps, self.down_exps],
            None => vec![self.up_exps, self.down_exps],
        }
    }

    /// Where expert `e`'s part of `t` lies (relative to the tensor's own data); `None` when the
    /// tensor's size is unknown or `e` is out of range.
    pub fn expert_slice(&self, t: &TensorInfo, e: u32) -> Option<ExpertSlice> {
        if e >= self.n_expert {
            return None;
        }
        let len = t.n_bytes?.checked_div(u64::from(self.n_expert))?;
        Some(ExpertSlice {
            offset: len * u64::from(e),
            len,
        })
    }

    /// Bytes of one expert (gate + up + down), or `None` when a tensor's size is unknown.
    pub fn bytes_per_expert(&self) -> Option<u64> {
        let mut sum = 0u64;
        for t in self.expert_tensors() {
            sum = sum.checked_add(t.n_bytes?.checked_div(u64::from(self.n_expert))?)?;
        }
        Some(sum)
    }

    /// Bytes of all routed experts of this layer.
    pub fn expert_bytes(&self) -> Option<u64> {
        self.bytes_per_expert()?
            .checked_mul(u64::from(self.n_expert))
    }
}

/// Tensors looked up in the file, with the set of names used.
pub(crate) struct Loader<'a> {
    file: &'a GgufFile,
    used: HashSet<&'a str>,
}

fn same_shape(expected: &[u64], got: &[u64]) -> bool {
    // As ggml compares: up to 4 dims, missing ones count as 1.
    (0..4).all(|i| expected.get(i).copied().unwrap_or(1) == got.get(i).copied().unwrap_or(1))
}

impl<'a> Loader<'a> {
    pub(crate) fn find(
        &mut self,
        name: &str,
        dims: &[u64],
    ) -> Result<Option<Tensor<'a>>, ModelError> {
        let Some(t) = self.file.tensor(name) else {
            return Ok(None);
        };
        if !same_shape(dims, &t.dims) {
            return Err(ModelError::BadShape {
                name: name.to_owned(),
                expected: dims.to_vec(),
                got: t.dims.clone(),
            });
        }
        self.used.insert(t.name.as_str());
        Ok(Some(t))
    }

    pub(crate) fn req(&mut self, name: &str, dims: &[u64]) -> Result<Tensor<'a>, ModelError> {
        self.find(name, dims)?
            .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))
    }

    pub(crate) fn opt(
        &mut self,
        name: &str,
        dims: &[u64],
    ) -> Result<Option<Tensor<'a>>, ModelError> {
        self.find(name, dims)
    }

    pub(crate) fn exists(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }
}

/// How many unused tensor names an error lists.
const UNUSED_LISTED: usize = 8;

impl<'a> ModelTensors<'a> {
    /// Map every tensor of `file` to its role for the model described by `hp`.
    ///
    /// Fails on a missing required tensor, a shape that differs from what `hp` implies, a fused
    /// layout, or a tensor that no role uses.
    pub fn from_file(file: &'a GgufFile, hp: &HParams) -> Result<ModelTensors<'a>, ModelError> {
        let mut ld = Loader {
            file,
            used: HashSet::new(),
        };
        let arch = hp.arch;
        let def = arch.def();
        let n_embd = u64::from(hp.n_embd);
        let n_vocab = u64::from(hp.n_vocab);

        let token_embd = ld.req("token_embd.weight", &[n_embd, n_vocab])?;
        let output_norm = ld.req(def.output_norm_name(), &[n_embd])?;
        let (output, output_tied) = if def.output_required() {
            (ld.req("output.weight", &[n_embd, n_vocab])?, false)
        } else {
            match ld.opt("output.weight", &[n_embd, n_vocab])? {
                Some(t) => (t, false),
                None => (token_embd, true),
            }
        };
        let Globals {
            output_bias,
            rope_freqs,
        } = def.globals(&mut ld, hp)?;

        let mut layers = Vec::with_capacity(hp.n_layer as usize);
        for il in 0..hp.n_layer as usize {
            layers.push(def.layer(&mut ld, hp, il)?);
        }
        let mut nextn = Vec::new();
        for il in hp.n_layer as usize..hp.n_layer_all() as usize {
            if let Some(l) = nextn_layer(&mut ld, hp, il)? {
                nextn.push(l);
            }
        }

        let mut unused: Vec<String> = file
            .tensors()
            .iter()
            .filter(|t| !ld.used.contains(t.name.as_str()))
            .map(|t| t.name.clone())
            .collect();
        if !unused.is_empty() {
            let count = unused.len();
            unused.truncate(UNUSED_LISTED);
            return Err(ModelError::UnusedTensors {
                arch: arch.name(),
                count,
                names: unused,
            });
        }

        Ok(ModelTensors {
            token_embd,
            output_norm,
            output,
            output_tied,
            output_bias,
            rope_freqs,
            layers,
            nextn,
        })
    }
}

/// NextN layer `il`, when the file has it: as llama.cpp, where the architecture's rules allow
/// it a file whose first NextN layer has no `nextn.eh_proj` holds the trunk only (then none of
/// that layer's tensors may be present, which the unused-tensor check enforces).
fn nextn_layer<'a>(
    ld: &mut Loader<'a>,
    hp: &HParams,
    il: usize,
) -> Result<Option<NextNTensors<'a>>, ModelError> {
    let rules = hp.arch.def().nextn_rules();
    let probe = format!("blk.{}.nextn.eh_proj.weight", hp.n_layer);
    if rules.trunk_only && !ld.exists(&probe) {
        return Ok(None);
    }
    let n = |s: &str| format!("blk.{il}.{s}");
    let e = u64::from(hp.n_embd);
    let v = u64::from(hp.n_vocab);
    let block = hp.arch.def().layer(ld, hp, il)?;
    Ok(Some(NextNTensors {
        layer: il,
        block,
        eh_proj: ld.req(&n("nextn.eh_proj.weight"), &[2 * e, e])?,
        enorm: ld.req(&n("nextn.enorm.weight"), &[e])?,
        hnorm: ld.req(&n("nextn.hnorm.weight"), &[e])?,
        embed_tokens: ld.opt(&n("nextn.embed_tokens.weight"), &[e, v])?,
        shared_head_head: ld.opt(&n("nextn.shared_head_head.weight"), &[e, v])?,
        shared_head_norm: ld.opt(&n("nextn.shared_head_norm.weight"), &[e])?,
        out_norm: if rules.out_norm {
            Some(ld.req(&n("layer_output_norm.weight"), &[e])?)
        } else {
            None
        },
    }))
}
