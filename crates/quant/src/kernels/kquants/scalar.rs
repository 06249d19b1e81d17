//! Portable reference kernels: k-quant / IQ4_XS / 1- to 3-bit i-quant / TQ2_0 weights × Q8_K
//! activations.
//!
//! Per super-block: the weight quants are unpacked into 256 signed bytes, multiplied with
//! the activation quants and summed as integers per sub-block; each sub-block sum is
//! multiplied by its integer scale, the minimum terms (Q2_K, Q4_K, Q5_K) come from the
//! activation group sums, and only then is the block converted to float with one multiply
//! by `d_weight · d_activation`. (Unpacking first keeps the inner loops simple enough for
//! the compiler to vectorize on any target.)

use super::layout::{
    iq1m, iq1s, iq2s, iq2xs, iq2xxs, iq3s, iq3xxs, iq4xs, q2k, q3k, q4k, q5k, q6k, tq10, tq20,
};
use super::{
    Q8K_BSUMS, Q8K_BYTES, Q8K_QS, check_dot, f16_at, f32_at, hsum8, iq1m_d, iq1m_nibble,
    iq1m_scale, tq1_digit, u32_at, unpack_scales_mins_k4, unpack_scales_q3k,
};
use crate::iq_tables::{
    IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
use crate::tables::KVALUES_IQ4NL;
use crate::{GgmlType, QK_K};

/// The pieces of one Q8_K block.
struct Q8K<'a> {
    d: f32,
    qs: &'a [u8],
    bsums: [i32; 16],
}

impl<'a> Q8K<'a> {
    fn new(b: &'a [u8]) -> Q8K<'a> {
        let mut bsums = [0i32; 16];
        for (s, c) in bsums.iter_mut().zip(b[Q8K_BSUMS..].chunks_exact(2)) {
            *s = i32::from(i16::from_le_bytes([c[0], c[1]]));
        }
        Q8K {
            d: f32_at(b, 0),
            qs: &b[Q8K_QS..Q8K_BSUMS],
            bsums,
        }
    }

    /// Σ q[e] · a[e] over elements `start .. start + w.len()` (activation quants are i8).
    #[inline]
    fn dot(&self, start: usize, w: &[i8]) -> i32 {
        w.iter()
            .zip(&self.qs[start..start + w.len()])
            .map(|(&q, &a)| i32::from(q) * i32::from(a as i8))
            .sum()
    }
}

/// Spread 2-bit fields the way Q2_K and Q3_K store them: element `128h + 32s + l` is bits
/// `2s..2s+2` of `qs[32h + l]`.
#[inline]
fn unpack_2bit(qs: &[u8], q: &mut [i8; QK_K]) {
    for (src, dst) in qs.chunks_exact(32).zip(q.chunks_exact_mut(128)) {
        for (s, d) in dst.chunks_exact_mut(32).enumerate() {
            for (o, &b) in d.iter_mut().zip(src) {
                *o = ((b >> (2 * s)) & 3) as i8;
            }
        }
    }
}

/// Spread nibbles the way Q4_K and Q5_K store them: element `64j + l` (l < 32) is the low
/// nibble of `qs[32j + l]`, element `64j + 32 + l` the high nibble.
#[inline]
fn unpack_nibbles_k4(qs: &[u8], q: &mut [i8; QK_K]) {
    for (src, dst) in qs.chunks_exact(32).zip(q.chunks_exact_mut(64)) {
        let (lo, hi) = dst.split_at_mut(32);
        for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(src) {
            *l = (b & 0xF) as i8;
            *h = (b >> 4) as i8;
        }
    }
}

pub(super) fn dot_q2_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::Q2_K, n, w, a);
    let mut q = [0i8; QK_K];
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(q2k::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        // Low nibble: the 16-element group's scale; high nibble: its minimum.
        let sc = &x[q2k::SCALES..q2k::SCALES + 16];
        unpack_2bit(&x[q2k::QS..q2k::QS + 64], &mut q);

        let summs: i32 = (0..16).map(|g| y.bsums[g] * i32::from(sc[g] >> 4)).sum();
        let isum: i32 = q
            .chunks_exact(16)
            .zip(sc)
            .enumerate()
            .map(|(g, (qg, &s))| i32::from(s & 0xF) * y.dot(16 * g, qg))
            .sum();
        let dall = y.d * f16_at(x, q2k::D);
        let dmin = y.d * f16_at(x, q2k::DMIN);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

pub(super) fn dot_q3_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::Q3_K, n, w, a);
    let mut q = [0i8; QK_K];
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(q3k::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let hmask = &x[q3k::HMASK..q3k::HMASK + 32];
        unpack_2bit(&x[q3k::QS..q3k::QS + 64], &mut q);
        // The high bit of element e is bit (e / 32) of hmask[e % 32]; when it is clear the
        // quant is offset by -4.
        for (bit, qc) in q.chunks_exact_mut(32).enumerate() {
            for (v, &m) in qc.iter_mut().zip(hmask) {
                *v -= if (m >> bit) & 1 == 0 { 4 } else { 0 };
            }
        }
        let scales = unpack_scales_q3k(&x[q3k::SCALES..q3k::SCALES + 12]);

        let isum: i32 = q
            .chunks_exact(16)
            .zip(scales)
            .enumerate()
            .map(|(g, (qg, s))| (i32::from(s) - 32) * y.dot(16 * g, qg))
            .sum();
        sumf += f16_at(x, q3k::D) * y.d * isum as f32;
    }
    sumf
}

/// Shared end of Q4_K and Q5_K: `q` holds the block's unsigned weight quants.
#[inline]
fn dot_k4_block(x: &[u8], scales_off: usize, y: &Q8K<'_>, q: &[i8; QK_K]) -> f32 {
    let sm = unpack_scales_mins_k4(&x[scales_off..scales_off + 12]);
    let (scales, mins) = sm.split_at(8);

    // Each 32-element sub-block owns two activation group sums.
    let summs: i32 = (0..16).map(|g| y.bsums[g] * i32::from(mins[g / 2])).sum();
    let isum: i32 = q
        .chunks_exact(32)
        .zip(scales)
        .enumerate()
        .map(|(sb, (qs, &s))| i32::from(s) * y.dot(32 * sb, qs))
        .sum();
    const _: () = assert!(q4k::D == q5k::D && q4k::DMIN == q5k::DMIN);
    let d = f16_at(x, q4k::D) * y.d;
    let dmin = f16_at(x, q4k::DMIN) * y.d;
    d * isum as f32 - dmin * summs as f32
}

pub(super) fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::Q4_K, n, w, a);
    let mut q = [0i8; QK_K];
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(q4k::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        unpack_nibbles_k4(&x[q4k::QS..q4k::QS + 128], &mut q);
        sumf += dot_k4_block(x, q4k::SCALES, &y, &q);
    }
    sumf
}

pub(super) fn dot_q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::Q5_K, n, w, a);
    let mut q = [0i8; QK_K];
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(q5k::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        unpack_nibbles_k4(&x[q5k::QS..q5k::QS + 128], &mut q);
        // The fifth bit of element e: bit (e / 32) of qh[e % 32].
        let qh = &x[q5k::QH..q5k::QH + 32];
        for (bit, qc) in q.chunks_exact_mut(32).enumerate() {
            for (v, &h) in qc.iter_mut().zip(qh) {
                *v |= (((h >> bit) & 1) << 4) as i8;
            }
        }
        sumf += dot_k4_block(x, q5k::SCALES, &y, &q);
    }
    sumf
}

pub(super) fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::Q6_K, n, w, a);
    let mut q = [0i8; QK_K];
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(q6k::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let ql = &x[q6k::QL..q6k::QL + 128];
        let qh = &x[q6k::QH..q6k::QH + 64];
        let scales = &x[q6k::SCALES..q6k::SCALES + 16];
        // Element 128h + 32s + l: low nibble (s < 2) or high nibble (s >= 2) of
        // ql[64h + 32(s % 2) + l], high two bits from bits 2s..2s+2 of qh[32h + l]; minus 32.
        for (h, dst) in q.chunks_exact_mut(128).enumerate() {
            let (ql, qh) = (&ql[64 * h..64 * h + 64], &qh[32 * h..32 * h + 32]);
            for (s, d) in dst.chunks_exact_mut(32).enumerate() {
                let lsrc = &ql[32 * (s % 2)..32 * (s % 2) + 32];
                let shift = if s < 2 { 0 } else { 4 };
                for ((o, &lb), &hb) in d.iter_mut().zip(lsrc).zip(qh) {
                    let low = (lb >> shift) & 0xF;
                    let high = (hb >> (2 * s)) & 3;
                    *o = (low | (high << 4)) as i8 - 32;
                }
            }
        }
        let isum: i32 = q
            .chunks_exact(16)
            .zip(scales)
            .enumerate()
            .map(|(g, (qg, &s))| i32::from(s as i8) * y.dot(16 * g, qg))
            .sum();
        sumf += f16_at(x, q6k::D) * y.d * isum as f32;
    }
    sumf
}

pub(super) fn dot_iq4_xs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::IQ4_XS, n, w, a);
    let mut q = [0i8; QK_K];
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(iq4xs::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let scales_h = u16::from_le_bytes([x[iq4xs::SCALES_H], x[iq4xs::SCALES_H + 1]]);
        let scales_l = &x[iq4xs::SCALES_L..iq4xs::SCALES_L + 4];
        let qs = &x[iq4xs::QS..iq4xs::QS + 128];
        // Element 32sb + j (j < 16) is the low nibble of qs[16sb + j], 32sb + 16 + j the high
        // nibble; nibbles index the non-linear value table.
        for (src, dst) in qs.chunks_exact(16).zip(q.chunks_exact_mut(32)) {
            let (lo, hi) = dst.split_at_mut(16);
            for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(src) {
                *l = KVALUES_IQ4NL[usize::from(b & 0xF)];
                *h = KVALUES_IQ4NL[usize::from(b >> 4)];
            }
        }
        let isum: i32 = q
            .chunks_exact(32)
            .enumerate()
            .map(|(sb, qs)| {
                let low = (scales_l[sb / 2] >> (4 * (sb % 2))) & 0xF;
                let high = ((scales_h >> (2 * sb)) & 3) as u8;
                (i32::from(low | (high << 4)) - 32) * y.dot(32 * sb, qs)
            })
            .sum();
        sumf += f16_at(x, iq4xs::D) * y.d * isum as f32;
    }
    sumf
}

/// TQ2_0 in the lanes of ggml's x86 kernel (see `x86::tq20_avx2`), which every ggml build
/// this project compares with uses: the products of element pairs `2m, 2m + 1` of each
/// 32-byte run are summed per `m`, activation group sum `m` is taken off lane `m` (the
/// offset of -1, applied to the lane totals of another grouping), lanes are paired into
/// eight, and each is multiplied into its own accumulator. The lanes can cancel each other
/// by far more than the row's magnitude, so another float order would differ from ggml by
/// more than rounding of the result; this one gives its bits.
pub(super) fn dot_tq2_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::TQ2_0, n, w, a);
    let mut acc = [0f32; 8];
    for (x, yb) in w.chunks_exact(tq20::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let mut lanes = [0i32; 8];
        for j in 0..2 {
            let qs = &x[tq20::QS + 32 * j..tq20::QS + 32 * (j + 1)];
            for l in 0..4 {
                let ys = &y.qs[128 * j + 32 * l..128 * j + 32 * (l + 1)];
                for (e, (&q, &v)) in qs.iter().zip(ys).enumerate() {
                    lanes[e / 4] += i32::from((q >> (2 * l)) & 3) * i32::from(v as i8);
                }
            }
        }
        fma_lanes(&mut acc, y.d * f16_at(x, tq20::D), &offset_lanes(lanes, &y));
    }
    hsum8(&acc)
}

/// The ternary types' lanes with the stored digits' offset of -1 taken off: lane `k` less
/// the activation sums of groups `2k` and `2k + 1` (as ggml takes them off its 16-bit lanes,
/// before pairing them).
#[inline]
fn offset_lanes(mut lanes: [i32; 8], y: &Q8K<'_>) -> [i32; 8] {
    for (k, lane) in lanes.iter_mut().enumerate() {
        *lane -= y.bsums[2 * k] + y.bsums[2 * k + 1];
    }
    lanes
}

/// `v` with its sign flipped where bit `j` of `signs` is set, as `vpsignb` flips it (-128
/// stays -128).
#[inline]
fn signed(v: u8, signs: u8, j: usize) -> i32 {
    let v = v as i8;
    i32::from(if (signs >> j) & 1 != 0 {
        v.wrapping_neg()
    } else {
        v
    })
}

/// The lanes of ggml's x86 kernels for the 2- and 3-bit i-quants over one block: lane `k`
/// sums elements `4k..4k + 4` of every 32-element group `g`, each the magnitude `m(g, e)`
/// times the activation with the sign byte `signs(g, l)` of its 8 elements `l` applied, times
/// the scale `scale(g, h)` of its 16 elements `h`.
#[inline]
fn grid_lanes(
    y: &Q8K<'_>,
    scale: impl Fn(usize, usize) -> i32,
    m: impl Fn(usize, usize) -> u8,
    signs: impl Fn(usize, usize) -> u8,
) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for g in 0..8 {
        let sc = [scale(g, 0), scale(g, 1)];
        for l in 0..4 {
            let s = signs(g, l);
            for j in 0..8 {
                let e = 8 * l + j;
                let v = signed(y.qs[32 * g + e], s, j);
                lanes[e / 4] += sc[e / 16] * i32::from(m(g, e)) * v;
            }
        }
    }
    lanes
}

/// Each lane times `d` into its accumulator (a fused multiply-add, as ggml's `vfmadd`).
#[inline]
fn fma_lanes(acc: &mut [f32; 8], d: f32, lanes: &[i32; 8]) {
    for (acc, &lane) in acc.iter_mut().zip(lanes) {
        *acc = d.mul_add(lane as f32, *acc);
    }
}

/// Magnitude `j % 8` of a grid entry (magnitudes packed little-endian, 8 or 4 of them).
#[inline]
fn byte_of(entry: u64, j: usize) -> u8 {
    entry.to_le_bytes()[j % 8]
}

/// IQ2_XXS in the lanes of ggml's x86 kernel ([`grid_lanes`]): per 32 elements a word of
/// four grid indices and a word of four 7-bit sign indices (the patterns of
/// [`KSIGNS_IQ2XS`]) with the scale `2s + 1` in its top bits; `d` times each lane into its
/// accumulator, and 1/8 of the lanes' total.
pub(super) fn dot_iq2_xxs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::IQ2_XXS, n, w, a);
    let mut acc = [0f32; 8];
    for (x, yb) in w.chunks_exact(iq2xxs::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let grid = |g: usize| u32_at(x, iq2xxs::QS + 8 * g);
        let word = |g: usize| u32_at(x, iq2xxs::QS + 8 * g + 4);
        let lanes = grid_lanes(
            &y,
            |g, _| 2 * (word(g) >> 28) as i32 + 1,
            |g, e| byte_of(IQ2XXS_GRID[((grid(g) >> (8 * (e / 8))) & 0xff) as usize], e),
            |g, l| KSIGNS_IQ2XS[((word(g) >> (7 * l)) & 127) as usize],
        );
        fma_lanes(&mut acc, f16_at(x, iq2xxs::D) * y.d, &lanes);
    }
    0.125 * hsum8(&acc)
}

/// IQ2_XS in the lanes of ggml's x86 kernel, as [`dot_iq2_xxs`]: a `u16` per 8 elements (a
/// 9-bit grid index, a 7-bit sign index), a scale per 16 elements.
pub(super) fn dot_iq2_xs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::IQ2_XS, n, w, a);
    let mut acc = [0f32; 8];
    for (x, yb) in w.chunks_exact(iq2xs::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let q = |g: usize, l: usize| {
            let o = iq2xs::QS + 2 * (4 * g + l);
            u16::from_le_bytes([x[o], x[o + 1]])
        };
        let lanes = grid_lanes(
            &y,
            |g, h| 2 * i32::from((x[iq2xs::SCALES + g] >> (4 * h)) & 15) + 1,
            |g, e| byte_of(IQ2XS_GRID[usize::from(q(g, e / 8) & 511)], e),
            |g, l| KSIGNS_IQ2XS[usize::from(q(g, l) >> 9)],
        );
        fma_lanes(&mut acc, f16_at(x, iq2xs::D) * y.d, &lanes);
    }
    0.125 * hsum8(&acc)
}

/// IQ2_S in the lanes of ggml's x86 kernel, as [`dot_iq2_xs`]: 10-bit grid indices, a sign
/// byte per 8 elements.
pub(super) fn dot_iq2_s(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::IQ2_S, n, w, a);
    let mut acc = [0f32; 8];
    for (x, yb) in w.chunks_exact(iq2s::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let lanes = grid_lanes(
            &y,
            |g, h| 2 * i32::from((x[iq2s::SCALES + g] >> (4 * h)) & 15) + 1,
            |g, e| {
                let l = e / 8;
                let qh = usize::from(x[iq2s::QH + g]);
                let idx = usize::from(x[iq2s::QS + 4 * g + l]) | ((qh << (8 - 2 * l)) & 0x300);
                byte_of(IQ2S_GRID[idx], e)
            },
            |g, l| x[iq2s::SIGNS + 4 * g + l],
        );
        fma_lanes(&mut acc, f16_at(x, iq2s::D) * y.d, &lanes);
    }
    0.125 * hsum8(&acc)
}

/// IQ3_XXS in the lanes of ggml's x86 kernel: a scale `2s + 1` per 32 elements, four
/// magnitudes per grid entry, the sign patterns of [`KSIGNS_IQ2XS`]; 1/4 of the lanes'
/// total.
pub(super) fn dot_iq3_xxs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::IQ3_XXS, n, w, a);
    let mut acc = [0f32; 8];
    for (x, yb) in w.chunks_exact(iq3xxs::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let word = |g: usize| u32_at(x, iq3xxs::SIGNS + 4 * g);
        let lanes = grid_lanes(
            &y,
            |g, _| 2 * (word(g) >> 28) as i32 + 1,
            |g, e| {
                let idx = usize::from(x[iq3xxs::QS + 8 * g + e / 4]);
                byte_of(u64::from(IQ3XXS_GRID[idx]), e % 4)
            },
            |g, l| KSIGNS_IQ2XS[((word(g) >> (7 * l)) & 127) as usize],
        );
        fma_lanes(&mut acc, f16_at(x, iq3xxs::D) * y.d, &lanes);
    }
    0.25 * hsum8(&acc)
}

/// IQ3_S in the lanes of ggml's x86 kernel: 9-bit grid indices, a sign byte per 8
/// elements, a scale `2s + 1` per 32 elements.
pub(super) fn dot_iq3_s(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::IQ3_S, n, w, a);
    let mut acc = [0f32; 8];
    for (x, yb) in w.chunks_exact(iq3s::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let lanes = grid_lanes(
            &y,
            |g, _| 2 * i32::from((x[iq3s::SCALES + g / 2] >> (4 * (g % 2))) & 15) + 1,
            |g, e| {
                let k = e / 4;
                let h = usize::from(x[iq3s::QH + g]);
                let idx = usize::from(x[iq3s::QS + 8 * g + k]) | ((h << (8 - k)) & 256);
                byte_of(u64::from(IQ3S_GRID[idx]), e % 4)
            },
            |g, l| x[iq3s::SIGNS + 4 * g + l],
        );
        fma_lanes(&mut acc, f16_at(x, iq3s::D) * y.d, &lanes);
    }
    hsum8(&acc)
}

/// `g · v` for a grid value `g` of -1, 0 or 1 as ggml's `mul_add_epi8` takes it: `|g|`
/// times `v` with `g`'s sign (`vpsignb`: -128 stays -128).
#[inline]
fn times_trit(g: u8, v: u8) -> i32 {
    let (g, v) = (g as i8, v as i8);
    i32::from(g.unsigned_abs()) * i32::from(if g < 0 { v.wrapping_neg() } else { v })
}

/// IQ1_S in the lanes of ggml's x86 kernel: lane `k` the grid products of elements
/// `4k..4k + 4` of every group times its `2s + 1`, times `d` into eight accumulators; the
/// shift (±1/8 per group) from the activation group sums in one f32 accumulator, added at
/// the end.
pub(super) fn dot_iq1_s(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::IQ1_S, n, w, a);
    let mut acc = [0f32; 8];
    let mut acc1 = 0f32;
    for (x, yb) in w.chunks_exact(iq1s::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let mut lanes = [0i32; 8];
        let mut shifts = 0i32;
        for g in 0..8 {
            let qh = u16::from_le_bytes([x[iq1s::QH + 2 * g], x[iq1s::QH + 2 * g + 1]]);
            let ls = 2 * i32::from((qh >> 12) & 7) + 1;
            for l in 0..4 {
                let hi = usize::from((qh >> (3 * l)) & 7) << 8;
                let grid = IQ1S_GRID[usize::from(x[iq1s::QS + 4 * g + l]) | hi].to_le_bytes();
                for (j, &m) in grid.iter().enumerate() {
                    let e = 8 * l + j;
                    lanes[e / 4] += ls * times_trit(m, y.qs[32 * g + e]);
                }
            }
            let sign = if qh & 0x8000 != 0 { -1 } else { 1 };
            shifts += (y.bsums[2 * g] + y.bsums[2 * g + 1]) * sign * ls;
        }
        let d = y.d * f16_at(x, iq1s::D);
        fma_lanes(&mut acc, d, &lanes);
        acc1 = d.mul_add(shifts as f32, acc1);
    }
    hsum8(&acc) + IQ1S_DELTA * acc1
}

/// IQ1_M in the lanes of ggml's x86 kernel: as [`dot_iq1_s`], with a scale per 16 elements
/// and the shift's sign per 8, the shifts' products (activations with the shift's sign)
/// summed in lanes and accumulators of their own.
pub(super) fn dot_iq1_m(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::IQ1_M, n, w, a);
    let mut acc = [0f32; 8];
    let mut acc2 = [0f32; 8];
    for (x, yb) in w.chunks_exact(iq1m::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let mut lanes = [0i32; 8];
        let mut shift_lanes = [0i32; 8];
        for g in 0..8 {
            for l in 0..4 {
                let nib = iq1m_nibble(x, g, l);
                let hi = usize::from(nib & 7) << 8;
                let grid = IQ1S_GRID[usize::from(x[iq1m::QS + 4 * g + l]) | hi].to_le_bytes();
                let ls = iq1m_scale(x, g, l / 2);
                let sign = if nib & 8 != 0 { 0xffu8 } else { 1 };
                for (j, &m) in grid.iter().enumerate() {
                    let e = 8 * l + j;
                    let v = y.qs[32 * g + e];
                    lanes[e / 4] += ls * times_trit(m, v);
                    shift_lanes[e / 4] += ls * times_trit(sign, v);
                }
            }
        }
        let d = y.d * iq1m_d(x);
        fma_lanes(&mut acc, d, &lanes);
        fma_lanes(&mut acc2, d, &shift_lanes);
    }
    hsum8(&acc) + IQ1S_DELTA * hsum8(&acc2)
}

/// TQ1_0 in the lanes of ggml's x86 kernel, as [`dot_tq2_0`]: each digit (as
/// [`tq1_digit`] extracts it) times its activation into lane `(e mod 32) / 4`, the
/// activation sums of the lane's two groups taken off, each lane times `d` into its
/// accumulator.
pub(super) fn dot_tq1_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::TQ1_0, n, w, a);
    let mut acc = [0f32; 8];
    for (x, yb) in w.chunks_exact(tq10::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let mut lanes = [0i32; 8];
        let mut add = |e: usize, digit: u8| {
            lanes[(e % 32) / 4] += i32::from(digit) * i32::from(y.qs[e] as i8);
        };
        for (start, len, first, digits) in [
            (tq10::QS, 32, 0, 5),
            (tq10::QS + 32, 16, 160, 5),
            (tq10::QH, 4, 240, 4),
        ] {
            for d in 0..digits {
                for m in 0..len {
                    add(first + len * d as usize + m, tq1_digit(x[start + m], d));
                }
            }
        }
        fma_lanes(&mut acc, y.d * f16_at(x, tq10::D), &offset_lanes(lanes, &y));
    }
    hsum8(&acc)
}
