//! AVX2 multi-token kernels of the float types in tinyBLAS order (see `kernels/tinyblas.rs`
//! for the order): per output one 8-lane FMA accumulator over groups of 8 elements, the
//! `n % 8` last elements fused into its first lanes, then tinyBLAS's lane tree. The tile keeps
//! `R · T` such accumulators side by side, loading (and widening) each weight group once for
//! the `T` tokens and each activation group once for the `R` rows.

use std::arch::x86_64::*;

use super::super::legacy::{bf16_to_f32, f16_to_f32};
use super::super::tinyblas::avx2::{finish, load_bf16, load_f16, load_f32};
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
