//! NEON + dot-product kernels for the ternary TQ1_0 and TQ2_0 and the 1- to 3-bit i-quants
//! (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) against Q8_K activations, in the
//! order of operations of ggml's ARM kernels (`arch/arm/quants.c`, NEON + dotprod path) as
//! its aarch64 build compiles them.
//!
//! Unlike ggml's x86 kernels, the ARM ones apply each sign to the weight (a grid magnitude
//! times ±1, exact in a byte) and sum every product in 32-bit integers: what they add is the
//! exact integer total of each group of 16 or 32 elements, whatever the lane layout. The
//! bits are decided by the float tail alone. Per super-block, with `dy` the activation scale
//! and `d` the weight's f16 scale:
//!
//! * TQ1_0, TQ2_0, IQ2_XS, IQ2_S, IQ3_S: `sum = fma(d · dy, isum, sum)` with `isum` the
//!   scaled integer total (the ternary types' offset of -1 taken off with the group sums);
//!   the result is `sum` times 1/8 (IQ2_XS, IQ2_S) or as is.
//! * IQ2_XXS, IQ3_XXS: each 32-element group's integer total `p` times its scale
//!   `1/2 + s` into one of two float sums (even and odd groups),
//!   `s_k = fma(p, 0.5 + s, s_k)`, then `sum = fma(d · dy, s_0 + s_1, sum)`; the result is
//!   `sum` times 1/4 (IQ2_XXS) or 1/2 (IQ3_XXS).
//! * IQ1_S, IQ1_M: `sum = fma(dy · d, fma(1/8, shifts, isum), sum)` with `shifts` the
//!   integer total of the ±1/8 shifts (from the group sums for IQ1_S, from the activations
//!   themselves for IQ1_M).
//!
//! The conversions of the i32 totals to f32 round to nearest, as `scvtf` does (they are
//! exact for these magnitudes).

use std::arch::aarch64::*;

use super::layout::{iq1m, iq1s, iq2s, iq2xs, iq2xxs, iq3s, iq3xxs, tq10, tq20};
use super::neon::{Q8KBlock, bsums, dot32, ld_s8, ld_u8};
use super::{Q8K_BYTES, check_dot, f32_at, iq1m_d, u32_at};
use crate::GgmlType;
use crate::iq_tables::{
    IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
};
use crate::kernels::Kernels;
use crate::kernels::legacy::neon::{f16_at, sdot};

pub(super) fn register(k: &mut Kernels) {
    k.set_dot(GgmlType::TQ1_0, dot_tq1_0);
    k.set_dot(GgmlType::TQ2_0, dot_tq2_0);
    k.set_dot(GgmlType::IQ2_XXS, dot_iq2_xxs);
    k.set_dot(GgmlType::IQ2_XS, dot_iq2_xs);
    k.set_dot(GgmlType::IQ2_S, dot_iq2_s);
    k.set_dot(GgmlType::IQ3_XXS, dot_iq3_xxs);
    k.set_dot(GgmlType::IQ3_S, dot_iq3_s);
    k.set_dot(GgmlType::IQ1_S, dot_iq1_s);
    k.set_dot(GgmlType::IQ1_M, dot_iq1_m);
}

/// Bytes of 1 and -1 for every sign byte: byte `j` of entry `s` is -1 where bit `j` of `s` is
/// set (IQ2_S and IQ3_S store a whole sign byte per 8 elements).
const SIGNS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut s = 0;
    while s < 256 {
        let mut v = 0u64;
        let mut j = 0;
        while j < 8 {
            let byte: u64 = if (s >> j) & 1 != 0 { 0xff } else { 0x01 };
            v |= byte << (8 * j);
            j += 1;
        }
        t[s] = v;
        s += 1;
    }
    t
};

/// The sign patterns of [`crate::iq_tables::KSIGNS_IQ2XS`] as bytes of 1 and -1 (ggml's
/// `keven_signs_q2xs`): entry `i` is [`SIGNS`]' entry for pattern `i`.
const EVEN_SIGNS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = SIGNS[crate::iq_tables::KSIGNS_IQ2XS[i] as usize];
        i += 1;
    }
    t
};

/// Two 8-byte grid entries (or sign patterns) as one vector, `lo` first.
#[inline]
#[target_feature(enable = "neon")]
fn pair(lo: u64, hi: u64) -> int8x16_t {
    vcombine_s8(vcreate_s8(lo), vcreate_s8(hi))
}

/// Four 4-byte grid entries as one vector, `g[0]` first.
#[inline]
#[target_feature(enable = "neon")]
fn quad(g: [u32; 4]) -> int8x16_t {
    let lo = u64::from(g[0]) | (u64::from(g[1]) << 32);
    let hi = u64::from(g[2]) | (u64::from(g[3]) << 32);
    pair(lo, hi)
}

/// Grid magnitudes with their signs (bytes of ±1) applied, exact in a byte.
#[inline]
#[target_feature(enable = "neon")]
fn signed(grid: int8x16_t, signs: int8x16_t) -> int8x16_t {
    vmulq_s8(grid, signs)
}

/// The exact sum of the 32 products of group `g`: weights `w0` (elements 0..16) and `w1`
/// (16..32) against the activations of that group.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn group(w0: int8x16_t, w1: int8x16_t, y: &Q8KBlock, g: usize) -> i32 {
    vaddvq_s32(dot32(w0, w1, y, 32 * g))
}

/// `acc` plus the four lanes of group `g`'s products (weights `w0`, `w1` against its 32
/// activations) times `sc`: summed across lanes once per block instead of once per group.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn group_acc(
    acc: int32x4_t,
    w0: int8x16_t,
    w1: int8x16_t,
    y: &Q8KBlock,
    g: usize,
    sc: i32,
) -> int32x4_t {
    vmlaq_n_s32(acc, dot32(w0, w1, y, 32 * g), sc)
}

/// The four 16-element sums of groups `g` and `g + 1` (weights `w[0..2]` and `w[2..4]`):
/// lanes (first half of `g`, second half of `g`, first half of `g + 1`, second of `g + 1`).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn pair_halves(w: [int8x16_t; 4], y: &Q8KBlock, g: usize) -> int32x4_t {
    let z = vdupq_n_s32(0);
    let half = |k: usize| sdot(z, w[k], ld_s8(y, super::Q8K_QS + 32 * g + 16 * k));
    vpaddq_s32(vpaddq_s32(half(0), half(1)), vpaddq_s32(half(2), half(3)))
}

/// The four scales `2s + 1` of two groups' halves from the two scale bytes `b` (low nibble
/// first), as [`pair_halves`] orders its lanes.
#[inline]
#[target_feature(enable = "neon")]
fn nibble_scales(b: u16) -> int32x4_t {
    let shifts = vcombine_s32(
        vcreate_s32(0xffff_fffc_0000_0000),
        vcreate_s32(0xffff_fff4_ffff_fff8),
    );
    let sc = vshlq_u32(vdupq_n_u32(u32::from(b)), shifts);
    vreinterpretq_s32_u32(vorrq_u32(
        vshlq_n_u32::<1>(vandq_u32(sc, vdupq_n_u32(15))),
        vdupq_n_u32(1),
    ))
}

/// The 2-bit types' integer total of a block: two groups a step, their four half-group sums
/// ([`pair_halves`]) against the four scales of their two scale bytes (`scales(p)` for groups
/// `2p` and `2p + 1`); `weights(g)` gives group `g`'s signed weights, 16 at a time.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn pairs_acc(
    weights: impl Fn(usize) -> [int8x16_t; 2],
    scales: impl Fn(usize) -> u16,
    y: &Q8KBlock,
) -> int32x4_t {
    let mut acc = vdupq_n_s32(0);
    for p in 0..4 {
        let ([a, b], [c, d]) = (weights(2 * p), weights(2 * p + 1));
        acc = vmlaq_s32(
            acc,
            pair_halves([a, b, c, d], y, 2 * p),
            nibble_scales(scales(p)),
        );
    }
    acc
}

/// The XXS types' float total of a block: each group's integer total times its scale
/// (`total(g)` gives both) into one of two float sums, even groups and odd ones, as ggml's ARM
/// kernels add them (two groups a step, so both sums stay in registers).
#[inline]
fn parity_sums(total: impl Fn(usize) -> (f32, f32)) -> f32 {
    let (mut s0, mut s1) = (0f32, 0f32);
    for p in 0..4 {
        let (t0, c0) = total(2 * p);
        let (t1, c1) = total(2 * p + 1);
        s0 = t0.mul_add(c0, s0);
        s1 = t1.mul_add(c1, s1);
    }
    s0 + s1
}

/// The sum of the 16 activation group sums of a block.
#[inline]
#[target_feature(enable = "neon")]
fn bsums_total(y: &Q8KBlock) -> i32 {
    let (s0, s1) = bsums(y);
    vaddvq_s32(vpaddlq_s16(vaddq_s16(s0, s1)))
}

/// The left shifts 8, 7, ..., 1: bit `k` of a byte to bit 8 of lane `k`.
#[inline]
#[target_feature(enable = "neon")]
fn top_bit_shifts() -> int16x8_t {
    vcombine_s16(
        vcreate_s16(0x0005_0006_0007_0008),
        vcreate_s16(0x0001_0002_0003_0004),
    )
}

/// `u16` number `i` of `b` from `off`.
#[inline]
fn u16_at(b: &[u8], off: usize, i: usize) -> u16 {
    u16::from_le_bytes([b[off + 2 * i], b[off + 2 * i + 1]])
}

// ---------------------------------------------------------------------------------------
// Ternary.

/// TQ2_0: four 2-bit digits per byte; digit `l` of byte `32j + m` is element `128j + 32l + m`.
#[target_feature(enable = "neon,dotprod")]
fn tq2_0_neon(w: &[[u8; tq20::BYTES]], a: &[Q8KBlock]) -> f32 {
    let m3 = vdupq_n_u8(3);
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let mut acc = vdupq_n_s32(0);
        for j in 0..2 {
            let q0 = ld_u8(x, tq20::QS + 32 * j);
            let q1 = ld_u8(x, tq20::QS + 32 * j + 16);
            for l in 0..4 {
                let sh = vdupq_n_s8(-2 * l as i8); // a right shift by 2l
                let d0 = vandq_u8(vshlq_u8(q0, sh), m3);
                let d1 = vandq_u8(vshlq_u8(q1, sh), m3);
                let p = dot32(
                    vreinterpretq_s8_u8(d0),
                    vreinterpretq_s8_u8(d1),
                    y,
                    128 * j + 32 * l as usize,
                );
                acc = vaddq_s32(acc, p);
            }
        }
        let isum = vaddvq_s32(acc) - bsums_total(y);
        let d = f16_at(x, tq20::D) * f32_at(y, 0);
        sumf = d.mul_add(isum as f32, sumf);
    }
    sumf
}

/// The base-3 digit of each byte after multiplying it by `3^k` (wrapping), as ggml's ARM
/// kernel extracts it: the top two bits of three quarters of the byte, by halving adds.
#[inline]
#[target_feature(enable = "neon")]
fn trit(q: uint8x16_t, mul: u8) -> int8x16_t {
    let q = vmulq_u8(q, vdupq_n_u8(mul));
    vreinterpretq_s8_u8(vshrq_n_u8::<6>(vhaddq_u8(q, vshrq_n_u8::<1>(q))))
}

/// TQ1_0: five base-3 digits per byte of `qs` (digit `k` of byte `m` is element `32k + m` for
/// the first 32 bytes, `160 + 16k + m` for the next 16), four per byte of `qh` (digit `k` of
/// byte `m` is element `240 + 4k + m`).
#[target_feature(enable = "neon,dotprod")]
fn tq1_0_neon(w: &[[u8; tq10::BYTES]], a: &[Q8KBlock]) -> f32 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let shift = vreinterpretq_u8_u32(vcombine_u32(
        vcreate_u32(0x0303_0303_0101_0101),
        vcreate_u32(0x1b1b_1b1b_0909_0909),
    ));
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let mut acc = vdupq_n_s32(0);
        let q0 = ld_u8(x, tq10::QS);
        let q1 = ld_u8(x, tq10::QS + 16);
        for (k, &m) in POW3.iter().enumerate() {
            acc = vaddq_s32(acc, dot32(trit(q0, m), trit(q1, m), y, 32 * k));
        }
        let q2 = ld_u8(x, tq10::QS + 32);
        let z = vdupq_n_s32(0);
        for (k, &m) in POW3.iter().enumerate() {
            let p = sdot(z, trit(q2, m), ld_s8(y, super::Q8K_QS + 160 + 16 * k));
            acc = vaddq_s32(acc, p);
        }
        let qh = vreinterpretq_u8_u32(vdupq_n_u32(u32_at(x, tq10::QH)));
        let qh = vmulq_u8(qh, shift);
        let h = vreinterpretq_s8_u8(vshrq_n_u8::<6>(vhaddq_u8(qh, vshrq_n_u8::<1>(qh))));
        let p = sdot(z, h, ld_s8(y, super::Q8K_QS + 240));
        acc = vaddq_s32(acc, p);
        let isum = vaddvq_s32(acc) - bsums_total(y);
        let d = f16_at(x, tq10::D) * f32_at(y, 0);
        sumf = d.mul_add(isum as f32, sumf);
    }
    sumf
}

// ---------------------------------------------------------------------------------------
// 2- and 3-bit i-quants.

/// IQ2_XXS: per 32 elements a word of four grid indices and a word of four 7-bit sign
/// indices with the scale in its top four bits.
#[target_feature(enable = "neon,dotprod")]
fn iq2_xxs_neon(w: &[[u8; iq2xxs::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        // group `g`'s total and its scale `1/2 + s`
        let total = |g: usize| {
            let grid = u32_at(x, iq2xxs::QS + 8 * g).to_le_bytes();
            let word = u32_at(x, iq2xxs::QS + 8 * g + 4);
            let gr = |l: usize| IQ2XXS_GRID[usize::from(grid[l])];
            let sg = |l: usize| EVEN_SIGNS[((word >> (7 * l)) & 127) as usize];
            let w0 = signed(pair(gr(0), gr(1)), pair(sg(0), sg(1)));
            let w1 = signed(pair(gr(2), gr(3)), pair(sg(2), sg(3)));
            (group(w0, w1, y, g) as f32, 0.5 + (word >> 28) as f32)
        };
        let d = f16_at(x, iq2xxs::D) * f32_at(y, 0);
        sumf = d.mul_add(parity_sums(total), sumf);
    }
    0.25 * sumf
}

/// IQ2_XS: a `u16` per 8 elements (a 9-bit grid index, a 7-bit sign index), a 4-bit scale
/// per 16 elements.
#[target_feature(enable = "neon,dotprod")]
fn iq2_xs_neon(w: &[[u8; iq2xs::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        // group `g`'s weights with their signs, 16 at a time
        let weights = |g: usize| {
            // the group's four words in one read
            let q = u64::from_le_bytes(x[iq2xs::QS + 8 * g..].as_chunks::<8>().0[0]);
            let gr = |l: usize| IQ2XS_GRID[((q >> (16 * l)) & 511) as usize];
            let sg = |l: usize| EVEN_SIGNS[((q >> (16 * l + 9)) & 127) as usize];
            [
                signed(pair(gr(0), gr(1)), pair(sg(0), sg(1))),
                signed(pair(gr(2), gr(3)), pair(sg(2), sg(3))),
            ]
        };
        let acc = pairs_acc(weights, |p| u16_at(x, iq2xs::SCALES, p), y);
        let d = f16_at(x, iq2xs::D) * f32_at(y, 0);
        sumf = d.mul_add(vaddvq_s32(acc) as f32, sumf);
    }
    0.125 * sumf
}

/// IQ2_S: 10-bit grid indices (a low byte, two bits of `qh`), a sign byte per 8 elements, a
/// 4-bit scale per 16 elements.
#[target_feature(enable = "neon,dotprod")]
fn iq2_s_neon(w: &[[u8; iq2s::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        // group `g`'s weights with their signs, 16 at a time
        let weights = |g: usize| {
            let qh = usize::from(x[iq2s::QH + g]);
            let gr = |l: usize| {
                let idx = usize::from(x[iq2s::QS + 4 * g + l]) | ((qh << (8 - 2 * l)) & 0x300);
                IQ2S_GRID[idx]
            };
            let sg = |l: usize| SIGNS[usize::from(x[iq2s::SIGNS + 4 * g + l])];
            [
                signed(pair(gr(0), gr(1)), pair(sg(0), sg(1))),
                signed(pair(gr(2), gr(3)), pair(sg(2), sg(3))),
            ]
        };
        let acc = pairs_acc(weights, |p| u16_at(x, iq2s::SCALES, p), y);
        let d = f16_at(x, iq2s::D) * f32_at(y, 0);
        sumf = d.mul_add(vaddvq_s32(acc) as f32, sumf);
    }
    0.125 * sumf
}

/// IQ3_XXS: eight 4-magnitude grid indices per 32 elements, and a word of four 7-bit sign
/// indices with the scale in its top four bits.
#[target_feature(enable = "neon,dotprod")]
fn iq3_xxs_neon(w: &[[u8; iq3xxs::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        // group `g`'s total and its scale `1/2 + s`
        let total = |g: usize| {
            let gr = |k: usize| IQ3XXS_GRID[usize::from(x[iq3xxs::QS + 8 * g + k])];
            let word = u32_at(x, iq3xxs::SIGNS + 4 * g);
            let sg = |l: usize| EVEN_SIGNS[((word >> (7 * l)) & 127) as usize];
            let w0 = signed(quad([gr(0), gr(1), gr(2), gr(3)]), pair(sg(0), sg(1)));
            let w1 = signed(quad([gr(4), gr(5), gr(6), gr(7)]), pair(sg(2), sg(3)));
            (group(w0, w1, y, g) as f32, 0.5 + (word >> 28) as f32)
        };
        let d = f16_at(x, iq3xxs::D) * f32_at(y, 0);
        sumf = d.mul_add(parity_sums(total), sumf);
    }
    0.5 * sumf
}

/// IQ3_S: 9-bit grid indices of four magnitudes (a low byte, one bit of `qh`), a sign byte
/// per 8 elements, a 4-bit scale per 32 elements.
#[target_feature(enable = "neon,dotprod")]
fn iq3_s_neon(w: &[[u8; iq3s::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let mut acc = vdupq_n_s32(0);
        for g in 0..8 {
            // the eight 9-bit indices: bytes of `qs`, bit `k` of `qh` as bit 8 of index `k`
            let qh = vdupq_n_u16(u16::from(x[iq3s::QH + g]));
            let top = vandq_u16(vshlq_u16(qh, top_bit_shifts()), vdupq_n_u16(256));
            let low = vmovl_u8(vcreate_u8(u64::from_le_bytes(
                x[iq3s::QS + 8 * g..].as_chunks::<8>().0[0],
            )));
            let idx = vorrq_u16(low, top);
            let i = [
                vgetq_lane_u16::<0>(idx),
                vgetq_lane_u16::<1>(idx),
                vgetq_lane_u16::<2>(idx),
                vgetq_lane_u16::<3>(idx),
                vgetq_lane_u16::<4>(idx),
                vgetq_lane_u16::<5>(idx),
                vgetq_lane_u16::<6>(idx),
                vgetq_lane_u16::<7>(idx),
            ];
            let gr = |k: usize| IQ3S_GRID[usize::from(i[k] & 511)];
            let sg = |l: usize| SIGNS[usize::from(x[iq3s::SIGNS + 4 * g + l])];
            let w0 = signed(quad([gr(0), gr(1), gr(2), gr(3)]), pair(sg(0), sg(1)));
            let w1 = signed(quad([gr(4), gr(5), gr(6), gr(7)]), pair(sg(2), sg(3)));
            let sc = i32::from((x[iq3s::SCALES + g / 2] >> (4 * (g % 2))) & 15);
            acc = group_acc(acc, w0, w1, y, g, 2 * sc + 1);
        }
        let d = f16_at(x, iq3s::D) * f32_at(y, 0);
        sumf = d.mul_add(vaddvq_s32(acc) as f32, sumf);
    }
    sumf
}

// ---------------------------------------------------------------------------------------
// 1-bit i-quants.

/// IQ1_S: 11-bit indices into a grid of -1, 0 and 1 (a low byte, three bits of the group's
/// `u16`), a 3-bit scale and the shift's sign per 32 elements.
#[target_feature(enable = "neon,dotprod")]
fn iq1_s_neon(w: &[[u8; iq1s::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (b0, b1) = bsums(y);
        let mut bs = [0i16; 16];
        // SAFETY: `bs` is 16 writable i16.
        unsafe {
            vst1q_s16(bs.as_mut_ptr(), b0);
            vst1q_s16(bs.as_mut_ptr().add(8), b1);
        }
        let (mut isum, mut shifts) = (0i32, 0i32);
        for g in 0..8 {
            let qh = u16_at(x, iq1s::QH, g);
            let gr = |l: usize| {
                let hi = usize::from((qh >> (3 * l)) & 7) << 8;
                IQ1S_GRID[usize::from(x[iq1s::QS + 4 * g + l]) | hi]
            };
            let ls = 2 * i32::from((qh >> 12) & 7) + 1;
            isum += vaddvq_s32(dot32(pair(gr(0), gr(1)), pair(gr(2), gr(3)), y, 32 * g)) * ls;
            let sign = if qh & 0x8000 != 0 { -1 } else { 1 };
            shifts += (i32::from(bs[2 * g]) + i32::from(bs[2 * g + 1])) * ls * sign;
        }
        let d = f32_at(y, 0) * f16_at(x, iq1s::D);
        sumf = d.mul_add(IQ1S_DELTA.mul_add(shifts as f32, isum as f32), sumf);
    }
    sumf
}

/// IQ1_M: as IQ1_S, with a 3-bit scale per 16 elements and the shift's sign per 8, the
/// shifts summed from the activations; `d` spread over the scale words' top nibbles.
///
/// Two groups a step, as a scale word holds their four scales: each half group's products (and
/// its shift products, the activations times a [`DELTAS`] vector) reduced to one lane, the
/// four lanes times the four scales into the accumulators.
#[target_feature(enable = "neon,dotprod")]
fn iq1_m_neon(w: &[[u8; iq1m::BYTES]], a: &[Q8KBlock]) -> f32 {
    let z = vdupq_n_s32(0);
    // scale `k` of a word at bits `3k..3k + 3`
    let shifts = vcombine_s32(
        vcreate_s32(0xffff_fffd_0000_0000),
        vcreate_s32(0xffff_fff7_ffff_fffa),
    );
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (mut acc, mut acc_shifts) = (z, z);
        for p in 0..4 {
            let sc = vshlq_u32(vdupq_n_u32(u32::from(u16_at(x, iq1m::SCALES, p))), shifts);
            let sc = vorrq_u32(
                vshlq_n_u32::<1>(vandq_u32(sc, vdupq_n_u32(7))),
                vdupq_n_u32(1),
            );
            let sc = vreinterpretq_s32_u32(sc);
            // group `g`: lanes (first half's two, second half's two) of its grid products and
            // of its shift products
            let group = |g: usize| {
                let qh = usize::from(u16_at(x, iq1m::QH, g));
                let gr = |l: usize| {
                    let hi = ((qh >> (4 * l)) & 7) << 8;
                    IQ1S_GRID[usize::from(x[iq1m::QS + 4 * g + l]) | hi]
                };
                // the signs of a half's two 8-element pieces: bits 3 and 7 of its byte
                let delta = |b: usize| {
                    // SAFETY: an entry of `DELTAS` is 16 readable bytes.
                    let d = unsafe { vld1q_u8(DELTAS[((b >> 3) & 1) | ((b >> 6) & 2)].as_ptr()) };
                    vreinterpretq_s8_u8(d)
                };
                let a0 = ld_s8(y, super::Q8K_QS + 32 * g);
                let a1 = ld_s8(y, super::Q8K_QS + 32 * g + 16);
                let p = vpaddq_s32(
                    sdot(z, pair(gr(0), gr(1)), a0),
                    sdot(z, pair(gr(2), gr(3)), a1),
                );
                let d = vpaddq_s32(sdot(z, delta(qh), a0), sdot(z, delta(qh >> 8), a1));
                (p, d)
            };
            let (p0, d0) = group(2 * p);
            let (p1, d1) = group(2 * p + 1);
            acc = vmlaq_s32(acc, vpaddq_s32(p0, p1), sc);
            acc_shifts = vmlaq_s32(acc_shifts, vpaddq_s32(d0, d1), sc);
        }
        let (isum, shifts) = (vaddvq_s32(acc), vaddvq_s32(acc_shifts));
        let d = f32_at(y, 0) * iq1m_d(x);
        sumf = d.mul_add(IQ1S_DELTA.mul_add(shifts as f32, isum as f32), sumf);
    }
    sumf
}

/// IQ1_M's shift signs of 16 elements as bytes ([`super::shift_signs`]): entry `s` holds -1
/// in the first 8 where bit 0 of `s` is set, in the last 8 where bit 1 is, 1 elsewhere.
static DELTAS: [[u8; 16]; 4] = super::shift_signs();

// ---------------------------------------------------------------------------------------
// DotFn wrappers (`neon_entry!` of kquants.rs).

neon_entry!(dot_tq1_0, GgmlType::TQ1_0, tq10::BYTES, tq1_0_neon);
neon_entry!(dot_tq2_0, GgmlType::TQ2_0, tq20::BYTES, tq2_0_neon);
neon_entry!(dot_iq2_xxs, GgmlType::IQ2_XXS, iq2xxs::BYTES, iq2_xxs_neon);
neon_entry!(dot_iq2_xs, GgmlType::IQ2_XS, iq2xs::BYTES, iq2_xs_neon);
neon_entry!(dot_iq2_s, GgmlType::IQ2_S, iq2s::BYTES, iq2_s_neon);
neon_entry!(dot_iq3_xxs, GgmlType::IQ3_XXS, iq3xxs::BYTES, iq3_xxs_neon);
neon_entry!(dot_iq3_s, GgmlType::IQ3_S, iq3s::BYTES, iq3_s_neon);
neon_entry!(dot_iq1_s, GgmlType::IQ1_S, iq1s::BYTES, iq1_s_neon);
neon_entry!(dot_iq1_m, GgmlType::IQ1_M, iq1m::BYTES, iq1_m_neon);
