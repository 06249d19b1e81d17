//! The ternary formats TQ1_0 and TQ2_0 (values -1, 0, 1 times an f16 scale).

use super::f16_at;

/// Digit `n` of a base-3 number packed into a byte by TQ1_0.
///
/// A byte holds up to five ternary digits as the fixed-point fraction `v / 243` scaled to
/// 256; multiplying by `3^n` (mod 256) moves digit `n` to the top, and `(byte * 3) >> 8`
/// reads it.
#[inline]
fn trit(byte: u8, n: usize) -> i32 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let q = byte.wrapping_mul(POW3[n]);
    i32::from((u16::from(q) * 3) >> 8)
}

/// TQ1_0: 48 bytes of five trits each, 4 bytes of four trits each, f16 `d`;
/// `x = (t - 1) * d`.
pub(super) fn tq1_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 52);
    let mut out = 0;
    // 32 bytes x 5 digits, then 16 bytes x 5 digits: digit-major within each run.
    for (start, len) in [(0usize, 32usize), (32, 16)] {
        for n in 0..5 {
            for &byte in &b[start..start + len] {
                y[out] = (trit(byte, n) - 1) as f32 * d;
                out += 1;
            }
        }
    }
    for n in 0..4 {
        for &byte in &b[48..52] {
            y[out] = (trit(byte, n) - 1) as f32 * d;
            out += 1;
        }
    }
}

/// TQ2_0: 64 bytes of 2-bit values, f16 `d`; `x = (q - 1) * d`. Byte `m` of a 32-byte run
/// holds elements `m`, `m+32`, `m+64`, `m+96` of that run's 128 in its bit pairs.
pub(super) fn tq2_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 64);
    let mut out = 0;
    for run in 0..2 {
        let qs = &b[32 * run..32 * run + 32];
        for shift in [0u32, 2, 4, 6] {
            for &byte in qs {
                let q = i32::from((byte >> shift) & 3);
                y[out] = (q - 1) as f32 * d;
                out += 1;
            }
        }
    }
}
