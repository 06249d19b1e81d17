//! NEON + dot-product versions of the 32-element block kernels in `legacy.rs`, in the order of
//! operations of ggml's ARM kernels (llama.cpp's `arch/arm/quants.c`, NEON path without I8MM)
//! as its aarch64 build compiles them.
//!
//! The integer block sums are exact whatever the order (`sdot` sums groups of four bytes into
//! four i32 lanes). Only the float steps decide the bits, and there the compiled reference is
//! what counts, not its C source: GCC contracts some scalar `a * b + c` into one fused
//! multiply-add and leaves the vector `vmlaq_n_f32` as a multiply then an add. So:
//!
//! * Q8_0, Q4_0, Q5_0, Q4_1, Q5_1: blocks in pairs, two f32x4 accumulators (even and odd
//!   blocks), each step `acc + float(sums) · (d_w · d_a)` with two roundings; each accumulator
//!   reduced pairwise (`(l0 + l1) + (l2 + l3)`) and the two added. Q4_1 / Q5_1 add their
//!   minimum terms `m · s` as scalars (Q4_1: one running sum, `fma(m0, s0, m1 · s1)` per pair;
//!   Q5_1: a running fused sum per parity). An odd last block is added as a scalar, with the
//!   per-type contraction noted at each kernel.
//! * IQ4_NL, MXFP4: blocks in pairs, one scalar sum, `sum + fma(., ., .)` per pair (the two
//!   types contract opposite products), an odd last block fused.
//! * F32: four f32x4 FMA accumulators over 16 elements, reduced as `(a0 + a2) + (a1 + a3)`
//!   and pairwise; of the `n % 16` leftovers, whole fours are multiplied as a vector and their
//!   products added one by one, the last `n % 4` fused one by one.
//! * F16: with FP16 arithmetic ggml accumulates in half precision: four f16x8 FMA
//!   accumulators over 32 elements (each step rounded to f16), reduced in f16 as F32's, the
//!   two halves widened to f32, added and reduced pairwise; the `n % 32` leftovers' f32
//!   products are added one by one in f64.
//! * BF16: ggml's portable loop (no BF16 instructions on this feature level): each f32
//!   product (exact: 8-bit significands) widened and added to one f64 sum, in order. The NEON
//!   kernel widens and multiplies eight at a time and keeps the adds in order: the scalar
//!   table's bits.

use std::arch::aarch64::*;
use std::arch::asm;

use super::{
    IQ4_NL_BYTES, MXFP4_BYTES, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES,
    Q8_1_BYTES, bf16_to_f32, check_blocks, check_floats, f16_to_f32,
};
use crate::GgmlType;
use crate::kernels::Kernels;
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half};

mod rows;

pub(super) fn register(k: &mut Kernels) {
    use GgmlType::*;
    k.set_dot(F32, dot_f32);
    k.set_dot(F16, dot_f16);
    k.set_dot(BF16, dot_bf16);
    k.set_dot(Q8_0, dot_q8_0);
    k.set_dot(Q4_0, dot_q4_0);
    k.set_dot(Q4_1, dot_q4_1);
    k.set_dot(Q5_0, dot_q5_0);
    k.set_dot(Q5_1, dot_q5_1);
    k.set_dot(IQ4_NL, dot_iq4_nl);
    k.set_dot(MXFP4, dot_mxfp4);
    rows::register(k);
}

// ---------------------------------------------------------------------------------------
// Helpers shared with the other NEON kernels.

/// `acc + Σ a[4i..4i+4] · b[4i..4i+4]` per i32 lane (the `sdot` instruction; its intrinsic is
/// not stable in Rust yet).
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(crate) fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: a register-only instruction of the dot-product extension, which this function
    // is compiled for; it reads and writes nothing else.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// Sum of the four lanes as `faddp` twice computes it: `(l0 + l1) + (l2 + l3)`.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn hsum(v: float32x4_t) -> f32 {
    let p = vpaddq_f32(v, v);
    vgetq_lane_f32::<0>(vpaddq_f32(p, p))
}

/// 16 bytes as signed lanes.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn load_s8(b: &[u8; 16]) -> int8x16_t {
    // SAFETY: `b` is 16 readable bytes; `vld1q` has no alignment requirement.
    unsafe { vld1q_s8(b.as_ptr().cast()) }
}

/// 16 bytes as unsigned lanes.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn load_u8(b: &[u8; 16]) -> uint8x16_t {
    // SAFETY: as for `load_s8`.
    unsafe { vld1q_u8(b.as_ptr()) }
}

/// The `M`-byte array at the start of `s` (panics only on a caller bug: `s` too short).
#[inline(always)]
pub(crate) fn arr<const M: usize>(s: &[u8]) -> &[u8; M] {
    &s.as_chunks::<M>().0[0]
}

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes(*arr(&b[at..])))
}

/// Low and high nibbles of 16 bytes (elements 0..16 and 16..32 of a block).
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn nibbles(b: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let v = load_u8(b);
    (vandq_u8(v, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(v))
}

/// `Σ lo · a[0..16] + Σ hi · a[16..32]` in four lanes.
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(crate) fn dot32(lo: int8x16_t, hi: int8x16_t, a: &[u8]) -> int32x4_t {
    let acc = sdot(vdupq_n_s32(0), lo, load_s8(arr(a)));
    sdot(acc, hi, load_s8(arr(&a[16..])))
}

/// The bits of a Q5 block's `qh` as byte masks: 0xff where bit j is set (elements 0..16 from
/// bits 0..16, 16..32 from bits 16..32). One broadcast of `qh`, two table lookups that spread
/// its bytes over the lanes, two tests against the bit of each lane.
#[inline]
#[target_feature(enable = "neon")]
fn bit_masks(qh: u32) -> (uint8x16_t, uint8x16_t) {
    const SPREAD_LO: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const SPREAD_HI: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    let v = vreinterpretq_u8_u32(vdupq_n_u32(qh));
    let lo = vqtbl1q_u8(v, load_u8(&SPREAD_LO));
    let hi = vqtbl1q_u8(v, load_u8(&SPREAD_HI));
    (vtstq_u8(lo, bit), vtstq_u8(hi, bit))
}

/// `nibble | 0x10` where `mask` is 0xff, `nibble` elsewhere (a nibble has bit 4 clear), as
/// one bit select.
#[inline]
#[target_feature(enable = "neon")]
fn with_bit4(mask: uint8x16_t, nibble: uint8x16_t) -> uint8x16_t {
    vbslq_u8(vdupq_n_u8(0x10), mask, nibble)
}

/// A weight block and its activation block.
type Block<'a, const WB: usize, const AB: usize> = (&'a [u8; WB], &'a [u8; AB]);

/// ggml's NEON pair loop for the types with vector accumulators: even blocks into one f32x4
/// accumulator, odd blocks into another, each step `acc + float(sums) · scale` (two
/// roundings); returns the sum of the two reduced accumulators and the last block if the count
/// is odd. `extra` sees every whole pair (for the scalar minimum terms).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn pairs<'a, const WB: usize, const AB: usize>(
    w: &'a [u8],
    a: &'a [u8],
    block: impl Fn(&[u8; WB], &[u8; AB]) -> (f32, int32x4_t),
    mut extra: impl FnMut(&[u8; WB], &[u8; AB], &[u8; WB], &[u8; AB]),
) -> (f32, Option<Block<'a, WB, AB>>) {
    let (w, _) = w.as_chunks::<WB>();
    let (a, _) = a.as_chunks::<AB>();
    let mut acc0 = vdupq_n_f32(0.0);
    let mut acc1 = vdupq_n_f32(0.0);
    let mut wp = w.chunks_exact(2);
    let mut ap = a.chunks_exact(2);
    for (x, y) in (&mut wp).zip(&mut ap) {
        extra(&x[0], &y[0], &x[1], &y[1]);
        let (d0, s0) = block(&x[0], &y[0]);
        let (d1, s1) = block(&x[1], &y[1]);
        acc0 = vaddq_f32(acc0, vmulq_n_f32(vcvtq_f32_s32(s0), d0));
        acc1 = vaddq_f32(acc1, vmulq_n_f32(vcvtq_f32_s32(s1), d1));
    }
    let sum = hsum(acc0) + hsum(acc1);
    let last = wp.remainder().first().zip(ap.remainder().first());
    (sum, last)
}

/// The block sums as one i32 (exact), then as f32 (exact: |sum| < 2^24).
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn total(s: int32x4_t) -> f32 {
    vaddvq_s32(s) as f32
}

// ---------------------------------------------------------------------------------------
// Kernels.

#[target_feature(enable = "neon,dotprod")]
fn q8_0_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q8_0_BYTES, a, Q8_0_BYTES);
    let block = |x: &[u8; Q8_0_BYTES], y: &[u8; Q8_0_BYTES]| {
        let s = dot32(load_s8(arr(&x[2..])), load_s8(arr(&x[18..])), &y[2..]);
        (f16_at(x, 0) * f16_at(y, 0), s)
    };
    let (sum, last) = pairs(w, a, block, |_, _, _, _| {});
    match last {
        // sum + sums · (d_w · d_a), fused
        Some((x, y)) => {
            let (d, s) = block(x, y);
            total(s).mul_add(d, sum)
        }
        None => sum,
    }
}

/// Q4_0 quants minus 8, as signed bytes.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn q4_0_quants(x: &[u8]) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles(arr(x));
    let eight = vdupq_n_s8(8);
    (
        vsubq_s8(vreinterpretq_s8_u8(lo), eight),
        vsubq_s8(vreinterpretq_s8_u8(hi), eight),
    )
}

#[target_feature(enable = "neon,dotprod")]
fn q4_0_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q4_0_BYTES, a, Q8_0_BYTES);
    let block = |x: &[u8; Q4_0_BYTES], y: &[u8; Q8_0_BYTES]| {
        let (lo, hi) = q4_0_quants(&x[2..]);
        (f16_at(x, 0) * f16_at(y, 0), dot32(lo, hi, &y[2..]))
    };
    let (sum, last) = pairs(w, a, block, |_, _, _, _| {});
    match last {
        // sum + (sums · d_w) · d_a, the second product fused
        Some((x, y)) => {
            let (_, s) = block(x, y);
            (total(s) * f16_at(x, 0)).mul_add(f16_at(y, 0), sum)
        }
        None => sum,
    }
}

#[target_feature(enable = "neon,dotprod")]
fn q4_1_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q4_1_BYTES, a, Q8_1_BYTES);
    let block = |x: &[u8; Q4_1_BYTES], y: &[u8; Q8_1_BYTES]| {
        let (lo, hi) = nibbles(arr(&x[4..]));
        let s = dot32(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), &y[4..]);
        (f16_at(x, 0) * f16_at(y, 0), s)
    };
    // Σ over pairs of fma(m0, s0, m1 · s1)
    let mut mins = 0f32;
    let (sum, last) = pairs(w, a, block, |x0, y0, x1, y1| {
        mins += f16_at(x0, 2).mul_add(f16_at(y0, 2), f16_at(x1, 2) * f16_at(y1, 2));
    });
    let sum = sum + mins;
    match last {
        // sum + fma(d_w · d_a, sums, m · s)
        Some((x, y)) => {
            let (d, s) = block(x, y);
            sum + d.mul_add(total(s), f16_at(x, 2) * f16_at(y, 2))
        }
        None => sum,
    }
}

/// Q5_0 quants: nibble plus the fifth bit, minus 16, as signed bytes. That is the nibble
/// where the bit is set and the nibble with the high four bits set (`nibble - 16` as i8)
/// where it is clear: the masks of the inverted `qh` select 0xf0 into the high bits.
#[inline]
#[target_feature(enable = "neon")]
fn q5_0_quants(x: &[u8; Q5_0_BYTES]) -> (int8x16_t, int8x16_t) {
    let (cl, ch) = bit_masks(!u32::from_le_bytes(*arr(&x[2..])));
    let (lo, hi) = nibbles(arr(&x[6..]));
    let high = vdupq_n_u8(0xf0);
    (
        vreinterpretq_s8_u8(vbslq_u8(high, cl, lo)),
        vreinterpretq_s8_u8(vbslq_u8(high, ch, hi)),
    )
}

#[target_feature(enable = "neon,dotprod")]
fn q5_0_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q5_0_BYTES, a, Q8_0_BYTES);
    let block = |x: &[u8; Q5_0_BYTES], y: &[u8; Q8_0_BYTES]| {
        let (lo, hi) = q5_0_quants(x);
        (f16_at(x, 0) * f16_at(y, 0), dot32(lo, hi, &y[2..]))
    };
    let (sum, last) = pairs(w, a, block, |_, _, _, _| {});
    match last {
        // sum + (d_w · d_a) · sums, fused
        Some((x, y)) => {
            let (d, s) = block(x, y);
            d.mul_add(total(s), sum)
        }
        None => sum,
    }
}

#[target_feature(enable = "neon,dotprod")]
fn q5_1_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q5_1_BYTES, a, Q8_1_BYTES);
    let block = |x: &[u8; Q5_1_BYTES], y: &[u8; Q8_1_BYTES]| {
        let (ml, mh) = bit_masks(u32::from_le_bytes(*arr(&x[4..])));
        let (lo, hi) = nibbles(arr(&x[8..]));
        let lo = vreinterpretq_s8_u8(with_bit4(ml, lo));
        let hi = vreinterpretq_s8_u8(with_bit4(mh, hi));
        (f16_at(x, 0) * f16_at(y, 0), dot32(lo, hi, &y[4..]))
    };
    // a fused running sum of m · s per parity
    let (mut mins0, mut mins1) = (0f32, 0f32);
    let (sum, last) = pairs(w, a, block, |x0, y0, x1, y1| {
        mins0 = f16_at(x0, 2).mul_add(f16_at(y0, 2), mins0);
        mins1 = f16_at(x1, 2).mul_add(f16_at(y1, 2), mins1);
    });
    let sum = sum + mins0 + mins1;
    match last {
        // sum + fma(d_w · d_a, sums, m · s)
        Some((x, y)) => {
            let (d, s) = block(x, y);
            sum + d.mul_add(total(s), f16_at(x, 2) * f16_at(y, 2))
        }
        None => sum,
    }
}

/// A 4-bit lookup-table block (IQ4_NL, MXFP4): the 32 table values of the nibbles at `qs`
/// times the activation quants, summed.
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(crate) fn lut_block(table: int8x16_t, qs: &[u8], y: &[u8; Q8_0_BYTES]) -> f32 {
    let (lo, hi) = nibbles(arr(qs));
    let s = dot32(vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi), &y[2..]);
    total(s)
}

#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn load_table(t: &[i8; 16]) -> int8x16_t {
    // SAFETY: `t` is 16 readable bytes.
    unsafe { vld1q_s8(t.as_ptr()) }
}

#[target_feature(enable = "neon,dotprod")]
fn iq4_nl_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = check_blocks(n, w, IQ4_NL_BYTES, a, Q8_0_BYTES);
    let table = load_table(&KVALUES_IQ4NL);
    // pairs of blocks as arrays (one index for both sides), the slices cut to the block count
    // (known from `n` by a shift) so that the chunking needs no division
    let (wp, wl) = w[..nb * IQ4_NL_BYTES].as_chunks::<{ 2 * IQ4_NL_BYTES }>();
    let (ap, al) = a[..nb * Q8_0_BYTES].as_chunks::<{ 2 * Q8_0_BYTES }>();
    let mut sum = 0f32;
    for (x, y) in wp.iter().zip(ap) {
        let (x0, x1) = (
            arr::<IQ4_NL_BYTES>(x),
            arr::<IQ4_NL_BYTES>(&x[IQ4_NL_BYTES..]),
        );
        let (y0, y1) = (arr::<Q8_0_BYTES>(y), arr::<Q8_0_BYTES>(&y[Q8_0_BYTES..]));
        let s0 = lut_block(table, &x0[2..], y0);
        let s1 = lut_block(table, &x1[2..], y1);
        let d0 = f16_at(x0, 0) * f16_at(y0, 0);
        let d1 = f16_at(x1, 0) * f16_at(y1, 0);
        // sum + fma(d0, s0, s1 · d1)
        sum += d0.mul_add(s0, s1 * d1);
    }
    if let (Some(x), Some(y)) = (
        wl.first_chunk::<IQ4_NL_BYTES>(),
        al.first_chunk::<Q8_0_BYTES>(),
    ) {
        let s = lut_block(table, &x[2..], y);
        sum = s.mul_add(f16_at(y, 0) * f16_at(x, 0), sum);
    }
    sum
}

#[target_feature(enable = "neon,dotprod")]
fn mxfp4_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, MXFP4_BYTES, a, Q8_0_BYTES);
    let table = load_table(&KVALUES_MXFP4);
    let (w, _) = w.as_chunks::<MXFP4_BYTES>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut sum = 0f32;
    let mut wp = w.chunks_exact(2);
    let mut ap = a.chunks_exact(2);
    for (x, y) in (&mut wp).zip(&mut ap) {
        let s0 = lut_block(table, &x[0][1..], &y[0]);
        let s1 = lut_block(table, &x[1][1..], &y[1]);
        let d0 = f16_at(&y[0], 0) * e8m0_to_f32_half(x[0][0]);
        let d1 = f16_at(&y[1], 0) * e8m0_to_f32_half(x[1][0]);
        // sum + fma(s1, d1, s0 · d0)
        sum += s1.mul_add(d1, s0 * d0);
    }
    if let (Some(x), Some(y)) = (wp.remainder().first(), ap.remainder().first()) {
        let s = lut_block(table, &x[1..], y);
        sum = s.mul_add(f16_at(y, 0) * e8m0_to_f32_half(x[0]), sum);
    }
    sum
}

// ---------------------------------------------------------------------------------------
// Float kernels.

/// Four f32 from 16 bytes (little-endian, any alignment).
#[inline]
#[target_feature(enable = "neon")]
fn load_f32x4(b: &[u8]) -> float32x4_t {
    vreinterpretq_f32_u8(load_u8(arr(b)))
}

#[target_feature(enable = "neon")]
fn f32_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_floats(n, w, a, 4);
    let np = n & !15;
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (x, y) in w[..4 * np].chunks_exact(64).zip(a.chunks_exact(64)) {
        for (j, acc) in acc.iter_mut().enumerate() {
            let o = 16 * j;
            *acc = vfmaq_f32(*acc, load_f32x4(&x[o..]), load_f32x4(&y[o..]));
        }
    }
    let mut sum = hsum(vaddq_f32(
        vaddq_f32(acc[0], acc[2]),
        vaddq_f32(acc[1], acc[3]),
    ));
    let (w, _) = w[4 * np..].as_chunks::<4>();
    let (a, _) = a[4 * np..].as_chunks::<4>();
    let f = |b: &[u8; 4]| f32::from_le_bytes(*b);
    let fours = w.len() / 4 * 4;
    for (x, y) in w[..fours].chunks_exact(4).zip(a.chunks_exact(4)) {
        for (x, y) in x.iter().zip(y) {
            sum += f(x) * f(y);
        }
    }
    for (x, y) in w[fours..].iter().zip(&a[fours..]) {
        sum = f(x).mul_add(f(y), sum);
    }
    sum
}

#[target_feature(enable = "neon")]
fn bf16_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_floats(n, w, a, 2);
    let (w, a) = (&w[..2 * n], &a[..2 * n]);
    let (wc, wt) = w.as_chunks::<16>();
    let (ac, at) = a.as_chunks::<16>();
    // bf16 bits shifted into the high half of a u32 are the f32
    let widen = |v: uint16x8_t| {
        (
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(v))),
            vreinterpretq_f32_u32(vshll_high_n_u16::<16>(v)),
        )
    };
    let mut sum = 0f64;
    for (x, y) in wc.iter().zip(ac) {
        let (x0, x1) = widen(vreinterpretq_u16_u8(load_u8(x)));
        let (y0, y1) = widen(vreinterpretq_u16_u8(load_u8(y)));
        for p in [vmulq_f32(x0, y0), vmulq_f32(x1, y1)] {
            for d in [vcvt_f64_f32(vget_low_f32(p)), vcvt_high_f64_f32(p)] {
                sum += vgetq_lane_f64::<0>(d);
                sum += vgetq_lane_f64::<1>(d);
            }
        }
    }
    let (wt, _) = wt.as_chunks::<2>();
    let (at, _) = at.as_chunks::<2>();
    for (x, y) in wt.iter().zip(at) {
        let p = bf16_to_f32(u16::from_le_bytes(*x)) * bf16_to_f32(u16::from_le_bytes(*y));
        sum += f64::from(p);
    }
    sum as f32
}

/// Eight halves (as bits) from 16 bytes.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn load_f16x8(b: &[u8]) -> uint16x8_t {
    vreinterpretq_u16_u8(load_u8(arr(b)))
}

/// `acc + x · y` in each of eight f16 lanes, one rounding (FP16 `fmla`; Rust has no stable
/// f16 vector type).
#[inline]
#[target_feature(enable = "neon,fp16")]
pub(crate) fn fmla_f16(mut acc: uint16x8_t, x: uint16x8_t, y: uint16x8_t) -> uint16x8_t {
    // SAFETY: a register-only instruction of the FP16 extension this function is compiled
    // for.
    unsafe {
        asm!(
            "fmla {acc:v}.8h, {x:v}.8h, {y:v}.8h",
            acc = inout(vreg) acc,
            x = in(vreg) x,
            y = in(vreg) y,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// `x + y` in each of eight f16 lanes.
#[inline]
#[target_feature(enable = "neon,fp16")]
fn fadd_f16(x: uint16x8_t, y: uint16x8_t) -> uint16x8_t {
    let r: uint16x8_t;
    // SAFETY: as for `fmla_f16`.
    unsafe {
        asm!(
            "fadd {r:v}.8h, {x:v}.8h, {y:v}.8h",
            r = lateout(vreg) r,
            x = in(vreg) x,
            y = in(vreg) y,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    r
}

/// The low and the high four f16 lanes widened to f32 (exact).
#[inline]
#[target_feature(enable = "neon,fp16")]
pub(crate) fn widen_f16(x: uint16x8_t) -> (float32x4_t, float32x4_t) {
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: as for `fmla_f16`. (`lo` is written before `x` is read the second time, so it
    // must not share `x`'s register: `out`, not `lateout`.)
    unsafe {
        asm!(
            "fcvtl {lo:v}.4s, {x:v}.4h",
            "fcvtl2 {hi:v}.4s, {x:v}.8h",
            lo = out(vreg) lo,
            hi = lateout(vreg) hi,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    (lo, hi)
}

#[target_feature(enable = "neon,fp16")]
fn f16_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_floats(n, w, a, 2);
    let np = n & !31;
    let mut acc = [vdupq_n_u16(0); 4];
    for (x, y) in w[..2 * np].chunks_exact(64).zip(a.chunks_exact(64)) {
        for (j, acc) in acc.iter_mut().enumerate() {
            let o = 16 * j;
            *acc = fmla_f16(*acc, load_f16x8(&x[o..]), load_f16x8(&y[o..]));
        }
    }
    f16_finish(acc, &w[2 * np..], &a[2 * np..])
}

/// The end of the F16 kernel: the four f16x8 accumulators reduced in f16, widened and
/// reduced in f32, then the leftover elements (`w`, `a`: their bytes) added in f64.
#[inline]
#[target_feature(enable = "neon,fp16")]
fn f16_finish(acc: [uint16x8_t; 4], w: &[u8], a: &[u8]) -> f32 {
    let r = fadd_f16(fadd_f16(acc[0], acc[2]), fadd_f16(acc[1], acc[3]));
    let (lo, hi) = widen_f16(r);
    let mut sum = f64::from(hsum(vaddq_f32(lo, hi)));
    let (w, _) = w.as_chunks::<2>();
    let (a, _) = a.as_chunks::<2>();
    for (x, y) in w.iter().zip(a) {
        let p = f16_to_f32(u16::from_le_bytes(*x)) * f16_to_f32(u16::from_le_bytes(*y));
        sum += f64::from(p);
    }
    sum as f32
}

// ---------------------------------------------------------------------------------------
// DotFn wrappers. They are registered only in a table built for `Isa::Neon`, which
// `Kernels::detect` builds only after it detected NEON, the dot product and FP16 at run time.

macro_rules! wrap {
    ($($name:ident => $imp:ident),* $(,)?) => {$(
        fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only reachable through a NEON table (see above), so the CPU has the
            // features `$imp` is compiled for.
            unsafe { $imp(n, w, a) }
        }
    )*};
}

wrap! {
    dot_f32 => f32_neon,
    dot_f16 => f16_neon,
    dot_bf16 => bf16_neon,
    dot_q8_0 => q8_0_neon,
    dot_q4_0 => q4_0_neon,
    dot_q4_1 => q4_1_neon,
    dot_q5_0 => q5_0_neon,
    dot_q5_1 => q5_1_neon,
    dot_iq4_nl => iq4_nl_neon,
    dot_mxfp4 => mxfp4_neon,
}
