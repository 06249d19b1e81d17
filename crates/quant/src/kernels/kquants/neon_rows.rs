//! NEON multi-row kernels ([`crate::kernels::DotRowsFn`]): four consecutive k-quant weight
//! rows (plain GGUF layout, read in place) × one Q8_K activation row.
//!
//! The single-row kernels in `neon.rs` keep one scalar float sum per row and change it once
//! or twice per super-block with a product and a fused multiply-add of scalars. Here the
//! four rows' sums are the four lanes of one f32x4, and each of those scalar operations is
//! the same IEEE operation done lane by lane, on the same operands in the same roles (the
//! products `dy · d` etc., `fma(-mins, dmin, sum)`, …), so every result is bit-identical to
//! `dot` on that row. The integer sums of a super-block are exact (modulo 2^32, like the
//! single-row kernels' own), so the four rows' totals come from one pairwise reduction
//! instead of one horizontal add each.
//!
//! The rows share the activation loads (each 16 activation quants are loaded once for the
//! four rows), the activation scale and group sums, and the float work of a super-block; the
//! f16 scales of the four rows are converted with one instruction.

use std::arch::aarch64::*;
use std::arch::asm;

use super::layout::{q4k, q5k, q6k};
use super::neon::{Q8KBlock, bsums, group_sums_lanes, ld_s8, ld_u8, s8};
use super::{Q8K_BYTES, Q8K_QS, check_dot, f32_at, unpack_scales_mins_k4};
use crate::kernels::Kernels;
use crate::kernels::legacy::neon::{load_u8, sdot};
use crate::{GgmlType, QK_K};

/// Rows per call: one f32 lane each.
const ROWS: usize = 4;

pub(super) fn register(k: &mut Kernels) {
    k.set_dot_rows(GgmlType::Q4_K, ROWS, dot_rows_q4_k);
    k.set_dot_rows(GgmlType::Q5_K, ROWS, dot_rows_q5_k);
    k.set_dot_rows(GgmlType::Q6_K, ROWS, dot_rows_q6_k);
}

/// Split `w` into [`ROWS`] rows of whole blocks after checking the
/// [`crate::kernels::DotRowsFn`] contract (each row against `a` as [`check_dot`] does for one
/// row).
#[inline]
fn split_rows<'w, const B: usize>(
    ty: GgmlType,
    n: usize,
    w: &'w [u8],
    a: &[u8],
    out: &[f32],
) -> [&'w [[u8; B]]; ROWS] {
    assert_eq!(out.len(), ROWS, "{ty} dot_rows: takes {ROWS} rows per call");
    let row_bytes = n / QK_K * B;
    assert_eq!(
        w.len(),
        ROWS * row_bytes,
        "{ty} dot_rows: weight rows length"
    );
    std::array::from_fn(|r| {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        check_dot(ty, n, row, a);
        row.as_chunks::<B>().0
    })
}

/// Plain-`fn` entry points with the `DotRowsFn` signature. They are registered only in the
/// NEON table, which [`Kernels::detect`] builds only after it detected NEON, the dot product
/// and FP16 at run time.
macro_rules! entry {
    ($vis:vis $name:ident, $ty:expr, $bytes:expr, $kernel:ident) => {
        $vis fn $name(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
            let rows = split_rows::<{ $bytes }>($ty, n, w, a, out);
            let (a, _) = a.as_chunks::<Q8K_BYTES>();
            // SAFETY: only reachable through the NEON table (see above), so the CPU has the
            // features the kernel is compiled for.
            let sums = unsafe { $kernel(rows, a) };
            out.copy_from_slice(&sums);
        }
    };
}

entry!(dot_rows_q4_k, GgmlType::Q4_K, q4k::BYTES, q4k_rows);
entry!(dot_rows_q5_k, GgmlType::Q5_K, q5k::BYTES, q5k_rows);
entry!(pub(super) dot_rows_q6_k, GgmlType::Q6_K, q6k::BYTES, q6k_rows);

// ---------------------------------------------------------------------------------------
// Helpers.

/// The totals of four i32x4 vectors, one per lane (exact modulo 2^32, as integers).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn totals4(v: [int32x4_t; ROWS]) -> int32x4_t {
    vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]))
}

/// The f16 at `off` of each of the four blocks, as f32 (exact; one `fcvtl`, the instruction
/// the single-row kernels' scalar conversion uses).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn f16x4<const B: usize>(x: [&[u8; B]; ROWS], off: usize) -> float32x4_t {
    let bits = x.map(|x| u16::from_le_bytes([x[off], x[off + 1]]));
    // SAFETY: `bits` is four readable u16.
    let h = unsafe { vld1_u16(bits.as_ptr()) };
    let f: float32x4_t;
    // SAFETY: a register-only instruction of base NEON.
    unsafe {
        asm!(
            "fcvtl {f:v}.4s, {h:v}.4h",
            f = lateout(vreg) f,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    f
}

/// The four lanes as an array.
#[inline]
#[target_feature(enable = "neon")]
fn lanes(v: float32x4_t) -> [f32; ROWS] {
    let mut out = [0f32; ROWS];
    // SAFETY: `out` is four writable f32.
    unsafe { vst1q_f32(out.as_mut_ptr(), v) };
    out
}

/// The 64 activation quants of `y` from element `e` as four vectors.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn act64(y: &Q8KBlock, e: usize) -> [int8x16_t; 4] {
    [0, 1, 2, 3].map(|k| ld_s8(y, Q8K_QS + e + 16 * k))
}

/// The Q4_K / Q5_K minimum term of one row before its horizontal sum: the sums of two
/// consecutive group sums (`q8sums`) times the row's eight minimums (the high half of `sm`).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn k4_mins_lanes(sm: &[u8; 16], q8sums: int16x8_t) -> int32x4_t {
    let mins = vreinterpretq_s16_u16(vmovl_high_u8(load_u8(sm)));
    vaddq_s32(
        vmull_s16(vget_low_s16(q8sums), vget_low_s16(mins)),
        vmull_high_s16(q8sums, mins),
    )
}

/// `Σ lo · y[0] + Σ hi · y[1]` in four lanes.
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(super) fn dot32(lo: int8x16_t, hi: int8x16_t, y0: int8x16_t, y1: int8x16_t) -> int32x4_t {
    sdot(sdot(vdupq_n_s32(0), lo, y0), hi, y1)
}

// ---------------------------------------------------------------------------------------
// Q4_K and Q5_K.

#[target_feature(enable = "neon,dotprod")]
fn q4k_rows(w: [&[[u8; q4k::BYTES]]; ROWS], a: &[Q8KBlock]) -> [f32; ROWS] {
    let m4 = vdupq_n_u8(0x0f);
    let mut sum = vdupq_n_f32(0.0);
    for (b, y) in a.iter().enumerate() {
        let x = w.map(|row| &row[b]);
        let dy = vdupq_n_f32(f32_at(y, 0));
        // dy · d and dy · dmin
        let d = vmulq_f32(dy, f16x4(x, q4k::D));
        let dmin = vmulq_f32(dy, f16x4(x, q4k::DMIN));
        let sm = x.map(|x| unpack_scales_mins_k4(&x[q4k::SCALES..q4k::SCALES + 12]));
        let (b0, b1) = bsums(y);
        let q8sums = vpaddq_s16(b0, b1);
        let mins = totals4(sm.map(|sm| k4_mins_lanes(&sm, q8sums)));
        // sum - mins · dmin, fused
        sum = vfmaq_f32(sum, vnegq_f32(vcvtq_f32_s32(mins)), dmin);

        let mut acc = [vdupq_n_s32(0); ROWS];
        for j in 0..4 {
            let yq = act64(y, 64 * j);
            for ((acc, x), sm) in acc.iter_mut().zip(x).zip(&sm) {
                let q0 = ld_u8(x, q4k::QS + 32 * j);
                let q1 = ld_u8(x, q4k::QS + 32 * j + 16);
                let lo = dot32(s8(vandq_u8(q0, m4)), s8(vandq_u8(q1, m4)), yq[0], yq[1]);
                let hi = dot32(
                    s8(vshrq_n_u8::<4>(q0)),
                    s8(vshrq_n_u8::<4>(q1)),
                    yq[2],
                    yq[3],
                );
                *acc = vmlaq_n_s32(*acc, lo, i32::from(sm[2 * j]));
                *acc = vmlaq_n_s32(*acc, hi, i32::from(sm[2 * j + 1]));
            }
        }
        // sum + isum · d, fused
        sum = vfmaq_f32(sum, vcvtq_f32_s32(totals4(acc)), d);
    }
    lanes(sum)
}

#[target_feature(enable = "neon,dotprod")]
fn q5k_rows(w: [&[[u8; q5k::BYTES]]; ROWS], a: &[Q8KBlock]) -> [f32; ROWS] {
    let m4 = vdupq_n_u8(0x0f);
    let one = vdupq_n_u8(1);
    let two = vdupq_n_u8(2);
    let mut sum = vdupq_n_f32(0.0);
    for (b, y) in a.iter().enumerate() {
        let x = w.map(|row| &row[b]);
        let dy = vdupq_n_f32(f32_at(y, 0));
        // dy · d and dy · dmin
        let d = vmulq_f32(dy, f16x4(x, q5k::D));
        let dmin = vmulq_f32(dy, f16x4(x, q5k::DMIN));
        let sm = x.map(|x| unpack_scales_mins_k4(&x[q5k::SCALES..q5k::SCALES + 12]));
        let (b0, b1) = bsums(y);
        let q8sums = vpaddq_s16(b0, b1);
        let mins = totals4(sm.map(|sm| k4_mins_lanes(&sm, q8sums)));

        // bit 2j of qh[l]: the fifth bit of element 64j + l; bit 2j + 1: of 64j + 32 + l
        let mut qh = x.map(|x| (ld_u8(x, q5k::QH), ld_u8(x, q5k::QH + 16)));
        let mut acc = [vdupq_n_s32(0); ROWS];
        for j in 0..4 {
            let yq = act64(y, 64 * j);
            for (((acc, x), sm), (qh0, qh1)) in acc.iter_mut().zip(x).zip(&sm).zip(&mut qh) {
                let q0 = ld_u8(x, q5k::QS + 32 * j);
                let q1 = ld_u8(x, q5k::QS + 32 * j + 16);
                let h0 = vshlq_n_u8::<4>(vandq_u8(one, *qh0));
                let h1 = vshlq_n_u8::<4>(vandq_u8(one, *qh1));
                let h2 = vshlq_n_u8::<3>(vandq_u8(two, *qh0));
                let h3 = vshlq_n_u8::<3>(vandq_u8(two, *qh1));
                *qh0 = vshrq_n_u8::<2>(*qh0);
                *qh1 = vshrq_n_u8::<2>(*qh1);
                let lo = dot32(
                    s8(vorrq_u8(vandq_u8(q0, m4), h0)),
                    s8(vorrq_u8(vandq_u8(q1, m4), h1)),
                    yq[0],
                    yq[1],
                );
                let hi = dot32(
                    s8(vorrq_u8(vshrq_n_u8::<4>(q0), h2)),
                    s8(vorrq_u8(vshrq_n_u8::<4>(q1), h3)),
                    yq[2],
                    yq[3],
                );
                *acc = vmlaq_n_s32(*acc, lo, i32::from(sm[2 * j]));
                *acc = vmlaq_n_s32(*acc, hi, i32::from(sm[2 * j + 1]));
            }
        }
        // sum + fma(isum, d, -(mins · dmin))
        let neg_mins = vnegq_f32(vmulq_f32(vcvtq_f32_s32(mins), dmin));
        let isum = vcvtq_f32_s32(totals4(acc));
        sum = vaddq_f32(sum, vfmaq_f32(neg_mins, isum, d));
    }
    lanes(sum)
}

// ---------------------------------------------------------------------------------------
// Q6_K.

/// `Σ_g bsums[g] · scales[g]` of a Q6_K block `x` against the group sums `bs`, before its
/// horizontal sum.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn q6k_scale_sums(x: &[u8; q6k::BYTES], bs: (int16x8_t, int16x8_t)) -> int32x4_t {
    let sc = ld_s8(x, q6k::SCALES);
    group_sums_lanes(vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc), bs)
}

/// The quants of half `j` (elements 128j..128j + 128) of a Q6_K block, unsigned (0..64), as
/// eight vectors of 16: group `8j + k` in vector `k`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn q6k_half(x: &[u8; q6k::BYTES], j: usize) -> [uint8x16_t; 8] {
    let m4 = vdupq_n_u8(0x0f);
    let m3 = vdupq_n_u8(0x03);
    let m30 = vdupq_n_u8(0x30);
    let mc = vdupq_n_u8(0x0c);
    let qh0 = ld_u8(x, q6k::QH + 32 * j);
    let qh1 = ld_u8(x, q6k::QH + 32 * j + 16);
    let ql = |k: usize| ld_u8(x, q6k::QL + 64 * j + 16 * k);
    let (l0, l1, l2, l3) = (ql(0), ql(1), ql(2), ql(3));
    // bits 2s..2s+2 of qh moved to bits 4..6
    let h0 = |qh: uint8x16_t| vshlq_n_u8::<4>(vandq_u8(qh, m3));
    let h2 = |qh: uint8x16_t| vshlq_n_u8::<2>(vandq_u8(qh, mc));
    let h4 = |qh: uint8x16_t| vandq_u8(qh, m30);
    let h6 = |qh: uint8x16_t| vandq_u8(vshrq_n_u8::<2>(qh), m30);
    [
        vorrq_u8(vandq_u8(l0, m4), h0(qh0)),
        vorrq_u8(vandq_u8(l1, m4), h0(qh1)),
        vorrq_u8(vandq_u8(l2, m4), h2(qh0)),
        vorrq_u8(vandq_u8(l3, m4), h2(qh1)),
        vorrq_u8(vshrq_n_u8::<4>(l0), h4(qh0)),
        vorrq_u8(vshrq_n_u8::<4>(l1), h4(qh1)),
        vorrq_u8(vshrq_n_u8::<4>(l2), h6(qh0)),
        vorrq_u8(vshrq_n_u8::<4>(l3), h6(qh1)),
    ]
}

#[target_feature(enable = "neon,dotprod")]
fn q6k_rows(w: [&[[u8; q6k::BYTES]]; ROWS], a: &[Q8KBlock]) -> [f32; ROWS] {
    let mut sum = vdupq_n_f32(0.0);
    for (b, y) in a.iter().enumerate() {
        let x = w.map(|row| &row[b]);
        let bs = bsums(y);
        // Σ_g bsums[g] · scales[g] per row, before its horizontal sum
        let mins = totals4(x.map(|x| q6k_scale_sums(x, bs)));

        // quants taken unsigned (0..64), the offset -32 applied through the group sums
        let mut acc = [vdupq_n_s32(0); ROWS];
        for j in 0..2 {
            let yq: [int8x16_t; 8] = std::array::from_fn(|k| ld_s8(y, Q8K_QS + 128 * j + 16 * k));
            for (acc, x) in acc.iter_mut().zip(x) {
                let quants = q6k_half(x, j);
                for (k, (q, yk)) in quants.into_iter().zip(yq).enumerate() {
                    let scale = i32::from(x[q6k::SCALES + 8 * j + k] as i8);
                    *acc = vmlaq_n_s32(*acc, sdot(vdupq_n_s32(0), s8(q), yk), scale);
                }
            }
        }
        let isum = vsubq_s32(totals4(acc), vshlq_n_s32::<5>(mins));
        // sum + (d · dy) · isum, fused
        let d = vmulq_f32(f16x4(x, q6k::D), vdupq_n_f32(f32_at(y, 0)));
        sum = vfmaq_f32(sum, d, vcvtq_f32_s32(isum));
    }
    lanes(sum)
}
