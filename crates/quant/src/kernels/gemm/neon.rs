//! NEON multi-token kernels of the float types in llama.cpp's ARM tinyBLAS order (see
//! `kernels/tinyblas/neon.rs` for the order): per output one accumulator, F32 four f32 lanes
//! updated by a fused multiply-add per group of 4 elements, F16 eight f16 lanes updated by
//! the FP16 `fmla` per group of 8; a last, partial group multiplied zero-padded; then the
//! single-row kernel's reduction. The tile keeps `R · T` such accumulators side by side,
//! loading each weight group once for the `T` tokens and each activation group once for the
//! `R` rows.

use std::arch::aarch64::*;

use super::super::legacy::neon::{fmla_f16, hsum, load_f16x8, widen_f16};
use super::super::tinyblas::neon::{load_f32x4, padded};
use super::check_tile;
use crate::GgmlType;
use crate::kernels::{Kernels, SumOrder};

/// Tile: `R · T` = 16 accumulators, `T` activation vectors and one weight vector in the 32
/// vector registers.
const ROWS: usize = 4;
const TOKENS: usize = 4;

pub(super) fn register(k: &mut Kernels) {
    let o = SumOrder::TinyBlas;
    k.set_dot_tokens_in(o, GgmlType::F32, ROWS, TOKENS, dot_tokens_f32);
    k.set_dot_tokens_in(o, GgmlType::F16, ROWS, TOKENS, dot_tokens_f16);
}

/// The tile over groups of `G` bytes (`n` elements of `S` bytes): `step(acc, x, y)` one
/// group's update, `finish(acc)` an output's reduction.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile<V: Copy, const S: usize, const G: usize>(
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    zero: V,
    load: impl Fn(&[u8]) -> V,
    step: impl Fn(V, V, V) -> V,
    finish: impl Fn(V) -> f32,
) {
    let rb = n * S;
    check_tile(n, 1, w, rb, a, rb, out, (ROWS, TOKENS));
    let wr: [&[u8]; ROWS] = std::array::from_fn(|r| &w[r * rb..(r + 1) * rb]);
    let ar: [&[u8]; TOKENS] = std::array::from_fn(|t| &a[t * rb..(t + 1) * rb]);
    let mut acc = [[zero; TOKENS]; ROWS];
    let whole = rb / G * G;
    let mut o = 0;
    while o < whole {
        let y: [V; TOKENS] = std::array::from_fn(|t| load(&ar[t][o..o + G]));
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = load(&wr[r][o..o + G]);
            for (acc, &y) in acc.iter_mut().zip(&y) {
                *acc = step(*acc, x, y);
            }
        }
        o += G;
    }
    if whole < rb {
        let y: [V; TOKENS] = std::array::from_fn(|t| load(&padded::<G>(&ar[t][whole..])));
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = load(&padded::<G>(&wr[r][whole..]));
            for (acc, &y) in acc.iter_mut().zip(&y) {
                *acc = step(*acc, x, y);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (t, &acc) in acc.iter().enumerate() {
            out[t * ROWS + r] = finish(acc);
        }
    }
}

#[target_feature(enable = "neon")]
fn tile_f32(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    tile::<float32x4_t, 4, 16>(
        n,
        w,
        a,
        out,
        vdupq_n_f32(0.0),
        |b| load_f32x4(b),
        |acc, x, y| vfmaq_f32(acc, x, y),
        |acc| hsum(acc),
    );
}

#[target_feature(enable = "neon,fp16")]
fn tile_f16(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    tile::<uint16x8_t, 2, 16>(
        n,
        w,
        a,
        out,
        vdupq_n_u16(0),
        |b| load_f16x8(b),
        |acc, x, y| fmla_f16(acc, x, y),
        |acc| {
            let (lo, hi) = widen_f16(acc);
            hsum(vaddq_f32(lo, hi))
        },
    );
}

// Registered only in a table built for `Isa::Neon`, which `Kernels::detect` builds only after
// it detected NEON, the dot product and FP16 at run time.
fn dot_tokens_f32(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: only reachable through a NEON table (see above).
    unsafe { tile_f32(n, w, a, out) }
}

fn dot_tokens_f16(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: only reachable through a NEON table (see above), so the CPU has FP16.
    unsafe { tile_f16(n, w, a, out) }
}
