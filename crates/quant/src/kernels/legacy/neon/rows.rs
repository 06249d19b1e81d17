//! Multi-row NEON kernels ([`crate::kernels::DotRowsFn`]): several consecutive weight rows,
//! read in place, against one activation row.
//!
//! Each row keeps the exact floating-point operations of its single-row kernel in `neon.rs`
//! (same accumulators, same block pairs, same products and fused multiply-adds, same
//! reductions, same tail of an odd last block), so every result is bit-identical to the
//! single-row one. The rows share what depends only on the activation: the loads of its
//! quants and the conversion of its block scale (F16: the loads of its elements). The
//! integer block sums are exact whatever the order, so they may be formed differently.
//!
//! * Q8_0, Q4_0: two f32x4 accumulators per row (even and odd blocks), as `pairs`.
//! * IQ4_NL, MXFP4: the single-row kernels keep one scalar sum; here the four rows' sums
//!   are the four lanes of one vector, and each scalar step (products, fused multiply-adds,
//!   additions) is the same IEEE operation done lane by lane, on the same operands in the
//!   same roles. The four block totals of a block come from one pairwise reduction.
//! * F16: four f16x8 accumulators per row (16 registers for 4 rows; aarch64 has 32).

use std::arch::aarch64::*;

use super::super::{IQ4_NL_BYTES, MXFP4_BYTES, Q4_0_BYTES, Q8_0_BYTES, QK};
use super::{
    arr, f16_at, f16_finish, fmla_f16, hsum, load_f16x8, load_s8, load_table, nibbles, q4_0_quants,
    sdot, total,
};
use crate::GgmlType;
use crate::kernels::Kernels;
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half};

/// Rows per call, by type. The lane-per-row kernels (IQ4_NL, MXFP4) take exactly four.
const Q8_0_ROWS: usize = 4;
const Q4_0_ROWS: usize = 4;
const LANES: usize = 4;
const F16_ROWS: usize = 4;

pub(super) fn register(k: &mut Kernels) {
    use GgmlType::*;
    k.set_dot_rows(Q8_0, Q8_0_ROWS, dot_rows_q8_0);
    k.set_dot_rows(Q4_0, Q4_0_ROWS, dot_rows_q4_0);
    k.set_dot_rows(IQ4_NL, LANES, dot_rows_iq4_nl);
    k.set_dot_rows(MXFP4, LANES, dot_rows_mxfp4);
    k.set_dot_rows(F16, F16_ROWS, dot_rows_f16);
    k.set_dot_tokens_in(
        crate::kernels::SumOrder::VecDot,
        Q8_0,
        Q8_0_TILE.0,
        Q8_0_TILE.1,
        dot_tokens_q8_0,
    );
}

/// The Q8_0 multi-token tile (rows × tokens): two f32x4 accumulators per output, 16 in all.
const Q8_0_TILE: (usize, usize) = (4, 2);

// ---------------------------------------------------------------------------------------
// Helpers.

/// A Q8_0 activation block.
type ActBlock = [u8; Q8_0_BYTES];

/// Asserts the [`crate::kernels::DotRowsFn`] contract for a 32-element block type and
/// returns the number of blocks per row.
#[inline]
fn check_rows(n: usize, w: &[u8], w_bytes: usize, a: &[u8], out: &[f32], rows: usize) -> usize {
    let nb = n / QK;
    assert!(
        n.is_multiple_of(QK)
            && out.len() == rows
            && w.len() == rows * nb * w_bytes
            && a.len() == nb * Q8_0_BYTES,
        "dot_rows kernel contract violated: n = {n}, {} rows (kernel takes {rows}), weight bytes {}, activation bytes {}",
        out.len(),
        w.len(),
        a.len()
    );
    nb
}

/// `w` as `R` rows of `nb` blocks of `WB` bytes (`w.len() == R * nb * WB`, checked).
#[inline]
fn split<const R: usize, const WB: usize>(w: &[u8], nb: usize) -> [&[[u8; WB]]; R] {
    std::array::from_fn(|r| w[r * nb * WB..(r + 1) * nb * WB].as_chunks::<WB>().0)
}

/// The quants of a Q8_0 activation block as two vectors, and its scale.
#[inline]
#[target_feature(enable = "neon")]
fn act(y: &ActBlock) -> (int8x16_t, int8x16_t, f32) {
    (load_s8(arr(&y[2..])), load_s8(arr(&y[18..])), f16_at(y, 0))
}

/// `Σ lo · y[0..16] + Σ hi · y[16..32]` in four lanes (as `super::dot32`).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn dot32(lo: int8x16_t, hi: int8x16_t, ylo: int8x16_t, yhi: int8x16_t) -> int32x4_t {
    sdot(sdot(vdupq_n_s32(0), lo, ylo), hi, yhi)
}

/// The totals of four i32x4 vectors, one per lane (exact, as integers).
#[inline]
#[target_feature(enable = "neon")]
fn totals4(v: [int32x4_t; LANES]) -> int32x4_t {
    vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]))
}

/// Four f32 as a vector.
#[inline]
#[target_feature(enable = "neon")]
fn f32x4(v: [f32; LANES]) -> float32x4_t {
    // SAFETY: `v` is four readable f32; `vld1q_f32` needs only f32 alignment.
    unsafe { vld1q_f32(v.as_ptr()) }
}

// ---------------------------------------------------------------------------------------
// Q8_0 and Q4_0: two f32x4 accumulators per row, as `super::pairs`.

/// ggml's pair loop over `R` rows: block 2p into the even accumulator of each row, block
/// 2p + 1 into the odd one, each step `acc + float(sums) · (d_w · d_a)`; then per row the
/// two reduced accumulators added, and an odd last block by `tail(sum, total, d_w, d_a)`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn vector_pairs<const R: usize, const WB: usize>(
    rows: [&[[u8; WB]]; R],
    a: &[ActBlock],
    out: &mut [f32],
    quants: impl Fn(&[u8; WB]) -> (int8x16_t, int8x16_t),
    tail: impl Fn(f32, f32, f32, f32) -> f32,
) {
    let nb = a.len();
    let mut acc0 = [vdupq_n_f32(0.0); R];
    let mut acc1 = [vdupq_n_f32(0.0); R];
    for p in 0..nb / 2 {
        for (b, acc) in [(2 * p, &mut acc0), (2 * p + 1, &mut acc1)] {
            let (ylo, yhi, dy) = act(&a[b]);
            for (acc, row) in acc.iter_mut().zip(rows) {
                let x = &row[b];
                let (lo, hi) = quants(x);
                let s = dot32(lo, hi, ylo, yhi);
                *acc = vaddq_f32(*acc, vmulq_n_f32(vcvtq_f32_s32(s), f16_at(x, 0) * dy));
            }
        }
    }
    let last = (nb % 2 == 1).then(|| act(&a[nb - 1]));
    for (r, (o, row)) in out.iter_mut().zip(rows).enumerate() {
        let sum = hsum(acc0[r]) + hsum(acc1[r]);
        *o = match last {
            Some((ylo, yhi, dy)) => {
                let x = &row[nb - 1];
                let (lo, hi) = quants(x);
                tail(sum, total(dot32(lo, hi, ylo, yhi)), f16_at(x, 0), dy)
            }
            None => sum,
        };
    }
}

/// [`vector_pairs`] for `R` rows × `T` activation rows (`out[t * R + r]`): each weight
/// block's quants and scale are loaded once for the `T` tokens; every output keeps its own
/// two accumulators and the single-row kernel's steps.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn vector_pairs_tile<const R: usize, const T: usize, const WB: usize>(
    rows: [&[[u8; WB]]; R],
    acts: [&[ActBlock]; T],
    out: &mut [f32],
    quants: impl Fn(&[u8; WB]) -> (int8x16_t, int8x16_t),
    tail: impl Fn(f32, f32, f32, f32) -> f32,
) {
    let nb = acts[0].len();
    let mut acc0 = [[vdupq_n_f32(0.0); R]; T];
    let mut acc1 = [[vdupq_n_f32(0.0); R]; T];
    for p in 0..nb / 2 {
        for (b, acc) in [(2 * p, &mut acc0), (2 * p + 1, &mut acc1)] {
            let q: [(int8x16_t, int8x16_t, f32); R] = std::array::from_fn(|r| {
                let x = &rows[r][b];
                let (lo, hi) = quants(x);
                (lo, hi, f16_at(x, 0))
            });
            for (acc, y) in acc.iter_mut().zip(acts) {
                let (ylo, yhi, dy) = act(&y[b]);
                for (acc, &(lo, hi, dx)) in acc.iter_mut().zip(&q) {
                    let s = dot32(lo, hi, ylo, yhi);
                    *acc = vaddq_f32(*acc, vmulq_n_f32(vcvtq_f32_s32(s), dx * dy));
                }
            }
        }
    }
    for (t, y) in acts.iter().enumerate() {
        let last = (nb % 2 == 1).then(|| act(&y[nb - 1]));
        for (r, row) in rows.iter().enumerate() {
            let sum = hsum(acc0[t][r]) + hsum(acc1[t][r]);
            out[t * R + r] = match last {
                Some((ylo, yhi, dy)) => {
                    let x = &row[nb - 1];
                    let (lo, hi) = quants(x);
                    tail(sum, total(dot32(lo, hi, ylo, yhi)), f16_at(x, 0), dy)
                }
                None => sum,
            };
        }
    }
}

#[target_feature(enable = "neon,dotprod")]
fn q8_0_tile(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    const R: usize = Q8_0_TILE.0;
    const T: usize = Q8_0_TILE.1;
    let nb = n / QK;
    assert!(
        n.is_multiple_of(QK)
            && w.len() == R * nb * Q8_0_BYTES
            && a.len() == T * nb * Q8_0_BYTES
            && out.len() == R * T,
        "Q8_0 tile contract violated: n = {n}, weight bytes {} ({R} rows), activation bytes \
         {} ({T} rows), {} outputs",
        w.len(),
        a.len(),
        out.len()
    );
    let rows = split::<R, Q8_0_BYTES>(w, nb);
    let acts: [&[ActBlock]; T] = std::array::from_fn(|t| {
        a[t * nb * Q8_0_BYTES..(t + 1) * nb * Q8_0_BYTES]
            .as_chunks::<Q8_0_BYTES>()
            .0
    });
    vector_pairs_tile(
        rows,
        acts,
        out,
        |x| (load_s8(arr(&x[2..])), load_s8(arr(&x[18..]))),
        // sum + sums · (d_w · d_a), fused
        |sum, s, dx, dy| s.mul_add(dx * dy, sum),
    );
}

#[target_feature(enable = "neon,dotprod")]
fn q8_0_rows<const R: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let nb = check_rows(n, w, Q8_0_BYTES, a, out, R);
    let rows = split::<R, Q8_0_BYTES>(w, nb);
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    vector_pairs(
        rows,
        a,
        out,
        |x| (load_s8(arr(&x[2..])), load_s8(arr(&x[18..]))),
        // sum + sums · (d_w · d_a), fused
        |sum, s, dx, dy| s.mul_add(dx * dy, sum),
    );
}

#[target_feature(enable = "neon,dotprod")]
fn q4_0_rows<const R: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let nb = check_rows(n, w, Q4_0_BYTES, a, out, R);
    let rows = split::<R, Q4_0_BYTES>(w, nb);
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    vector_pairs(
        rows,
        a,
        out,
        |x| q4_0_quants(&x[2..]),
        // sum + (sums · d_w) · d_a, the second product fused
        |sum, s, dx, dy| (s * dx).mul_add(dy, sum),
    );
}

// ---------------------------------------------------------------------------------------
// IQ4_NL and MXFP4: one lane per row.

/// The block totals of block `b` of the four rows (the 32 table values of the nibbles at
/// `qs` of each weight block times the activation quants), one per lane, as f32 (exact).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn lut_totals<const WB: usize>(
    table: int8x16_t,
    rows: [&[[u8; WB]]; LANES],
    b: usize,
    qs: usize,
    y: &ActBlock,
) -> float32x4_t {
    let (ylo, yhi, _) = act(y);
    let s = rows.map(|row| {
        let (lo, hi) = nibbles(arr(&row[b][qs..]));
        dot32(vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi), ylo, yhi)
    });
    vcvtq_f32_s32(totals4(s))
}

#[target_feature(enable = "neon,dotprod")]
fn iq4_nl_rows(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let nb = check_rows(n, w, IQ4_NL_BYTES, a, out, LANES);
    let rows = split::<LANES, IQ4_NL_BYTES>(w, nb);
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let table = load_table(&KVALUES_IQ4NL);
    let dx = |b: usize| f32x4(rows.map(|row| f16_at(&row[b], 0)));
    let mut sum = vdupq_n_f32(0.0);
    for p in 0..nb / 2 {
        let (b0, b1) = (2 * p, 2 * p + 1);
        let s0 = lut_totals(table, rows, b0, 2, &a[b0]);
        let s1 = lut_totals(table, rows, b1, 2, &a[b1]);
        // d = d_w · d_a
        let d0 = vmulq_n_f32(dx(b0), f16_at(&a[b0], 0));
        let d1 = vmulq_n_f32(dx(b1), f16_at(&a[b1], 0));
        // sum + fma(d0, s0, s1 · d1)
        sum = vaddq_f32(sum, vfmaq_f32(vmulq_f32(s1, d1), d0, s0));
    }
    if nb % 2 == 1 {
        let b = nb - 1;
        let s = lut_totals(table, rows, b, 2, &a[b]);
        // fma(s, d_a · d_w, sum)
        let d = vmulq_f32(vdupq_n_f32(f16_at(&a[b], 0)), dx(b));
        sum = vfmaq_f32(sum, s, d);
    }
    // SAFETY: `sum` is four f32 and `out` holds four (checked above).
    unsafe { vst1q_f32(out.as_mut_ptr(), sum) }
}

/// `d_a · e8m0(x)` of block `b` of the four rows, one per lane.
#[inline]
#[target_feature(enable = "neon")]
fn mxfp4_scales(rows: [&[[u8; MXFP4_BYTES]]; LANES], b: usize, y: &ActBlock) -> float32x4_t {
    let e = f32x4(rows.map(|row| e8m0_to_f32_half(row[b][0])));
    vmulq_f32(vdupq_n_f32(f16_at(y, 0)), e)
}

#[target_feature(enable = "neon,dotprod")]
fn mxfp4_rows(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let nb = check_rows(n, w, MXFP4_BYTES, a, out, LANES);
    let rows = split::<LANES, MXFP4_BYTES>(w, nb);
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let table = load_table(&KVALUES_MXFP4);
    let mut sum = vdupq_n_f32(0.0);
    for p in 0..nb / 2 {
        let (b0, b1) = (2 * p, 2 * p + 1);
        let s0 = lut_totals(table, rows, b0, 1, &a[b0]);
        let s1 = lut_totals(table, rows, b1, 1, &a[b1]);
        // sum + fma(s1, d1, s0 · d0)
        let (d0, d1) = (
            mxfp4_scales(rows, b0, &a[b0]),
            mxfp4_scales(rows, b1, &a[b1]),
        );
        sum = vaddq_f32(sum, vfmaq_f32(vmulq_f32(s0, d0), s1, d1));
    }
    if nb % 2 == 1 {
        let b = nb - 1;
        let s = lut_totals(table, rows, b, 1, &a[b]);
        // fma(s, d_a · e8m0(x), sum)
        sum = vfmaq_f32(sum, s, mxfp4_scales(rows, b, &a[b]));
    }
    // SAFETY: `sum` is four f32 and `out` holds four (checked above).
    unsafe { vst1q_f32(out.as_mut_ptr(), sum) }
}

// ---------------------------------------------------------------------------------------
// F16: four f16x8 accumulators per row over 32 elements per step, as `super::f16_neon`.

#[target_feature(enable = "neon,fp16")]
fn f16_rows<const R: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    assert!(
        out.len() == R && w.len() == R * n * 2 && a.len() == n * 2,
        "dot_rows kernel contract violated: n = {n}, {} rows (kernel takes {R}), weight bytes {}, activation bytes {}",
        out.len(),
        w.len(),
        a.len()
    );
    let np = n & !31;
    let rows: [&[u8]; R] = std::array::from_fn(|r| &w[r * 2 * n..(r + 1) * 2 * n]);
    let steps = rows.map(|row| row[..2 * np].as_chunks::<64>().0);
    let mut acc = [[vdupq_n_u16(0); 4]; R];
    for (s, y) in a[..2 * np].as_chunks::<64>().0.iter().enumerate() {
        let yv = [0, 1, 2, 3].map(|j| load_f16x8(&y[16 * j..]));
        for (acc, x) in acc.iter_mut().zip(steps) {
            let x = &x[s];
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = fmla_f16(*acc, load_f16x8(&x[16 * j..]), yv[j]);
            }
        }
    }
    for ((o, acc), row) in out.iter_mut().zip(acc).zip(rows) {
        *o = f16_finish(acc, &row[2 * np..], &a[2 * np..]);
    }
}

// ---------------------------------------------------------------------------------------
// DotRowsFn wrappers, registered only in a table built for `Isa::Neon` (see `neon.rs`).

macro_rules! wrap_rows {
    ($($name:ident => $imp:ident $(::<$r:ident>)?);* $(;)?) => {$(
        fn $name(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
            // SAFETY: only reachable through a NEON table, so the CPU has the features
            // `$imp` is compiled for.
            unsafe { $imp$(::<{ $r }>)?(n, w, a, out) }
        }
    )*};
}

wrap_rows! {
    dot_tokens_q8_0 => q8_0_tile;
    dot_rows_q8_0 => q8_0_rows::<Q8_0_ROWS>;
    dot_rows_q4_0 => q4_0_rows::<Q4_0_ROWS>;
    dot_rows_iq4_nl => iq4_nl_rows;
    dot_rows_mxfp4 => mxfp4_rows;
    dot_rows_f16 => f16_rows::<F16_ROWS>;
}
