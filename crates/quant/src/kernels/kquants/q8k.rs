//! The Q8_K activation quantizer.
//!
//! Reproduces ggml's reference quantizer byte for byte (ggml's x86 CPU backend uses the
//! reference quantizer for Q8_K, so one implementation serves every table):
//!
//! * `max` is the first element of largest magnitude (NaNs never win); a block whose
//!   largest magnitude is zero is stored as `d = 0` and all-zero quants and sums;
//! * `iscale = -127 / max` (note the sign: the element `max` maps to `-127`), computed in
//!   f32;
//! * `q = min(127, round(iscale * x))`, where the product is rounded to f32 first and then
//!   to the nearest integer with ties to even (ggml adds `1.5 · 2^23` and reads the low
//!   mantissa bits, which is what is done here too);
//! * `d = 1 / iscale` in f32, `bsums[g]` = sum of `q[16g .. 16g + 16]`.

use super::{Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use crate::QK_K;

/// `1.5 · 2^23`: adding it to an f32 of magnitude below `2^22` leaves the value rounded to
/// an integer (ties to even) in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Round `v` to the nearest integer, ties to even, exactly as ggml's `nearest_int` does
/// (valid for `|v| < 2^22`; other inputs give the same bits as ggml's trick).
#[inline]
fn nearest_int(v: f32) -> i32 {
    let bits = (v + ROUND_MAGIC).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// Quantize `x` (a whole number of 256-element blocks) into Q8_K blocks in `out`.
pub(super) fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(QK_K),
        "q8_K quantize: {} elements is not a multiple of {QK_K}",
        x.len()
    );
    assert_eq!(
        out.len(),
        x.len() / QK_K * Q8K_BYTES,
        "q8_K quantize: output length"
    );
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8K_BYTES)) {
        quantize_block(xb, ob);
    }
}

fn quantize_block(x: &[f32], out: &mut [u8]) {
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        if a > amax {
            amax = a;
        }
    }
    if amax == 0.0 {
        out.fill(0);
        return;
    }
    // The first element whose magnitude is the maximum (it exists: amax came from one).
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
    let iscale = -127.0f32 / max;

    let mut q = [0i8; QK_K];
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = nearest_int(iscale * v).min(127) as i8;
    }

    out[..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
    for (o, &qi) in out[Q8K_QS..Q8K_BSUMS].iter_mut().zip(&q) {
        *o = qi as u8;
    }
    for (g, o) in q.chunks_exact(16).zip(out[Q8K_BSUMS..].chunks_exact_mut(2)) {
        let s: i16 = g.iter().map(|&v| i16::from(v)).sum();
        o.copy_from_slice(&s.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let cases = [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (-2.5, -2),
            (126.49, 126),
            (-127.0, -127),
            (127.4, 127),
            (0.0, 0),
            (-0.0, 0),
        ];
        for (v, want) in cases {
            assert_eq!(nearest_int(v), want, "v = {v}");
        }
    }

    #[test]
    fn largest_magnitude_maps_to_minus_127() {
        let mut x = [0.0f32; QK_K];
        x[3] = 2.0;
        x[7] = -2.0; // same magnitude, later: must not be chosen as `max`
        x[9] = 1.0;
        let mut out = [0u8; Q8K_BYTES];
        quantize_row_q8_k(&x, &mut out);
        let d = f32::from_le_bytes(out[..4].try_into().unwrap());
        assert_eq!(d, 1.0 / (-127.0f32 / 2.0));
        assert_eq!(out[Q8K_QS + 3] as i8, -127);
        assert_eq!(out[Q8K_QS + 7] as i8, 127);
        // -127/2 * 1 = -63.5, a tie: rounds to the even -64.
        assert_eq!(out[Q8K_QS + 9] as i8, -64);
    }
}
