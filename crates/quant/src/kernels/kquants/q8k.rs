//! The Q8_K activation quantizer.
//!
//! Reproduces ggml's reference quantizer byte for byte (ggml's x86 CPU backend uses the
//! reference quantizer for Q8_K, so one implementation serves every table):
//!
//! * `max` is the first element of largest magnitude (NaNs never win); a block whose
//!   largest magnitude is zero is stored as `d = 0` and all-zero quants and sums (ggml
//!   leaves the sums of such a block unwritten; every use multiplies them by `d`);
//! * `iscale = -127 / max` (note the sign: the element `max` maps to `-127`), computed in
//!   f32;
//! * `q = min(127, round(iscale * x))`, where the product is rounded to f32 first and then
//!   to the nearest integer with ties to even (ggml adds `1.5 · 2^23` and reads the low
//!   mantissa bits, which is what is done here too);
//! * `d = 1 / iscale` in f32, `bsums[g]` = sum of `q[16g .. 16g + 16]`.
//!
//! llama.cpp's aarch64 build compiles the same C with GCC, which contracts `iscale · x +
//! 1.5 · 2^23` into one fused multiply-add (both in the row quantizer and in the repacked
//! path's `ggml_quantize_mat_q8_K_4x4`): there the product is not rounded to f32 first, and
//! `q` is the exact product rounded to the nearest integer, ties to even. That differs where
//! the rounded product lands on a half and the exact one does not.
//! [`quantize_row_q8_k_fused`] is that variant; the NEON table quantizes with it.

use super::{Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use crate::QK_K;

/// `1.5 · 2^23`: adding it to an f32 of magnitude below `2^22` leaves the value rounded to
/// an integer (ties to even) in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Round `v` to the nearest integer, ties to even, exactly as ggml's `nearest_int` does
/// (valid for `|v| < 2^22`; other inputs give the same bits as ggml's trick).
#[inline]
fn nearest_int(v: f32) -> i32 {
    round_bits(v + ROUND_MAGIC)
}

/// The integer in the low mantissa bits of `v + 1.5 · 2^23` (given that sum).
#[inline]
fn round_bits(sum: f32) -> i32 {
    (sum.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// Quantize `x` (a whole number of 256-element blocks) into Q8_K blocks in `out`.
pub(super) fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
    quantize_row::<false>(x, out);
}

/// [`quantize_row_q8_k`] with llama.cpp's aarch64 rounding of the quants: `iscale · x`
/// rounded once, from its exact value, to the nearest integer (ties to even).
pub fn quantize_row_q8_k_fused(x: &[f32], out: &mut [u8]) {
    quantize_row::<true>(x, out);
}

fn quantize_row<const FUSED: bool>(x: &[f32], out: &mut [u8]) {
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
        quantize_block::<FUSED>(xb, ob);
    }
}

fn quantize_block<const FUSED: bool>(x: &[f32], out: &mut [u8]) {
    // The largest magnitude, compared as integers: for non-NaN floats the order of
    // `bits & 0x7fff_ffff` is the order of the magnitudes; NaNs (above the infinity bits)
    // are left out, as the float comparison `|x| > amax` leaves them out.
    // (As i32: the magnitude bits are below 2^31, and a signed maximum vectorizes on
    // baseline x86-64.)
    const ABS: u32 = 0x7fff_ffff;
    const INF: i32 = 0x7f80_0000;
    let mag = |v: &f32| (v.to_bits() & ABS) as i32;
    let mut lanes = [0i32; 8];
    for g in x.chunks_exact(8) {
        for (l, v) in lanes.iter_mut().zip(g) {
            let b = mag(v);
            *l = (*l).max(if b > INF { 0 } else { b });
        }
    }
    let amax_bits = lanes.into_iter().fold(0, i32::max);
    if amax_bits == 0 {
        out.fill(0);
        return;
    }
    // The first element of largest magnitude (it exists: amax_bits came from one). Whole
    // groups of 16 are tested first, so that the scan vectorizes.
    let max = x
        .chunks_exact(16)
        .find(|g| {
            g.iter()
                .map(mag)
                .fold(false, |hit, b| hit | (b == amax_bits))
        })
        .and_then(|g| g.iter().copied().find(|v| mag(v) == amax_bits))
        .unwrap_or(f32::from_bits(amax_bits as u32));
    let iscale = -127.0f32 / max;

    let mut q = [0i8; QK_K];
    for (qi, &v) in q.iter_mut().zip(x) {
        let r = if FUSED {
            // one rounding, of the exact `iscale · v + 1.5 · 2^23` (what `nearest_int`
            // computes from the unrounded product)
            round_bits(iscale.mul_add(v, ROUND_MAGIC))
        } else {
            nearest_int(iscale * v)
        };
        *qi = r.min(127) as i8;
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

    /// The fused variant rounds the exact product: where `iscale · x` rounds to a half in
    /// f32 but is not one, the two variants part; elsewhere they agree.
    #[test]
    fn fused_rounds_the_exact_product() {
        // max = 100: iscale = -1.27 (inexact). Find an x whose f32 product is exactly
        // -(k + 0.5) while the exact product is not.
        let iscale = -127.0f32 / 100.0;
        let mut x = [0.0f32; QK_K];
        x[0] = 100.0;
        let mut found = 0;
        for (k, slot) in (1..120).zip(1..) {
            let target = -(k as f32 + 0.5);
            let mut v = target / iscale;
            for _ in 0..64 {
                let exact = f64::from(v) * f64::from(iscale);
                if iscale * v == target && exact != f64::from(target) {
                    x[slot] = v;
                    found += 1;
                    break;
                }
                v = f32::from_bits(v.to_bits() + 1);
            }
        }
        assert!(found > 10, "only {found} near-halves found");
        let (mut a, mut b) = ([0u8; Q8K_BYTES], [0u8; Q8K_BYTES]);
        quantize_row_q8_k(&x, &mut a);
        quantize_row_q8_k_fused(&x, &mut b);
        let mut parted = 0;
        for (j, &v) in x.iter().enumerate() {
            let (qa, qb) = (a[Q8K_QS + j] as i8, b[Q8K_QS + j] as i8);
            let exact = f64::from(v) * f64::from(iscale);
            // the fused one is the exact product rounded to nearest (no exact halves here)
            assert_eq!(f64::from(qb), exact.round(), "x[{j}] = {v}");
            assert!((i32::from(qa) - i32::from(qb)).abs() <= 1);
            parted += usize::from(qa != qb);
        }
        assert!(parted > 0, "no element parted the two roundings");
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
