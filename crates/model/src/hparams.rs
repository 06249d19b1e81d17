//! The common reader: the keys every architecture has (vocabulary, dimensions, layers,
//! attention heads, norms, rope), with llama.cpp's defaults and checks. The architecture's
//! module then reads its own keys into the same [`HParams`] (`arch/`).

use gguf::{Metadata, Value};

use crate::arch::{Arch, ExpertGating, QDim, QkNorm};
use crate::error::ModelError;
use crate::kv::{Kv, invalid, value_type_name};
use crate::params::{HParams, KEY_TOKENS, MAX_LAYERS, PerLayer, Rope, RopeScalingType};

impl HParams {
    /// Read and validate the hyperparameters of `arch` from `md`.
    pub fn from_metadata(arch: Arch, md: &Metadata) -> Result<HParams, ModelError> {
        let kv = Kv {
            md,
            prefix: arch.name(),
        };
        let mut hp = common(arch, &kv)?;
        arch.def().read(&kv, &mut hp)?;
        check_heads(&kv, &hp)?;
        Ok(hp)
    }
}

/// Vocabulary, dimensions, layers, heads, norms and rope.
fn common(arch: Arch, kv: &Kv<'_>) -> Result<HParams, ModelError> {
    let k = |s: &str| kv.key(s);
    let features = arch.features();
    // Vocabulary: the token list wins, as in llama.cpp; `vocab_size` covers files without one.
    let n_vocab = match kv.md.get(KEY_TOKENS) {
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
    let rope = rope(arch, kv, head_dim_k, n_ctx_train)?;
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
        qk_norm: features.qk_norm,
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
        mla: None,
        head_dim_k_swa: head_dim_k,
        head_dim_v_swa: head_dim_v,
        logit_softcap: 0.0,
        ssm: None,
        recurrent: vec![false; nl],
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
        if hkv == 0 || !h.is_multiple_of(hkv) {
            return Err(invalid(
                k("attention.head_count_kv"),
                format!("layer {il}: {h} heads are not a multiple of {hkv} kv heads"),
            ));
        }
        if arch.features().qk_norm == QkNorm::Whole && hkv != h {
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

/// What the head sizes must satisfy once the architecture has read its own keys (MLA's
/// head sizes are its own: it checks them).
fn check_heads(kv: &Kv<'_>, hp: &HParams) -> Result<(), ModelError> {
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

/// The rotary embedding's keys (the sliding-window layers' own and IMRoPE's sections are read
/// by the architectures that have them).
fn rope(arch: Arch, kv: &Kv<'_>, head_dim_k: u32, n_ctx_train: u32) -> Result<Rope, ModelError> {
    let k = |s: &str| kv.key(s);
    let freq_base = kv.f32(&k("rope.freq_base"))?.unwrap_or(10000.0);
    if !(freq_base.is_finite() && freq_base > 0.0) {
        return Err(invalid(
            k("rope.freq_base"),
            format!("{freq_base} is not a positive number"),
        ));
    }
    let n_rot = kv.u32(&k("rope.dimension_count"))?.unwrap_or(head_dim_k);
    let sections_key = k("rope.dimension_sections");
    if !arch.features().imrope
        && let Some(Value::Array(a)) = kv.md.get(&sections_key)
    {
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
    let yarn_ext_factor = match kv.f32(&k("rope.scaling.yarn_ext_factor"))? {
        Some(v) if v >= 0.0 => v,
        _ if scaling == RopeScalingType::Yarn => 1.0,
        _ => 0.0,
    };
    Ok(Rope {
        ty: arch.features().rope_type,
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
        n_rot_swa: n_rot,
        freq_base_swa: freq_base,
        sections: [0; 4],
        yarn_log_mul: 0.0,
    })
}
