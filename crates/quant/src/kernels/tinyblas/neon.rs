//! NEON kernels of the tinyBLAS order as llama.cpp's aarch64 build runs it (`llamafile_sgemm`
//! compiled with NEON and FP16 vector arithmetic). Every output element is one accumulator
//! over the row, whatever tile tinyBLAS picks:
//!
//! * F32 (`tinyBLAS<4, float32x4_t>`): one 4-lane f32 accumulator, lane `i % 4` becomes
//!   `fma(w[i], a[i], lane)`; the lanes are added as `vaddvq_f32`: `(l0 + l1) + (l2 + l3)`.
//! * F16 (`tinyBLAS<8, float16x8_t>`, the activation converted to F16 first): one 8-lane
//!   **f16** accumulator updated by the FP16 `fmla` (one f16 rounding per step); the low and
//!   the high four lanes are widened to f32, added lane-wise, and summed as F32's.
//!
//! llama.cpp only takes this path for row lengths that are a multiple of the lane count; these
//! kernels accept any length and multiply the missing lanes of a last, partial group as
//! zeros.
//!
//! * Q4_0 and Q8_0 (`tinyBLAS_Q0_ARM`, the activation quantized to Q8_0): one 4-lane f32
//!   accumulator; per block two `sdot`s give lane `t` the integer sum of elements
//!   `4t..4t+4` and `16+4t..16+4t+4`, which is converted, multiplied by `d_w · d_a` and then
//!   added (not fused); the lanes are summed as F32's. The scalar reference is
//!   [`super::arm_q0_reference`].

use std::arch::aarch64::*;

use super::super::legacy::neon::{
    arr, dot32, f16_at, fmla_f16, hsum, load_f16x8, load_s8, q4_0_quants, widen_f16,
};
use super::super::legacy::{Q4_0_BYTES, Q8_0_BYTES, check_blocks, check_floats};
use super::super::{Kernels, SumOrder};
use crate::GgmlType;

/// Four f32 from 16 bytes.
#[inline]
#[target_feature(enable = "neon")]
pub(in crate::kernels) fn load_f32x4(b: &[u8]) -> float32x4_t {
    // SAFETY: `arr` gives 16 readable bytes; `vld1q` has no alignment requirement.
    unsafe { vld1q_f32(arr::<16>(b).as_ptr().cast()) }
}

/// `b` (at most `g` bytes) zero-padded to a whole group of `g` bytes.
#[inline(always)]
pub(in crate::kernels) fn padded<const G: usize>(b: &[u8]) -> [u8; G] {
    let mut t = [0u8; G];
    t[..b.len()].copy_from_slice(b);
    t
}

#[target_feature(enable = "neon")]
fn f32_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_floats(n, w, a, 4);
    let (w, a) = (&w[..4 * n], &a[..4 * n]);
    let mut acc = vdupq_n_f32(0.0);
    let (wc, wt) = w.as_chunks::<16>();
    let (ac, at) = a.as_chunks::<16>();
    for (x, y) in wc.iter().zip(ac) {
        acc = vfmaq_f32(acc, load_f32x4(x), load_f32x4(y));
    }
    if !wt.is_empty() {
        let (x, y) = (padded::<16>(wt), padded::<16>(at));
        acc = vfmaq_f32(acc, load_f32x4(&x), load_f32x4(&y));
    }
    hsum(acc)
}

#[target_feature(enable = "neon,fp16")]
fn f16_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_floats(n, w, a, 2);
    let (w, a) = (&w[..2 * n], &a[..2 * n]);
    let mut acc = vdupq_n_u16(0);
    let (wc, wt) = w.as_chunks::<16>();
    let (ac, at) = a.as_chunks::<16>();
    for (x, y) in wc.iter().zip(ac) {
        acc = fmla_f16(acc, load_f16x8(x), load_f16x8(y));
    }
    if !wt.is_empty() {
        let (x, y) = (padded::<16>(wt), padded::<16>(at));
        acc = fmla_f16(acc, load_f16x8(&x), load_f16x8(&y));
    }
    let (lo, hi) = widen_f16(acc);
    hsum(vaddq_f32(lo, hi))
}

/// One block's step of `tinyBLAS_Q0_ARM`: `acc + f32(Σ) · d`, the product rounded first.
#[inline]
#[target_feature(enable = "neon")]
fn q0_step(acc: float32x4_t, sums: int32x4_t, d: f32) -> float32x4_t {
    vaddq_f32(acc, vmulq_n_f32(vcvtq_f32_s32(sums), d))
}

#[target_feature(enable = "neon,dotprod")]
fn q8_0_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q8_0_BYTES, a, Q8_0_BYTES);
    let (w, _) = w.as_chunks::<Q8_0_BYTES>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut acc = vdupq_n_f32(0.0);
    for (x, y) in w.iter().zip(a) {
        let s = dot32(load_s8(arr(&x[2..])), load_s8(arr(&x[18..])), &y[2..]);
        acc = q0_step(acc, s, f16_at(x, 0) * f16_at(y, 0));
    }
    hsum(acc)
}

#[target_feature(enable = "neon,dotprod")]
fn q4_0_neon(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q4_0_BYTES, a, Q8_0_BYTES);
    let (w, _) = w.as_chunks::<Q4_0_BYTES>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut acc = vdupq_n_f32(0.0);
    for (x, y) in w.iter().zip(a) {
        let (lo, hi) = q4_0_quants(&x[2..]);
        acc = q0_step(acc, dot32(lo, hi, &y[2..]), f16_at(x, 0) * f16_at(y, 0));
    }
    hsum(acc)
}

// Registered only in a table built for `Isa::Neon`, which `Kernels::detect` builds only after
// it detected NEON, the dot product and FP16 at run time.
fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: only reachable through a NEON table (see above).
    unsafe { f32_neon(n, w, a) }
}

fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: only reachable through a NEON table (see above), so the CPU has FP16.
    unsafe { f16_neon(n, w, a) }
}

fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: only reachable through a NEON table (see above), so the CPU has the dot product.
    unsafe { q8_0_neon(n, w, a) }
}

fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: as for `dot_q8_0`.
    unsafe { q4_0_neon(n, w, a) }
}

pub(in crate::kernels) fn register(k: &mut Kernels) {
    k.set_dot_in(SumOrder::TinyBlas, GgmlType::F32, dot_f32);
    k.set_dot_in(SumOrder::TinyBlas, GgmlType::F16, dot_f16);
    k.set_dot_in(SumOrder::TinyBlas, GgmlType::Q8_0, dot_q8_0);
    k.set_dot_in(SumOrder::TinyBlas, GgmlType::Q4_0, dot_q4_0);
}
