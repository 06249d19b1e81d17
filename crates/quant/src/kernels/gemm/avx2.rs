//! AVX2 multi-token kernels of the 32-element block types (VecDot order).
//!
//! Q8_0: per (row, token) one 8-lane accumulator, `acc = fma(dx·dy, Σ, acc)` per block with
//! `Σ` the eight i32 sums of four byte products each (the sign trick: `|x|` times `y` carrying
//! `x`'s sign), then the same lane sum as the single-row kernel (`legacy/avx2.rs`). The tile
//! shares `|x|` of a weight block between its tokens and the activation quants and scale
//! between its rows.

use std::arch::x86_64::*;

use super::super::legacy::{Q8_0_BYTES, QK, f16_to_f32};
use super::check_tile;
use crate::GgmlType;
use crate::kernels::{Kernels, SumOrder};

/// Tile of the Q8_0 kernel: `R` weight rows × `T` tokens (`R · T` accumulators, plus the `R`
/// weight vectors, fit the 16 vector registers).
const Q8_0_ROWS: usize = 4;
const Q8_0_TOKENS: usize = 2;

pub(super) fn register(k: &mut Kernels) {
    k.set_dot_tokens_in(
        SumOrder::VecDot,
        GgmlType::Q8_0,
        Q8_0_ROWS,
        Q8_0_TOKENS,
        dot_tokens_q8_0,
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
