//! Rotary embedding: its parameters and the common reader of the `rope.*` keys (the
//! sliding-window layers' own and IMRoPE's sections are read by the architectures that have
//! them).

use gguf::Value;

use crate::arch::Arch;
use crate::error::ModelError;
use crate::kv::{Kv, invalid};

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

/// The rotary embedding's keys (the sliding-window layers' own and IMRoPE's sections are read
/// by the architectures that have them).
pub(crate) fn read(
    arch: Arch,
    kv: &Kv<'_>,
    head_dim_k: u32,
    n_ctx_train: u32,
) -> Result<Rope, ModelError> {
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
