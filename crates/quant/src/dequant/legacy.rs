//! The 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL and MXFP4.
//!
//! All of them store element `j` of the first half in the low nibble (or bit) of byte `j`
//! and element `j + 16` in the high nibble: the halves are split, not interleaved.

use super::{f16_at, u32_at};
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half};

/// Q4_0: f16 scale `d`, 16 bytes of nibbles; `x = (q - 8) * d`.
pub(super) fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        let lo = i32::from(qs[j] & 0x0F) - 8;
        let hi = i32::from(qs[j] >> 4) - 8;
        y[j] = lo as f32 * d;
        y[j + 16] = hi as f32 * d;
    }
}

/// Q4_1: f16 scale `d`, f16 offset `m`, 16 bytes of nibbles; `x = q * d + m`.
pub(super) fn q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = f32::from(qs[j] & 0x0F) * d + m;
        y[j + 16] = f32::from(qs[j] >> 4) * d + m;
    }
}

/// The fifth bits of Q5_0 / Q5_1: bit `j` of the little-endian u32 belongs to element `j`.
#[inline]
fn fifth_bit(qh: u32, j: usize) -> u8 {
    (((qh >> j) & 1) as u8) << 4
}

/// Q5_0: f16 `d`, 32 high bits, 16 bytes of low nibbles; `x = (q - 16) * d`.
pub(super) fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32_at(b, 2);
    let qs = &b[6..22];
    for j in 0..16 {
        let lo = i32::from((qs[j] & 0x0F) | fifth_bit(qh, j)) - 16;
        let hi = i32::from((qs[j] >> 4) | fifth_bit(qh, j + 16)) - 16;
        y[j] = lo as f32 * d;
        y[j + 16] = hi as f32 * d;
    }
}

/// Q5_1: f16 `d`, f16 `m`, 32 high bits, 16 bytes of low nibbles; `x = q * d + m`.
pub(super) fn q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32_at(b, 4);
    let qs = &b[8..24];
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) | fifth_bit(qh, j);
        let hi = (qs[j] >> 4) | fifth_bit(qh, j + 16);
        y[j] = f32::from(lo) * d + m;
        y[j + 16] = f32::from(hi) * d + m;
    }
}

/// Q8_0: f16 `d`, 32 signed bytes; `x = q * d`.
pub(super) fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[2..34]) {
        *yj = f32::from(q as i8) * d;
    }
}

/// Q8_1: f16 `d`, f16 `s` (= d * sum of the quants, used only by dot products), 32 signed
/// bytes; `x = q * d`.
pub(super) fn q8_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[4..36]) {
        *yj = f32::from(q as i8) * d;
    }
}

/// IQ4_NL: f16 `d`, 16 bytes of nibbles indexing the non-linear levels; `x = d * level`.
pub(super) fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0x0F)]);
        y[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]);
    }
}

/// MXFP4: an E8M0 exponent byte, 16 bytes of FP4 (e2m1) nibbles; `x = fp4 * 2^(e - 127)`,
/// computed as the doubled FP4 value times the halved scale.
pub(super) fn mxfp4(b: &[u8], y: &mut [f32]) {
    let d = e8m0_to_f32_half(b[0]);
    let qs = &b[1..17];
    for j in 0..16 {
        y[j] = f32::from(KVALUES_MXFP4[usize::from(qs[j] & 0x0F)]) * d;
        y[j + 16] = f32::from(KVALUES_MXFP4[usize::from(qs[j] >> 4)]) * d;
    }
}
