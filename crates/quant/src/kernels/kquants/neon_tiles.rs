//! NEON multi-token kernels ([`crate::kernels::DotTokensFn`]) of the k-quants and IQ4_XS,
//! and the multi-row kernels of llama.cpp's ARM 8x4 orders: four weight rows (one f32 lane
//! each, as in `neon_rows.rs`) × `T` Q8_K activation rows.
//!
//! Each output keeps the float steps of its single-row kernel in `neon.rs`, lane by lane:
//!
//! * `SumOrder::VecDot` (`vec_dot`): Q4_K `sum = fma(-mins, dy · dmin, sum)` then
//!   `sum = fma(isum, dy · d, sum)`; Q5_K `sum = sum + fma(isum, dy · d, -(mins · (dy · dmin)))`;
//!   Q6_K and IQ4_XS `sum = fma(d · dy, isum, sum)`; Q3_K `sum = fma(isum, dy · d, sum)`; Q2_K
//!   `sum = fma(mins, -(dy · dmin), sum)` then `sum = fma(isum, dy · d, sum)`.
//! * `SumOrder::Repacked` (the 8x4 gemv and gemm): Q4_K and Q5_K
//!   `acc = fma(d · dy, isum_j, acc)` per pair of sub-blocks `j`, then
//!   `acc = acc - mins · (dmin · dy)`; Q6_K's gemv as its `vec_dot`, its gemm
//!   `acc = acc + isum · (d · dy)`.
//!
//! Per super-block, the quants, sub-block scales and f16 scales of the four rows are unpacked
//! once for the `T` tokens. Integer sums are exact, so the four rows' totals come from one
//! pairwise reduction.
//!
//! For Q4_K and Q5_K, `T = 1` is also the multi-row kernel of a one-token product in the
//! repacked order (which the NEON table uses for every weight llama.cpp's ARM build repacks);
//! `T = 4` is the tile of a batched one.

use std::arch::aarch64::*;

use super::layout::{iq4xs, q2k, q3k, q4k, q5k, q6k};
use super::neon::{Q8KBlock, bsums, group_sums_lanes, ld_s8, ld_u8, s8};
use super::neon_rows::{act64, dot32, f16x4, k4_mins_lanes, q6k_half, q6k_scale_sums, totals4};
use super::{Q8K_BYTES, Q8K_QS, f32_at, unpack_scales_q3k};
use crate::kernels::legacy::neon::load_u8;
use crate::kernels::legacy::neon::sdot;
use crate::kernels::{DotRows, DotRowsFn, DotTokens, DotTokensFn, SumOrder};
use crate::tables::KVALUES_IQ4NL;
use crate::{GgmlType, QK_K};

/// Weight rows per call: one f32 lane each.
const ROWS: usize = 4;
/// Activation rows per call of the multi-token kernels.
const TOKENS: usize = 4;

/// `w` as [`ROWS`] rows and `a` as `T` rows of `n / 256` blocks, after checking the
/// [`crate::kernels::DotTokensFn`] contract.
#[inline]
#[allow(clippy::type_complexity)]
fn split<'w, 'a, const B: usize, const T: usize>(
    ty: GgmlType,
    n: usize,
    w: &'w [u8],
    a: &'a [u8],
    out: &[f32],
) -> ([&'w [[u8; B]]; ROWS], [&'a [Q8KBlock]; T]) {
    let nb = n / QK_K;
    assert!(
        n.is_multiple_of(QK_K)
            && w.len() == ROWS * nb * B
            && a.len() == T * nb * Q8K_BYTES
            && out.len() == ROWS * T,
        "{ty} tile contract violated: n = {n}, weight bytes {} ({ROWS} rows), activation \
         bytes {} ({T} rows), {} outputs",
        w.len(),
        a.len(),
        out.len()
    );
    (
        std::array::from_fn(|r| w[r * nb * B..(r + 1) * nb * B].as_chunks::<B>().0),
        std::array::from_fn(|t| {
            a[t * nb * Q8K_BYTES..(t + 1) * nb * Q8K_BYTES]
                .as_chunks::<Q8K_BYTES>()
                .0
        }),
    )
}

/// Stores the `T` accumulators (lane `r` = row `r`) token-major into `out`.
#[inline]
#[target_feature(enable = "neon")]
fn store<const T: usize>(acc: [float32x4_t; T], out: &mut [f32]) {
    for (o, acc) in out.as_chunks_mut::<ROWS>().0.iter_mut().zip(acc) {
        // SAFETY: `o` is four writable f32.
        unsafe { vst1q_f32(o.as_mut_ptr(), acc) }
    }
}

// ---------------------------------------------------------------------------------------
// Q4_K and Q5_K.

/// The 12 scale bytes of a Q4_K / Q5_K block `x` unpacked as `unpack_scales_mins_k4` does:
/// the eight 6-bit scales, then the eight 6-bit minimums (with `s` the 12 bytes: scales and
/// minimums 0..4 are the low 6 bits of `s[0..4]` and `s[4..8]`, 4..8 the low and high
/// nibbles of `s[8..12]` with the top 2 bits of `s[0..4]` and `s[4..8]` above them).
#[inline]
#[target_feature(enable = "neon")]
fn k4_scales_mins<const B: usize>(x: &[u8; B]) -> [u8; 16] {
    const Z: u8 = 0xff;
    // [s0..4, s8..12, s4..8, s8..12] and [0, s0..4, 0, s4..8]
    const LOW: [u8; 16] = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11];
    const TOP: [u8; 16] = [Z, Z, Z, Z, 0, 1, 2, 3, Z, Z, Z, Z, 4, 5, 6, 7];
    const SHIFT: [i8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -4, -4, -4, -4];
    const MASK: [u8; 16] = [
        0x3f, 0x3f, 0x3f, 0x3f, 0x0f, 0x0f, 0x0f, 0x0f, 0x3f, 0x3f, 0x3f, 0x3f, 0x0f, 0x0f, 0x0f,
        0x0f,
    ];
    const { assert!(q4k::SCALES + 16 <= B) };
    let s = ld_u8(x, q4k::SCALES);
    let low = vqtbl1q_u8(s, load_u8(&LOW));
    let top = vqtbl1q_u8(s, load_u8(&TOP));
    // SAFETY: `SHIFT` is 16 readable bytes.
    let shift = unsafe { vld1q_s8(SHIFT.as_ptr()) };
    let low = vandq_u8(vshlq_u8(low, shift), load_u8(&MASK));
    let top = vandq_u8(vshrq_n_u8::<2>(top), vdupq_n_u8(0x30));
    let mut out = [0u8; 16];
    // SAFETY: `out` is 16 writable bytes.
    unsafe { vst1q_u8(out.as_mut_ptr(), vorrq_u8(low, top)) };
    out
}

/// The float steps of a Q4_K / Q5_K super-block.
#[derive(Clone, Copy, PartialEq, Eq)]
enum K4Order {
    /// Q4_K's `vec_dot`.
    VecDotQ4,
    /// Q5_K's `vec_dot`.
    VecDotQ5,
    /// The 8x4 gemv and gemm of both.
    Repacked,
}

/// The tile for Q4_K (`Q5 = false`) or Q5_K weights (blocks of `B` bytes) in `order`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn k4_tile<const B: usize, const T: usize, const Q5: bool>(
    ty: GgmlType,
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    order: K4Order,
) {
    // both layouts start with d, dmin, scales[12]; Q5_K has qh[32] before its qs
    const { assert!(q4k::D == q5k::D && q4k::DMIN == q5k::DMIN && q4k::SCALES == q5k::SCALES) };
    let qs = if Q5 { q5k::QS } else { q4k::QS };
    let (w, a) = split::<B, T>(ty, n, w, a, out);
    let m4 = vdupq_n_u8(0x0f);
    let one = vdupq_n_u8(1);
    let two = vdupq_n_u8(2);
    let mut acc = [vdupq_n_f32(0.0); T];
    for b in 0..n / QK_K {
        let x = w.map(|row| &row[b]);
        let y: [&Q8KBlock; T] = a.map(|act| &act[b]);
        let dw = f16x4(x, q4k::D);
        let dminw = f16x4(x, q4k::DMIN);
        let sm = x.map(|x| k4_scales_mins(x));
        // bit 2j of qh[l]: the fifth bit of element 64j + l; bit 2j + 1: of 64j + 32 + l
        let mut qh = x.map(|x| {
            if Q5 {
                (ld_u8(x, q5k::QH), ld_u8(x, q5k::QH + 16))
            } else {
                (vdupq_n_u8(0), vdupq_n_u8(0))
            }
        });
        // per token: d · dy and dmin · dy
        let dy: [f32; T] = y.map(|y| f32_at(y, 0));
        let d = dy.map(|dy| vmulq_n_f32(dw, dy));
        // per token, the vec_dot orders' integer sum over the super-block
        let mut isum = [vdupq_n_s32(0); T];
        for j in 0..4 {
            // the 64 quants of pair j of each row: low nibbles (sub-block 2j), high nibbles
            // (sub-block 2j + 1), with the fifth bit for Q5_K
            let q: [[int8x16_t; 4]; ROWS] = std::array::from_fn(|r| {
                let q0 = ld_u8(x[r], qs + 32 * j);
                let q1 = ld_u8(x[r], qs + 32 * j + 16);
                let mut v = [
                    vandq_u8(q0, m4),
                    vandq_u8(q1, m4),
                    vshrq_n_u8::<4>(q0),
                    vshrq_n_u8::<4>(q1),
                ];
                if Q5 {
                    let (qh0, qh1) = &mut qh[r];
                    v[0] = vorrq_u8(v[0], vshlq_n_u8::<4>(vandq_u8(one, *qh0)));
                    v[1] = vorrq_u8(v[1], vshlq_n_u8::<4>(vandq_u8(one, *qh1)));
                    v[2] = vorrq_u8(v[2], vshlq_n_u8::<3>(vandq_u8(two, *qh0)));
                    v[3] = vorrq_u8(v[3], vshlq_n_u8::<3>(vandq_u8(two, *qh1)));
                    *qh0 = vshrq_n_u8::<2>(*qh0);
                    *qh1 = vshrq_n_u8::<2>(*qh1);
                }
                v.map(|v| s8(v))
            });
            for (((acc, isum), y), d) in acc.iter_mut().zip(&mut isum).zip(y).zip(d) {
                let yq = act64(y, 64 * j);
                // scale_2j · Σ_2j + scale_2j+1 · Σ_2j+1, one row per lane
                let v: [int32x4_t; ROWS] = std::array::from_fn(|r| {
                    let lo = dot32(q[r][0], q[r][1], yq[0], yq[1]);
                    let hi = dot32(q[r][2], q[r][3], yq[2], yq[3]);
                    let s = vmulq_n_s32(lo, i32::from(sm[r][2 * j]));
                    vmlaq_n_s32(s, hi, i32::from(sm[r][2 * j + 1]))
                });
                let pair = totals4(v);
                if order == K4Order::Repacked {
                    *acc = vfmaq_f32(*acc, d, vcvtq_f32_s32(pair));
                } else {
                    *isum = vaddq_s32(*isum, pair);
                }
            }
        }
        for (((acc, isum), y), (d, dy)) in
            acc.iter_mut().zip(isum).zip(y).zip(d.into_iter().zip(dy))
        {
            let (b0, b1) = bsums(y);
            let q8sums = vpaddq_s16(b0, b1);
            let mins = vcvtq_f32_s32(totals4(sm.map(|sm| k4_mins_lanes(&sm, q8sums))));
            let dmin = vmulq_n_f32(dminw, dy);
            match order {
                K4Order::Repacked => *acc = vsubq_f32(*acc, vmulq_f32(mins, dmin)),
                K4Order::VecDotQ4 => {
                    *acc = vfmaq_f32(*acc, vnegq_f32(mins), dmin);
                    *acc = vfmaq_f32(*acc, vcvtq_f32_s32(isum), d);
                }
                K4Order::VecDotQ5 => {
                    let neg_mins = vnegq_f32(vmulq_f32(mins, dmin));
                    *acc = vaddq_f32(*acc, vfmaq_f32(neg_mins, vcvtq_f32_s32(isum), d));
                }
            }
        }
    }
    store(acc, out);
}

// ---------------------------------------------------------------------------------------
// Q6_K.

/// The tile for Q6_K weights: `gemm` false for `vec_dot` and the 8x4 gemv, true for the 8x4
/// gemm.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn q6k_tile<const T: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32], gemm: bool) {
    let (w, a) = split::<{ q6k::BYTES }, T>(GgmlType::Q6_K, n, w, a, out);
    let mut acc = [vdupq_n_f32(0.0); T];
    for b in 0..n / QK_K {
        let x = w.map(|row| &row[b]);
        let y: [&Q8KBlock; T] = a.map(|act| &act[b]);
        let scales: [[i32; 16]; ROWS] =
            x.map(|x| std::array::from_fn(|g| i32::from(x[q6k::SCALES + g] as i8)));
        // per token and row: Σ_g scale_g · Σ q · a (quants taken unsigned, 0..64)
        let mut isum = [[vdupq_n_s32(0); ROWS]; T];
        for j in 0..2 {
            for (r, &x) in x.iter().enumerate() {
                let quants = q6k_half(x, j).map(|v| s8(v));
                for (isum, y) in isum.iter_mut().zip(y) {
                    let mut s = isum[r];
                    for (k, &q) in quants.iter().enumerate() {
                        let yk = ld_s8(y, Q8K_QS + 128 * j + 16 * k);
                        s = vmlaq_n_s32(s, sdot(vdupq_n_s32(0), q, yk), scales[r][8 * j + k]);
                    }
                    isum[r] = s;
                }
            }
        }
        let dw = f16x4(x, q6k::D);
        for ((acc, isum), y) in acc.iter_mut().zip(isum).zip(y) {
            let bs = bsums(y);
            // Σ_g bsums[g] · scales[g] per row, before its horizontal sum
            let mins = totals4(x.map(|x| q6k_scale_sums(x, bs)));
            // the offset -32 applied through the group sums
            let isum = vcvtq_f32_s32(vsubq_s32(totals4(isum), vshlq_n_s32::<5>(mins)));
            // d · dy
            let d = vmulq_n_f32(dw, f32_at(y, 0));
            *acc = if gemm {
                vaddq_f32(*acc, vmulq_f32(isum, d))
            } else {
                vfmaq_f32(*acc, d, isum)
            };
        }
    }
    store(acc, out);
}

// ---------------------------------------------------------------------------------------
// Q2_K, Q3_K, IQ4_XS (vec_dot order only: llama.cpp's ARM build does not repack them).

/// A super-block's 256 quants as 16 groups of 16 signed bytes and each group's scale: the
/// integer sum against an activation block is `Σ_g scale[g] · Σ q[g] · a[16g..16g + 16]`.
struct Groups {
    q: [int8x16_t; 16],
    scale: [i32; 16],
}

#[inline]
#[target_feature(enable = "neon")]
fn q2k_groups(x: &[u8; q2k::BYTES]) -> Groups {
    let m3 = vdupq_n_u8(3);
    let mut q = [vdupq_n_s8(0); 16];
    // element 128h + 32s + l: bits 2s..2s+2 of qs[32h + l]; group 8h + 2s + l / 16
    for h in 0..2 {
        let q0 = ld_u8(x, q2k::QS + 32 * h);
        let q1 = ld_u8(x, q2k::QS + 32 * h + 16);
        for s in 0..4 {
            let shift = vdupq_n_s8(-2 * s as i8);
            q[8 * h + 2 * s] = s8(vandq_u8(vshlq_u8(q0, shift), m3));
            q[8 * h + 2 * s + 1] = s8(vandq_u8(vshlq_u8(q1, shift), m3));
        }
    }
    let scale = std::array::from_fn(|g| i32::from(x[q2k::SCALES + g] & 0x0f));
    Groups { q, scale }
}

#[inline]
#[target_feature(enable = "neon")]
fn q3k_groups(x: &[u8; q3k::BYTES]) -> Groups {
    let m3 = vdupq_n_u8(3);
    let four = vdupq_n_u8(4);
    let hm0 = ld_u8(x, q3k::HMASK);
    let hm1 = ld_u8(x, q3k::HMASK + 16);
    let mut q = [vdupq_n_s8(0); 16];
    // element 128h + 32s + l: bits 2s..2s+2 of qs[32h + l], minus 4 where bit 4h + s of
    // hmask[l] is clear; group 8h + 2s + l / 16
    for h in 0..2 {
        let q0 = ld_u8(x, q3k::QS + 32 * h);
        let q1 = ld_u8(x, q3k::QS + 32 * h + 16);
        for s in 0..4 {
            let bit = vdupq_n_u8(1 << (4 * h + s));
            let shift = vdupq_n_s8(-2 * s as i8);
            let quant = |v: uint8x16_t, hm: uint8x16_t| {
                let low = vandq_u8(vshlq_u8(v, shift), m3);
                let off = vbicq_u8(four, vtstq_u8(hm, bit));
                vsubq_s8(s8(low), s8(off))
            };
            q[8 * h + 2 * s] = quant(q0, hm0);
            q[8 * h + 2 * s + 1] = quant(q1, hm1);
        }
    }
    let sc = unpack_scales_q3k(&x[q3k::SCALES..q3k::SCALES + 12]);
    let scale = std::array::from_fn(|g| i32::from(sc[g]) - 32);
    Groups { q, scale }
}

#[inline]
#[target_feature(enable = "neon")]
fn iq4xs_groups(x: &[u8; iq4xs::BYTES]) -> Groups {
    // SAFETY: `KVALUES_IQ4NL` is 16 readable bytes.
    let values = unsafe { vld1q_s8(KVALUES_IQ4NL.as_ptr()) };
    let m4 = vdupq_n_u8(0x0f);
    let lut = |v: uint8x16_t| vqtbl1q_s8(values, v);
    let mut q = [vdupq_n_s8(0); 16];
    let mut scale = [0i32; 16];
    let h = u32::from(u16::from_le_bytes([
        x[iq4xs::SCALES_H],
        x[iq4xs::SCALES_H + 1],
    ]));
    // sub-block 2ib: the low then the high nibbles of qs[32ib..32ib + 16] (groups 4ib,
    // 4ib + 1); sub-block 2ib + 1: those of qs[32ib + 16..32ib + 32]
    for ib in 0..4 {
        let q0 = ld_u8(x, iq4xs::QS + 32 * ib);
        let q1 = ld_u8(x, iq4xs::QS + 32 * ib + 16);
        q[4 * ib] = lut(vandq_u8(q0, m4));
        q[4 * ib + 1] = lut(vshrq_n_u8::<4>(q0));
        q[4 * ib + 2] = lut(vandq_u8(q1, m4));
        q[4 * ib + 3] = lut(vshrq_n_u8::<4>(q1));
        let sl = u32::from(x[iq4xs::SCALES_L + ib]);
        let hb = h >> (4 * ib);
        let ls1 = ((sl & 0xf) | ((hb << 4) & 0x30)) as i32 - 32;
        let ls2 = ((sl >> 4) | ((hb << 2) & 0x30)) as i32 - 32;
        scale[4 * ib..4 * ib + 4].copy_from_slice(&[ls1, ls1, ls2, ls2]);
    }
    Groups { q, scale }
}

/// The float steps of a Q2_K / Q3_K / IQ4_XS super-block (their `vec_dot` ones).
#[derive(Clone, Copy, PartialEq, Eq)]
enum GroupOrder {
    /// `sum = fma(mins, -(dy · dmin), sum)`, then `sum = fma(isum, dy · d, sum)`.
    Q2,
    /// `sum = fma(isum, dy · d, sum)`.
    Q3,
    /// `sum = fma(d · dy, isum, sum)`.
    Iq4Xs,
}

/// The tile for a type whose super-blocks `groups` decodes (blocks of `B` bytes, the f16 `d`
/// at `d_at`, Q2_K's `dmin` right after it), with the float steps of `order`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
#[allow(clippy::too_many_arguments)]
fn groups_tile<const B: usize, const T: usize>(
    ty: GgmlType,
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    groups: impl Fn(&[u8; B]) -> Groups,
    d_at: usize,
    order: GroupOrder,
) {
    let (w, a) = split::<B, T>(ty, n, w, a, out);
    let mut acc = [vdupq_n_f32(0.0); T];
    for b in 0..n / QK_K {
        let x = w.map(|row| &row[b]);
        let y: [&Q8KBlock; T] = a.map(|act| &act[b]);
        // per token and row: the integer sum of the super-block
        let mut isum = [[vdupq_n_s32(0); ROWS]; T];
        for (r, x) in x.iter().enumerate() {
            let g = groups(x);
            for (isum, y) in isum.iter_mut().zip(y) {
                let mut s = vdupq_n_s32(0);
                for (k, (&q, &sc)) in g.q.iter().zip(&g.scale).enumerate() {
                    let p = sdot(vdupq_n_s32(0), q, ld_s8(y, Q8K_QS + 16 * k));
                    s = vmlaq_n_s32(s, p, sc);
                }
                isum[r] = s;
            }
        }
        let dw = f16x4(x, d_at);
        for ((acc, isum), y) in acc.iter_mut().zip(isum).zip(y) {
            let dy = f32_at(y, 0);
            let isum = vcvtq_f32_s32(totals4(isum));
            // dy · d (= d · dy)
            let d = vmulq_n_f32(dw, dy);
            match order {
                GroupOrder::Q2 => {
                    // Σ_g bsums[g] · min[g] per row, before its horizontal sum
                    let bs = bsums(y);
                    let mins = totals4(x.map(|x| {
                        let m = vshrq_n_u8::<4>(ld_u8(x, q2k::SCALES));
                        group_sums_lanes(
                            vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(m))),
                            vreinterpretq_s16_u16(vmovl_high_u8(m)),
                            bs,
                        )
                    }));
                    let dmin = vnegq_f32(vmulq_n_f32(f16x4(x, q2k::DMIN), dy));
                    *acc = vfmaq_f32(*acc, vcvtq_f32_s32(mins), dmin);
                    *acc = vfmaq_f32(*acc, isum, d);
                }
                GroupOrder::Q3 | GroupOrder::Iq4Xs => *acc = vfmaq_f32(*acc, isum, d),
            }
        }
    }
    store(acc, out);
}

// ---------------------------------------------------------------------------------------
// Entry points with the `DotRowsFn` / `DotTokensFn` signature. They are registered only in
// the NEON table, which `Kernels::detect` builds only after it detected NEON, the dot
// product and FP16 at run time.

macro_rules! entries {
    ($($name:ident => |$n:ident, $w:ident, $a:ident, $out:ident| $body:expr);* $(;)?) => {$(
        fn $name($n: usize, $w: &[u8], $a: &[u8], $out: &mut [f32]) {
            // SAFETY: only reachable through the NEON table (see above), so the CPU has the
            // features the kernel is compiled for.
            unsafe { $body }
        }
    )*};
}

const Q4: usize = q4k::BYTES;
const Q5: usize = q5k::BYTES;

entries! {
    q4k_vecdot_tokens => |n, w, a, out|
        k4_tile::<Q4, TOKENS, false>(GgmlType::Q4_K, n, w, a, out, K4Order::VecDotQ4);
    q5k_vecdot_tokens => |n, w, a, out|
        k4_tile::<Q5, TOKENS, true>(GgmlType::Q5_K, n, w, a, out, K4Order::VecDotQ5);
    q6k_vecdot_tokens => |n, w, a, out| q6k_tile::<TOKENS>(n, w, a, out, false);
    q4k_repacked_rows => |n, w, a, out|
        k4_tile::<Q4, 1, false>(GgmlType::Q4_K, n, w, a, out, K4Order::Repacked);
    q4k_repacked_tokens => |n, w, a, out|
        k4_tile::<Q4, TOKENS, false>(GgmlType::Q4_K, n, w, a, out, K4Order::Repacked);
    q5k_repacked_rows => |n, w, a, out|
        k4_tile::<Q5, 1, true>(GgmlType::Q5_K, n, w, a, out, K4Order::Repacked);
    q5k_repacked_tokens => |n, w, a, out|
        k4_tile::<Q5, TOKENS, true>(GgmlType::Q5_K, n, w, a, out, K4Order::Repacked);
    q6k_gemm_rows => |n, w, a, out| q6k_tile::<1>(n, w, a, out, true);
    q2k_vecdot_tokens => |n, w, a, out| groups_tile::<{ q2k::BYTES }, TOKENS>(
        GgmlType::Q2_K, n, w, a, out, |x| q2k_groups(x), q2k::D, GroupOrder::Q2);
    q3k_vecdot_tokens => |n, w, a, out| groups_tile::<{ q3k::BYTES }, TOKENS>(
        GgmlType::Q3_K, n, w, a, out, |x| q3k_groups(x), q3k::D, GroupOrder::Q3);
    iq4xs_vecdot_tokens => |n, w, a, out| groups_tile::<{ iq4xs::BYTES }, TOKENS>(
        GgmlType::IQ4_XS, n, w, a, out, |x| iq4xs_groups(x), iq4xs::D, GroupOrder::Iq4Xs);
    q6k_gemm_tokens => |n, w, a, out| q6k_tile::<TOKENS>(n, w, a, out, true);
}

fn tokens(f: DotTokensFn) -> DotTokens {
    DotTokens {
        rows: ROWS,
        tokens: TOKENS,
        f,
    }
}

fn rows(f: DotRowsFn) -> DotRows {
    DotRows { rows: ROWS, f }
}

pub(super) fn register(k: &mut crate::kernels::Kernels) {
    use GgmlType::*;
    let v = SumOrder::VecDot;
    k.set_dot_tokens_in(v, Q4_K, ROWS, TOKENS, q4k_vecdot_tokens);
    k.set_dot_tokens_in(v, Q5_K, ROWS, TOKENS, q5k_vecdot_tokens);
    k.set_dot_tokens_in(v, Q6_K, ROWS, TOKENS, q6k_vecdot_tokens);
    k.set_dot_tokens_in(v, Q2_K, ROWS, TOKENS, q2k_vecdot_tokens);
    k.set_dot_tokens_in(v, Q3_K, ROWS, TOKENS, q3k_vecdot_tokens);
    k.set_dot_tokens_in(v, IQ4_XS, ROWS, TOKENS, iq4xs_vecdot_tokens);
    // the 8x4 orders; Q6_K's gemv sums as its vec_dot (the multi-row kernel of `neon_rows.rs`)
    let r = SumOrder::Repacked;
    k.set_dot_rows_in(r, Q4_K, ROWS, q4k_repacked_rows);
    k.set_dot_tokens_in(r, Q4_K, ROWS, TOKENS, q4k_repacked_tokens);
    k.set_dot_rows_in(r, Q5_K, ROWS, q5k_repacked_rows);
    k.set_dot_tokens_in(r, Q5_K, ROWS, TOKENS, q5k_repacked_tokens);
    k.set_dot_rows_in(r, Q6_K, ROWS, super::neon_rows::dot_rows_q6_k);
    k.set_dot_tokens_in(r, Q6_K, ROWS, TOKENS, q6k_vecdot_tokens);
}

/// The multi-row and multi-token kernels of Q6_K's 8x4 gemm order.
pub(super) fn q6k_gemm() -> (DotRows, DotTokens) {
    (rows(q6k_gemm_rows), tokens(q6k_gemm_tokens))
}
