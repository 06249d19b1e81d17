//! The grid-based i-quants: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M.
//!
//! Each group of 8 (or 4) elements is an index into a fixed grid of magnitudes
//! ([`crate::iq_tables`]) plus a sign pattern, times a per-32 scale derived from an f16 `d`.

use super::{f16_at, u16_at, u32_at};
use crate::iq_tables::{
    IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KMASK_IQ2XS,
    KSIGNS_IQ2XS,
};

/// Element `j` of a packed grid entry.
#[inline]
fn grid_byte(entry: u64, j: usize) -> u8 {
    (entry >> (8 * j)) as u8
}

/// `-1.0` when sign bit `j` is set in `signs`, else `1.0`.
#[inline]
fn sign(signs: u8, j: usize) -> f32 {
    if signs & KMASK_IQ2XS[j] != 0 {
        -1.0
    } else {
        1.0
    }
}

/// Eight outputs `db * grid[j] * sign[j]`.
#[inline]
fn put8(y: &mut [f32], db: f32, entry: u64, signs: u8) {
    for (j, yj) in y.iter_mut().enumerate().take(8) {
        *yj = db * f32::from(grid_byte(entry, j)) * sign(signs, j);
    }
}

/// Two grid entries of four elements each, sharing one 8-bit sign pattern.
#[inline]
fn put4x2(y: &mut [f32], db: f32, g1: u32, g2: u32, signs: u8) {
    for j in 0..4 {
        y[j] = db * f32::from(grid_byte(u64::from(g1), j)) * sign(signs, j);
        y[j + 4] = db * f32::from(grid_byte(u64::from(g2), j)) * sign(signs, j + 4);
    }
}

/// IQ2_XXS: f16 `d`, then per 32 elements two u32: four 8-bit grid indices, and four 7-bit
/// sign indices plus a 4-bit scale in the top bits; `db = d * (0.5 + scale) / 4`.
pub(super) fn iq2_xxs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let at = 2 + 8 * ib;
        let aux1 = u32_at(b, at + 4);
        let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
        for l in 0..4 {
            let entry = IQ2XXS_GRID[usize::from(b[at + l])];
            let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
            put8(&mut y[32 * ib + 8 * l..], db, entry, signs);
        }
    }
}

/// IQ2_XS: f16 `d`, 32 u16 (9-bit grid index, 7-bit sign index), 8 bytes of two 4-bit
/// scales (one per 16 elements).
pub(super) fn iq2_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales = &b[66..74];
    for ib in 0..8 {
        let db = [
            d * (0.5 + f32::from(scales[ib] & 0x0F)) * 0.25,
            d * (0.5 + f32::from(scales[ib] >> 4)) * 0.25,
        ];
        for l in 0..4 {
            let q = u16_at(b, 2 + 2 * (4 * ib + l));
            let entry = IQ2XS_GRID[usize::from(q & 511)];
            let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
            put8(&mut y[32 * ib + 8 * l..], db[l / 2], entry, signs);
        }
    }
}

/// IQ2_S: f16 `d`, 32 low index bytes, 32 sign bytes, 8 bytes of high index bit pairs,
/// 8 bytes of two 4-bit scales.
pub(super) fn iq2_s(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..34];
    let signs = &b[34..66];
    let qh = &b[66..74];
    let scales = &b[74..82];
    for ib in 0..8 {
        let db = [
            d * (0.5 + f32::from(scales[ib] & 0x0F)) * 0.25,
            d * (0.5 + f32::from(scales[ib] >> 4)) * 0.25,
        ];
        for l in 0..4 {
            let high = (usize::from(qh[ib]) << (8 - 2 * l)) & 0x300;
            let entry = IQ2S_GRID[usize::from(qs[4 * ib + l]) | high];
            put8(
                &mut y[32 * ib + 8 * l..],
                db[l / 2],
                entry,
                signs[4 * ib + l],
            );
        }
    }
}

/// IQ3_XXS: f16 `d`, 64 grid index bytes (two 4-element entries per 8 elements), then per
/// 32 elements a u32 of four 7-bit sign indices and a 4-bit scale; `db = d*(0.5+scale)/2`.
pub(super) fn iq3_xxs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    for ib in 0..8 {
        let aux = u32_at(b, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let g1 = IQ3XXS_GRID[usize::from(qs[8 * ib + 2 * l])];
            let g2 = IQ3XXS_GRID[usize::from(qs[8 * ib + 2 * l + 1])];
            put4x2(&mut y[32 * ib + 8 * l..], db, g1, g2, signs);
        }
    }
}

/// IQ3_S: f16 `d`, 64 low index bytes, 8 bytes of ninth index bits, 32 sign bytes, 4 bytes
/// of two 4-bit scales (one per 32 elements); `db = d * (1 + 2*scale)`.
pub(super) fn iq3_s(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    let qh = &b[66..74];
    let signs = &b[74..106];
    let scales = &b[106..110];
    for ib in 0..8 {
        let sc = if ib % 2 == 0 {
            scales[ib / 2] & 0x0F
        } else {
            scales[ib / 2] >> 4
        };
        let db = d * f32::from(1 + 2 * sc);
        let h = usize::from(qh[ib]);
        for l in 0..4 {
            let i1 = usize::from(qs[8 * ib + 2 * l]) | ((h << (8 - 2 * l)) & 256);
            let i2 = usize::from(qs[8 * ib + 2 * l + 1]) | ((h << (7 - 2 * l)) & 256);
            put4x2(
                &mut y[32 * ib + 8 * l..],
                db,
                IQ3S_GRID[i1],
                IQ3S_GRID[i2],
                signs[4 * ib + l],
            );
        }
    }
}

/// Eight outputs `dl * (grid[j] + delta)` from a ternary IQ1 grid entry.
#[inline]
fn put8_iq1(y: &mut [f32], dl: f32, entry: u64, delta: f32) {
    for (j, yj) in y.iter_mut().enumerate().take(8) {
        *yj = dl * (f32::from(grid_byte(entry, j) as i8) + delta);
    }
}

/// IQ1_S: f16 `d`, 32 low index bytes, 8 u16 (four 3-bit high index parts, a 3-bit scale,
/// the sign of the shift); `dl = d * (2*scale + 1)`.
pub(super) fn iq1_s(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..34];
    for ib in 0..8 {
        let qh = u16_at(b, 34 + 2 * ib);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = if qh & 0x8000 != 0 {
            -IQ1S_DELTA
        } else {
            IQ1S_DELTA
        };
        for l in 0..4 {
            let idx = usize::from(qs[4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            put8_iq1(&mut y[32 * ib + 8 * l..], dl, IQ1S_GRID[idx], delta);
        }
    }
}

/// IQ1_M: 32 low index bytes, 16 bytes of (3-bit high index, shift sign) nibbles, and four
/// u16 holding sixteen 3-bit scales with the f16 `d` spread over their top nibbles.
pub(super) fn iq1_m(b: &[u8], y: &mut [f32]) {
    let qs = &b[0..32];
    let qh = &b[32..48];
    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    let d_bits =
        (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
    let d = half::f16::from_bits(d_bits).to_f32();
    for ib in 0..8 {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl = [
            d * f32::from(2 * (s & 7) + 1),
            d * f32::from(2 * ((s >> 3) & 7) + 1),
        ];
        let h = [qh[2 * ib], qh[2 * ib + 1]];
        for l in 0..4 {
            let hb = h[l / 2];
            // Even l uses the low nibble of its qh byte, odd l the high nibble.
            let nib = if l % 2 == 0 { hb & 0x0F } else { hb >> 4 };
            let idx = usize::from(qs[4 * ib + l]) | (usize::from(nib & 7) << 8);
            let delta = if nib & 8 != 0 {
                -IQ1S_DELTA
            } else {
                IQ1S_DELTA
            };
            put8_iq1(&mut y[32 * ib + 8 * l..], dl[l / 2], IQ1S_GRID[idx], delta);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spot checks of the generated tables against entries of ggml-common.h (first, second,
    /// 101st and last of each table).
    #[test]
    fn tables_match_ggml_spot_checks() {
        let u64s: [(&[u64], [u64; 4]); 4] = [
            (
                &IQ2XXS_GRID,
                [
                    0x0808080808080808,
                    0x080808080808082b,
                    0x08192b0808081908,
                    0x2b2b2b1908081908,
                ],
            ),
            (
                &IQ2XS_GRID,
                [
                    0x0808080808080808,
                    0x080808080808082b,
                    0x0808192b08081908,
                    0x2b2b2b2b2b2b2b2b,
                ],
            ),
            (
                &IQ2S_GRID,
                [
                    0x0808080808080808,
                    0x080808080808082b,
                    0x080819081919192b,
                    0x2b2b2b2b2b2b2b2b,
                ],
            ),
            (
                &IQ1S_GRID,
                [
                    0xffffffffffffffff,
                    0xffffffffffffff01,
                    0xffff000000000000,
                    0x0101010101010101,
                ],
            ),
        ];
        for (table, [a, b, c, last]) in u64s {
            assert_eq!([table[0], table[1], table[100]], [a, b, c]);
            assert_eq!(table[table.len() - 1], last);
        }
        let u32s: [(&[u32], [u32; 4]); 2] = [
            (
                &IQ3XXS_GRID,
                [0x04040404, 0x04040414, 0x14040c1c, 0x3e341c04],
            ),
            (&IQ3S_GRID, [0x01010101, 0x01010103, 0x010f0101, 0x0f0f0101]),
        ];
        for (table, [a, b, c, last]) in u32s {
            assert_eq!([table[0], table[1], table[100]], [a, b, c]);
            assert_eq!(table[table.len() - 1], last);
        }
        assert_eq!(
            [
                KSIGNS_IQ2XS[0],
                KSIGNS_IQ2XS[1],
                KSIGNS_IQ2XS[100],
                KSIGNS_IQ2XS[127]
            ],
            [0, 129, 228, 255]
        );
        assert_eq!(IQ2XXS_GRID.len(), 256);
        assert_eq!(IQ2XS_GRID.len(), 512);
        assert_eq!(IQ2S_GRID.len(), 1024);
        assert_eq!(IQ1S_GRID.len(), 2048);
    }
}
