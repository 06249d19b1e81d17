//! AVX2 + FMA + F16C versions of the [`SumOrder::Repacked`] kernels.
//!
//! Each kernel works on up to 8 consecutive weight rows at once, one row per f32 lane, the
//! way llama.cpp's interleaved kernels do: per block, every row's integer block sum is
//! formed in eight i32 partial sums, the eight rows' partial sums are added into one vector
//! holding one row total per lane, and one vector FMA applies the scales. Lane `r` therefore
//! performs exactly the scalar kernel's float operations on row `r`; the single-row kernel
//! is the same code with one row, so every row gives the same bits whichever kernel computes
//! it.
//!
//! Integer products take the activation's magnitude as the unsigned `maddubs` operand and
//! the weight signed by the activation's sign (weights are at most 127 in magnitude, so the
//! negation never wraps, and |a| = 128 is representable unsigned): the sums are exact for
//! every input, and no 16-bit pair sum saturates (at most 2 · 128 · 127).

use std::arch::x86_64::*;

use super::super::legacy::{IQ4_NL_BYTES, MXFP4_BYTES, Q4_0_BYTES, Q8_0_BYTES, QK, f16_to_f32};
use super::{
    GroupedDot, Q4_0_VALUES, Q4K_BYTES, Q4K_D, Q4K_DMIN, Q4K_QS, Q4K_SCALES, Q8K_BYTES, Q8K_QS,
    q4_k_scales_mins, q8_k_sub_sums,
};
use crate::kernels::{DotRows, Kernels, SumOrder};
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half};
use crate::{GgmlType, QK_K};

/// Rows per call of the multi-row kernels.
const ROWS: usize = 8;

pub(super) fn register(k: &mut Kernels) {
    use GgmlType::*;
    let r = SumOrder::Repacked;
    k.set_dot_in(r, Q4_0, dot_q4_0);
    k.set_dot_rows_in(r, Q4_0, ROWS, dot_rows_q4_0);
    k.set_dot_in(r, IQ4_NL, dot_iq4_nl);
    k.set_dot_rows_in(r, IQ4_NL, ROWS, dot_rows_iq4_nl);
    k.set_dot_in(r, MXFP4, dot_mxfp4);
    k.set_dot_rows_in(r, MXFP4, ROWS, dot_rows_mxfp4);
    k.set_dot_in(r, Q4_K, dot_q4_k);
    k.set_dot_rows_in(r, Q4_K, ROWS, dot_rows_q4_k);
}

/// The grouped (gemm-order) Q4_K kernels of this instruction set; the quantizer stays the
/// portable one of `scalar`.
pub(super) fn grouped_q4_k(scalar: GroupedDot) -> GroupedDot {
    GroupedDot {
        dot: dot_q4_k_pairs,
        dot_rows: Some(DotRows {
            rows: ROWS,
            f: dot_rows_q4_k_pairs,
        }),
        ..scalar
    }
}

// ---------------------------------------------------------------------------------------
// Helpers.

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load256(b: &[u8]) -> __m256i {
    let b: &[u8; 32] = &b.as_chunks::<32>().0[0];
    // SAFETY: `b` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load128(b: &[u8]) -> __m128i {
    let b: &[u8; 16] = &b.as_chunks::<16>().0[0];
    // SAFETY: `b` is 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[inline]
fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Lane `r` of the result is the sum of the eight i32 lanes of `v[r]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce8(v: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // Low 128 bits: rows 0-3 (g0) / 4-7 (g1), elements 0-3 of each; high: elements 4-7.
    let g0 = _mm256_hadd_epi32(h01, h23);
    let g1 = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(g0, g1),
        _mm256_permute2x128_si256::<0x31>(g0, g1),
    )
}

/// `R` consecutive weight rows of `nb` blocks of `WB` bytes each.
struct Rows<'a, const R: usize, const WB: usize> {
    rows: [&'a [[u8; WB]]; R],
}

impl<'a, const R: usize, const WB: usize> Rows<'a, R, WB> {
    /// Splits `w` (`R` rows of `nb` blocks) and checks the activation and output lengths;
    /// a violation is a caller bug (see the kernel contracts).
    #[inline]
    fn new(n: usize, qk: usize, w: &'a [u8], a_len: usize, ab: usize, out_len: usize) -> Self {
        let nb = n / qk;
        assert!(
            n.is_multiple_of(qk) && w.len() == R * nb * WB && a_len == nb * ab && out_len == R,
            "repacked-order kernel contract violated: n = {n}, {out_len} outputs for {R} rows, weight bytes {}, activation bytes {a_len}",
            w.len()
        );
        let (blocks, _) = w.as_chunks::<WB>();
        Rows {
            rows: std::array::from_fn(|r| &blocks[r * nb..(r + 1) * nb]),
        }
    }
}

/// Lanes `0..R` of `v` to `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store<const R: usize>(v: __m256, out: &mut [f32]) {
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` is 8 writable f32; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
    out[..R].copy_from_slice(&lanes[..R]);
}

/// The 16-entry table in both 128-bit lanes, for `shuffle_epi8` lookups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lut(t: &[i8; 16]) -> __m256i {
    let b: [u8; 16] = t.map(|v| v as u8);
    _mm256_broadcastsi128_si256(load128(&b))
}

// ---------------------------------------------------------------------------------------
// Q4_0, IQ4_NL, MXFP4: one running total per row.

/// `R` rows of a 32-element lookup-table type (quants from byte `qs` of each block, decoded
/// by `table`, block scale `d_w`) against one Q8_0 row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lut4_rows<const R: usize, const WB: usize>(
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    qs: usize,
    table: &[i8; 16],
    d_w: impl Fn(&[u8; WB]) -> f32,
) {
    let rows = Rows::<R, WB>::new(n, QK, w, a.len(), Q8_0_BYTES, out.len());
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let table = lut(table);
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (b, y) in a.iter().enumerate() {
        let ya = load256(&y[2..]);
        let ya_abs = _mm256_sign_epi8(ya, ya);
        let mut sums = [_mm256_setzero_si256(); 8];
        let mut dw = [0f32; 8];
        for r in 0..R {
            let x = &rows.rows[r][b];
            let raw = load128(&x[qs..]);
            // Elements 0..16 are the low nibbles, 16..32 the high nibbles.
            let nib = _mm256_and_si256(
                _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(raw), _mm_srli_epi16::<4>(raw)),
                m4,
            );
            let xv = _mm256_shuffle_epi8(table, nib);
            let p = _mm256_maddubs_epi16(ya_abs, _mm256_sign_epi8(xv, ya));
            sums[r] = _mm256_madd_epi16(p, ones);
            dw[r] = d_w(x);
        }
        // SAFETY: `dw` is 8 readable f32; `loadu` has no alignment requirement.
        let dw = unsafe { _mm256_loadu_ps(dw.as_ptr()) };
        let scale = _mm256_mul_ps(dw, _mm256_set1_ps(f16_to_f32(le16(y, 0))));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(&sums)), scale, acc);
    }
    store::<R>(acc, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_rows<const R: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    lut4_rows::<R, Q4_0_BYTES>(n, w, a, out, 2, &Q4_0_VALUES, |x| f16_to_f32(le16(x, 0)));
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl_rows<const R: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    lut4_rows::<R, IQ4_NL_BYTES>(n, w, a, out, 2, &KVALUES_IQ4NL, |x| f16_to_f32(le16(x, 0)));
}

#[target_feature(enable = "avx2,fma,f16c")]
fn mxfp4_rows<const R: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    lut4_rows::<R, MXFP4_BYTES>(n, w, a, out, 1, &KVALUES_MXFP4, |x| e8m0_to_f32_half(x[0]));
}

// ---------------------------------------------------------------------------------------
// Q4_K.

/// `R` rows of Q4_K against one Q8_K row; `PAIRS` selects the gemm order (float steps per
/// pair of sub-blocks) over the gemv order (per super-block).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k_rows<const R: usize, const PAIRS: bool>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let rows = Rows::<R, Q4K_BYTES>::new(n, QK_K, w, a.len(), Q8K_BYTES, out.len());
    let (a, _) = a.as_chunks::<Q8K_BYTES>();
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = _mm256_setzero_ps();
    for (b, y) in a.iter().enumerate() {
        let sub_sums = q8_k_sub_sums(y);
        let mut scales = [[0i16; 8]; 8];
        // Per pair of sub-blocks, each row's min terms.
        let mut mins = [[0i32; 8]; 4];
        let mut dw = [0f32; 8];
        let mut dmin = [0f32; 8];
        for r in 0..R {
            let x = &rows.rows[r][b];
            let (sc, mn) = q4_k_scales_mins(&x[Q4K_SCALES..Q4K_SCALES + 12]);
            scales[r] = sc.map(i16::from);
            for (p, m) in mins.iter_mut().enumerate() {
                m[r] = i32::from(mn[2 * p]) * sub_sums[2 * p]
                    + i32::from(mn[2 * p + 1]) * sub_sums[2 * p + 1];
            }
            dw[r] = f16_to_f32(le16(x, Q4K_D));
            dmin[r] = f16_to_f32(le16(x, Q4K_DMIN));
        }
        let da = _mm256_set1_ps(f32::from_le_bytes([y[0], y[1], y[2], y[3]]));
        // SAFETY: `dw` and `dmin` are 8 readable f32 each; `loadu` has no alignment
        // requirement.
        let (d, dm) = unsafe { (_mm256_loadu_ps(dw.as_ptr()), _mm256_loadu_ps(dmin.as_ptr())) };
        let d = _mm256_mul_ps(d, da);
        let dm = _mm256_mul_ps(dm, da);
        let mut total = _mm256_setzero_si256();
        for p in 0..4 {
            let ya = load256(&y[Q8K_QS + 64 * p..]);
            let yb = load256(&y[Q8K_QS + 64 * p + 32..]);
            let (ya_abs, yb_abs) = (_mm256_sign_epi8(ya, ya), _mm256_sign_epi8(yb, yb));
            let mut sums = [_mm256_setzero_si256(); 8];
            for r in 0..R {
                let raw = load256(&rows.rows[r][b][Q4K_QS + 32 * p..]);
                let lo = _mm256_and_si256(raw, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                let plo = _mm256_maddubs_epi16(ya_abs, _mm256_sign_epi8(lo, ya));
                let phi = _mm256_maddubs_epi16(yb_abs, _mm256_sign_epi8(hi, yb));
                sums[r] = _mm256_add_epi32(
                    _mm256_madd_epi16(plo, _mm256_set1_epi16(scales[r][2 * p])),
                    _mm256_madd_epi16(phi, _mm256_set1_epi16(scales[r][2 * p + 1])),
                );
            }
            let pair = reduce8(&sums);
            if PAIRS {
                // SAFETY: `mins[p]` is 8 readable i32; `loadu` has no alignment requirement.
                let mv = unsafe { _mm256_loadu_si256(mins[p].as_ptr().cast()) };
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair), d, acc);
                acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mv), dm, acc_min);
            } else {
                total = _mm256_add_epi32(total, pair);
            }
        }
        if !PAIRS {
            let mut m = [0i32; 8];
            for (r, v) in m.iter_mut().enumerate() {
                *v = mins[0][r] + mins[1][r] + mins[2][r] + mins[3][r];
            }
            // SAFETY: `m` is 8 readable i32; `loadu` has no alignment requirement.
            let mv = unsafe { _mm256_loadu_si256(m.as_ptr().cast()) };
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), d, acc);
            acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mv), dm, acc_min);
        }
    }
    store::<R>(_mm256_sub_ps(acc, acc_min), out);
}

// ---------------------------------------------------------------------------------------
// DotFn / DotRowsFn wrappers. They are registered only in a table built for `Isa::Avx2`,
// which `Kernels::detect` builds only after it detected AVX2, FMA and F16C at run time.

macro_rules! wrap {
    ($($one:ident, $many:ident => $imp:ident $(::<$pairs:literal>)?;)*) => {$(
        fn $one(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let mut out = [0f32];
            // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the
            // features the kernel is compiled for.
            unsafe { $imp::<1 $(, $pairs)?>(n, w, a, &mut out) };
            out[0]
        }
        fn $many(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
            // SAFETY: as above.
            unsafe { $imp::<ROWS $(, $pairs)?>(n, w, a, out) }
        }
    )*};
}

wrap! {
    dot_q4_0, dot_rows_q4_0 => q4_0_rows;
    dot_iq4_nl, dot_rows_iq4_nl => iq4_nl_rows;
    dot_mxfp4, dot_rows_mxfp4 => mxfp4_rows;
    dot_q4_k, dot_rows_q4_k => q4_k_rows::<false>;
    dot_q4_k_pairs, dot_rows_q4_k_pairs => q4_k_rows::<true>;
}
