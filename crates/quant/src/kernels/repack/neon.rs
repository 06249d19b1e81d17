//! The orders of llama.cpp's ARM repacked kernels (NEON + dotprod, no I8MM), on plain rows.
//!
//! On that feature level llama.cpp interleaves Q4_0 and Q8_0 matrices whose row count is a
//! multiple of 4 four rows at a time ("4x4") and multiplies them with its own gemv (one
//! activation row) and gemm (four activation rows) kernels. Per output both walk the blocks in
//! order with one f32 running sum; they differ in one step, as the compiled reference shows:
//!
//! * gemv (Q4_0, Q8_0) and Q4_0's gemm (hand-written assembly): `acc = fma(Σ, d_a · d_w, acc)`.
//! * Q8_0's gemm: `acc = acc + (d_w · d_a) · Σ`, a multiply then an add.
//!
//! `Σ` is the block's exact integer sum (Q4_0's gemv converts `16 Σ` with 4 fraction bits:
//! the same value). The interleaving itself changes nothing per output, so these kernels read
//! the rows as stored. Which activation rows take the gemm: the first `n - n % 4` of a plain
//! product (llama.cpp's expert products take the gemv for every row), see
//! [`super::GroupedDot`].
//!
//! IQ4_NL and MXFP4 are repacked 4x4 too; their gemv and gemm (NEON intrinsics) both take
//! `acc = acc + (d_a · d_w) · Σ`, a multiply then an add (the compiled reference does not
//! fuse them), `Σ` over the table values (MXFP4's doubled, with half its E8M0 scale).
//!
//! The multi-row and multi-token kernels of these orders are in `neon/tiles.rs`.

use super::super::act::quantize_q8_0_neon;
use super::super::legacy::neon::{
    dot32, f16_at, load_s8, load_table, lut_block, q4_0_quants, total,
};
use super::super::legacy::{IQ4_NL_BYTES, MXFP4_BYTES, Q4_0_BYTES, Q8_0_BYTES, check_blocks};
use super::{GroupedDot, Kernels, SumOrder};
use crate::GgmlType;
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half};

mod tiles;

pub(super) fn register(k: &mut Kernels) {
    use GgmlType::*;
    let r = SumOrder::Repacked;
    k.set_dot_in(r, Q4_0, dot_q4_0);
    k.set_dot_in(r, Q8_0, dot_q8_0);
    k.set_dot_in(r, IQ4_NL, dot_iq4_nl);
    k.set_dot_in(r, MXFP4, dot_mxfp4);
    for ty in [Q4_0, Q8_0, IQ4_NL, MXFP4] {
        if let Some((rows, tokens)) = tiles::kernels(ty, false) {
            k.set_dot_rows_in(r, ty, rows.rows, rows.f);
            k.set_dot_tokens_in(r, ty, tokens.rows, tokens.tokens, tokens.f);
        }
    }
}

/// The Q8_0 gemm's order for the grouped activation rows.
pub(super) fn grouped_q8_0() -> GroupedDot {
    let gemm = tiles::kernels(GgmlType::Q8_0, true);
    GroupedDot {
        group: 4,
        dot: dot_q8_0_gemm,
        dot_rows: gemm.map(|(r, _)| r),
        dot_tokens: gemm.map(|(_, t)| t),
        quantize: quantize_q8_0_neon,
    }
}

#[inline]
#[target_feature(enable = "neon,dotprod")]
fn q8_0_sum(x: &[u8; Q8_0_BYTES], y: &[u8; Q8_0_BYTES]) -> f32 {
    use super::super::legacy::neon::arr;
    total(dot32(
        load_s8(arr(&x[2..])),
        load_s8(arr(&x[18..])),
        &y[2..],
    ))
}

#[target_feature(enable = "neon,dotprod")]
fn q8_0_gemv(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q8_0_BYTES, a, Q8_0_BYTES);
    let (w, _) = w.as_chunks::<Q8_0_BYTES>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut acc = 0f32;
    for (x, y) in w.iter().zip(a) {
        acc = q8_0_sum(x, y).mul_add(f16_at(y, 0) * f16_at(x, 0), acc);
    }
    acc
}

#[target_feature(enable = "neon,dotprod")]
fn q8_0_gemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q8_0_BYTES, a, Q8_0_BYTES);
    let (w, _) = w.as_chunks::<Q8_0_BYTES>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut acc = 0f32;
    for (x, y) in w.iter().zip(a) {
        acc += f16_at(x, 0) * f16_at(y, 0) * q8_0_sum(x, y);
    }
    acc
}

#[target_feature(enable = "neon,dotprod")]
fn q4_0_gemv(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q4_0_BYTES, a, Q8_0_BYTES);
    let (w, _) = w.as_chunks::<Q4_0_BYTES>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut acc = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (lo, hi) = q4_0_quants(&x[2..]);
        let s = total(dot32(lo, hi, &y[2..]));
        acc = s.mul_add(f16_at(y, 0) * f16_at(x, 0), acc);
    }
    acc
}

#[target_feature(enable = "neon,dotprod")]
fn iq4_nl_4x4(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, IQ4_NL_BYTES, a, Q8_0_BYTES);
    let table = load_table(&KVALUES_IQ4NL);
    let (w, _) = w.as_chunks::<IQ4_NL_BYTES>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut acc = 0f32;
    for (x, y) in w.iter().zip(a) {
        acc += f16_at(y, 0) * f16_at(x, 0) * lut_block(table, &x[2..], y);
    }
    acc
}

#[target_feature(enable = "neon,dotprod")]
fn mxfp4_4x4(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, MXFP4_BYTES, a, Q8_0_BYTES);
    let table = load_table(&KVALUES_MXFP4);
    let (w, _) = w.as_chunks::<MXFP4_BYTES>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut acc = 0f32;
    for (x, y) in w.iter().zip(a) {
        acc += f16_at(y, 0) * e8m0_to_f32_half(x[0]) * lut_block(table, &x[1..], y);
    }
    acc
}

// DotFn wrappers: registered only in a table built for `Isa::Neon`, which `Kernels::detect`
// builds only after it detected NEON, the dot product and FP16 at run time.

fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: only reachable through a NEON table (see above).
    unsafe { q8_0_gemv(n, w, a) }
}

fn dot_q8_0_gemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: as for `dot_q8_0`.
    unsafe { q8_0_gemm(n, w, a) }
}

fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: as for `dot_q8_0`.
    unsafe { q4_0_gemv(n, w, a) }
}

fn dot_iq4_nl(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: as for `dot_q8_0`.
    unsafe { iq4_nl_4x4(n, w, a) }
}

fn dot_mxfp4(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: as for `dot_q8_0`.
    unsafe { mxfp4_4x4(n, w, a) }
}
