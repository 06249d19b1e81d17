//! The validated hyperparameters of a model and what follows from them per layer.
//!
//! `hparams.rs` reads the keys every architecture has; each module of `arch/` reads its own
//! into the same [`HParams`].

use crate::arch::{Arch, ExpertGating, Features, QDim, SharedExperts};
use crate::error::ModelError;
use crate::kv::{Kv, invalid};
use crate::rope::Rope;

/// Most layers llama.cpp accepts.
pub const MAX_LAYERS: u32 = 512;
/// Most experts llama.cpp accepts.
pub const MAX_EXPERTS: u32 = 1024;

/// Key holding the token list (its length is the vocabulary size).
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
/// Key holding the architecture name.
pub const KEY_ARCH: &str = "general.architecture";

/// A value per layer (a scalar key is repeated for every layer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerLayer(pub(crate) Vec<u32>);

impl PerLayer {
    /// The value for layer `il` (0 for a layer out of range).
    pub fn at(&self, il: usize) -> u32 {
        self.0.get(il).copied().unwrap_or(0)
    }

    /// The largest value.
    pub fn max(&self) -> u32 {
        self.0.iter().copied().max().unwrap_or(0)
    }

    /// The value when every layer has the same one.
    pub fn uniform(&self) -> Option<u32> {
        let first = *self.0.first()?;
        self.0.iter().all(|&v| v == first).then_some(first)
    }

    /// All values, layer by layer.
    pub fn as_slice(&self) -> &[u32] {
        &self.0
    }

    /// Every layer's value set to `v`.
    pub fn set_all(&mut self, v: u32) {
        self.0.iter_mut().for_each(|x| *x = v);
    }
}

/// The dimensions of multi-head latent attention (deepseek2).
///
/// Each token's attention input is projected to one compressed row of `kv_lora_rank` values
/// (RMS-normalised) and `n_rot` rotated key values shared by every head. In the absorbed form
/// (`attn_k_b`/`attn_v_b`, llama.cpp's `is_mla`) that row and the rotated part are the one
/// key head of the cache ([`HParams::head_dim_k`] = `kv_lora_rank + n_rot`), the row alone its
/// value ([`HParams::head_dim_v`] = `kv_lora_rank`), and each query head is carried into the
/// compressed space by `attn_k_b`; the attention output goes back to `head_dim_v` values per
/// head through `attn_v_b`. In the legacy form (`attn_kv_b`) the row is expanded into ordinary
/// keys and values of `head_dim_k` / `head_dim_v` per head.
#[derive(Debug, Clone, PartialEq)]
pub struct Mla {
    /// `attention.q_lora_rank`: rank of the low-rank query (`attn_q_a`, its norm, `attn_q_b`);
    /// 0 when the query is one projection `attn_q` (DeepSeek-V2-Lite's layout).
    pub q_lora_rank: u32,
    /// `attention.kv_lora_rank`: width of the compressed key/value row.
    pub kv_lora_rank: u32,
    /// Query/key head size of the model (`attention.key_length_mla`; `key_length` in legacy
    /// files): `head_dim_k - n_rot` plain values, then `n_rot` rotated ones.
    pub head_dim_k: u32,
    /// Value head size of the model (`attention.value_length_mla`; `value_length` in legacy
    /// files).
    pub head_dim_v: u32,
    /// True for the absorbed form (`attn_k_b`/`attn_v_b`; the file has the `*_length_mla`
    /// keys), false for the legacy `attn_kv_b`.
    pub absorbed: bool,
}

impl Mla {
    /// The plain (not rotated) part of a query/key head.
    pub fn head_dim_nope(&self, n_rot: u32) -> u32 {
        self.head_dim_k - n_rot
    }
}

/// The sizes of the Gated DeltaNet (linear attention) layers of a hybrid stack (qwen35moe), as
/// llama.cpp reads them from the `ssm.*` keys.
/// Attention temperature tuning (llama4's NoPE layers): the queries of the token at position
/// `p` are multiplied by `ln(floor((p + offset) / floor_scale) + 1) · scale + 1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnTemp {
    /// Positions per step of the factor (llama.cpp's `n_attn_temp_floor_scale`, > 0).
    pub floor_scale: u32,
    /// `f_attn_temp_scale`.
    pub scale: f32,
    /// `f_attn_temp_offset`: added to the position first.
    pub offset: f32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ssm {
    /// Width of the causal convolution (`ssm.conv_kernel`).
    pub d_conv: u32,
    /// Key and value head size (`ssm.state_size`).
    pub d_state: u32,
    /// Key heads (`ssm.group_count`).
    pub n_k_heads: u32,
    /// Value heads (`ssm.time_step_rank`); a multiple of the key heads.
    pub n_v_heads: u32,
}

impl Ssm {
    /// Values of all key heads (of the queries, likewise).
    pub fn key_dim(&self) -> u32 {
        self.d_state * self.n_k_heads
    }

    /// Values of all value heads (`ssm.inner_size`).
    pub fn value_dim(&self) -> u32 {
        self.d_state * self.n_v_heads
    }

    /// Channels of the convolution: queries, keys and values.
    pub fn conv_channels(&self) -> u32 {
        2 * self.key_dim() + self.value_dim()
    }

    /// Floats of a layer's convolution state: the last `d_conv - 1` inputs of every channel.
    pub fn conv_state_len(&self) -> usize {
        (self.d_conv as usize - 1) * self.conv_channels() as usize
    }

    /// Floats of a layer's recurrent state: one `d_state` x `d_state` matrix per value head.
    pub fn state_len(&self) -> usize {
        let d = self.d_state as usize;
        d * d * self.n_v_heads as usize
    }
}

/// The sizes of a Mamba-2 mixer (nemotron_h_moe's recurrent layers): `ssm.conv_kernel`,
/// `ssm.inner_size`, `ssm.state_size`, `ssm.time_step_rank` (its heads) and
/// `ssm.group_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mamba2 {
    /// Width of the causal convolution.
    pub d_conv: u32,
    /// Channels of the scan's input x and of its output (`n_head` heads of
    /// `d_inner / n_head`).
    pub d_inner: u32,
    /// Size of each channel's state, and of each group's B and C.
    pub d_state: u32,
    /// Heads: each has one decay `A`, one skip `D` and one time step.
    pub n_head: u32,
    /// Groups of heads sharing a B and a C (and of the output's norm).
    pub n_group: u32,
}

impl Mamba2 {
    /// Values of one head.
    pub fn head_dim(&self) -> u32 {
        self.d_inner / self.n_head
    }

    /// Channels of the convolution: x, then every group's B, then every group's C.
    pub fn conv_channels(&self) -> u32 {
        self.d_inner + 2 * self.n_group * self.d_state
    }

    /// Rows of `ssm_in`: the gate z, the convolution's channels, the heads' time steps.
    pub fn in_proj_rows(&self) -> u32 {
        self.d_inner + self.conv_channels() + self.n_head
    }

    /// Floats of a layer's convolution state: the last `d_conv - 1` inputs of every channel.
    pub fn conv_state_len(&self) -> usize {
        (self.d_conv as usize - 1) * self.conv_channels() as usize
    }

    /// Floats of a layer's scan state: `d_state` per channel of x.
    pub fn state_len(&self) -> usize {
        self.d_state as usize * self.d_inner as usize
    }
}

/// Validated hyperparameters of a model.
///
/// Per-arch rules that are not stored in the file (rope pairing, QK-norm kind, router rule,
/// shared expert) are resolved here too, in [`HParams::features`], so that the forward pass
/// never asks which arch it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct HParams {
    /// The architecture (its name, for messages).
    pub arch: Arch,
    /// The graph rules the architecture switches on.
    pub features: Features,
    /// Vocabulary size: length of `tokenizer.ggml.tokens`, else `{arch}.vocab_size`.
    pub n_vocab: u32,
    /// `context_length`.
    pub n_ctx_train: u32,
    /// `embedding_length`.
    pub n_embd: u32,
    /// Layers the model runs: `block_count` less the NextN layers.
    pub n_layer: u32,
    /// `nextn_predict_layers`: NextN (multi-token prediction) layers stored after the trunk's,
    /// counted in `block_count`, never run by decoding (default 0).
    pub n_layer_nextn: u32,
    /// `feed_forward_length` per layer (0 when absent): width of dense FFNs (and of the
    /// experts for olmoe and llama).
    pub n_ff: PerLayer,
    /// Width of one routed expert per layer, resolved per arch (0 for dense layers).
    pub n_ff_exp: PerLayer,
    /// Width of the shared expert (qwen2moe: `expert_shared_feed_forward_length`, default n_ff;
    /// glm4moe: `expert_shared_count` × the first MoE layer's expert width; bailingmoe2:
    /// `expert_shared_count` × `expert_shared_feed_forward_length`, or the expert width where
    /// that is 0 or absent; see [`HParams::n_ff_shexp_at`]).
    pub n_ff_shexp: u32,
    /// `attention.head_count` per layer.
    pub n_head: PerLayer,
    /// `attention.head_count_kv` per layer (default n_head).
    pub n_head_kv: PerLayer,
    /// `attention.key_length` (default n_embd / n_head).
    pub head_dim_k: u32,
    /// `attention.value_length` (default n_embd / n_head).
    pub head_dim_v: u32,
    /// `attention.layer_norm_rms_epsilon` (required).
    pub rms_eps: f32,
    /// Rotary embedding.
    pub rope: Rope,
    /// `expert_count` (0: dense).
    pub n_expert: u32,
    /// `expert_used_count` per layer (top-k).
    pub n_expert_used: PerLayer,
    /// `expert_group_count` (0 or 1: no grouped routing).
    pub n_expert_groups: u32,
    /// `expert_group_used_count`.
    pub n_group_used: u32,
    /// Renormalise the top-k weights to sum 1 (`expert_weights_norm`, default per arch).
    pub expert_weights_norm: bool,
    /// Multiply the routing weights by this when it is neither 0 nor 1
    /// (`expert_weights_scale`, default 0).
    pub expert_weights_scale: f32,
    /// Number of shared (always-on) experts: 1 for qwen2moe, `expert_shared_count` for
    /// glm4moe, else 0.
    pub n_expert_shared: u32,
    /// How router logits become expert weights (`expert_gating_func` where the arch reads
    /// it, else fixed per arch).
    pub expert_gating: ExpertGating,
    /// `leading_dense_block_count`: the first layers use a dense FFN (default 0).
    pub n_layer_dense_lead: u32,
    /// `attention.sliding_window` (gpt-oss): a sliding-window layer's token at position `p`
    /// sees the keys at positions `p - n_swa + 1 ..= p`. 0: no sliding window.
    pub n_swa: u32,
    /// Per layer: true when the layer attends through the sliding window
    /// (`attention.sliding_window_pattern`, an array of bools or a period; llama.cpp's
    /// per-arch default otherwise). All false when `n_swa` is 0.
    pub swa_layers: Vec<bool>,
    /// Per layer: true when the layer's attention has no rotary embedding (NoPE: SmallThinker's
    /// full-attention layers); empty or false: rope as [`HParams::rope`] says.
    pub nope_layers: Vec<bool>,
    /// `interleave_moe_layer_step` (llama4): of the layers past the leading dense ones, only
    /// those with `(il + 1) % step == 0` have experts; 0: all of them.
    pub moe_layer_step: u32,
    /// Attention temperature tuning of the NoPE layers (llama4), else `None`.
    pub attn_temp: Option<AttnTemp>,
    /// True when the rope layers' queries and keys are RMS-normalised per head without
    /// weights after the rope, with `rms_eps` (llama4's `use_kq_norm`, its L2 norm).
    pub qk_norm_plain_rope: bool,
    /// Multi-head latent attention (deepseek2), else `None`.
    pub mla: Option<Mla>,
    /// Key and value head sizes of the sliding-window layers (`attention.key_length_swa` /
    /// `value_length_swa`, gemma4; else `head_dim_k` / `head_dim_v`).
    pub head_dim_k_swa: u32,
    /// See [`HParams::head_dim_k_swa`].
    pub head_dim_v_swa: u32,
    /// `final_logit_softcapping` (gemma4): logits become `cap · tanh(logit / cap)`; 0: none.
    pub logit_softcap: f32,
    /// Linear-attention sizes of a hybrid stack (qwen35moe).
    pub ssm: Option<Ssm>,
    /// Per stored layer: true for a linear-attention (recurrent) layer.
    pub recurrent: Vec<bool>,
    /// `shortconv.l_cache` (LFM2): the width of the short convolution of the recurrent
    /// layers, whose state per sequence is the last `l_cache - 1` gated inputs of each of the
    /// `n_embd` channels; 0 where the model has no short-convolution layers.
    pub shortconv_l_cache: u32,
    /// Mamba-2 sizes of a hybrid stack whose recurrent layers are Mamba-2 mixers
    /// (nemotron_h_moe), else `None`.
    pub mamba2: Option<Mamba2>,
    /// Per stored layer: true for a layer that is its FFN alone, with no attention or other
    /// mixer before it (nemotron_h_moe's MoE layers); empty or false: a mixer runs first.
    pub no_mixer: Vec<bool>,
    /// Per stored layer: true for a layer that is its mixer alone, with no FFN after it
    /// (nemotron_h_moe's attention and Mamba-2 layers); empty or false: an FFN follows.
    pub no_ffn: Vec<bool>,
    /// `moe_latent_size` (Nemotron 3 Super): the routed experts read and write vectors of this
    /// width, projected down from `n_embd` (`ffn_latent_down`) before them and back up
    /// (`ffn_latent_up`) after; 0: the experts work in `n_embd`.
    pub moe_latent: u32,
    /// A factor the token embeddings are multiplied by before the first layer (gemma4:
    /// sqrt(n_embd)); `None`: none.
    pub embd_scale: Option<f32>,
    /// The attention scale when the architecture fixes it instead of 1/sqrt(head_dim)
    /// (gemma4: 1, the q/k norms take its place; granitemoe: `attention.scale`); `None`: see
    /// [`HParams::attn_scale`].
    pub attn_scale_fixed: Option<f32>,
    /// A factor the attention's and the FFN's outputs are multiplied by before each residual
    /// add (granitemoe's `residual_scale`); `None`: none.
    pub residual_scale: Option<f32>,
    /// A factor the logits are multiplied by (granitemoe: `1 / logit_scale`, as llama.cpp
    /// computes it in f32); `None`: none.
    pub logit_scale: Option<f32>,
}

impl HParams {
    /// True when layer `il` attends through the sliding window of `n_swa` positions.
    pub fn is_swa_layer(&self, il: usize) -> bool {
        self.n_swa > 0 && self.swa_layers.get(il).copied().unwrap_or(false)
    }

    /// True when layer `il` rotates its queries and keys (not a NoPE layer).
    pub fn has_rope(&self, il: usize) -> bool {
        !self.nope_layers.get(il).copied().unwrap_or(false)
    }

    /// True when layer `il` is a linear-attention layer with a recurrent state (no KV cells).
    pub fn is_recurrent(&self, il: usize) -> bool {
        self.recurrent.get(il).copied().unwrap_or(false)
    }

    /// The floats of recurrent layer `il`'s state per sequence: its convolution's last inputs
    /// and its recurrent matrices (`None` for a layer with KV cells).
    pub fn recurrent_state_lens(&self, il: usize) -> Option<(usize, usize)> {
        if !self.is_recurrent(il) {
            return None;
        }
        if self.shortconv_l_cache > 0 {
            let k = self.shortconv_l_cache as usize - 1;
            return Some((k * self.n_embd as usize, 0));
        }
        if let Some(m) = &self.mamba2 {
            return Some((m.conv_state_len(), m.state_len()));
        }
        let m = self.ssm.as_ref()?;
        Some((m.conv_state_len(), m.state_len()))
    }

    /// True when layer `il` has no mixer: its block is the FFN alone.
    pub fn has_no_mixer(&self, il: usize) -> bool {
        self.no_mixer.get(il).copied().unwrap_or(false)
    }

    /// True when layer `il` has no FFN: its block is the mixer alone.
    pub fn has_no_ffn(&self, il: usize) -> bool {
        self.no_ffn.get(il).copied().unwrap_or(false)
    }

    /// Width of the vectors the routed experts read and write: `moe_latent_size` where the
    /// model projects into a latent space for them, else `n_embd`.
    pub fn n_embd_moe(&self) -> u32 {
        if self.moe_latent > 0 {
            self.moe_latent
        } else {
            self.n_embd
        }
    }

    /// True when layer `il` has a routed-expert FFN.
    pub fn is_moe_layer(&self, il: usize) -> bool {
        il < self.n_layer as usize && self.stored_layer_has_experts(il)
    }

    /// `block_count`: the trunk's layers and the NextN layers after them.
    pub fn n_layer_all(&self) -> u32 {
        self.n_layer + self.n_layer_nextn
    }

    /// True when stored layer `il` (of [`HParams::n_layer_all`]) has a routed-expert FFN: the
    /// trunk's MoE layers and the NextN layers past the leading dense ones.
    pub fn stored_layer_has_experts(&self, il: usize) -> bool {
        self.n_expert > 0
            && !self.has_no_ffn(il)
            && il >= self.n_layer_dense_lead as usize
            && il < self.n_layer_all() as usize
            && (self.moe_layer_step == 0 || (il + 1).is_multiple_of(self.moe_layer_step as usize))
    }

    /// Width of layer `il`'s shared expert (0 without one).
    pub fn n_ff_shexp_at(&self, il: usize) -> u32 {
        match self.features.shared_experts {
            SharedExperts::None => 0,
            SharedExperts::Gated | SharedExperts::CountedKeyed | SharedExperts::Keyed => {
                self.n_ff_shexp
            }
            SharedExperts::Counted => self.n_ff_exp.at(il) * self.n_expert_shared,
            SharedExperts::One => self.n_ff_exp.at(il),
        }
    }

    /// Number of MoE layers.
    pub fn n_moe_layers(&self) -> u32 {
        (0..self.n_layer as usize)
            .filter(|&il| self.is_moe_layer(il))
            .count() as u32
    }

    /// Key head size of layer `il` (the sliding-window layers' own in gemma4).
    pub fn head_dim_k_at(&self, il: usize) -> u32 {
        if self.is_swa_layer(il) {
            self.head_dim_k_swa
        } else {
            self.head_dim_k
        }
    }

    /// Value head size of layer `il`.
    pub fn head_dim_v_at(&self, il: usize) -> u32 {
        if self.is_swa_layer(il) {
            self.head_dim_v_swa
        } else {
            self.head_dim_v
        }
    }

    /// Rotated elements per head in layer `il`.
    pub fn n_rot_at(&self, il: usize) -> u32 {
        if self.is_swa_layer(il) {
            self.rope.n_rot_swa
        } else {
            self.rope.n_rot
        }
    }

    /// Rows of the q projection (and columns of attn_output) in layer `il`; with MLA, the
    /// rows of the q projection (`attn_q_b` or `attn_q`).
    pub fn n_embd_q(&self, il: usize) -> u32 {
        if let Some(m) = &self.mla {
            return m.head_dim_k * self.n_head.at(il);
        }
        match self.features.q_dim {
            // queries and their output gate, interleaved per head
            QDim::HeadDimTimesHeads if self.features.gated_q => {
                2 * self.head_dim_k_at(il) * self.n_head.at(il)
            }
            QDim::HeadDimTimesHeads => self.head_dim_k_at(il) * self.n_head.at(il),
            QDim::Embd => self.n_embd,
        }
    }

    /// Rows of the k projection in layer `il`.
    pub fn n_embd_k_gqa(&self, il: usize) -> u32 {
        self.head_dim_k_at(il) * self.n_head_kv.at(il)
    }

    /// Rows of the v projection in layer `il`.
    pub fn n_embd_v_gqa(&self, il: usize) -> u32 {
        self.head_dim_v_at(il) * self.n_head_kv.at(il)
    }

    /// Values the KV cache holds per token in layer `il`: keys and values, or the keys alone
    /// in MLA's absorbed form, whose value is the start of its key.
    pub fn kv_values_per_token(&self, il: usize) -> u32 {
        if self.is_recurrent(il) {
            return 0;
        }
        if self.mla.as_ref().is_some_and(|m| m.absorbed) {
            self.n_embd_k_gqa(il)
        } else {
            self.n_embd_k_gqa(il) + self.n_embd_v_gqa(il)
        }
    }

    /// Columns of `attn_output` in layer `il`.
    pub fn n_embd_out(&self, il: usize) -> u32 {
        if self.shortconv_l_cache > 0 && self.is_recurrent(il) {
            return self.n_embd;
        }
        if let Some(m) = self.mamba2.as_ref().filter(|_| self.is_recurrent(il)) {
            return m.d_inner;
        }
        if let Some(ssm) = self.ssm.as_ref().filter(|_| self.is_recurrent(il)) {
            return ssm.value_dim();
        }
        match &self.mla {
            Some(m) => m.head_dim_v * self.n_head.at(il),
            None if self.features.gated_q => self.head_dim_v_at(il) * self.n_head.at(il),
            None => self.n_embd_q(il),
        }
    }

    /// The attention scale: 1/sqrt(head_dim); with MLA, llama.cpp's deepseek2 scale
    /// `mscale² / sqrt(head_dim_k of the model)`, where `mscale` carries the YaRN magnitude
    /// correction (`1 + 0.1 · yarn_log_mul · ln(factor)` over the original attention factor).
    pub fn attn_scale(&self) -> f32 {
        if let Some(scale) = self.attn_scale_fixed {
            return scale;
        }
        match &self.mla {
            None => 1.0 / (self.head_dim_k as f32).sqrt(),
            Some(m) => {
                let r = &self.rope;
                let ln = (1.0f32 / r.freq_scale).ln();
                let attn_factor_org = r.mscale() * (1.0 + 0.1 * ln);
                let mscale = attn_factor_org * (1.0 + 0.1 * r.yarn_log_mul * ln);
                mscale * mscale / (m.head_dim_k as f32).sqrt()
            }
        }
    }

    /// What the head sizes must satisfy once the architecture has read its own keys (MLA's
    /// head sizes are its own: it checks them).
    pub(crate) fn check_heads(&self, kv: &Kv<'_>) -> Result<(), ModelError> {
        let hp = self;
        let k = |s: &str| kv.key(s);
        let (arch, head_dim_k, head_dim_v) = (hp.arch, hp.head_dim_k, hp.head_dim_v);
        if hp.mla.is_none() && head_dim_v != head_dim_k {
            return Err(invalid(
                k("attention.value_length"),
                format!("value head size {head_dim_v} differs from key head size {head_dim_k}"),
            ));
        }
        for &h in hp.n_head.as_slice() {
            if head_dim_k.checked_mul(h).is_none() {
                return Err(invalid(
                    k("attention.key_length"),
                    format!("head size {head_dim_k} x {h} heads overflows 32 bits"),
                ));
            }
            if hp.features.q_dim == QDim::Embd && head_dim_k * h != hp.n_embd {
                return Err(invalid(
                    k("attention.key_length"),
                    format!(
                        "{arch} needs heads x head size = n_embd, got {h} x {head_dim_k} != {}",
                        hp.n_embd
                    ),
                ));
            }
        }
        let n_rot = hp.rope.n_rot;
        if hp.mla.is_some() {
            return Ok(());
        }
        if hp.features.partial_rope {
            if n_rot == 0 || !n_rot.is_multiple_of(2) || n_rot > head_dim_k {
                return Err(invalid(
                    k("rope.dimension_count"),
                    format!("{n_rot} rotated dimensions; must be even and in 2..={head_dim_k}"),
                ));
            }
        } else if n_rot != head_dim_k {
            return Err(invalid(
                k("rope.dimension_count"),
                format!("{n_rot} rotated dimensions; {arch} rotates the whole head ({head_dim_k})"),
            ));
        }
        Ok(())
    }
}
