//! The common reader: the keys every architecture has (vocabulary, dimensions, layers,
//! attention heads, norms, and rope through `rope.rs`), with llama.cpp's defaults and checks.
//! The architecture's module then reads its own keys into the same [`HParams`] (`arch/`), and
//! [`HParams::check_heads`] checks what needs both.

use gguf::Metadata;

use crate::arch::{Arch, ExpertGating, QDim, QkNorm, keys};
use crate::error::ModelError;
use crate::kv::{Kv, invalid};
use crate::params::{HParams, MAX_LAYERS, PerLayer};

impl HParams {
    /// Read and validate the hyperparameters of `arch` from `md`.
    pub fn from_metadata(arch: Arch, md: &Metadata) -> Result<HParams, ModelError> {
        let kv = Kv {
            md,
            prefix: arch.name(),
        };
        let mut hp = common(arch, &kv)?;
        let def = arch.def();
        def.read_layer_types(&kv, &mut hp)?;
        let experts = def.experts(&hp);
        keys::experts(&kv, &mut hp, &experts)?;
        def.read(&kv, &mut hp)?;
        hp.check_heads(&kv)?;
        Ok(hp)
    }
}

/// Vocabulary, dimensions, layers, heads, norms and rope.
fn common(arch: Arch, kv: &Kv<'_>) -> Result<HParams, ModelError> {
    let k = |s: &str| kv.key(s);
    let features = arch.features();
    let n_vocab = kv.n_vocab()?;
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
    let n_layer_nextn = if features.nextn {
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
    // Per-layer arrays cover every stored layer.
    let nl = n_layer_all as usize;
    let n_ff = kv
        .per_layer(&k("feed_forward_length"), n_layer_all)?
        .unwrap_or(PerLayer(vec![0; nl]));
    let (n_head, n_head_kv) = heads(arch, kv, n_layer_all)?;
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
    let rms_eps = kv
        .f32(&k("attention.layer_norm_rms_epsilon"))?
        .ok_or_else(|| ModelError::MissingKey(k("attention.layer_norm_rms_epsilon")))?;
    if !(rms_eps.is_finite() && rms_eps >= 0.0) {
        return Err(invalid(
            k("attention.layer_norm_rms_epsilon"),
            format!("{rms_eps} is not a finite non-negative number"),
        ));
    }
    let rope = crate::rope::read(arch, kv, head_dim_k, n_ctx_train)?;
    Ok(HParams {
        arch,
        features,
        n_vocab,
        n_ctx_train,
        n_embd,
        n_layer: n_layer_all - n_layer_nextn,
        n_layer_nextn,
        n_ff,
        n_ff_exp: PerLayer(vec![0; nl]),
        n_ff_shexp: 0,
        n_head,
        n_head_kv,
        head_dim_k,
        head_dim_v,
        rms_eps,
        rope,
        n_expert: 0,
        n_expert_used: PerLayer(vec![0; nl]),
        n_expert_groups: 0,
        n_group_used: 0,
        expert_weights_norm: false,
        expert_weights_scale: 0.0,
        n_expert_shared: 0,
        expert_gating: ExpertGating::Softmax,
        n_layer_dense_lead: 0,
        n_swa: 0,
        swa_layers: vec![false; nl],
        nope_layers: Vec::new(),
        moe_layer_step: 0,
        attn_temp: None,
        qk_norm_plain_rope: false,
        mla: None,
        head_dim_k_swa: head_dim_k,
        head_dim_v_swa: head_dim_v,
        logit_softcap: 0.0,
        ssm: None,
        recurrent: vec![false; nl],
        shortconv_l_cache: 0,
        mamba2: None,
        no_mixer: Vec::new(),
        no_ffn: Vec::new(),
        moe_latent: 0,
        embd_scale: None,
        attn_scale_fixed: None,
        residual_scale: None,
        logit_scale: None,
    })
}

/// `attention.head_count` and `head_count_kv` per stored layer.
fn heads(arch: Arch, kv: &Kv<'_>, n_layer_all: u32) -> Result<(PerLayer, PerLayer), ModelError> {
    let k = |s: &str| kv.key(s);
    let n_head = kv
        .per_layer(&k("attention.head_count"), n_layer_all)?
        .ok_or_else(|| ModelError::MissingKey(k("attention.head_count")))?;
    let n_head_kv = kv
        .per_layer(&k("attention.head_count_kv"), n_layer_all)?
        .unwrap_or_else(|| n_head.clone());
    for il in 0..n_layer_all as usize {
        let (h, hkv) = (n_head.at(il), n_head_kv.at(il));
        if h == 0 {
            return Err(invalid(
                k("attention.head_count"),
                format!("layer {il} has 0 heads"),
            ));
        }
        // (LFM2: a layer of no kv heads is a short-convolution layer; Nemotron-H: a Mamba-2
        // mixer or an FFN alone)
        if hkv == 0 && (arch.features().shortconv || arch.features().mamba2) {
            continue;
        }
        if hkv == 0 || !h.is_multiple_of(hkv) {
            return Err(invalid(
                k("attention.head_count_kv"),
                format!("layer {il}: {h} heads are not a multiple of {hkv} kv heads"),
            ));
        }
        // OLMoE's whole-projection norms are n_embd wide, for keys as for queries
        let f = arch.features();
        if f.qk_norm == QkNorm::Whole && f.q_dim == QDim::Embd && hkv != h {
            return Err(invalid(
                k("attention.head_count_kv"),
                format!(
                    "{arch} normalises the whole k projection with n_embd weights, so kv heads ({hkv}) must equal heads ({h})"
                ),
            ));
        }
    }
    Ok((n_head, n_head_kv))
}
