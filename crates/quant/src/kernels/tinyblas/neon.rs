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

use std::arch::aarch64::*;

use super::super::legacy::check_floats;
use super::super::legacy::neon::{arr, fmla_f16, hsum, load_f16x8, widen_f16};
use super::super::{Kernels, SumOrder};
use crate::GgmlType;

/// Four f32 from 16 bytes.
#[inline]
#[target_feature(enable = "neon")]
fn load_f32x4(b: &[u8]) -> float32x4_t {
    // SAFETY: `arr` gives 16 readable bytes; `vld1q` has no alignment requirement.
    unsafe { vld1q_f32(arr::<16>(b).as_ptr().cast()) }
}

/// `b` (at most `g` bytes) zero-padded to a whole group of `g` bytes.
#[inline(always)]
fn padded<const G: usize>(b: &[u8]) -> [u8; G] {
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

pub(in crate::kernels) fn register(k: &mut Kernels) {
    k.set_dot_in(SumOrder::TinyBlas, GgmlType::F32, dot_f32);
    k.set_dot_in(SumOrder::TinyBlas, GgmlType::F16, dot_f16);
}
