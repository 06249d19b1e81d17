//! Numerical operations on f32 slices, matching ggml's CPU backend.
//!
//! Every operation has a portable scalar implementation that reproduces ggml's arithmetic
//! (order of operations, accumulator widths, and the exponential approximation ggml's x86
//! build uses). Where SIMD pays, an AVX2+FMA version is chosen at run time; it returns the same
//! bits as the scalar one (tests check this), so the choice never changes a result.

mod act;
mod attn;
mod gdn;
mod norm;
mod rope;
mod route;
mod ssm;

pub use act::{
    EXP_LANES, exp_ggml, geglu, gelu, gelu_one, reglu, sigmoid, silu, silu_scalar, softmax,
    softmax_scalar, softmax_sink, softmax_sink_scalar, swiglu, swiglu_oai, swiglu_scalar,
};
pub use attn::{
    AttnExtras, KvCache, KvPrefix, KvType, attend, attend_batch, attend_batch_with, dot_ggml,
    dot_ggml_scalar, dot_tinyblas, dot_tinyblas_scalar,
};
pub use gdn::{ConvSum, KeyHeads, causal_conv, gated_delta_rule, l2_norm_inplace, softplus};
pub use norm::{
    attn_temp_factor, rms_norm, rms_norm_inplace, rms_norm_plain_inplace, scale_inplace,
};
pub use rope::{Rope, RopeConfig, RopeMode};
pub use route::{
    Gating, RouteScratch, Selection, argsort_desc, argsort_desc_into, gate_probs, route,
    route_biased_into, route_fixed_into, route_into, selection_scores, top_k_desc,
};
pub use ssm::{ScanDims, mamba2_scan, relu_sqr};

/// True when the AVX2+FMA paths can run on this CPU (checked once, cached by std).
#[inline]
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
