//! Dot kernels for the float types (F32, F16, BF16) and the 32-element block types
//! (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4).
//!
//! The scalar kernels follow ggml's portable algorithm: per block an exact integer sum of
//! the quant products, then one float multiply-accumulate with the two block scales, in the
//! same operation order as ggml's generic C. The float types multiply in f32 and
//! accumulate in f64. The AVX2 kernels (in `legacy/avx2.rs`) compute the same integer
//! sums with SIMD and accumulate the scaled sums in f32 lanes, so only the float summation
//! order differs from the scalar reference.

use super::{Isa, Kernels};
use crate::GgmlType;
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "aarch64")]
pub(super) mod neon;

/// Elements per block of every type in this module (and of Q8_0 / Q8_1).
pub(super) const QK: usize = 32;

/// Bytes of one block, by type.
pub(super) const Q4_0_BYTES: usize = 18;
pub(super) const Q4_1_BYTES: usize = 20;
pub(super) const Q5_0_BYTES: usize = 22;
pub(super) const Q5_1_BYTES: usize = 24;
pub(super) const Q8_0_BYTES: usize = 34;
pub(super) const Q8_1_BYTES: usize = 36;
pub(super) const IQ4_NL_BYTES: usize = 18;
pub(super) const MXFP4_BYTES: usize = 17;

/// Every IEEE half as f32 (256 KiB, built at compile time). A block scale then costs one
/// load; ggml's x86 kernels convert scales the same way. Only the entries of the scales a
/// model actually uses get touched, so the working set stays small.
static F16_TO_F32: [f32; 1 << 16] = {
    let mut t = [0f32; 1 << 16];
    let mut i = 0;
    while i < t.len() {
        t[i] = half::f16::from_bits(i as u16).to_f32_const();
        i += 1;
    }
    t
};

/// IEEE half (as stored, little-endian bits) to f32; exact for every non-NaN value.
#[inline(always)]
pub(super) fn f16_to_f32(bits: u16) -> f32 {
    F16_TO_F32[usize::from(bits)]
}

/// f32 to IEEE half bits, round to nearest even (what x86 F16C `vcvtps2ph` with
/// immediate 0 computes, including overflow to infinity and NaN quieting).
#[inline]
pub(super) fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// bfloat16 bits to f32 (exact).
#[inline]
pub(super) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

#[inline]
fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..].as_chunks::<2>().0[0])
}

/// Asserts the [`super::DotFn`] contract for a 32-element block type and returns the
/// number of blocks.
#[inline]
pub(super) fn check_blocks(n: usize, w: &[u8], w_bytes: usize, a: &[u8], a_bytes: usize) -> usize {
    let nb = n / QK;
    assert!(
        n.is_multiple_of(QK) && w.len() == nb * w_bytes && a.len() == nb * a_bytes,
        "dot kernel contract violated: n = {n}, weight bytes {}, activation bytes {}",
        w.len(),
        a.len()
    );
    nb
}

/// Asserts the [`super::DotFn`] contract for a float type of `size` bytes per element.
#[inline]
pub(super) fn check_floats(n: usize, w: &[u8], a: &[u8], size: usize) {
    assert!(
        w.len() == n * size && a.len() == n * size,
        "dot kernel contract violated: n = {n}, weight bytes {}, activation bytes {}",
        w.len(),
        a.len()
    );
}

/// The 32 signed quants of a Q8_0 / Q8_1 block.
#[inline]
fn q8(qs: &[u8]) -> impl Iterator<Item = i32> + '_ {
    qs.iter().map(|&b| i32::from(b as i8))
}

fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_floats(n, w, a, 4);
    let (w, _) = w.as_chunks::<4>();
    let (a, _) = a.as_chunks::<4>();
    let mut sum = 0f64;
    for (x, y) in w.iter().zip(a) {
        sum += f64::from(f32::from_le_bytes(*x) * f32::from_le_bytes(*y));
    }
    sum as f32
}

fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_floats(n, w, a, 2);
    let (w, _) = w.as_chunks::<2>();
    let (a, _) = a.as_chunks::<2>();
    let mut sum = 0f64;
    for (x, y) in w.iter().zip(a) {
        let x = f16_to_f32(u16::from_le_bytes(*x));
        let y = f16_to_f32(u16::from_le_bytes(*y));
        sum += f64::from(x * y);
    }
    sum as f32
}

fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_floats(n, w, a, 2);
    let (w, _) = w.as_chunks::<2>();
    let (a, _) = a.as_chunks::<2>();
    let mut sum = 0f64;
    for (x, y) in w.iter().zip(a) {
        let x = bf16_to_f32(u16::from_le_bytes(*x));
        let y = bf16_to_f32(u16::from_le_bytes(*y));
        sum += f64::from(x * y);
    }
    sum as f32
}

fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q8_0_BYTES, a, Q8_0_BYTES);
    let (w, _) = w.as_chunks::<Q8_0_BYTES>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi: i32 = q8(&x[2..]).zip(q8(&y[2..])).map(|(p, q)| p * q).sum();
        let d = f16_to_f32(le16(x, 0)) * f16_to_f32(le16(y, 0));
        sum += sumi as f32 * d;
    }
    sum
}

fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q4_0_BYTES, a, Q8_0_BYTES);
    let (w, _) = w.as_chunks::<Q4_0_BYTES>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (xq, yq) = (&x[2..], &y[2..]);
        let (mut lo, mut hi) = (0i32, 0i32);
        for j in 0..QK / 2 {
            lo += (i32::from(xq[j] & 0x0f) - 8) * i32::from(yq[j] as i8);
            hi += (i32::from(xq[j] >> 4) - 8) * i32::from(yq[j + QK / 2] as i8);
        }
        sum += (lo + hi) as f32 * f16_to_f32(le16(x, 0)) * f16_to_f32(le16(y, 0));
    }
    sum
}

fn dot_q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q4_1_BYTES, a, Q8_1_BYTES);
    let (w, _) = w.as_chunks::<Q4_1_BYTES>();
    let (a, _) = a.as_chunks::<Q8_1_BYTES>();
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (xq, yq) = (&x[4..], &y[4..]);
        let (mut lo, mut hi) = (0i32, 0i32);
        for j in 0..QK / 2 {
            lo += i32::from(xq[j] & 0x0f) * i32::from(yq[j] as i8);
            hi += i32::from(xq[j] >> 4) * i32::from(yq[j + QK / 2] as i8);
        }
        let d = f16_to_f32(le16(x, 0)) * f16_to_f32(le16(y, 0));
        let m = f16_to_f32(le16(x, 2)) * f16_to_f32(le16(y, 2));
        sum += d * (lo + hi) as f32 + m;
    }
    sum
}

fn dot_q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q5_0_BYTES, a, Q8_0_BYTES);
    let (w, _) = w.as_chunks::<Q5_0_BYTES>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
        let (xq, yq) = (&x[6..], &y[2..]);
        let (mut lo, mut hi) = (0i32, 0i32);
        for j in 0..QK / 2 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            let v0 = (u32::from(xq[j] & 0x0f) | h0) as i32 - 16;
            let v1 = (u32::from(xq[j] >> 4) | h1) as i32 - 16;
            lo += v0 * i32::from(yq[j] as i8);
            hi += v1 * i32::from(yq[j + QK / 2] as i8);
        }
        let d = f16_to_f32(le16(x, 0)) * f16_to_f32(le16(y, 0));
        sum += d * (lo + hi) as f32;
    }
    sum
}

fn dot_q5_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q5_1_BYTES, a, Q8_1_BYTES);
    let (w, _) = w.as_chunks::<Q5_1_BYTES>();
    let (a, _) = a.as_chunks::<Q8_1_BYTES>();
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
        let (xq, yq) = (&x[8..], &y[4..]);
        let (mut lo, mut hi) = (0i32, 0i32);
        for j in 0..QK / 2 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            let v0 = (u32::from(xq[j] & 0x0f) | h0) as i32;
            let v1 = (u32::from(xq[j] >> 4) | h1) as i32;
            lo += v0 * i32::from(yq[j] as i8);
            hi += v1 * i32::from(yq[j + QK / 2] as i8);
        }
        let d = f16_to_f32(le16(x, 0)) * f16_to_f32(le16(y, 0));
        let m = f16_to_f32(le16(x, 2)) * f16_to_f32(le16(y, 2));
        sum += d * (lo + hi) as f32 + m;
    }
    sum
}

/// Shared body of the two lookup-table 4-bit types (IQ4_NL, MXFP4): `scale(x, y)` is the
/// combined block scale, the quants start at byte `qs` of the weight block.
#[inline]
fn dot_lut4<const WB: usize>(
    w: &[u8],
    a: &[u8],
    qs: usize,
    table: &[i8; 16],
    scale: impl Fn(&[u8; WB], &[u8; Q8_0_BYTES]) -> f32,
) -> f32 {
    let (w, _) = w.as_chunks::<WB>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (xq, yq) = (&x[qs..], &y[2..]);
        let (mut lo, mut hi) = (0i32, 0i32);
        for j in 0..QK / 2 {
            lo += i32::from(yq[j] as i8) * i32::from(table[usize::from(xq[j] & 0x0f)]);
            hi += i32::from(yq[j + QK / 2] as i8) * i32::from(table[usize::from(xq[j] >> 4)]);
        }
        sum += scale(x, y) * (lo + hi) as f32;
    }
    sum
}

fn dot_iq4_nl(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, IQ4_NL_BYTES, a, Q8_0_BYTES);
    dot_lut4::<IQ4_NL_BYTES>(w, a, 2, &KVALUES_IQ4NL, |x, y| {
        f16_to_f32(le16(y, 0)) * f16_to_f32(le16(x, 0))
    })
}

fn dot_mxfp4(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, MXFP4_BYTES, a, Q8_0_BYTES);
    dot_lut4::<MXFP4_BYTES>(w, a, 1, &KVALUES_MXFP4, |x, y| {
        f16_to_f32(le16(y, 0)) * e8m0_to_f32_half(x[0])
    })
}

pub(super) fn register(k: &mut Kernels) {
    use GgmlType::*;
    k.set_dot(F32, dot_f32);
    k.set_dot(F16, dot_f16);
    k.set_dot(BF16, dot_bf16);
    k.set_dot(Q8_0, dot_q8_0);
    k.set_dot(Q4_0, dot_q4_0);
    k.set_dot(Q4_1, dot_q4_1);
    k.set_dot(Q5_0, dot_q5_0);
    k.set_dot(Q5_1, dot_q5_1);
    k.set_dot(IQ4_NL, dot_iq4_nl);
    k.set_dot(MXFP4, dot_mxfp4);
    if k.isa() == Isa::Avx2 {
        #[cfg(target_arch = "x86_64")]
        avx2::register(k);
    }
    if k.isa() == Isa::Neon {
        #[cfg(target_arch = "aarch64")]
        neon::register(k);
    }
}
