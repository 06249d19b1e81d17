//! Exponential-based element-wise operations: SiLU, SwiGLU, sigmoid and row softmax.
//!
//! ggml's x86 CPU build (AVX2+FMA, the `haswell` variant llama.cpp loads on such machines)
//! evaluates `exp` in two ways inside one row: whole groups of [`EXP_LANES`] elements go
//! through its vector approximation (reproduced lane for lane by [`exp_ggml`]) and the
//! remaining `len % 8` elements go through the C library's `expf` (Rust's `f32::exp`, which
//! calls the same library). The operations here keep that split, so the same element gets the
//! same bits as in ggml. The scalar functions are the reference; the AVX2 ones give identical
//! bits and are chosen at run time.
//!
//! ggml's aarch64 build (NEON) runs the same approximation lane for lane on groups of 4, so on
//! aarch64 the split is at `len % 4` and a softmax group's sum is NEON's pairwise one.

/// Width of ggml's vector loops on this architecture: rows are processed in groups of this
/// many elements (AVX2: 8; NEON: 4).
pub const EXP_LANES: usize = if cfg!(target_arch = "aarch64") { 4 } else { 8 };

const EXP_SHIFT: u32 = 0x4b40_0000; // 0x1.8p23: adding it rounds to an integer
const EXP_LOG2E: u32 = 0x3fb8_aa3b; // 0x1.715476p+0
const EXP_LN2_HI: u32 = 0x3f31_7200; // 0x1.62e4p-1
const EXP_LN2_LO: u32 = 0x35bf_be8e; // 0x1.7f7d1cp-20
const EXP_C5: u32 = 0x3c07_2010; // 0x1.0e4020p-7
const EXP_C4: u32 = 0x3d2b_9f17; // 0x1.573e2ep-5
const EXP_C3: u32 = 0x3e2a_af33; // 0x1.555e66p-3
const EXP_C2: u32 = 0x3eff_fedb; // 0x1.fffdb6p-2
const EXP_C1: u32 = 0x3f7f_fff6; // 0x1.ffffecp-1

#[inline(always)]
fn c(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// One lane of ggml's vector `expf` approximation (x86 AVX2+FMA build), bit for bit.
///
/// Range reduction `x = n·ln2 + b` with `n` rounded through the 1.5·2^23 shift trick and ln2
/// split in two, a degree-5 polynomial for `e^b - 1`, and a scale by `2^n` built in the
/// exponent bits; `|n| > 126` takes a two-factor scale to reach subnormals and infinity,
/// `|n| > 192` saturates to 0 or +inf. Every multiply-add is a fused one, as in ggml.
/// Maximum error about 1.5 ulp against the exact exponential.
#[inline]
pub fn exp_ggml(x: f32) -> f32 {
    let r = c(EXP_SHIFT);
    let z = x.mul_add(c(EXP_LOG2E), r);
    let n = z - r;
    let b = (-n).mul_add(c(EXP_LN2_LO), (-n).mul_add(c(EXP_LN2_HI), x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = c(EXP_C5)
        .mul_add(b, c(EXP_C4))
        .mul_add(u, c(EXP_C3).mul_add(b, c(EXP_C2)))
        .mul_add(u, c(EXP_C1) * b);
    if n.abs() <= 126.0 || n.is_nan() {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    if n.abs() > 192.0 {
        return s1 * s1;
    }
    let s2 = f32::from_bits(e.wrapping_sub(g));
    s2.mul_add(j, s2) * s1
}

/// `x / (1 + e^-x)` with ggml's exponential: [`exp_ggml`] in the vector part, `expf` in the tail.
#[inline(always)]
fn silu_one(x: f32, vector_part: bool) -> f32 {
    let e = if vector_part {
        exp_ggml(0.0 - x)
    } else {
        (-x).exp()
    };
    x / (1.0 + e)
}

/// Split point of a row of `n` elements: elements before it are in whole 8-lane groups.
#[inline(always)]
fn vec_end(n: usize) -> usize {
    n - n % EXP_LANES
}

/// SiLU `out[i] = x[i] / (1 + e^-x[i])`, as ggml's CPU backend computes it (scalar reference).
///
/// # Panics
/// If `x` and `out` differ in length.
pub fn silu_scalar(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "silu: length mismatch");
    let ve = vec_end(x.len());
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = silu_one(v, i < ve);
    }
}

/// SwiGLU `out[i] = silu(gate[i]) * up[i]`, as ggml's CPU backend computes it (scalar
/// reference).
///
/// # Panics
/// If the three slices differ in length.
pub fn swiglu_scalar(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_eq!(gate.len(), out.len(), "swiglu: length mismatch");
    assert_eq!(up.len(), out.len(), "swiglu: length mismatch");
    let ve = vec_end(gate.len());
    for (i, ((o, &g), &u)) in out.iter_mut().zip(gate).zip(up).enumerate() {
        *o = silu_one(g, i < ve) * u;
    }
}

/// SiLU, AVX2 when available; identical bits to [`silu_scalar`].
///
/// # Panics
/// If `x` and `out` differ in length.
pub fn silu(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "silu: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        unsafe { avx2::silu(x, out) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: NEON is part of every aarch64 CPU (the target's baseline).
        unsafe { neon::silu(x, out) };
        return;
    }
    #[allow(unreachable_code)]
    silu_scalar(x, out);
}

/// SwiGLU, AVX2 when available; identical bits to [`swiglu_scalar`].
///
/// # Panics
/// If the three slices differ in length.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_eq!(gate.len(), out.len(), "swiglu: length mismatch");
    assert_eq!(up.len(), out.len(), "swiglu: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        unsafe { avx2::swiglu(gate, up, out) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: NEON is part of every aarch64 CPU (the target's baseline).
        unsafe { neon::swiglu(gate, up, out) };
        return;
    }
    #[allow(unreachable_code)]
    swiglu_scalar(gate, up, out);
}

/// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): with `g = min(gate, limit)` and
/// `u = clamp(up, -limit, limit)`, `out = g / (1 + expf(-alpha g)) * (u + 1)`. ggml computes it
/// with the C library's `expf` on every element (no vector approximation), and so does this
/// (`f32::exp`); there is no SIMD version to keep equal to it.
///
/// # Panics
/// If the three slices differ in length.
pub fn swiglu_oai(gate: &[f32], up: &[f32], alpha: f32, limit: f32, out: &mut [f32]) {
    assert_eq!(gate.len(), out.len(), "swiglu_oai: length mismatch");
    assert_eq!(up.len(), out.len(), "swiglu_oai: length mismatch");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        // std::min(g, limit) and std::clamp(u, -limit, limit), NaN handling included
        let x = if limit < g { limit } else { g };
        let y = if u < -limit {
            -limit
        } else if limit < u {
            limit
        } else {
            u
        };
        let glu = x / (1.0 + (alpha * -x).exp());
        *o = glu * (y + 1.0);
    }
}

/// Logistic sigmoid `1 / (1 + expf(-x))` element-wise, as ggml's unary op (scalar `expf`,
/// no vector approximation).
///
/// # Panics
/// If `x` and `out` differ in length.
pub fn sigmoid(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "sigmoid: length mismatch");
    for (o, &v) in out.iter_mut().zip(x) {
        *o = 1.0 / (1.0 + (-v).exp());
    }
}

/// ggml's GELU (tanh form) of one value as its CPU backend computes it: inputs at or below
/// −10 give 0, at or above 10 themselves; the others are rounded to f16 and looked up in the
/// table ggml fills at start-up with the f16 rounding of
/// `0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))` at every f16 value (`GGML_GELU_FP16`).
#[inline]
pub fn gelu_one(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let t = half::f16::from_f32(x).to_bits();
        gelu_table()[t as usize]
    }
}

/// The f16 GELU table, as f32 (built once).
fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|i| half::f16::from_f32(gelu_f32(half::f16::from_bits(i).to_f32())).to_f32())
            .collect()
    })
}

/// ggml's `ggml_gelu_f32`, in its order of operations, as its x86 CPU library is compiled: the
/// compiler contracts `1 + a·x·x` into one fused multiply-add (`fma(a·x, x, 1)`), which moves
/// some table entries by one f16 step (a Gemma 4 fixture met one: gelu(−1.999) rounds to
/// −0.045502 with the contraction, −0.045471 without).
fn gelu_f32(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

/// GELU of every element ([`gelu_one`]), as ggml's `ggml_gelu` on the CPU.
pub fn gelu(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "gelu: length mismatch");
    for (o, &v) in out.iter_mut().zip(x) {
        *o = gelu_one(v);
    }
}

/// `gelu(gate) · up`, as ggml's `ggml_geglu_split` on the CPU (at or above 10 the gate passes
/// through unchanged before the product).
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_eq!(gate.len(), out.len(), "geglu: length mismatch");
    assert_eq!(up.len(), out.len(), "geglu: length mismatch");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_one(g) * u;
    }
}

/// `relu(gate) · up`, as ggml's `ggml_reglu_split` on the CPU: `gate > 0 ? gate · up : 0` (a
/// positive zero wherever the gate is not positive, whatever `up` holds).
pub fn reglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_eq!(gate.len(), out.len(), "reglu: length mismatch");
    assert_eq!(up.len(), out.len(), "reglu: length mismatch");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = if g > 0.0 { g * u } else { 0.0 };
    }
}

/// Row softmax as ggml's `soft_max` op: `w = x·scale`, elements at index `>= n_visible` are
/// masked (as an added `-inf`, so they come out as exactly 0), `m = max w`,
/// `e_i = exp(w_i - m)`, `sum` accumulated in f64, `out_i = e_i · (f32)(1/sum)`.
///
/// The exponentials are split between the vector approximation and `expf` by position in
/// the row of length `x.len()` (see the module docs). Scalar reference.
///
/// # Panics
/// If `x` and `out` differ in length or `n_visible > x.len()`.
pub fn softmax_scalar(x: &[f32], scale: f32, n_visible: usize, out: &mut [f32]) {
    softmax_row(x, scale, n_visible, None, false, out);
}

/// [`softmax_scalar`], AVX2 when available; identical bits.
///
/// # Panics
/// If `x` and `out` differ in length or `n_visible > x.len()`.
pub fn softmax(x: &[f32], scale: f32, n_visible: usize, out: &mut [f32]) {
    softmax_row(x, scale, n_visible, None, true, out);
}

/// [`softmax_scalar`] with an attention sink: one more logit, `sink` (not scaled), that joins
/// the maximum and the normaliser but has no output (ggml's `soft_max` with sinks: the
/// maximum is `max(max, sink)`, and `expf(sink - max)` is added to the f64 sum after the
/// row's own terms). Scalar reference.
///
/// # Panics
/// If `x` and `out` differ in length or `n_visible > x.len()`.
pub fn softmax_sink_scalar(x: &[f32], scale: f32, n_visible: usize, sink: f32, out: &mut [f32]) {
    softmax_row(x, scale, n_visible, Some(sink), false, out);
}

/// [`softmax_sink_scalar`], AVX2 when available; identical bits.
///
/// # Panics
/// If `x` and `out` differ in length or `n_visible > x.len()`.
pub fn softmax_sink(x: &[f32], scale: f32, n_visible: usize, sink: f32, out: &mut [f32]) {
    softmax_row(x, scale, n_visible, Some(sink), true, out);
}

/// A whole row: the visible prefix through the scalar reference or the dispatched kernel, the
/// masked rest zero.
fn softmax_row(
    x: &[f32],
    scale: f32,
    n_visible: usize,
    sink: Option<f32>,
    dispatch: bool,
    out: &mut [f32],
) {
    check_softmax(x, n_visible, out);
    let (vis, vout) = (&x[..n_visible], &mut out[..n_visible]);
    if dispatch {
        softmax_visible(vis, scale, x.len(), sink, vout);
    } else {
        softmax_rows_scalar(vis, scale, x.len(), sink, vout);
    }
    out[n_visible..].fill(0.0);
}

fn check_softmax(x: &[f32], n_visible: usize, out: &[f32]) {
    assert_eq!(x.len(), out.len(), "softmax: length mismatch");
    assert!(n_visible <= x.len(), "softmax: n_visible beyond the row");
}

/// Softmax of the visible prefix `x` of a row of `row_len >= x.len()` elements whose other
/// elements are masked out, with an optional attention sink (see [`softmax_sink_scalar`]);
/// writes `x.len()` outputs. Dispatches to AVX2 when available.
pub(crate) fn softmax_visible(
    x: &[f32],
    scale: f32,
    row_len: usize,
    sink: Option<f32>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2 and FMA were detected on this CPU just above.
        unsafe { avx2::softmax(x, scale, row_len, sink, out) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: NEON is part of every aarch64 CPU (the target's baseline).
        unsafe { neon::softmax(x, scale, row_len, sink, out) };
        return;
    }
    #[allow(unreachable_code)]
    softmax_rows_scalar(x, scale, row_len, sink, out);
}

/// The row maximum joined with the sink as ggml does (`max > sink ? max : sink`).
#[inline]
fn with_sink(max: f32, sink: Option<f32>) -> f32 {
    match sink {
        // ggml's MAX(max, sink): `max > sink ? max : sink`
        Some(s) => {
            if max > s {
                max
            } else {
                s
            }
        }
        None => max,
    }
}

/// The sink's term of the normaliser: `expf(sink - max)` (the C library's, as in ggml).
#[inline]
fn sink_term(max: f32, sink: Option<f32>) -> f64 {
    sink.map_or(0.0, |s| f64::from((s - max).exp()))
}

/// Scaled maximum as ggml takes it: `m = (m > v) ? m : v` from `-inf`.
#[inline]
fn scaled_max(x: &[f32], scale: f32) -> f32 {
    x.iter().fold(
        f32::NEG_INFINITY,
        |m, &v| if m > v * scale { m } else { v * scale },
    )
}

/// Scalar softmax of a visible prefix (see [`softmax_visible`]).
pub(crate) fn softmax_rows_scalar(
    x: &[f32],
    scale: f32,
    row_len: usize,
    sink: Option<f32>,
    out: &mut [f32],
) {
    let n = x.len();
    if n == 0 {
        return;
    }
    let max = with_sink(scaled_max(x, scale), sink);
    let ve = vec_end(row_len);
    let mut sum = 0f64;
    let mut i = 0;
    // Whole 8-lane groups: vector exponential, horizontal sum in ggml's lane order.
    while i < ve && i < n {
        let mut v = [0f32; EXP_LANES];
        for (l, vl) in v.iter_mut().enumerate() {
            if i + l < n {
                *vl = exp_ggml(x[i + l] * scale - max);
                out[i + l] = *vl;
            }
        }
        sum += f64::from(hsum_group(&v));
        i += EXP_LANES;
    }
    // Tail of the row: libm expf, one by one.
    while i < n {
        let v = (x[i] * scale - max).exp();
        sum += f64::from(v);
        out[i] = v;
        i += 1;
    }
    sum += sink_term(max, sink);
    let inv = (1.0 / sum) as f32;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// The part of a softmax row after its whole vector groups (which end at `full`; the row's
/// groups at `ve`), for the SIMD versions: a partial group, where the visible prefix `x` ends
/// inside one, through the vector approximation and the group sum; the tail of the row
/// through `expf`; then the sink's term. Takes the groups' sum, returns the normaliser.
fn softmax_rest(
    x: &[f32],
    (scale, max): (f32, f32),
    (full, ve): (usize, usize),
    sink: Option<f32>,
    out: &mut [f32],
    mut sum: f64,
) -> f64 {
    let n = x.len();
    let mut i = full;
    if i < n && i < ve {
        // A partial group: the visible prefix ends inside a vector group of the row.
        let mut v = [0f32; EXP_LANES];
        for (l, vl) in v.iter_mut().enumerate() {
            if i + l < n {
                *vl = exp_ggml(x[i + l] * scale - max);
                out[i + l] = *vl;
            }
        }
        sum += f64::from(hsum_group(&v));
        i = n;
    }
    while i < n {
        let v = (x[i] * scale - max).exp();
        sum += f64::from(v);
        out[i] = v;
        i += 1;
    }
    sum + sink_term(max, sink)
}

/// Horizontal sum of one group in the order of ggml's reduction on this architecture: on x86
/// (AVX2, 8 lanes) `((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))`, on aarch64 (NEON's `vaddvq_f32`, 4
/// lanes) `(v0+v1)+(v2+v3)`.
#[inline(always)]
fn hsum_group(v: &[f32; EXP_LANES]) -> f32 {
    #[cfg(target_arch = "aarch64")]
    {
        (v[0] + v[1]) + (v[2] + v[3])
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        let a = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
        (a[0] + a[2]) + (a[1] + a[3])
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// ggml's AVX2 exponential on 8 lanes (same operations as [`exp_ggml`]).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) fn exp8(x: __m256) -> __m256 {
        let r = _mm256_set1_ps(c(EXP_SHIFT));
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(c(EXP_LOG2E)), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(c(EXP_LN2_LO)),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(c(EXP_LN2_HI)), x),
        );
        let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
        let k = _mm256_castsi256_ps(_mm256_add_epi32(
            e,
            _mm256_castps_si256(_mm256_set1_ps(1.0)),
        ));
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let cmask = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(_mm256_set1_ps(c(EXP_C5)), b, _mm256_set1_ps(c(EXP_C4))),
                u,
                _mm256_fmadd_ps(_mm256_set1_ps(c(EXP_C3)), b, _mm256_set1_ps(c(EXP_C2))),
            ),
            u,
            _mm256_mul_ps(_mm256_set1_ps(c(EXP_C1)), b),
        );
        if _mm256_movemask_ps(cmask) == 0 {
            return _mm256_fmadd_ps(j, k, k);
        }
        let g = _mm256_and_si256(
            _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
            _mm256_set1_epi32(0x8200_0000u32 as i32),
        );
        let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
        let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
        let dmask = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
        _mm256_or_ps(
            _mm256_and_ps(dmask, _mm256_mul_ps(s1, s1)),
            _mm256_andnot_ps(
                dmask,
                _mm256_or_ps(
                    _mm256_and_ps(cmask, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                    _mm256_andnot_ps(cmask, _mm256_fmadd_ps(k, j, k)),
                ),
            ),
        )
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn silu8(x: __m256) -> __m256 {
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn silu(x: &[f32], out: &mut [f32]) {
        let ve = vec_end(x.len());
        for (xc, oc) in x[..ve].chunks_exact(8).zip(out[..ve].chunks_exact_mut(8)) {
            // SAFETY: both chunks hold exactly 8 f32; unaligned loads/stores are used.
            unsafe { _mm256_storeu_ps(oc.as_mut_ptr(), silu8(_mm256_loadu_ps(xc.as_ptr()))) };
        }
        for (o, &v) in out[ve..].iter_mut().zip(&x[ve..]) {
            *o = silu_one(v, false);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let ve = vec_end(gate.len());
        for ((gc, uc), oc) in gate[..ve]
            .chunks_exact(8)
            .zip(up[..ve].chunks_exact(8))
            .zip(out[..ve].chunks_exact_mut(8))
        {
            // SAFETY: the three chunks hold exactly 8 f32; unaligned loads/stores are used.
            unsafe {
                let s = silu8(_mm256_loadu_ps(gc.as_ptr()));
                _mm256_storeu_ps(
                    oc.as_mut_ptr(),
                    _mm256_mul_ps(s, _mm256_loadu_ps(uc.as_ptr())),
                );
            }
        }
        for ((o, &g), &u) in out[ve..].iter_mut().zip(&gate[ve..]).zip(&up[ve..]) {
            *o = silu_one(g, false) * u;
        }
    }

    /// Softmax of a visible prefix (see `softmax_visible`).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn softmax(
        x: &[f32],
        scale: f32,
        row_len: usize,
        sink: Option<f32>,
        out: &mut [f32],
    ) {
        let n = x.len();
        if n == 0 {
            return;
        }
        let max = with_sink(scaled_max(x, scale), sink);
        let ve = vec_end(row_len);
        let full = ve.min(n) - ve.min(n) % 8;
        let vmax = _mm256_set1_ps(max);
        let vscale = _mm256_set1_ps(scale);
        let mut sum = 0f64;
        for (xc, oc) in x[..full]
            .chunks_exact(8)
            .zip(out[..full].chunks_exact_mut(8))
        {
            // SAFETY: both chunks hold exactly 8 f32; unaligned loads/stores are used.
            let val = unsafe {
                let w = _mm256_mul_ps(_mm256_loadu_ps(xc.as_ptr()), vscale);
                let val = exp8(_mm256_sub_ps(w, vmax));
                _mm256_storeu_ps(oc.as_mut_ptr(), val);
                val
            };
            sum += f64::from(hsum(val));
        }
        let sum = softmax_rest(x, (scale, max), (full, ve), sink, out, sum);
        let inv = _mm256_set1_ps((1.0 / sum) as f32);
        let mut oc = out.chunks_exact_mut(8);
        for o in &mut oc {
            // SAFETY: the chunk holds exactly 8 f32; unaligned loads/stores are used.
            unsafe {
                _mm256_storeu_ps(
                    o.as_mut_ptr(),
                    _mm256_mul_ps(_mm256_loadu_ps(o.as_ptr()), inv),
                )
            };
        }
        let inv = (1.0 / sum) as f32;
        for o in oc.into_remainder() {
            *o *= inv;
        }
    }

    /// Horizontal sum in ggml's reduction order (see `hsum_group`).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn hsum(v: __m256) -> f32 {
        let v2 = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
        let v2 = _mm_add_ps(v2, _mm_movehl_ps(v2, v2));
        let v2 = _mm_add_ss(v2, _mm_movehdup_ps(v2));
        _mm_cvtss_f32(v2)
    }
}

/// The NEON versions (every aarch64 CPU has NEON and its fused multiply-add): ggml's ARM
/// build's `ggml_v_expf`, `ggml_v_silu` and soft-max loop on groups of 4, lane for lane the
/// operations of [`exp_ggml`] and the scalar functions above, so the bits are the same.
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use std::arch::aarch64::*;

    /// ggml's NEON exponential on 4 lanes (same operations as [`exp_ggml`]).
    #[inline]
    #[target_feature(enable = "neon")]
    fn exp4(x: float32x4_t) -> float32x4_t {
        let r = vdupq_n_f32(c(EXP_SHIFT));
        let z = vfmaq_f32(r, x, vdupq_n_f32(c(EXP_LOG2E)));
        let n = vsubq_f32(z, r);
        let b = vfmsq_f32(
            vfmsq_f32(x, n, vdupq_n_f32(c(EXP_LN2_HI))),
            n,
            vdupq_n_f32(c(EXP_LN2_LO)),
        );
        let e = vshlq_n_u32::<23>(vreinterpretq_u32_f32(z));
        let k = vreinterpretq_f32_u32(vaddq_u32(e, vreinterpretq_u32_f32(vdupq_n_f32(1.0))));
        let cmask = vcagtq_f32(n, vdupq_n_f32(126.0));
        let u = vmulq_f32(b, b);
        let j = vfmaq_f32(
            vmulq_f32(vdupq_n_f32(c(EXP_C1)), b),
            vfmaq_f32(
                vfmaq_f32(vdupq_n_f32(c(EXP_C2)), vdupq_n_f32(c(EXP_C3)), b),
                vfmaq_f32(vdupq_n_f32(c(EXP_C4)), vdupq_n_f32(c(EXP_C5)), b),
                u,
            ),
            u,
        );
        if vmaxvq_u32(cmask) == 0 {
            return vfmaq_f32(k, j, k);
        }
        let d = vandq_u32(vclezq_f32(n), vdupq_n_u32(0x8200_0000));
        let s1 = vreinterpretq_f32_u32(vaddq_u32(d, vdupq_n_u32(0x7f00_0000)));
        let s2 = vreinterpretq_f32_u32(vsubq_u32(e, d));
        vbslq_f32(
            vcagtq_f32(n, vdupq_n_f32(192.0)),
            vmulq_f32(s1, s1),
            vbslq_f32(
                cmask,
                vmulq_f32(vfmaq_f32(s2, s2, j), s1),
                vfmaq_f32(k, k, j),
            ),
        )
    }

    #[inline]
    #[target_feature(enable = "neon")]
    fn silu4(x: float32x4_t) -> float32x4_t {
        let e = exp4(vsubq_f32(vdupq_n_f32(0.0), x));
        vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0), e))
    }

    #[inline]
    #[target_feature(enable = "neon")]
    fn load(x: &[f32]) -> float32x4_t {
        let a: &[f32; 4] = &x.as_chunks::<4>().0[0];
        // SAFETY: `a` is 4 readable f32; `vld1q` has no alignment requirement.
        unsafe { vld1q_f32(a.as_ptr()) }
    }

    #[inline]
    #[target_feature(enable = "neon")]
    fn store(v: float32x4_t, out: &mut [f32]) {
        let a: &mut [f32; 4] = &mut out.as_chunks_mut::<4>().0[0];
        // SAFETY: `a` is 4 writable f32; `vst1q` has no alignment requirement.
        unsafe { vst1q_f32(a.as_mut_ptr(), v) }
    }

    #[target_feature(enable = "neon")]
    pub(super) fn silu(x: &[f32], out: &mut [f32]) {
        let ve = vec_end(x.len());
        for (xc, oc) in x[..ve].chunks_exact(4).zip(out[..ve].chunks_exact_mut(4)) {
            store(silu4(load(xc)), oc);
        }
        for (o, &v) in out[ve..].iter_mut().zip(&x[ve..]) {
            *o = silu_one(v, false);
        }
    }

    #[target_feature(enable = "neon")]
    pub(super) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let ve = vec_end(gate.len());
        for ((gc, uc), oc) in gate[..ve]
            .chunks_exact(4)
            .zip(up[..ve].chunks_exact(4))
            .zip(out[..ve].chunks_exact_mut(4))
        {
            store(vmulq_f32(silu4(load(gc)), load(uc)), oc);
        }
        for ((o, &g), &u) in out[ve..].iter_mut().zip(&gate[ve..]).zip(&up[ve..]) {
            *o = silu_one(g, false) * u;
        }
    }

    /// Softmax of a visible prefix (see `softmax_visible`).
    #[target_feature(enable = "neon")]
    pub(super) fn softmax(
        x: &[f32],
        scale: f32,
        row_len: usize,
        sink: Option<f32>,
        out: &mut [f32],
    ) {
        let n = x.len();
        if n == 0 {
            return;
        }
        let max = with_sink(scaled_max(x, scale), sink);
        let ve = vec_end(row_len);
        let full = ve.min(n) - ve.min(n) % 4;
        let (vmax, vscale) = (vdupq_n_f32(max), vdupq_n_f32(scale));
        let mut sum = 0f64;
        for (xc, oc) in x[..full]
            .chunks_exact(4)
            .zip(out[..full].chunks_exact_mut(4))
        {
            let val = exp4(vsubq_f32(vmulq_f32(load(xc), vscale), vmax));
            store(val, oc);
            // `vaddvq_f32`: (v0 + v1) + (v2 + v3), as ggml's reduction
            sum += f64::from(vaddvq_f32(val));
        }
        let sum = softmax_rest(x, (scale, max), (full, ve), sink, out, sum);
        let inv = (1.0 / sum) as f32;
        for o in out.iter_mut() {
            *o *= inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_prefix_equals_masked_full_row() {
        // The attention path passes only the visible prefix plus the padded row length; it
        // must equal the public masked softmax over the full padded row.
        let row_len = 40;
        let x: Vec<f32> = (0..row_len)
            .map(|i| ((i * 7919) % 97) as f32 * 0.13 - 5.0)
            .collect();
        for n_vis in [1, 7, 8, 9, 31, 32, 33, 39, 40] {
            let mut full = vec![0f32; row_len];
            softmax_scalar(&x, 0.3, n_vis, &mut full);
            let mut pre = vec![0f32; n_vis];
            softmax_visible(&x[..n_vis], 0.3, row_len, None, &mut pre);
            assert_eq!(pre, full[..n_vis], "n_vis {n_vis}");
            softmax_rows_scalar(&x[..n_vis], 0.3, row_len, None, &mut pre);
            assert_eq!(pre, full[..n_vis], "scalar, n_vis {n_vis}");
        }
    }

    #[test]
    fn exp_split_follows_row_length() {
        // In a row of 11, elements 0..8 use the vector exponential and 8..11 libm expf (on
        // aarch64, whose groups are of 4, too).
        assert_eq!(vec_end(11), 8);
        assert_eq!(
            vec_end(7),
            if cfg!(target_arch = "aarch64") { 4 } else { 0 }
        );
        assert_eq!(vec_end(16), 16);
        let x = [-1.3f32; 11];
        let mut out = [0f32; 11];
        silu_scalar(&x, &mut out);
        assert_eq!(out[0], -1.3 / (1.0 + exp_ggml(1.3)));
        assert_eq!(out[10], -1.3 / (1.0 + 1.3f32.exp()));
    }

    #[test]
    #[cfg(not(target_arch = "aarch64"))]
    fn hsum_group_order() {
        // 1e8 absorbs 1.0 unless the small values are added together first; the expected
        // value follows the grouping ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)).
        let v = [1e8f32, 1.0, -1e8, 1.0, 1.0, 1.0, 1.0, 1.0];
        let want = ((1e8f32 + 1.0) + (-1e8f32 + 1.0)) + ((1.0f32 + 1.0) + (1.0f32 + 1.0));
        assert_eq!(hsum_group(&v), want);
        assert_eq!(want, 4.0);
    }

    #[test]
    #[cfg(target_arch = "aarch64")]
    fn hsum_group_order() {
        // NEON's pairwise sum: (v0+v1)+(v2+v3); 1e8 absorbs the 1.0 added to it first.
        let v = [1e8f32, 1.0, -1e8, 1.0];
        assert_eq!(hsum_group(&v), 0.0);
        let v = [1e8f32, -1e8, 1.0, 1.0];
        assert_eq!(hsum_group(&v), 2.0);
    }
}
