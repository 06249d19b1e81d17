//! AVX2 multi-token kernels of the 32-element block types (VecDot order).
//!
//! Q8_0: per (row, token) one 8-lane accumulator, `acc = fma(dx·dy, Σ, acc)` per block with
//! `Σ` the eight i32 sums of four byte products each (the sign trick: `|x|` times `y` carrying
//! `x`'s sign), then the same lane sum as the single-row kernel (`legacy/avx2.rs`). The tile
//! shares `|x|` of a weight block between its tokens and the activation quants and scale
//! between its rows.
//!
//! IQ4_NL and MXFP4 (quants looked up in a 16-entry table): the single-row kernel's order
//! (`blocks_paired` there): even blocks into one 8-lane accumulator and odd blocks into
//! another, `fma(d, Σ, acc)` with `d` the product of the two scales, the lane sum of the two
//! accumulators' sum, and an odd last block added as a scalar `fma(d, lane sum of Σ, total)`.
//! The tile walks its rows one after the other: each weight block is looked up once for the
//! tile's tokens.

use std::arch::x86_64::*;

use super::super::legacy::{IQ4_NL_BYTES, MXFP4_BYTES, Q8_0_BYTES, QK, f16_to_f32};
use super::check_tile;
use crate::GgmlType;
use crate::kernels::{Kernels, SumOrder};
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half};

/// Tile of the Q8_0 kernel: `R` weight rows × `T` tokens (`R · T` accumulators, plus the `R`
/// weight vectors, fit the 16 vector registers).
const Q8_0_ROWS: usize = 4;
const Q8_0_TOKENS: usize = 2;
/// Tile of the IQ4_NL and MXFP4 kernels (rows walked one after the other, so `R` only sets how
/// many a call covers; two accumulators per token).
const LUT_ROWS: usize = 4;
const LUT_TOKENS: usize = 4;

pub(super) fn register(k: &mut Kernels) {
    k.set_dot_tokens_in(
        SumOrder::VecDot,
        GgmlType::Q8_0,
        Q8_0_ROWS,
        Q8_0_TOKENS,
        dot_tokens_q8_0,
    );
    k.set_dot_tokens_in(
        SumOrder::VecDot,
        GgmlType::IQ4_NL,
        LUT_ROWS,
        LUT_TOKENS,
        dot_tokens_iq4_nl,
    );
    k.set_dot_tokens_in(
        SumOrder::VecDot,
        GgmlType::MXFP4,
        LUT_ROWS,
        LUT_TOKENS,
        dot_tokens_mxfp4,
    );
}

#[inline(always)]
fn block(b: &[u8], i: usize) -> &[u8; Q8_0_BYTES] {
    &b[i * Q8_0_BYTES..].as_chunks::<Q8_0_BYTES>().0[0]
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load256(b: &[u8; Q8_0_BYTES]) -> __m256i {
    let q = &b[2..];
    // SAFETY: `q` is 32 readable bytes (a block is 2 scale bytes and 32 quants); `loadu` has
    // no alignment requirement.
    unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
}

#[inline(always)]
fn scale(b: &[u8; Q8_0_BYTES]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// Lane sum as the single-row kernel reduces: upper half plus lower half, then pairwise.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_tile<const R: usize, const T: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let nb = n / QK;
    let rb = nb * Q8_0_BYTES;
    check_tile(n, QK, w, rb, a, rb, out, (R, T));
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for b in 0..nb {
        let mut yq = [_mm256_setzero_si256(); T];
        let mut dy = [_mm256_setzero_ps(); T];
        for t in 0..T {
            let y = block(&a[t * rb..], b);
            yq[t] = load256(y);
            dy[t] = _mm256_set1_ps(scale(y));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = block(&w[r * rb..], b);
            let xq = load256(x);
            let ax = _mm256_sign_epi8(xq, xq);
            let dx = _mm256_set1_ps(scale(x));
            for t in 0..T {
                let p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(yq[t], xq));
                let s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                // dx · dy in every lane: the single-row kernel's scalar product, splat.
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy[t]), s, acc[t]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (t, acc) in acc.iter().enumerate() {
            out[t * R + r] = hsum(*acc);
        }
    }
}

fn dot_tokens_q8_0(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: registered only in the AVX2 table, which `Kernels::detect` builds only after it
    // detected AVX2, FMA and F16C at run time.
    unsafe { q8_0_tile::<Q8_0_ROWS, Q8_0_TOKENS>(n, w, a, out) }
}

/// `a * b + c` with one rounding (scalar FMA), as the single-row kernel adds an odd last block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fma_ss(a: f32, b: f32, c: f32) -> f32 {
    _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)))
}

/// `T` tokens' worth of one row of a lookup-table type (`WB`-byte blocks whose 16 bytes of
/// packed quants start at `qs`, looked up in `table`; `scale(x, y)` the block's product of
/// scales, as the single-row kernel forms it); writes `out[t * stride]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lut_row<const WB: usize, const T: usize>(
    x_row: &[u8],
    a: &[u8],
    nb: usize,
    (qs, table): (usize, __m256i),
    scale: impl Fn(&[u8; WB], &[u8; Q8_0_BYTES]) -> f32,
    out: &mut [f32],
    stride: usize,
) {
    let (x_row, _) = x_row.as_chunks::<WB>();
    let (acts, _) = a.as_chunks::<Q8_0_BYTES>();
    let ones = _mm256_set1_epi16(1);
    let m4 = _mm_set1_epi8(0x0f);
    // Σ of block b for token t, from the block's looked-up quants: `|x|` and x.
    let sums = |ax: __m256i, qx: __m256i, y: &[u8; Q8_0_BYTES]| {
        let p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(load256(y), qx));
        _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones))
    };
    let quants = |x: &[u8; WB]| {
        let q = &x[qs..qs + 16];
        // SAFETY: `q` is 16 readable bytes; `loadu` has no alignment requirement.
        let v = unsafe { _mm_loadu_si128(q.as_ptr().cast()) };
        let both = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_and_si128(v, m4)),
            _mm_and_si128(_mm_srli_epi16::<4>(v), m4),
        );
        let qx = _mm256_shuffle_epi8(table, both);
        (_mm256_sign_epi8(qx, qx), qx)
    };
    let mut acc = [[_mm256_setzero_ps(); T]; 2];
    let pairs = nb / 2;
    for b in 0..2 * pairs {
        let x = &x_row[b];
        let (ax, qx) = quants(x);
        for (t, acc) in acc[b % 2].iter_mut().enumerate() {
            let y = &acts[t * nb + b];
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(scale(x, y)), sums(ax, qx, y), *acc);
        }
    }
    for t in 0..T {
        let mut sum = hsum(_mm256_add_ps(acc[0][t], acc[1][t]));
        if nb % 2 == 1 {
            let (x, y) = (&x_row[nb - 1], &acts[t * nb + nb - 1]);
            let (ax, qx) = quants(x);
            // The lanes hold exact integers and the block sum is below 2^24: the f32 sum is
            // exact, as in the single-row kernel.
            sum = fma_ss(scale(x, y), hsum(sums(ax, qx, y)), sum);
        }
        out[t * stride] = sum;
    }
}

/// The 16-entry table in both 128-bit lanes, for `shuffle_epi8` lookups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lut(t: &[i8; 16]) -> __m256i {
    let b: [u8; 16] = t.map(|v| v as u8);
    // SAFETY: `b` is 16 readable bytes; `loadu` has no alignment requirement.
    _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(b.as_ptr().cast()) })
}

/// `R` rows of a lookup-table type against `T` tokens ([`lut_row`] per row).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn lut_tile<const WB: usize, const R: usize, const T: usize>(
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    qs: usize,
    values: &[i8; 16],
    scale: impl Fn(&[u8; WB], &[u8; Q8_0_BYTES]) -> f32 + Copy,
) {
    let nb = n / QK;
    let rb = nb * WB;
    check_tile(n, QK, w, rb, a, nb * Q8_0_BYTES, out, (R, T));
    let table = lut(values);
    for r in 0..R {
        let row = &w[r * rb..(r + 1) * rb];
        lut_row::<WB, T>(row, a, nb, (qs, table), scale, &mut out[r..], R);
    }
}

fn dot_tokens_iq4_nl(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // the single-row kernel's product: activation scale times weight scale
    let scale = |x: &[u8; IQ4_NL_BYTES], y: &[u8; Q8_0_BYTES]| {
        f16_to_f32(u16::from_le_bytes([y[0], y[1]])) * f16_to_f32(u16::from_le_bytes([x[0], x[1]]))
    };
    // SAFETY: registered only in the AVX2 table, which `Kernels::detect` builds only after it
    // detected AVX2, FMA and F16C at run time.
    unsafe {
        lut_tile::<IQ4_NL_BYTES, LUT_ROWS, LUT_TOKENS>(n, w, a, out, 2, &KVALUES_IQ4NL, scale)
    }
}

fn dot_tokens_mxfp4(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let scale = |x: &[u8; MXFP4_BYTES], y: &[u8; Q8_0_BYTES]| {
        f16_to_f32(u16::from_le_bytes([y[0], y[1]])) * e8m0_to_f32_half(x[0])
    };
    // SAFETY: as in `dot_tokens_iq4_nl`.
    unsafe { lut_tile::<MXFP4_BYTES, LUT_ROWS, LUT_TOKENS>(n, w, a, out, 1, &KVALUES_MXFP4, scale) }
}
