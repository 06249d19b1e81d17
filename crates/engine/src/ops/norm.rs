//! RMS normalization.

/// Row-wise RMS norm with a weight: for each row `r` of `x` (rows of `weight.len()`
/// elements), `out[r][i] = (x[r][i] · s) · weight[i]` with
/// `s = 1 / sqrtf((f32)(Σ (f64)(x·x) / n) + eps)`.
///
/// As ggml: each square is rounded to f32 and summed in f64 in index order; the mean is
/// divided in f64 and rounded to f32; the scale is an f32 `1/sqrtf`.
///
/// # Panics
/// If `x` is not a whole number of rows or `out` differs from `x` in length.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = weight.len();
    assert_eq!(x.len(), out.len(), "rms_norm: length mismatch");
    if n == 0 {
        return;
    }
    assert_eq!(x.len() % n, 0, "rms_norm: not a whole number of rows");
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let s = rms_scale(xr, eps);
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * s * w;
        }
    }
}

/// [`rms_norm`] in place.
///
/// # Panics
/// If `x` is not a whole number of rows of `weight.len()` elements.
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let n = weight.len();
    if n == 0 {
        return;
    }
    assert_eq!(x.len() % n, 0, "rms_norm: not a whole number of rows");
    for xr in x.chunks_exact_mut(n) {
        let s = rms_scale(xr, eps);
        for (v, &w) in xr.iter_mut().zip(weight) {
            *v = *v * s * w;
        }
    }
}

/// RMS norm without a weight of each row of `n` elements, in place: `x · s` (ggml's
/// `rms_norm` alone; Gemma 4's value heads).
///
/// # Panics
/// If `x` is not a whole number of rows.
pub fn rms_norm_plain_inplace(x: &mut [f32], n: usize, eps: f32) {
    if n == 0 {
        return;
    }
    assert_eq!(x.len() % n, 0, "rms_norm: not a whole number of rows");
    for xr in x.chunks_exact_mut(n) {
        let s = rms_scale(xr, eps);
        for v in xr.iter_mut() {
            *v *= s;
        }
    }
}

/// `x · k` element by element, in place (ggml's `mul` by a broadcast scalar, or `scale`).
pub fn scale_inplace(x: &mut [f32], k: f32) {
    for v in x {
        *v *= k;
    }
}

/// The attention temperature factor of the token at position `pos` (Llama 4's NoPE layers),
/// as llama.cpp's `llm_graph_input_attn_temp` computes it: `floor((pos + offset) /
/// floor_scale)` in f32, then `ln(that + 1) · scale + 1` in f64, rounded to f32.
pub fn attn_temp_factor(t: &model::AttnTemp, pos: usize) -> f32 {
    let steps = ((pos as f32 + t.offset) / t.floor_scale as f32).floor();
    ((f64::from(steps) + 1.0).ln() * f64::from(t.scale) + 1.0) as f32
}

#[inline]
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}
