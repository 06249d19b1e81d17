//! AVX2 multi-token kernels of the float types in tinyBLAS order (see `kernels/tinyblas.rs`
//! for the order): per output one 8-lane FMA accumulator over groups of 8 elements, the
//! `n % 8` last elements fused into its first lanes, then tinyBLAS's lane tree. The tile keeps
//! `R · T` such accumulators side by side, loading (and widening) each weight group once for
//! the `T` tokens and each activation group once for the `R` rows.

use std::arch::x86_64::*;

use super::super::legacy::{bf16_to_f32, f16_to_f32};
use super::super::tinyblas::{LANES, hsum8};
use super::check_tile;
use crate::GgmlType;
use crate::kernels::{Kernels, SumOrder};

/// Tile: `R · T` accumulators plus `T` activation vectors and one weight vector fill the 16
/// vector registers. Measured (one thread, 2048×2048, 82 tokens, CPU time against the
/// 4-row kernel): F16 1.35×, F32 1.45×.
const ROWS: usize = 4;
const TOKENS: usize = 3;

pub(super) fn register(k: &mut Kernels) {
    let o = SumOrder::TinyBlas;
    k.set_dot_tokens_in(o, GgmlType::F32, ROWS, TOKENS, dot_tokens_f32);
    k.set_dot_tokens_in(o, GgmlType::F16, ROWS, TOKENS, dot_tokens_f16);
    k.set_dot_tokens_in(o, GgmlType::BF16, ROWS, TOKENS, dot_tokens_bf16);
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_f32(b: &[u8; 32]) -> __m256 {
    // SAFETY: `b` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_ps(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_f16(b: &[u8; 16]) -> __m256 {
    // SAFETY: `b` is 16 readable bytes; `loadu` has no alignment requirement.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(b.as_ptr().cast()) })
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_bf16(b: &[u8; 16]) -> __m256 {
    // SAFETY: `b` is 16 readable bytes; `loadu` has no alignment requirement.
    let h = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

/// tinyBLAS's horizontal sum (the same adds as [`hsum8`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)))
}

/// The lane sum of `acc` after the tail elements (`wt`, `at`) went into its first lanes, as
/// the single-row kernel finishes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn finish<const S: usize>(acc: __m256, wt: &[u8], at: &[u8], elem: impl Fn([u8; S]) -> f32) -> f32 {
    if wt.is_empty() {
        return hsum(acc);
    }
    let mut lanes = [0f32; LANES];
    // SAFETY: `lanes` is 8 writable f32; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    let (wt, _) = wt.as_chunks::<S>();
    let (at, _) = at.as_chunks::<S>();
    for ((l, x), y) in lanes.iter_mut().zip(wt).zip(at) {
        *l = elem(*x).mul_add(elem(*y), *l);
    }
    hsum8(&lanes)
}

/// The tile: `S` bytes per element, `G = 8 · S` bytes per group of 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile<const S: usize, const G: usize, const R: usize, const T: usize>(
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    load: impl Fn(&[u8; G]) -> __m256,
    elem: impl Fn([u8; S]) -> f32 + Copy,
) {
    let rb = n * S;
    check_tile(n, 1, w, rb, a, rb, out, (R, T));
    let ng = n / 8;
    let group = |b: &[u8], row: usize, g: usize| -> __m256 {
        assert!(g < ng && (row + 1) * rb <= b.len());
        // SAFETY: g < ng = n / 8 gives row * rb + g * G + G <= row * rb + rb <= b.len()
        // (asserted); [u8; G] has alignment 1.
        load(unsafe { &*b.as_ptr().add(row * rb + g * G).cast::<[u8; G]>() })
    };
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for g in 0..ng {
        let mut y = [_mm256_setzero_ps(); T];
        for (t, y) in y.iter_mut().enumerate() {
            *y = group(a, t, g);
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = group(w, r, g);
            for t in 0..T {
                acc[t] = _mm256_fmadd_ps(x, y[t], acc[t]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let wt = &w[r * rb + ng * G..(r + 1) * rb];
        for (t, acc) in acc.iter().enumerate() {
            let at = &a[t * rb + ng * G..(t + 1) * rb];
            out[t * R + r] = finish(*acc, wt, at, elem);
        }
    }
}

fn f32_elem(b: [u8; 4]) -> f32 {
    f32::from_le_bytes(b)
}

fn f16_elem(b: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

fn bf16_elem(b: [u8; 2]) -> f32 {
    bf16_to_f32(u16::from_le_bytes(b))
}

// Registered only in the AVX2 table, which `Kernels::detect` builds only after it detected
// AVX2, FMA and F16C at run time.

fn dot_tokens_f32(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: only reachable through the AVX2 table (see above).
    unsafe { tile::<4, 32, ROWS, TOKENS>(n, w, a, out, |b| load_f32(b), f32_elem) }
}

fn dot_tokens_f16(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: only reachable through the AVX2 table (see above).
    unsafe { tile::<2, 16, ROWS, TOKENS>(n, w, a, out, |b| load_f16(b), f16_elem) }
}

fn dot_tokens_bf16(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: only reachable through the AVX2 table (see above).
    unsafe { tile::<2, 16, ROWS, TOKENS>(n, w, a, out, |b| load_bf16(b), bf16_elem) }
}
