//! Portable reference kernels: k-quant / IQ4_XS weights × Q8_K activations.
//!
//! Per super-block: the weight quants are multiplied with the activation quants and summed
//! as integers per sub-block, each sub-block sum is multiplied by its integer scale, the
//! minimum terms (Q2_K, Q4_K, Q5_K) come from the activation group sums, and only then is
//! the block converted to float with one multiply by `d_weight · d_activation`.

use super::layout::{iq4xs, q2k, q3k, q4k, q5k, q6k};
use super::{
    Q8K_BSUMS, Q8K_BYTES, Q8K_QS, check_dot, f16_at, f32_at, unpack_scales_mins_k4,
    unpack_scales_q3k,
};
use crate::GgmlType;
use crate::tables::KVALUES_IQ4NL;

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

    /// Activation quant `i` (0..256).
    #[inline]
    fn q(&self, i: usize) -> i32 {
        i32::from(self.qs[i] as i8)
    }
}

/// Visit the 256 weight quants of a block whose quants are spread over 2-bit planes the way
/// Q2_K and Q3_K store them: element `128h + 32s + l` is bits `2s..2s+2` of `qs[32h + l]`.
#[inline]
fn q2_plane(qs: &[u8], e: usize) -> i32 {
    let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
    i32::from((qs[32 * h + l] >> (2 * s)) & 3)
}

pub(super) fn dot_q2_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::Q2_K, n, w, a);
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(q2k::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let sc = &x[q2k::SCALES..q2k::SCALES + 16];
        let qs = &x[q2k::QS..q2k::QS + 64];

        let summs: i32 = (0..16).map(|g| y.bsums[g] * i32::from(sc[g] >> 4)).sum();
        let mut isum = 0i32;
        for (g, &sg) in sc.iter().enumerate() {
            let part: i32 = (16 * g..16 * g + 16)
                .map(|e| y.q(e) * q2_plane(qs, e))
                .sum();
            isum += i32::from(sg & 0xF) * part;
        }
        let dall = y.d * f16_at(x, q2k::D);
        let dmin = y.d * f16_at(x, q2k::DMIN);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

pub(super) fn dot_q3_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::Q3_K, n, w, a);
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(q3k::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let hmask = &x[q3k::HMASK..q3k::HMASK + 32];
        let qs = &x[q3k::QS..q3k::QS + 64];
        let scales = unpack_scales_q3k(&x[q3k::SCALES..q3k::SCALES + 12]);

        let mut isum = 0i32;
        for (g, &sc) in scales.iter().enumerate() {
            let part: i32 = (16 * g..16 * g + 16)
                .map(|e| {
                    // The high bit of element e is bit (e / 32) of hmask[e % 32]; when it is
                    // clear the quant is offset by -4.
                    let high = (hmask[e % 32] >> (e / 32)) & 1;
                    let q = q2_plane(qs, e) - if high == 0 { 4 } else { 0 };
                    y.q(e) * q
                })
                .sum();
            isum += (i32::from(sc) - 32) * part;
        }
        sumf += f16_at(x, q3k::D) * y.d * isum as f32;
    }
    sumf
}

/// Shared body of Q4_K and Q5_K: `quant(e)` gives the unsigned weight quant of element `e`.
#[inline]
fn dot_k4_block(x: &[u8], scales_off: usize, y: &Q8K<'_>, quant: impl Fn(usize) -> i32) -> f32 {
    let sm = unpack_scales_mins_k4(&x[scales_off..scales_off + 12]);
    let (scales, mins) = sm.split_at(8);

    // Each 32-element sub-block owns two activation group sums.
    let summs: i32 = (0..16).map(|g| y.bsums[g] * i32::from(mins[g / 2])).sum();
    let mut isum = 0i32;
    for (sb, &sc) in scales.iter().enumerate() {
        let part: i32 = (32 * sb..32 * sb + 32).map(|e| y.q(e) * quant(e)).sum();
        isum += i32::from(sc) * part;
    }
    const _: () = assert!(q4k::D == q5k::D && q4k::DMIN == q5k::DMIN);
    let d = f16_at(x, q4k::D) * y.d;
    let dmin = f16_at(x, q4k::DMIN) * y.d;
    d * isum as f32 - dmin * summs as f32
}

pub(super) fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::Q4_K, n, w, a);
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(q4k::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let qs = &x[q4k::QS..q4k::QS + 128];
        // Element 64j + l (l < 32) is the low nibble of qs[32j + l], element 64j + 32 + l the
        // high nibble.
        sumf += dot_k4_block(x, q4k::SCALES, &y, |e| {
            let byte = qs[32 * (e / 64) + e % 32];
            i32::from(if e % 64 < 32 { byte & 0xF } else { byte >> 4 })
        });
    }
    sumf
}

pub(super) fn dot_q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::Q5_K, n, w, a);
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(q5k::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let qh = &x[q5k::QH..q5k::QH + 32];
        let qs = &x[q5k::QS..q5k::QS + 128];
        // As Q4_K, plus the fifth bit of element e: bit (e / 32) of qh[e % 32].
        sumf += dot_k4_block(x, q5k::SCALES, &y, |e| {
            let byte = qs[32 * (e / 64) + e % 32];
            let low = if e % 64 < 32 { byte & 0xF } else { byte >> 4 };
            let high = (qh[e % 32] >> (e / 32)) & 1;
            i32::from(low | (high << 4))
        });
    }
    sumf
}

pub(super) fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::Q6_K, n, w, a);
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(q6k::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let ql = &x[q6k::QL..q6k::QL + 128];
        let qh = &x[q6k::QH..q6k::QH + 64];
        let scales = &x[q6k::SCALES..q6k::SCALES + 16];
        // Element 128h + 32s + l: low nibble (s even) or high nibble (s odd) of
        // ql[64h + 32(s % 2) + l], high two bits from bits 2s..2s+2 of qh[32h + l]; minus 32.
        let quant = |e: usize| -> i32 {
            let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
            let lb = ql[64 * h + 32 * (s % 2) + l];
            let low = if s < 2 { lb & 0xF } else { lb >> 4 };
            let high = (qh[32 * h + l] >> (2 * s)) & 3;
            i32::from(low | (high << 4)) - 32
        };
        let mut isum = 0i32;
        for (g, &sc) in scales.iter().enumerate() {
            let part: i32 = (16 * g..16 * g + 16).map(|e| y.q(e) * quant(e)).sum();
            isum += i32::from(sc as i8) * part;
        }
        sumf += f16_at(x, q6k::D) * y.d * isum as f32;
    }
    sumf
}

pub(super) fn dot_iq4_xs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_dot(GgmlType::IQ4_XS, n, w, a);
    let mut sumf = 0.0f32;
    for (x, yb) in w.chunks_exact(iq4xs::BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let y = Q8K::new(yb);
        let scales_h = u16::from_le_bytes([x[iq4xs::SCALES_H], x[iq4xs::SCALES_H + 1]]);
        let scales_l = &x[iq4xs::SCALES_L..iq4xs::SCALES_L + 4];
        let qs = &x[iq4xs::QS..iq4xs::QS + 128];
        let mut isum = 0i32;
        for sb in 0..8 {
            let low = (scales_l[sb / 2] >> (4 * (sb % 2))) & 0xF;
            let high = ((scales_h >> (2 * sb)) & 3) as u8;
            let ls = i32::from(low | (high << 4)) - 32;
            // Element 32sb + j (j < 16) is the low nibble of qs[16sb + j], 32sb + 16 + j the
            // high nibble; nibbles index the non-linear value table.
            let part: i32 = (0..16)
                .map(|j| {
                    let b = qs[16 * sb + j];
                    y.q(32 * sb + j) * i32::from(KVALUES_IQ4NL[usize::from(b & 0xF)])
                        + y.q(32 * sb + 16 + j) * i32::from(KVALUES_IQ4NL[usize::from(b >> 4)])
                })
                .sum();
            isum += ls * part;
        }
        sumf += f16_at(x, iq4xs::D) * y.d * isum as f32;
    }
    sumf
}
