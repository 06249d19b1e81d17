//! Hyperparameters read from `{arch}.*` metadata keys, with llama.cpp's defaults and checks.

use gguf::{ArrayValue, Metadata, Value};

use crate::arch::{Arch, ExpertGating, QDim, QkNorm, RopeType, SharedExperts};
use crate::error::ModelError;

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
pub struct PerLayer(Vec<u32>);

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

/// RoPE frequency scaling as stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeScalingType {
    /// No scaling: the frequency scale is forced to 1.
    None,
    /// Linear position interpolation (llama.cpp's default when the key is absent).
    Linear,
    /// YaRN.
    Yarn,
}

/// Rotary embedding parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    /// Pairing of the rotated elements (fixed per arch).
    pub ty: RopeType,
    /// `rope.freq_base` (default 10000).
    pub freq_base: f32,
    /// `rope.dimension_count`: rotated elements per head (default head_dim_k).
    pub n_rot: u32,
    /// `rope.scaling.type` (default linear).
    pub scaling: RopeScalingType,
    /// `rope.scaling.factor` (or the older `rope.scale_linear`); 0 when absent.
    pub scaling_factor: f32,
    /// Frequency scale applied to positions: 1/factor, or 1 when the factor is 0 or the type is none.
    pub freq_scale: f32,
    /// `rope.scaling.original_context_length` (default context_length).
    pub n_ctx_orig: u32,
    /// `rope.scaling.attn_factor` (default 1).
    pub attn_factor: f32,
    /// `rope.scaling.yarn_ext_factor`; when absent 1 for YaRN, else 0.
    pub yarn_ext_factor: f32,
    /// `rope.scaling.yarn_attn_factor` (default 1; replaced as llama.cpp does when ext_factor != 0,
    /// see [`Rope::mscale`]).
    pub yarn_attn_factor: f32,
    /// `rope.scaling.yarn_beta_fast` (default 32).
    pub yarn_beta_fast: f32,
    /// `rope.scaling.yarn_beta_slow` (default 1).
    pub yarn_beta_slow: f32,
    /// `rope.scaling.finetuned` (default false; informational).
    pub finetuned: bool,
    /// Rotated elements per head in sliding-window layers (`rope.dimension_count_swa`,
    /// gemma4; else `n_rot`).
    pub n_rot_swa: u32,
    /// Rope base of sliding-window layers (`rope.freq_base_swa`; gemma4: 10000 when absent,
    /// as llama.cpp; else `freq_base`).
    pub freq_base_swa: f32,
    /// deepseek2: `rope.scaling.yarn_log_multiplier` / 0.1 (llama.cpp undoes the converter's
    /// factor of 0.1); 0 when absent and for the other archs, which do not read it.
    pub yarn_log_mul: f32,
    /// IMRoPE's sections (`rope.dimension_sections`, rotated pairs per position stream), all
    /// zero where the arch has none.
    pub sections: [u32; 4],
}

impl Rope {
    /// The magnitude factor handed to the rope kernel (ggml's `attn_factor` argument), as
    /// llama.cpp's context computes it. When `yarn_ext_factor != 0` the kernel itself further
    /// multiplies by `1 + 0.1 ln(1/freq_scale)`.
    ///
    /// With a YaRN log multiplier (deepseek2), llama.cpp's ratio of two equal magnitude factors
    /// is exactly 1, so the base is 1 before the kernel's factor is cancelled.
    pub fn mscale(&self) -> f32 {
        let mut base = self.yarn_attn_factor;
        if self.yarn_ext_factor != 0.0 {
            let factor = 1.0 / self.freq_scale;
            base = if self.yarn_log_mul != 0.0 || factor <= 1.0 {
                1.0
            } else {
                0.1 * factor.ln() + 1.0
            };
            // llama.cpp multiplies by the reciprocal (not the same bits as a division)
            base *= 1.0 / (1.0 + 0.1 * factor.ln());
        }
        base * self.attn_factor
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

/// Validated hyperparameters of a model.
///
/// Per-arch rules that are not stored in the file (rope pairing, QK-norm kind, router rule,
/// shared expert) are resolved here too, so that the forward pass never asks which arch it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct HParams {
    /// The architecture.
    pub arch: Arch,
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
    /// glm4moe: `expert_shared_count` × the first MoE layer's expert width; see
    /// [`HParams::n_ff_shexp_at`]).
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
    /// QK-norm kind (fixed per arch).
    pub qk_norm: QkNorm,
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
}

impl HParams {
    /// True when layer `il` attends through the sliding window of `n_swa` positions.
    pub fn is_swa_layer(&self, il: usize) -> bool {
        self.n_swa > 0 && self.swa_layers.get(il).copied().unwrap_or(false)
    }

    /// True when layer `il` is a linear-attention layer with a recurrent state (no KV cells).
    pub fn is_recurrent(&self, il: usize) -> bool {
        self.recurrent.get(il).copied().unwrap_or(false)
    }

    /// True when layer `il` has a routed-expert FFN.
    pub fn is_moe_layer(&self, il: usize) -> bool {
        self.n_expert > 0 && il >= self.n_layer_dense_lead as usize && il < self.n_layer as usize
    }

    /// `block_count`: the trunk's layers and the NextN layers after them.
    pub fn n_layer_all(&self) -> u32 {
        self.n_layer + self.n_layer_nextn
    }

    /// True when stored layer `il` (of [`HParams::n_layer_all`]) has a routed-expert FFN: the
    /// trunk's MoE layers and the NextN layers past the leading dense ones.
    pub fn stored_layer_has_experts(&self, il: usize) -> bool {
        self.n_expert > 0
            && il >= self.n_layer_dense_lead as usize
            && il < self.n_layer_all() as usize
    }

    /// Width of layer `il`'s shared expert (0 without one).
    pub fn n_ff_shexp_at(&self, il: usize) -> u32 {
        match self.arch.shared_experts() {
            SharedExperts::None => 0,
            SharedExperts::Gated => self.n_ff_shexp,
            SharedExperts::Counted => self.n_ff_exp.at(il) * self.n_expert_shared,
        }
    }

    /// Number of MoE layers.
    pub fn n_moe_layers(&self) -> u32 {
        if self.n_expert == 0 {
            0
        } else {
            self.n_layer - self.n_layer_dense_lead
        }
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
        match self.arch.q_dim() {
            // queries and their output gate, interleaved per head
            QDim::HeadDimTimesHeads if self.arch.gated_q() => {
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
        if let Some(ssm) = self.ssm.as_ref().filter(|_| self.is_recurrent(il)) {
            return ssm.value_dim();
        }
        match &self.mla {
            Some(m) => m.head_dim_v * self.n_head.at(il),
            None if self.arch.gated_q() => self.head_dim_v_at(il) * self.n_head.at(il),
            None => self.n_embd_q(il),
        }
    }

    /// The attention scale: 1/sqrt(head_dim); with MLA, llama.cpp's deepseek2 scale
    /// `mscale² / sqrt(head_dim_k of the model)`, where `mscale` carries the YaRN magnitude
    /// correction (`1 + 0.1 · yarn_log_mul · ln(factor)` over the original attention factor).
    pub fn attn_scale(&self) -> f32 {
        if self.arch.is_gemma4() {
            // llama.cpp's f_attention_scale for Gemma 4 (the q/k norms take its place)
            return 1.0;
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

    /// Read and validate the hyperparameters of `arch` from `md`.
    pub fn from_metadata(arch: Arch, md: &Metadata) -> Result<HParams, ModelError> {
        read(arch, md)
    }
}

struct Kv<'m> {
    md: &'m Metadata,
    prefix: &'static str,
}

fn value_type_name(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("array of {}", a.elem_type()),
        v => v.value_type().to_string(),
    }
}

fn int_to_u32(key: &str, v: &Value) -> Result<u32, ModelError> {
    let n = v.as_u64().ok_or_else(|| ModelError::KeyType {
        key: key.to_owned(),
        expected: "unsigned integer",
        found: value_type_name(v),
    })?;
    u32::try_from(n).map_err(|_| ModelError::InvalidValue {
        key: key.to_owned(),
        reason: format!("{n} does not fit in 32 bits"),
    })
}

impl Kv<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }

    fn u32(&self, key: &str) -> Result<Option<u32>, ModelError> {
        match self.md.get(key) {
            None => Ok(None),
            Some(v) => int_to_u32(key, v).map(Some),
        }
    }

    fn u32_req(&self, key: &str) -> Result<u32, ModelError> {
        self.u32(key)?
            .ok_or_else(|| ModelError::MissingKey(key.to_owned()))
    }

    fn f32(&self, key: &str) -> Result<Option<f32>, ModelError> {
        match self.md.get(key) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(*v)),
            Some(Value::F64(v)) => Ok(Some(*v as f32)),
            Some(v) => Err(ModelError::KeyType {
                key: key.to_owned(),
                expected: "float",
                found: value_type_name(v),
            }),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        match self.md.get(key) {
            None => Ok(None),
            Some(Value::Bool(v)) => Ok(Some(*v)),
            Some(v) => Err(ModelError::KeyType {
                key: key.to_owned(),
                expected: "bool",
                found: value_type_name(v),
            }),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&str>, ModelError> {
        match self.md.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ModelError::KeyType {
                key: key.to_owned(),
                expected: "string",
                found: value_type_name(v),
            }),
        }
    }

    /// A scalar repeated per layer, or an array of exactly `n_layer` integers.
    fn per_layer(&self, key: &str, n_layer: u32) -> Result<Option<PerLayer>, ModelError> {
        let n = n_layer as usize;
        match self.md.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => {
                if a.len() != n {
                    return Err(ModelError::ArrayLength {
                        key: key.to_owned(),
                        expected: n,
                        found: a.len(),
                    });
                }
                let bad = || ModelError::KeyType {
                    key: key.to_owned(),
                    expected: "unsigned integer or array of integers",
                    found: format!("array of {}", a.elem_type()),
                };
                if matches!(
                    a,
                    ArrayValue::F32(_)
                        | ArrayValue::F64(_)
                        | ArrayValue::Bool(_)
                        | ArrayValue::String(_)
                        | ArrayValue::Array(_)
                ) {
                    return Err(bad());
                }
                let mut out = Vec::with_capacity(n);
                for i in 0..n {
                    let v = a.get(i).ok_or_else(bad)?;
                    out.push(int_to_u32(key, &v)?);
                }
                Ok(Some(PerLayer(out)))
            }
            Some(_) => Ok(self.u32(key)?.map(|v| PerLayer(vec![v; n]))),
        }
    }
}

fn invalid(key: String, reason: impl Into<String>) -> ModelError {
    ModelError::InvalidValue {
        key,
        reason: reason.into(),
    }
}

fn read(arch: Arch, md: &Metadata) -> Result<HParams, ModelError> {
    let kv = Kv {
        md,
        prefix: arch.name(),
    };
    let k = |s: &str| kv.key(s);

    // Vocabulary: the token list wins, as in llama.cpp; `vocab_size` covers files without one.
    let n_vocab = match md.get(KEY_TOKENS) {
        Some(Value::Array(a)) => u32::try_from(a.len())
            .map_err(|_| invalid(KEY_TOKENS.to_owned(), "more than 2^32 tokens"))?,
        Some(v) => {
            return Err(ModelError::KeyType {
                key: KEY_TOKENS.to_owned(),
                expected: "array of strings",
                found: value_type_name(v),
            });
        }
        None => kv.u32(&k("vocab_size"))?.ok_or_else(|| {
            ModelError::MissingKey(format!("{KEY_TOKENS} (or {})", k("vocab_size")))
        })?,
    };
    if n_vocab == 0 {
        return Err(invalid(k("vocab_size"), "the vocabulary is empty"));
    }

    let n_ctx_train = kv.u32_req(&k("context_length"))?;
    let n_embd = kv.u32_req(&k("embedding_length"))?;
    if n_embd == 0 {
        return Err(invalid(k("embedding_length"), "must be > 0"));
    }
    let n_layer_all = kv.u32_req(&k("block_count"))?;
    if n_layer_all == 0 || n_layer_all > MAX_LAYERS {
        return Err(invalid(
            k("block_count"),
            format!("{n_layer_all} layers; must be in 1..={MAX_LAYERS}"),
        ));
    }
    let nextn_key = k("nextn_predict_layers");
    let n_layer_nextn = if arch.has_nextn() {
        kv.u32(&nextn_key)?.unwrap_or(0)
    } else {
        0
    };
    if n_layer_nextn >= n_layer_all {
        return Err(invalid(
            nextn_key,
            format!("{n_layer_nextn} NextN layers leave none of the {n_layer_all} layers to run"),
        ));
    }
    let n_layer = n_layer_all - n_layer_nextn;
    // Per-layer arrays cover every stored layer.
    let nl = n_layer_all as usize;

    // Experts.
    let n_expert = kv.u32(&k("expert_count"))?.unwrap_or(0);
    let n_expert_used = kv
        .per_layer(&k("expert_used_count"), n_layer_all)?
        .unwrap_or(PerLayer(vec![0; nl]));
    let n_expert_groups = kv.u32(&k("expert_group_count"))?.unwrap_or(0);
    let n_group_used = kv.u32(&k("expert_group_used_count"))?.unwrap_or(0);
    if n_expert > MAX_EXPERTS {
        return Err(invalid(
            k("expert_count"),
            format!("{n_expert} experts; at most {MAX_EXPERTS} are supported"),
        ));
    }
    if n_expert > 0 && !arch.allows_experts() {
        return Err(invalid(
            k("expert_count"),
            format!("{arch} is a dense architecture; {n_expert} experts are not supported"),
        ));
    }

    if n_expert == 0 && arch.requires_experts() {
        return match md.get(&k("expert_count")) {
            None => Err(ModelError::MissingKey(k("expert_count"))),
            Some(_) => Err(invalid(
                k("expert_count"),
                format!("must be > 0 for {arch}"),
            )),
        };
    }
    let used_max = n_expert_used.max();
    if used_max > n_expert {
        return Err(invalid(
            k("expert_used_count"),
            format!("{used_max} experts used per token but only {n_expert} exist"),
        ));
    }
    if n_expert > 0 {
        if n_expert_used.as_slice().contains(&0) {
            return Err(invalid(
                k("expert_used_count"),
                format!("must be > 0 in every layer when expert_count is {n_expert}"),
            ));
        }
        if n_expert_groups >= n_expert {
            return Err(invalid(
                k("expert_group_count"),
                format!("{n_expert_groups} groups must be fewer than the {n_expert} experts"),
            ));
        }
        if n_expert_groups > 1 {
            if !n_expert.is_multiple_of(n_expert_groups) {
                return Err(invalid(
                    k("expert_group_count"),
                    format!("{n_expert} experts do not split into {n_expert_groups} groups"),
                ));
            }
            if n_expert / n_expert_groups < 2 {
                return Err(invalid(
                    k("expert_group_count"),
                    format!(
                        "{n_expert_groups} groups of {n_expert} experts leave fewer than 2 in a group"
                    ),
                ));
            }
            if n_group_used == 0 || n_group_used >= n_expert_groups {
                return Err(invalid(
                    k("expert_group_used_count"),
                    format!("{n_group_used} must be in 1..{n_expert_groups}"),
                ));
            }
        }
    } else {
        if used_max != 0 {
            return Err(invalid(
                k("expert_used_count"),
                format!("{used_max} experts used per token but expert_count is 0"),
            ));
        }
        if n_expert_groups != 0 {
            return Err(invalid(
                k("expert_group_count"),
                "expert groups without experts (expert_count is 0)",
            ));
        }
    }
    // Feed-forward widths.
    let n_ff = kv
        .per_layer(&k("feed_forward_length"), n_layer_all)?
        .unwrap_or(PerLayer(vec![0; nl]));

    // Leading dense blocks (an extension for these archs; llama.cpp reads it for others).
    let n_layer_dense_lead = kv.u32(&k("leading_dense_block_count"))?.unwrap_or(0);
    if n_layer_dense_lead > n_layer {
        return Err(invalid(
            k("leading_dense_block_count"),
            format!("{n_layer_dense_lead} dense layers but only {n_layer} layers"),
        ));
    }
    let is_moe = |il: usize| n_expert > 0 && il >= n_layer_dense_lead as usize;

    for il in 0..nl {
        // gemma4 has its dense MLP next to the experts
        if (!is_moe(il) || arch.is_gemma4()) && n_ff.at(il) == 0 {
            return Err(match md.get(&k("feed_forward_length")) {
                None => ModelError::MissingKey(k("feed_forward_length")),
                Some(_) => invalid(
                    k("feed_forward_length"),
                    format!("layer {il} has a dense FFN of width 0"),
                ),
            });
        }
    }

    let n_ff_exp_key = k("expert_feed_forward_length");
    let n_ff_exp_file = match arch {
        Arch::Qwen3Moe
        | Arch::Qwen35Moe
        | Arch::Qwen2Moe
        | Arch::GptOss
        | Arch::Glm4Moe
        | Arch::Deepseek2
        | Arch::Gemma4 => kv.per_layer(&n_ff_exp_key, n_layer_all)?,
        _ => None,
    };
    let mut n_ff_exp = vec![0u32; nl];
    for (il, slot) in n_ff_exp.iter_mut().enumerate() {
        if !is_moe(il) {
            continue;
        }
        let w = match arch {
            Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::Qwen35Moe => {
                let from_key = n_ff_exp_file.as_ref().map_or(0, |p| p.at(il));
                if from_key != 0 {
                    from_key
                } else {
                    n_ff.at(il) / n_expert_used.at(il).max(1)
                }
            }
            // llama.cpp requires the key for gpt-oss, glm4moe and deepseek2
            Arch::GptOss | Arch::Glm4Moe | Arch::Deepseek2 | Arch::Gemma4 => {
                n_ff_exp_file.as_ref().map_or(0, |p| p.at(il))
            }
            _ => n_ff.at(il),
        };
        if w == 0 {
            let key = match arch {
                Arch::Qwen3Moe
                | Arch::Qwen2Moe
                | Arch::Qwen35Moe
                | Arch::GptOss
                | Arch::Glm4Moe
                | Arch::Deepseek2
                | Arch::Gemma4 => n_ff_exp_key.clone(),
                _ => k("feed_forward_length"),
            };
            // gpt-oss, glm4moe and deepseek2 take no fallback from feed_forward_length
            let no_fallback = matches!(
                arch,
                Arch::GptOss | Arch::Glm4Moe | Arch::Deepseek2 | Arch::Gemma4
            );
            return Err(
                if md.get(&key).is_none()
                    && (no_fallback || md.get(&k("feed_forward_length")).is_none())
                {
                    ModelError::MissingKey(key)
                } else {
                    invalid(key, format!("layer {il} has experts of width 0"))
                },
            );
        }
        *slot = w;
    }
    let n_ff_exp = PerLayer(n_ff_exp);

    let shared_count_key = k("expert_shared_count");
    let (n_expert_shared, n_ff_shexp) = match arch.shared_experts() {
        SharedExperts::None => (0, 0),
        SharedExperts::Gated => {
            let w = match kv.u32(&k("expert_shared_feed_forward_length"))? {
                Some(v) if v > 0 => v,
                _ => n_ff.at(0),
            };
            if w == 0 {
                return Err(ModelError::MissingKey(k(
                    "expert_shared_feed_forward_length",
                )));
            }
            if let Some(v) = kv.u32(&shared_count_key)?
                && v != 1
            {
                return Err(invalid(
                    shared_count_key,
                    format!("{arch} has exactly 1 shared expert, the file says {v}"),
                ));
            }
            (1, w)
        }
        SharedExperts::Counted => {
            // llama.cpp requires the key (0: no shared expert)
            let count = kv.u32_req(&shared_count_key)?;
            let first_moe = (n_layer_dense_lead as usize).min(nl.saturating_sub(1));
            let w = n_ff_exp.at(first_moe).checked_mul(count).ok_or_else(|| {
                invalid(
                    shared_count_key.clone(),
                    format!("{count} shared experts overflow 32 bits of width"),
                )
            })?;
            (count, w)
        }
    };

    let gating_key = k("expert_gating_func");
    let expert_gating = match (arch.reads_gating_func(), kv.u32(&gating_key)?) {
        // 0 is llama.cpp's "none": the arch's default
        (true, Some(v)) if v != 0 => ExpertGating::from_func(v).ok_or_else(|| {
            ModelError::Unsupported(format!(
                "{gating_key} = {v} (supported: 1 softmax, 2 sigmoid)"
            ))
        })?,
        // deepseek2 files written before the key existed: GLM-4.7-Lite's shape (47 or 48
        // layers, a vocabulary of 154880) routes by sigmoid, DeepSeek V2/V2.5 by softmax
        _ if arch == Arch::Deepseek2 && matches!(n_layer, 47 | 48) && n_vocab == 154_880 => {
            ExpertGating::Sigmoid
        }
        _ => arch.default_expert_gating(),
    };

    let expert_weights_norm = kv
        .bool(&k("expert_weights_norm"))?
        .unwrap_or(arch.default_expert_weights_norm());
    let expert_weights_scale = kv.f32(&k("expert_weights_scale"))?.unwrap_or(0.0);
    if !expert_weights_scale.is_finite() || expert_weights_scale < 0.0 {
        return Err(invalid(
            k("expert_weights_scale"),
            format!("{expert_weights_scale} is not a finite non-negative number"),
        ));
    }

    // Attention.
    let n_head = kv
        .per_layer(&k("attention.head_count"), n_layer_all)?
        .ok_or_else(|| ModelError::MissingKey(k("attention.head_count")))?;
    let n_head_kv = kv
        .per_layer(&k("attention.head_count_kv"), n_layer_all)?
        .unwrap_or_else(|| n_head.clone());
    for il in 0..nl {
        let (h, hkv) = (n_head.at(il), n_head_kv.at(il));
        if h == 0 {
            return Err(invalid(
                k("attention.head_count"),
                format!("layer {il} has 0 heads"),
            ));
        }
        if hkv == 0 || !h.is_multiple_of(hkv) {
            return Err(invalid(
                k("attention.head_count_kv"),
                format!("layer {il}: {h} heads are not a multiple of {hkv} kv heads"),
            ));
        }
        if arch.qk_norm() == QkNorm::Whole && hkv != h {
            return Err(invalid(
                k("attention.head_count_kv"),
                format!(
                    "{arch} normalises the whole k projection with n_embd weights, so kv heads ({hkv}) must equal heads ({h})"
                ),
            ));
        }
    }
    let default_head_dim = n_embd / n_head.at(0);
    let head_dim_k = kv
        .u32(&k("attention.key_length"))?
        .unwrap_or(default_head_dim);
    let head_dim_v = kv
        .u32(&k("attention.value_length"))?
        .unwrap_or(default_head_dim);
    if head_dim_k == 0 {
        return Err(invalid(k("attention.key_length"), "head size is 0"));
    }
    let (head_dim_k_swa, head_dim_v_swa) = if arch.is_gemma4() {
        let ks = kv
            .u32(&k("attention.key_length_swa"))?
            .unwrap_or(head_dim_k);
        let vs = kv
            .u32(&k("attention.value_length_swa"))?
            .unwrap_or(head_dim_v);
        if ks == 0 || ks != vs {
            return Err(invalid(
                k("attention.value_length_swa"),
                format!(
                    "sliding-window heads of key {ks} and value {vs}; gemma4 needs them equal and > 0"
                ),
            ));
        }
        (ks, vs)
    } else {
        (head_dim_k, head_dim_v)
    };
    let mla = if arch.is_mla() {
        Some(mla(
            &kv, n_layer, n_vocab, head_dim_k, head_dim_v, &n_head, &n_head_kv,
        )?)
    } else {
        None
    };
    if mla.is_none() && head_dim_v != head_dim_k {
        return Err(invalid(
            k("attention.value_length"),
            format!("value head size {head_dim_v} differs from key head size {head_dim_k}"),
        ));
    }
    for il in 0..nl {
        if head_dim_k.checked_mul(n_head.at(il)).is_none() {
            return Err(invalid(
                k("attention.key_length"),
                format!(
                    "head size {head_dim_k} x {} heads overflows 32 bits",
                    n_head.at(il)
                ),
            ));
        }
    }
    if arch.q_dim() == QDim::Embd {
        for il in 0..nl {
            if head_dim_k * n_head.at(il) != n_embd {
                return Err(invalid(
                    k("attention.key_length"),
                    format!(
                        "{arch} needs heads x head size = n_embd, got {} x {head_dim_k} != {n_embd}",
                        n_head.at(il)
                    ),
                ));
            }
        }
    }
    let rms_eps = kv
        .f32(&k("attention.layer_norm_rms_epsilon"))?
        .ok_or_else(|| ModelError::MissingKey(k("attention.layer_norm_rms_epsilon")))?;
    if !(rms_eps.is_finite() && rms_eps >= 0.0) {
        return Err(invalid(
            k("attention.layer_norm_rms_epsilon"),
            format!("{rms_eps} is not a finite non-negative number"),
        ));
    }

    // Rope.
    let freq_base = kv.f32(&k("rope.freq_base"))?.unwrap_or(10000.0);
    if !(freq_base.is_finite() && freq_base > 0.0) {
        return Err(invalid(
            k("rope.freq_base"),
            format!("{freq_base} is not a positive number"),
        ));
    }
    let n_rot = kv.u32(&k("rope.dimension_count"))?.unwrap_or(head_dim_k);
    if let Some(m) = &mla {
        // llama.cpp's deepseek2 requires at least one plain value per head
        if n_rot == 0 || !n_rot.is_multiple_of(2) || n_rot >= m.head_dim_k {
            return Err(invalid(
                k("rope.dimension_count"),
                format!(
                    "{n_rot} rotated dimensions; must be even and below the key head size {}",
                    m.head_dim_k
                ),
            ));
        }
        if m.absorbed && head_dim_k != m.kv_lora_rank + n_rot {
            return Err(invalid(
                k("attention.key_length"),
                format!(
                    "{head_dim_k}; the absorbed form caches kv_lora_rank + rotated dims = {} + {n_rot}",
                    m.kv_lora_rank
                ),
            ));
        }
    } else if arch.partial_rope() {
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
    let sections_key = k("rope.dimension_sections");
    let mut sections = [0u32; 4];
    if arch.imrope() {
        // llama.cpp requires the key (four sections) for IMRoPE
        let Some(Value::Array(a)) = md.get(&sections_key) else {
            return Err(match md.get(&sections_key) {
                None => ModelError::MissingKey(sections_key),
                Some(v) => ModelError::KeyType {
                    key: sections_key,
                    expected: "array of 4 integers",
                    found: value_type_name(v),
                },
            });
        };
        if a.len() < 4 {
            return Err(ModelError::ArrayLength {
                key: sections_key,
                expected: 4,
                found: a.len(),
            });
        }
        for (i, slot) in sections.iter_mut().enumerate() {
            let v = a.get(i).and_then(|v| v.as_u64()).ok_or_else(|| {
                invalid(
                    sections_key.clone(),
                    format!("element {i} is not an integer"),
                )
            })?;
            *slot = u32::try_from(v)
                .map_err(|_| invalid(sections_key.clone(), format!("element {i} is {v}")))?;
        }
        let sum: u64 = sections.iter().map(|&v| u64::from(v)).sum();
        if sum == 0 || 2 * sum > u64::from(head_dim_k) {
            return Err(invalid(
                sections_key,
                format!(
                    "sections {sections:?} cover {sum} rotated pairs; must be 1..={}",
                    head_dim_k / 2
                ),
            ));
        }
    } else if let Some(Value::Array(a)) = md.get(&sections_key) {
        let at = |i: usize| a.get(i).and_then(|v| v.as_u64()).unwrap_or(0);
        // llama.cpp's use_mrope(): the first two sections non-zero
        if at(0) > 0 && at(1) > 0 {
            return Err(ModelError::Unsupported(format!(
                "multimodal rope sections (M-RoPE, {sections_key})"
            )));
        }
    }
    let scaling = match kv.str(&k("rope.scaling.type"))?.unwrap_or("linear") {
        "none" => RopeScalingType::None,
        "linear" => RopeScalingType::Linear,
        "yarn" => RopeScalingType::Yarn,
        "longrope" => {
            return Err(ModelError::Unsupported(format!(
                "rope scaling type 'longrope' ({})",
                k("rope.scaling.type")
            )));
        }
        other => {
            return Err(invalid(
                k("rope.scaling.type"),
                format!("unknown rope scaling type '{other}' (known: none, linear, yarn)"),
            ));
        }
    };
    let scaling_factor = match kv.f32(&k("rope.scaling.factor"))? {
        Some(f) => f,
        None => kv.f32(&k("rope.scale_linear"))?.unwrap_or(0.0),
    };
    if !(scaling_factor.is_finite() && scaling_factor >= 0.0) {
        return Err(invalid(
            k("rope.scaling.factor"),
            format!("{scaling_factor} is not a finite non-negative number"),
        ));
    }
    let freq_scale = if scaling == RopeScalingType::None || scaling_factor == 0.0 {
        1.0
    } else {
        1.0 / scaling_factor
    };
    let n_ctx_orig = match kv.u32(&k("rope.scaling.original_context_length"))? {
        Some(v) if v != 0 => v,
        _ => n_ctx_train,
    };
    let ext_key = k("rope.scaling.yarn_ext_factor");
    let yarn_ext_factor = match kv.f32(&ext_key)? {
        Some(v) if v >= 0.0 => v,
        _ => {
            if scaling == RopeScalingType::Yarn {
                1.0
            } else {
                0.0
            }
        }
    };
    let (n_swa, swa_layers) = sliding_window(arch, &kv, n_layer_all)?;
    let (n_rot_swa, freq_base_swa) = if arch.is_gemma4() {
        let r = kv.u32(&k("rope.dimension_count_swa"))?.unwrap_or(n_rot);
        if r == 0 || !r.is_multiple_of(2) || r > head_dim_k_swa {
            return Err(invalid(
                k("rope.dimension_count_swa"),
                format!("{r} rotated dimensions; must be even and in 2..={head_dim_k_swa}"),
            ));
        }
        (r, kv.f32(&k("rope.freq_base_swa"))?.unwrap_or(10000.0))
    } else {
        (n_rot, freq_base)
    };
    if arch.is_gemma4() {
        for (key, what) in [
            (
                "embedding_length_per_layer_input",
                "per-layer token embeddings (Gemma 4 E2B/E4B)",
            ),
            (
                "attention.shared_kv_layers",
                "layers that reuse other layers' KV (Gemma 4 E2B/E4B)",
            ),
        ] {
            let v = if key.starts_with("embedding") {
                kv.u32_req(&k(key))?
            } else {
                kv.u32(&k(key))?.unwrap_or(0)
            };
            if v > 0 {
                return Err(ModelError::Unsupported(format!(
                    "{what} ({} = {v})",
                    k(key)
                )));
            }
        }
    }
    if n_swa > 0
        && !arch.is_gemma4()
        && let Some(base_swa) = kv.f32(&k("rope.freq_base_swa"))?
        && base_swa != freq_base
    {
        return Err(ModelError::Unsupported(format!(
            "a separate rope base for the sliding-window layers ({} = {base_swa}, {} = {freq_base})",
            k("rope.freq_base_swa"),
            k("rope.freq_base")
        )));
    }
    let rope = Rope {
        ty: arch.rope_type(),
        freq_base,
        n_rot,
        scaling,
        scaling_factor,
        freq_scale,
        n_ctx_orig,
        attn_factor: kv.f32(&k("rope.scaling.attn_factor"))?.unwrap_or(1.0),
        yarn_ext_factor,
        yarn_attn_factor: kv.f32(&k("rope.scaling.yarn_attn_factor"))?.unwrap_or(1.0),
        yarn_beta_fast: kv.f32(&k("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0),
        yarn_beta_slow: kv.f32(&k("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
        finetuned: kv.bool(&k("rope.scaling.finetuned"))?.unwrap_or(false),
        n_rot_swa,
        freq_base_swa,
        sections,
        yarn_log_mul: if arch.is_mla() {
            kv.f32(&k("rope.scaling.yarn_log_multiplier"))?
                .map_or(0.0, |v| v / 0.1)
        } else {
            0.0
        },
    };
    let (ssm, recurrent) = if arch.is_hybrid_recurrent() {
        hybrid(&kv, n_layer, n_layer_all)?
    } else {
        (None, vec![false; nl])
    };
    if arch.is_mla()
        && let Some(t) = kv.f32(&k("attention.temperature_scale"))?
        && t != 0.0
    {
        return Err(ModelError::Unsupported(format!(
            "attention temperature tuning ({} = {t})",
            k("attention.temperature_scale")
        )));
    }

    Ok(HParams {
        arch,
        n_vocab,
        n_ctx_train,
        n_embd,
        n_layer,
        n_layer_nextn,
        n_ff,
        n_ff_exp,
        n_ff_shexp,
        n_head,
        n_head_kv,
        head_dim_k,
        head_dim_v,
        rms_eps,
        rope,
        qk_norm: arch.qk_norm(),
        n_expert,
        n_expert_used,
        n_expert_groups,
        n_group_used,
        expert_weights_norm,
        expert_weights_scale,
        n_expert_shared,
        expert_gating,
        n_layer_dense_lead,
        n_swa,
        swa_layers,
        mla,
        head_dim_k_swa,
        head_dim_v_swa,
        logit_softcap: if arch.is_gemma4() {
            kv.f32(&k("final_logit_softcapping"))?.unwrap_or(0.0)
        } else {
            0.0
        },
        ssm,
        recurrent,
    })
}

/// The linear-attention sizes and the recurrent layers of a hybrid stack, as llama.cpp's
/// qwen35moe loader reads them: `attention.recurrent_layers` (one bool per stored layer) or
/// else every layer but each `full_attention_interval`-th (default 4) of the trunk; NextN
/// layers are never recurrent.
fn hybrid(
    kv: &Kv<'_>,
    n_layer: u32,
    n_layer_all: u32,
) -> Result<(Option<Ssm>, Vec<bool>), ModelError> {
    let k = |s: &str| kv.key(s);
    let nl = n_layer_all as usize;
    let d_conv = kv.u32_req(&k("ssm.conv_kernel"))?;
    let d_inner = kv.u32_req(&k("ssm.inner_size"))?;
    let d_state = kv.u32_req(&k("ssm.state_size"))?;
    let n_v_heads = kv.u32_req(&k("ssm.time_step_rank"))?;
    let n_k_heads = kv.u32_req(&k("ssm.group_count"))?;
    if d_conv < 2 {
        return Err(invalid(
            k("ssm.conv_kernel"),
            format!("{d_conv}; the convolution needs a width of at least 2"),
        ));
    }
    if d_state == 0 || n_k_heads == 0 || n_v_heads == 0 || !n_v_heads.is_multiple_of(n_k_heads) {
        return Err(invalid(
            k("ssm.time_step_rank"),
            format!(
                "{n_v_heads} value heads of {d_state} over {n_k_heads} key heads (ssm.group_count); \
                 need a positive multiple of the key heads and a positive head size"
            ),
        ));
    }
    if d_state.checked_mul(n_v_heads) != Some(d_inner) {
        return Err(invalid(
            k("ssm.inner_size"),
            format!("{d_inner} is not {n_v_heads} value heads x head size {d_state}"),
        ));
    }
    let layers_key = k("attention.recurrent_layers");
    let recurrent = match kv.md.get(&layers_key) {
        Some(Value::Array(ArrayValue::Bool(b))) => {
            if b.len() != nl {
                return Err(ModelError::ArrayLength {
                    key: layers_key,
                    expected: nl,
                    found: b.len(),
                });
            }
            b.iter()
                .enumerate()
                .map(|(il, &r)| r && il < n_layer as usize)
                .collect()
        }
        Some(v) => {
            return Err(ModelError::KeyType {
                key: layers_key,
                expected: "array of bools",
                found: value_type_name(v),
            });
        }
        None => {
            let every = kv.u32(&k("full_attention_interval"))?.unwrap_or(4);
            if every == 0 {
                return Err(invalid(k("full_attention_interval"), "must be > 0"));
            }
            (0..n_layer_all)
                .map(|il| il < n_layer && !(il + 1).is_multiple_of(every))
                .collect()
        }
    };
    Ok((
        Some(Ssm {
            d_conv,
            d_state,
            n_k_heads,
            n_v_heads,
        }),
        recurrent,
    ))
}

/// The MLA dimensions of a deepseek2 file, checked against the cached head sizes
/// (`attention.key_length` / `value_length`) and the kv heads.
#[allow(clippy::too_many_arguments)]
fn mla(
    kv: &Kv<'_>,
    n_layer: u32,
    n_vocab: u32,
    head_dim_k: u32,
    head_dim_v: u32,
    n_head: &PerLayer,
    n_head_kv: &PerLayer,
) -> Result<Mla, ModelError> {
    let k = |s: &str| kv.key(s);
    // llama.cpp's "lite" shapes (DeepSeek-V2-Lite, GigaChat3-10B-A1.8B, Kanana-2-30B-A3B)
    // have no low-rank query and it does not read the key for them
    let lite = matches!(n_layer, 26 | 27) || (n_layer == 48 && n_vocab == 128_256);
    let q_lora_rank = if lite {
        0
    } else {
        kv.u32_req(&k("attention.q_lora_rank"))?
    };
    let kv_lora_rank = kv.u32_req(&k("attention.kv_lora_rank"))?;
    if kv_lora_rank == 0 {
        return Err(invalid(k("attention.kv_lora_rank"), "must be > 0"));
    }
    let (k_mla, v_mla) = (
        kv.u32(&k("attention.key_length_mla"))?,
        kv.u32(&k("attention.value_length_mla"))?,
    );
    let absorbed = match (k_mla, v_mla) {
        (Some(a), Some(b)) if a != 0 && b != 0 => true,
        (None | Some(0), None | Some(0)) => false,
        _ => {
            let missing = if k_mla.unwrap_or(0) == 0 {
                "attention.key_length_mla"
            } else {
                "attention.value_length_mla"
            };
            return Err(invalid(
                k(missing),
                "the absorbed MLA form needs both key_length_mla and value_length_mla",
            ));
        }
    };
    let nl = n_head.as_slice().len();
    let m = if absorbed {
        let m = Mla {
            q_lora_rank,
            kv_lora_rank,
            head_dim_k: k_mla.unwrap_or(0),
            head_dim_v: v_mla.unwrap_or(0),
            absorbed,
        };
        if head_dim_v != kv_lora_rank {
            return Err(invalid(
                k("attention.value_length"),
                format!(
                    "{head_dim_v}; the absorbed MLA form caches the compressed row (kv_lora_rank {kv_lora_rank}) as the value"
                ),
            ));
        }
        if let Some(il) = (0..nl).find(|&il| n_head_kv.at(il) != 1) {
            return Err(invalid(
                k("attention.head_count_kv"),
                format!(
                    "layer {il} has {} kv heads; the absorbed MLA form has one",
                    n_head_kv.at(il)
                ),
            ));
        }
        m
    } else {
        if let Some(il) = (0..nl).find(|&il| n_head_kv.at(il) != n_head.at(il)) {
            return Err(invalid(
                k("attention.head_count_kv"),
                format!(
                    "layer {il} has {} kv heads for {} heads; legacy MLA (attn_kv_b) expands one per head",
                    n_head_kv.at(il),
                    n_head.at(il)
                ),
            ));
        }
        Mla {
            q_lora_rank,
            kv_lora_rank,
            head_dim_k,
            head_dim_v,
            absorbed,
        }
    };
    if m.head_dim_v == 0 {
        return Err(invalid(k("attention.value_length_mla"), "head size is 0"));
    }
    Ok(m)
}

/// The sliding window and which layers use it, as llama.cpp reads them for `arch`
/// (`attention.sliding_window`, required where the arch has one; the pattern from
/// `attention.sliding_window_pattern`: an array of one bool per layer, or a period `n` where
/// layer `il` slides when `il % n < n - 1`, 0 meaning every layer).
fn sliding_window(arch: Arch, kv: &Kv<'_>, n_layer: u32) -> Result<(u32, Vec<bool>), ModelError> {
    let nl = n_layer as usize;
    let default_pattern = arch.default_swa_pattern();
    if default_pattern == 0 {
        return Ok((0, vec![false; nl]));
    }
    let window_key = kv.key("attention.sliding_window");
    let n_swa = kv.u32_req(&window_key)?;
    let pattern_key = kv.key("attention.sliding_window_pattern");
    let layers = match kv.md.get(&pattern_key) {
        Some(Value::Array(ArrayValue::Bool(b))) => {
            if b.len() != nl {
                return Err(ModelError::ArrayLength {
                    key: pattern_key,
                    expected: nl,
                    found: b.len(),
                });
            }
            b.clone()
        }
        Some(Value::Array(a)) => {
            return Err(ModelError::KeyType {
                key: pattern_key,
                expected: "unsigned integer or array of bools",
                found: format!("array of {}", a.elem_type()),
            });
        }
        None if default_pattern == u32::MAX => return Err(ModelError::MissingKey(pattern_key)),
        _ => {
            let n = kv.u32(&pattern_key)?.unwrap_or(default_pattern);
            (0..n_layer).map(|il| n == 0 || il % n < n - 1).collect()
        }
    };
    if n_swa == 0 {
        return Ok((0, vec![false; nl]));
    }
    Ok((n_swa, layers))
}
