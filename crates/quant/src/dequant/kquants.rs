//! The 256-element super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K and IQ4_XS.

use super::{f16_at, u16_at, u32_at};
use crate::tables::KVALUES_IQ4NL;

/// Q2_K: 16 bytes of (4-bit scale, 4-bit min) pairs for 16 groups of 16, 64 bytes of 2-bit
/// quants, f16 `d`, f16 `dmin`; `x = d*scale * q - dmin*min`.
///
/// Quant byte `l` of a 128-element half holds elements `l`, `l+32`, `l+64`, `l+96` in its
/// bit pairs 0-1, 2-3, 4-5, 6-7.
pub(super) fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    let mut group = 0;
    let mut out = 0;
    for half in 0..2 {
        let q = &b[16 + 32 * half..16 + 32 * half + 32];
        for shift in [0u32, 2, 4, 6] {
            for sub in 0..2 {
                let sc = scales[group];
                group += 1;
                let dl = d * f32::from(sc & 0x0F);
                let ml = dmin * f32::from(sc >> 4);
                for &qb in &q[16 * sub..16 * sub + 16] {
                    y[out] = dl * f32::from((qb >> shift) & 3) - ml;
                    out += 1;
                }
            }
        }
    }
}

/// The sixteen 6-bit scales of Q3_K, offset by -32.
///
/// Bytes 0..8 hold the low nibbles (scale `j` in byte `j % 8`, low nibble for `j < 8`, high
/// nibble otherwise); bytes 8..12 hold the top two bits, scale `j` in byte `8 + j % 4` at bit
/// `2 * (j / 4)`.
fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0x0F } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = i32::from(low | (high << 4)) - 32;
    }
    out
}

/// Q3_K: 32 bytes of high bits, 64 bytes of 2-bit low parts, 12 bytes of 6-bit scales,
/// f16 `d`; `x = d*(scale-32) * (low - (high bit clear ? 4 : 0))`.
pub(super) fn q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let scales = q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    let mut group = 0;
    let mut out = 0;
    let mut bit = 0u32;
    for half in 0..2 {
        let q = &b[32 + 32 * half..32 + 32 * half + 32];
        for shift in [0u32, 2, 4, 6] {
            let m = 1u8 << bit;
            for sub in 0..2 {
                let dl = d * scales[group] as f32;
                group += 1;
                for l in 16 * sub..16 * sub + 16 {
                    let low = i32::from((q[l] >> shift) & 3);
                    let sub4 = if hmask[l] & m != 0 { 0 } else { 4 };
                    y[out] = dl * (low - sub4) as f32;
                    out += 1;
                }
            }
            bit += 1;
        }
    }
}

/// Scale and min `j` (0..8) of the 12-byte, 6-bit packing used by Q4_K and Q5_K.
///
/// Pairs 0..4 are the low six bits of bytes `j` and `j+4`; pairs 4..8 take their low four
/// bits from the nibbles of byte `j+4` and their top two bits from the spare top bits of
/// bytes `j-4` and `j`.
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales/mins for 8 groups of 32, 128 bytes
/// of nibbles; `x = d*scale * q - dmin*min`. Each 32-byte chunk holds two groups: the low
/// nibbles are the first, the high nibbles the second.
pub(super) fn q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    for chunk in 0..4 {
        let q = &b[16 + 32 * chunk..16 + 32 * chunk + 32];
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let out = &mut y[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            out[l] = d1 * f32::from(q[l] & 0x0F) - min1;
            out[l + 32] = d2 * f32::from(q[l] >> 4) - min2;
        }
    }
}

/// Q5_K: as Q4_K plus 32 bytes of fifth bits: byte `l`, bit `2*chunk` (first group of the
/// chunk) and `2*chunk + 1` (second group) belong to element `l` of that group.
pub(super) fn q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    for chunk in 0..4 {
        let ql = &b[48 + 32 * chunk..48 + 32 * chunk + 32];
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let u1 = 1u8 << (2 * chunk);
        let u2 = 2u8 << (2 * chunk);
        let out = &mut y[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            out[l] = d1 * f32::from((ql[l] & 0x0F) + h1) - min1;
            out[l + 32] = d2 * f32::from((ql[l] >> 4) + h2) - min2;
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 signed 8-bit scales for
/// groups of 16, f16 `d`; `x = d * scale * (q - 32)`.
///
/// Per 128-element half: low-nibble byte `l` holds elements `l` (low) and `l+64` (high),
/// byte `l+32` holds `l+32` and `l+96`; high byte `l` holds the top bits of `l`, `l+32`,
/// `l+64`, `l+96` in its bit pairs.
pub(super) fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let out = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            let s = |k: usize| f32::from(sc[is + k] as i8);
            out[l] = d * s(0) * q1 as f32;
            out[l + 32] = d * s(2) * q2 as f32;
            out[l + 64] = d * s(4) * q3 as f32;
            out[l + 96] = d * s(6) * q4 as f32;
        }
    }
}

/// Q8_K: f32 `d`, 256 signed bytes, 16 i16 group sums (for dot products only); `x = d * q`.
pub(super) fn q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_bits(u32_at(b, 0));
    for (yj, &q) in y.iter_mut().zip(&b[4..260]) {
        *yj = d * f32::from(q as i8);
    }
}

/// IQ4_XS: f16 `d`, 6-bit scales for 8 groups of 32 (high bit pairs in a u16, low nibbles in
/// 4 bytes), 128 bytes of nibbles indexing the IQ4_NL levels; `x = d*(scale-32) * level`.
pub(super) fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16_at(b, 2);
    let scales_l = &b[4..8];
    for ib in 0..8 {
        let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let ls = i32::from(low | (high << 4));
        let dl = d * (ls - 32) as f32;
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        let out = &mut y[32 * ib..32 * ib + 32];
        for j in 0..16 {
            out[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0x0F)]);
            out[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]);
        }
    }
}
