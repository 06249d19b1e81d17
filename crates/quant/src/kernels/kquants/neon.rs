//! NEON + dot-product kernels: k-quant / IQ4_XS weights × Q8_K activations, in the order of
//! operations of ggml's ARM kernels (llama.cpp's `arch/arm/quants.c`, NEON path without I8MM
//! or SVE) as its aarch64 build compiles them.
//!
//! The integer work is exact in any order: weight quants times activation quants with `sdot`
//! (four i32 lanes), sub-block scales applied per lane, minimums and offsets from the
//! activation group sums. What decides the bits is the float tail of each super-block, and
//! there the compiled reference counts, not its C source (GCC contracts some `a * b + c`).
//! Per super-block, with `dy` the activation scale, `d`, `dmin` the weight's f16 scales (each
//! product `dy · d` etc. rounded once), `isum` the scaled integer sum and `mins` the integer
//! minimum term, ggml's aarch64 build computes:
//!
//! * Q4_K: `sum = fma(-mins, dy · dmin, sum)`, then `sum = fma(isum, dy · d, sum)` (the C
//!   source's `sumf -= dmin * mins; sumf += d * isum`, both contracted).
//! * Q5_K: `sum = sum + fma(isum, dy · d, -(mins · (dy · dmin)))` (the C source's
//!   `sumf += d * isum - dmin * mins`, the first product fused).
//! * Q6_K: `sum = fma(d · dy, isum - 32 · mins, sum)` (quants taken unsigned, the offset 32
//!   applied through the group sums).
//! * Q3_K: `sum = fma(isum, dy · d, sum)`.
//! * Q2_K: `sum = fma(mins, -(dy · dmin), sum)`, then `sum = fma(isum, dy · d, sum)`.
//! * IQ4_XS: `sum = fma(d · dy, isum, sum)`.
//!
//! The conversions of the i32 sums to f32 round to nearest, as `scvtf` does.

use std::arch::aarch64::*;

use super::layout::{iq4xs, q2k, q3k, q4k, q5k, q6k};
use super::{
    Q8K_BSUMS, Q8K_BYTES, Q8K_QS, check_dot, f32_at, unpack_scales_mins_k4, unpack_scales_q3k,
};
use crate::GgmlType;
use crate::kernels::legacy::neon::{arr, f16_at, load_s8, load_u8, sdot};
use crate::kernels::{Kernels, SumOrder};
use crate::tables::KVALUES_IQ4NL;

pub(super) fn register(k: &mut Kernels) {
    // llama.cpp's ARM build rounds the Q8_K quants from the exact product (GCC fuses it)
    k.set_quantize(GgmlType::Q8_K, super::q8k::quantize_row_q8_k_fused);
    k.set_dot(GgmlType::Q2_K, dot_q2_k);
    k.set_dot(GgmlType::Q3_K, dot_q3_k);
    k.set_dot(GgmlType::Q4_K, dot_q4_k);
    k.set_dot(GgmlType::Q5_K, dot_q5_k);
    k.set_dot(GgmlType::Q6_K, dot_q6_k);
    k.set_dot(GgmlType::IQ4_XS, dot_iq4_xs);
    // llama.cpp's ARM build repacks Q4_K, Q5_K and Q6_K 8x4 (see `Kernels::order_for`); Q6_K's
    // gemv sums as its vec_dot, its gemm otherwise (`grouped_q6_k`)
    let r = SumOrder::Repacked;
    k.set_dot_in(r, GgmlType::Q4_K, dot_q4_k_repacked);
    k.set_dot_in(r, GgmlType::Q5_K, dot_q5_k_repacked);
    k.set_dot_in(r, GgmlType::Q6_K, dot_q6_k);
}

/// The Q6_K 8x4 gemm's order for whole groups of four activation rows of a plain product.
pub(in crate::kernels) fn grouped_q6_k() -> crate::kernels::GroupedDot {
    let (rows, tokens) = super::neon_tiles::q6k_gemm();
    crate::kernels::GroupedDot {
        group: 4,
        dot: dot_q6_k_gemm,
        dot_rows: Some(rows),
        dot_tokens: Some(tokens),
        quantize: super::q8k::quantize_row_q8_k_fused,
    }
}

pub(super) type Q8KBlock = [u8; Q8K_BYTES];

// ---------------------------------------------------------------------------------------
// Helpers.

/// 16 bytes of `b` from `off`, unsigned (panics only on a caller bug: `b` too short).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn ld_u8(b: &[u8], off: usize) -> uint8x16_t {
    load_u8(arr(&b[off..]))
}

/// 16 bytes of `b` from `off`, signed.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn ld_s8(b: &[u8], off: usize) -> int8x16_t {
    load_s8(arr(&b[off..]))
}

/// Unsigned bytes reinterpreted as signed (the weight quants here are below 128).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn s8(v: uint8x16_t) -> int8x16_t {
    vreinterpretq_s8_u8(v)
}

/// The 16 activation group sums of a Q8_K block, as two i16x8.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn bsums(y: &Q8KBlock) -> (int16x8_t, int16x8_t) {
    (
        vreinterpretq_s16_s8(ld_s8(y, Q8K_BSUMS)),
        vreinterpretq_s16_s8(ld_s8(y, Q8K_BSUMS + 16)),
    )
}

/// `Σ w · a[off..off + 16]` in four lanes.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn dot16(w: int8x16_t, y: &Q8KBlock, off: usize) -> int32x4_t {
    sdot(vdupq_n_s32(0), w, ld_s8(y, Q8K_QS + off))
}

/// `Σ w0 · a[off..off + 16] + Σ w1 · a[off + 16..off + 32]` in four lanes.
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(super) fn dot32(w0: int8x16_t, w1: int8x16_t, y: &Q8KBlock, off: usize) -> int32x4_t {
    let acc = sdot(vdupq_n_s32(0), w0, ld_s8(y, Q8K_QS + off));
    sdot(acc, w1, ld_s8(y, Q8K_QS + off + 16))
}

/// `Σ_g pairsum_g · mins[g]` for the Q4_K / Q5_K minimums (`sm` = 8 scales then 8 minimums),
/// each minimum meeting the sum of two consecutive group sums.
#[inline]
#[target_feature(enable = "neon")]
fn k4_mins(sm: uint8x16_t, y: &Q8KBlock) -> i32 {
    let (b0, b1) = bsums(y);
    let q8sums = vpaddq_s16(b0, b1);
    let mins = vreinterpretq_s16_u16(vmovl_high_u8(sm));
    let prod = vaddq_s32(
        vmull_s16(vget_low_s16(q8sums), vget_low_s16(mins)),
        vmull_high_s16(q8sums, mins),
    );
    vaddvq_s32(prod)
}

/// `Σ_g bsums[g] · v[g]` over the 16 groups, `v` as two i16x8.
#[inline]
#[target_feature(enable = "neon")]
fn group_sums(v0: int16x8_t, v1: int16x8_t, y: &Q8KBlock) -> i32 {
    vaddvq_s32(group_sums_lanes(v0, v1, bsums(y)))
}

/// [`group_sums`] before its horizontal sum: four i32 lanes whose total it is (`bs` the
/// group sums as [`bsums`] loads them).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn group_sums_lanes(
    v0: int16x8_t,
    v1: int16x8_t,
    (b0, b1): (int16x8_t, int16x8_t),
) -> int32x4_t {
    let p0 = vaddq_s32(
        vmull_s16(vget_low_s16(b0), vget_low_s16(v0)),
        vmull_high_s16(b0, v0),
    );
    let p1 = vaddq_s32(
        vmull_s16(vget_low_s16(b1), vget_low_s16(v1)),
        vmull_high_s16(b1, v1),
    );
    vaddq_s32(p0, p1)
}

// ---------------------------------------------------------------------------------------
// Kernels.

#[target_feature(enable = "neon,dotprod")]
fn q4_k_neon(w: &[[u8; q4k::BYTES]], a: &[Q8KBlock]) -> f32 {
    let m4 = vdupq_n_u8(0x0f);
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let dy = f32_at(y, 0);
        let d = dy * f16_at(x, q4k::D);
        let dmin = dy * f16_at(x, q4k::DMIN);
        let sm_bytes = unpack_scales_mins_k4(&x[q4k::SCALES..q4k::SCALES + 12]);
        let mins = k4_mins(load_u8(&sm_bytes), y);
        // sum - mins · dmin, fused
        sumf = (-(mins as f32)).mul_add(dmin, sumf);

        let mut acc = vdupq_n_s32(0);
        for j in 0..4 {
            let q0 = ld_u8(x, q4k::QS + 32 * j);
            let q1 = ld_u8(x, q4k::QS + 32 * j + 16);
            let lo = dot32(s8(vandq_u8(q0, m4)), s8(vandq_u8(q1, m4)), y, 64 * j);
            let hi = dot32(
                s8(vshrq_n_u8::<4>(q0)),
                s8(vshrq_n_u8::<4>(q1)),
                y,
                64 * j + 32,
            );
            acc = vmlaq_n_s32(acc, lo, i32::from(sm_bytes[2 * j]));
            acc = vmlaq_n_s32(acc, hi, i32::from(sm_bytes[2 * j + 1]));
        }
        // sum + isum · d, fused
        sumf = (vaddvq_s32(acc) as f32).mul_add(d, sumf);
    }
    sumf
}

/// The order of llama.cpp's ARM Q4_K 8x4 gemv and gemm (the same per output; the compiled
/// reference fuses the scale step and not the minimum step): per super-block, per pair of
/// sub-blocks `acc = fma(d_w · d_a, scale_lo · Σ_lo + scale_hi · Σ_hi, acc)`, then
/// `acc = acc - (Σ_g pairsum_g · min_g) · (dmin_w · d_a)`, multiply then subtract.
#[target_feature(enable = "neon,dotprod")]
fn q4_k_repacked_neon(w: &[[u8; q4k::BYTES]], a: &[Q8KBlock]) -> f32 {
    let m4 = vdupq_n_u8(0x0f);
    let mut acc = 0f32;
    for (x, y) in w.iter().zip(a) {
        let dy = f32_at(y, 0);
        let d = f16_at(x, q4k::D) * dy;
        let dmin = f16_at(x, q4k::DMIN) * dy;
        let sm_bytes = unpack_scales_mins_k4(&x[q4k::SCALES..q4k::SCALES + 12]);
        for j in 0..4 {
            let q0 = ld_u8(x, q4k::QS + 32 * j);
            let q1 = ld_u8(x, q4k::QS + 32 * j + 16);
            let lo = dot32(s8(vandq_u8(q0, m4)), s8(vandq_u8(q1, m4)), y, 64 * j);
            let hi = dot32(
                s8(vshrq_n_u8::<4>(q0)),
                s8(vshrq_n_u8::<4>(q1)),
                y,
                64 * j + 32,
            );
            let sumi = vaddvq_s32(lo) * i32::from(sm_bytes[2 * j])
                + vaddvq_s32(hi) * i32::from(sm_bytes[2 * j + 1]);
            acc = d.mul_add(sumi as f32, acc);
        }
        let mins = k4_mins(load_u8(&sm_bytes), y);
        acc -= mins as f32 * dmin;
    }
    acc
}

#[target_feature(enable = "neon,dotprod")]
fn q5_k_neon(w: &[[u8; q5k::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let dy = f32_at(y, 0);
        let d = dy * f16_at(x, q5k::D);
        let dmin = dy * f16_at(x, q5k::DMIN);
        let sm_bytes = unpack_scales_mins_k4(&x[q5k::SCALES..q5k::SCALES + 12]);
        let mins = k4_mins(load_u8(&sm_bytes), y);
        let isum: i32 = q5_k_pair_sums(x, y, &sm_bytes).iter().sum();
        // sum + fma(isum, d, -(mins · dmin))
        sumf += (isum as f32).mul_add(d, -(mins as f32 * dmin));
    }
    sumf
}

/// Per pair of Q5_K sub-blocks `j`: `scale_2j · Σ_2j + scale_2j+1 · Σ_2j+1` (exact).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn q5_k_pair_sums(x: &[u8; q5k::BYTES], y: &Q8KBlock, sm_bytes: &[u8; 16]) -> [i32; 4] {
    let m4 = vdupq_n_u8(0x0f);
    let one = vdupq_n_u8(1);
    let two = vdupq_n_u8(2);
    // bit 2j of qh[l]: the fifth bit of element 64j + l; bit 2j + 1: of 64j + 32 + l
    let mut qh0 = ld_u8(x, q5k::QH);
    let mut qh1 = ld_u8(x, q5k::QH + 16);
    let mut out = [0i32; 4];
    for (j, o) in out.iter_mut().enumerate() {
        let q0 = ld_u8(x, q5k::QS + 32 * j);
        let q1 = ld_u8(x, q5k::QS + 32 * j + 16);
        let h0 = vshlq_n_u8::<4>(vandq_u8(one, qh0));
        let h1 = vshlq_n_u8::<4>(vandq_u8(one, qh1));
        let h2 = vshlq_n_u8::<3>(vandq_u8(two, qh0));
        let h3 = vshlq_n_u8::<3>(vandq_u8(two, qh1));
        qh0 = vshrq_n_u8::<2>(qh0);
        qh1 = vshrq_n_u8::<2>(qh1);
        let lo = dot32(
            s8(vorrq_u8(vandq_u8(q0, m4), h0)),
            s8(vorrq_u8(vandq_u8(q1, m4), h1)),
            y,
            64 * j,
        );
        let hi = dot32(
            s8(vorrq_u8(vshrq_n_u8::<4>(q0), h2)),
            s8(vorrq_u8(vshrq_n_u8::<4>(q1), h3)),
            y,
            64 * j + 32,
        );
        *o = vaddvq_s32(lo) * i32::from(sm_bytes[2 * j])
            + vaddvq_s32(hi) * i32::from(sm_bytes[2 * j + 1]);
    }
    out
}

/// The order of llama.cpp's ARM Q5_K 8x4 gemv and gemm: as Q4_K's
/// ([`q4_k_repacked_neon`]).
#[target_feature(enable = "neon,dotprod")]
fn q5_k_repacked_neon(w: &[[u8; q5k::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0f32;
    for (x, y) in w.iter().zip(a) {
        let dy = f32_at(y, 0);
        let d = f16_at(x, q5k::D) * dy;
        let dmin = f16_at(x, q5k::DMIN) * dy;
        let sm_bytes = unpack_scales_mins_k4(&x[q5k::SCALES..q5k::SCALES + 12]);
        for sumi in q5_k_pair_sums(x, y, &sm_bytes) {
            acc = d.mul_add(sumi as f32, acc);
        }
        let mins = k4_mins(load_u8(&sm_bytes), y);
        acc -= mins as f32 * dmin;
    }
    acc
}

#[target_feature(enable = "neon,dotprod")]
fn q6_k_neon(w: &[[u8; q6k::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let isum = q6_k_isum(x, y);
        // sum + (d · dy) · isum, fused (also the order of llama.cpp's ARM Q6_K 8x4 gemv)
        sumf = (f16_at(x, q6k::D) * f32_at(y, 0)).mul_add(isum as f32, sumf);
    }
    sumf
}

/// The order of llama.cpp's ARM Q6_K 8x4 gemm: `acc + isum · (d_w · d_a)`, multiply then add.
#[target_feature(enable = "neon,dotprod")]
fn q6_k_gemm_neon(w: &[[u8; q6k::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0f32;
    for (x, y) in w.iter().zip(a) {
        let isum = q6_k_isum(x, y);
        acc += isum as f32 * (f16_at(x, q6k::D) * f32_at(y, 0));
    }
    acc
}

/// `Σ_g scale_g · Σ (q - 32) · a` over a Q6_K super-block (exact).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn q6_k_isum(x: &[u8; q6k::BYTES], y: &Q8KBlock) -> i32 {
    let m4 = vdupq_n_u8(0x0f);
    let m3 = vdupq_n_u8(3);
    let sc = ld_s8(x, q6k::SCALES);
    let mins = group_sums(vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc), y);
    let scale = |g: usize| i32::from(x[q6k::SCALES + g] as i8);

    // quants taken unsigned (0..64), the offset -32 applied through the group sums
    let mut acc = vdupq_n_s32(0);
    for j in 0..2 {
        let qh0 = ld_u8(x, q6k::QH + 32 * j);
        let qh1 = ld_u8(x, q6k::QH + 32 * j + 16);
        let ql = |k: usize| ld_u8(x, q6k::QL + 64 * j + 16 * k);
        let (l0, l1, l2, l3) = (ql(0), ql(1), ql(2), ql(3));
        let high = |qh: uint8x16_t, shift: i8| {
            vshlq_n_u8::<4>(vandq_u8(m3, vshlq_u8(qh, vdupq_n_s8(-shift))))
        };
        let quants = [
            vorrq_u8(vandq_u8(l0, m4), high(qh0, 0)),
            vorrq_u8(vandq_u8(l1, m4), high(qh1, 0)),
            vorrq_u8(vandq_u8(l2, m4), high(qh0, 2)),
            vorrq_u8(vandq_u8(l3, m4), high(qh1, 2)),
            vorrq_u8(vshrq_n_u8::<4>(l0), high(qh0, 4)),
            vorrq_u8(vshrq_n_u8::<4>(l1), high(qh1, 4)),
            vorrq_u8(vshrq_n_u8::<4>(l2), high(qh0, 6)),
            vorrq_u8(vshrq_n_u8::<4>(l3), high(qh1, 6)),
        ];
        for (k, q) in quants.into_iter().enumerate() {
            let g = 8 * j + k;
            acc = vmlaq_n_s32(acc, dot16(s8(q), y, 16 * g), scale(g));
        }
    }
    vaddvq_s32(acc) - 32 * mins
}

/// 16 unsigned bytes (one scale per 16-element group) widened to four i32x4, group `g` in
/// lane `g % 4` of vector `g / 4`, by four table lookups (out-of-range indices give the zero
/// bytes). Unlike a chain of widening moves, the compiler keeps these vectors and multiplies
/// by their lanes.
#[inline]
#[target_feature(enable = "neon")]
fn spread_u8_i32(v: uint8x16_t) -> [int32x4_t; 4] {
    const Z: u8 = 0xff;
    const IDX: [[u8; 16]; 4] = [
        [0, Z, Z, Z, 1, Z, Z, Z, 2, Z, Z, Z, 3, Z, Z, Z],
        [4, Z, Z, Z, 5, Z, Z, Z, 6, Z, Z, Z, 7, Z, Z, Z],
        [8, Z, Z, Z, 9, Z, Z, Z, 10, Z, Z, Z, 11, Z, Z, Z],
        [12, Z, Z, Z, 13, Z, Z, Z, 14, Z, Z, Z, 15, Z, Z, Z],
    ];
    IDX.map(|i| vreinterpretq_s32_u8(vqtbl1q_u8(v, load_u8(&i))))
}

/// `acc + p0 · scale[g] + p1 · scale[g + 1]` for an even group `g`, the scales taken as
/// lanes of [`spread_u8_i32`]'s vectors (one `mla` by element each).
#[inline]
#[target_feature(enable = "neon")]
fn mla_groups(
    acc: int32x4_t,
    p0: int32x4_t,
    p1: int32x4_t,
    scales: &[int32x4_t; 4],
    g: usize,
) -> int32x4_t {
    let v = scales[g / 4];
    if g.is_multiple_of(4) {
        vmlaq_laneq_s32::<1>(vmlaq_laneq_s32::<0>(acc, p0, v), p1, v)
    } else {
        vmlaq_laneq_s32::<3>(vmlaq_laneq_s32::<2>(acc, p0, v), p1, v)
    }
}

#[target_feature(enable = "neon,dotprod")]
fn q3_k_neon(w: &[[u8; q3k::BYTES]], a: &[Q8KBlock]) -> f32 {
    let m3 = vdupq_n_u8(3);
    let four = vdupq_n_u8(4);
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d = f32_at(y, 0) * f16_at(x, q3k::D);
        let scales = unpack_scales_q3k(&x[q3k::SCALES..q3k::SCALES + 12]);
        let hm0 = ld_u8(x, q3k::HMASK);
        let hm1 = ld_u8(x, q3k::HMASK + 16);

        // element 128h + 32s + l: bits 2s..2s+2 of qs[32h + l], minus 4 where bit 4h + s of
        // hmask[l] is clear; 16-element group 8h + 2s + l / 16
        let scales = spread_u8_i32(load_u8(&scales)).map(|v| vsubq_s32(v, vdupq_n_s32(32)));
        let mut acc = vdupq_n_s32(0);
        for h in 0..2 {
            let q0 = ld_u8(x, q3k::QS + 32 * h);
            let q1 = ld_u8(x, q3k::QS + 32 * h + 16);
            for s in 0..4 {
                let bit = vdupq_n_u8(1 << (4 * h + s));
                let shift = vdupq_n_s8(-2 * s as i8);
                let quant = |q: uint8x16_t, hm: uint8x16_t| {
                    let low = vandq_u8(vshlq_u8(q, shift), m3);
                    let off = vbicq_u8(four, vtstq_u8(hm, bit));
                    vsubq_s8(s8(low), s8(off))
                };
                let e = 128 * h + 32 * s;
                let p0 = dot16(quant(q0, hm0), y, e);
                let p1 = dot16(quant(q1, hm1), y, e + 16);
                acc = mla_groups(acc, p0, p1, &scales, 8 * h + 2 * s);
            }
        }
        // sum + isum · d, fused
        sumf = (vaddvq_s32(acc) as f32).mul_add(d, sumf);
    }
    sumf
}

#[target_feature(enable = "neon,dotprod")]
fn q2_k_neon(w: &[[u8; q2k::BYTES]], a: &[Q8KBlock]) -> f32 {
    let m3 = vdupq_n_u8(3);
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let dy = f32_at(y, 0);
        let d = dy * f16_at(x, q2k::D);
        let dmin = -(dy * f16_at(x, q2k::DMIN));
        let sc = ld_u8(x, q2k::SCALES);
        let mins = vshrq_n_u8::<4>(sc);
        let mins = group_sums(
            vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins))),
            vreinterpretq_s16_u16(vmovl_high_u8(mins)),
            y,
        );
        // sum + mins · (-dmin), fused
        sumf = (mins as f32).mul_add(dmin, sumf);

        // element 128h + 32s + l: bits 2s..2s+2 of qs[32h + l]; group 8h + 2s + l / 16.
        // The 16 scales widened to four i32x4 once; each group's product then takes its
        // scale as a lane (`mla` by element) instead of a scalar moved into a vector.
        let scales = spread_u8_i32(vandq_u8(sc, vdupq_n_u8(0x0f)));
        let mut acc = vdupq_n_s32(0);
        for h in 0..2 {
            let q0 = ld_u8(x, q2k::QS + 32 * h);
            let q1 = ld_u8(x, q2k::QS + 32 * h + 16);
            for s in 0..4 {
                let shift = vdupq_n_s8(-2 * s as i8);
                let e = 128 * h + 32 * s;
                let p0 = dot16(s8(vandq_u8(vshlq_u8(q0, shift), m3)), y, e);
                let p1 = dot16(s8(vandq_u8(vshlq_u8(q1, shift), m3)), y, e + 16);
                acc = mla_groups(acc, p0, p1, &scales, 8 * h + 2 * s);
            }
        }
        // sum + isum · d, fused
        sumf = (vaddvq_s32(acc) as f32).mul_add(d, sumf);
    }
    sumf
}

#[target_feature(enable = "neon,dotprod")]
fn iq4_xs_neon(w: &[[u8; iq4xs::BYTES]], a: &[Q8KBlock]) -> f32 {
    // SAFETY: `KVALUES_IQ4NL` is 16 readable bytes.
    let values = unsafe { vld1q_s8(KVALUES_IQ4NL.as_ptr()) };
    let m4 = vdupq_n_u8(0x0f);
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let h = u32::from(u16::from_le_bytes(*arr(&x[iq4xs::SCALES_H..])));
        let mut acc = vdupq_n_s32(0);
        // 64 elements per step: sub-block 2ib is the low then the high nibbles of
        // qs[32ib..32ib + 16], sub-block 2ib + 1 those of qs[32ib + 16..32ib + 32]
        for ib in 0..4 {
            let q0 = ld_u8(x, iq4xs::QS + 32 * ib);
            let q1 = ld_u8(x, iq4xs::QS + 32 * ib + 16);
            let lut = |v: uint8x16_t| vqtbl1q_s8(values, v);
            let p1 = dot32(lut(vandq_u8(q0, m4)), lut(vshrq_n_u8::<4>(q0)), y, 64 * ib);
            let p2 = dot32(
                lut(vandq_u8(q1, m4)),
                lut(vshrq_n_u8::<4>(q1)),
                y,
                64 * ib + 32,
            );
            let sl = u32::from(x[iq4xs::SCALES_L + ib]);
            let hb = h >> (4 * ib);
            let ls1 = ((sl & 0xf) | ((hb << 4) & 0x30)) as i32 - 32;
            let ls2 = ((sl >> 4) | ((hb << 2) & 0x30)) as i32 - 32;
            acc = vmlaq_n_s32(acc, p1, ls1);
            acc = vmlaq_n_s32(acc, p2, ls2);
        }
        // sum + (d · dy) · isum, fused
        let d = f16_at(x, iq4xs::D) * f32_at(y, 0);
        sumf = d.mul_add(vaddvq_s32(acc) as f32, sumf);
    }
    sumf
}

// ---------------------------------------------------------------------------------------
// DotFn wrappers (`neon_entry!` of kquants.rs).

neon_entry!(dot_q2_k, GgmlType::Q2_K, q2k::BYTES, q2_k_neon);
neon_entry!(dot_q3_k, GgmlType::Q3_K, q3k::BYTES, q3_k_neon);
neon_entry!(dot_q4_k, GgmlType::Q4_K, q4k::BYTES, q4_k_neon);
neon_entry!(
    dot_q4_k_repacked,
    GgmlType::Q4_K,
    q4k::BYTES,
    q4_k_repacked_neon
);
neon_entry!(
    dot_q5_k_repacked,
    GgmlType::Q5_K,
    q5k::BYTES,
    q5_k_repacked_neon
);
neon_entry!(dot_q6_k_gemm, GgmlType::Q6_K, q6k::BYTES, q6_k_gemm_neon);
neon_entry!(dot_q5_k, GgmlType::Q5_K, q5k::BYTES, q5_k_neon);
neon_entry!(dot_q6_k, GgmlType::Q6_K, q6k::BYTES, q6_k_neon);
neon_entry!(dot_iq4_xs, GgmlType::IQ4_XS, iq4xs::BYTES, iq4_xs_neon);
