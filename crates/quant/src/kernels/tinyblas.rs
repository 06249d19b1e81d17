//! Dot kernels in the summation order of llamafile's tinyBLAS ([`SumOrder::TinyBlas`]), for
//! the float weight types F32, F16 and BF16.
//!
//! llama.cpp's CPU backend hands a plain (`MUL_MAT`) product of a 2-D F32, F16 or BF16 weight
//! to tinyBLAS (`llamafile_sgemm`) when the activation is a batch of at least two rows, the
//! weight's row count is a multiple of 4 and its row length a multiple of 8 (the AVX2 vector
//! width); the activation is first converted to the weight's type (F32 stays F32). Whatever
//! tile tinyBLAS picks, every output element is summed the same way:
//!
//! * one 8-lane accumulator, starting at zero; for each group of 8 consecutive elements,
//!   lane `l` becomes `fma(w[8g + l], a[8g + l], lane l)` (one rounding per step);
//! * at the end the lanes are added as a tree: `t[i] = lane[4 + i] + lane[i]` for `i < 4`,
//!   then `(t[0] + t[2]) + (t[1] + t[3])`.
//!
//! The F16 and BF16 elements are widened to f32 exactly before the multiply-add.
//!
//! llama.cpp never uses this path for a row length that is not a multiple of 8; these
//! kernels accept one anyway and give the `n % 8` last elements to lanes `0..n % 8` of a last,
//! partial group (the other lanes are left alone), so that the scalar and the SIMD kernels
//! agree for every `n`.
//!
//! The scalar kernels here are the reference: they emulate the 8 lanes and the tree with
//! `f32::mul_add` and plain adds, so every target computes the same bits as the AVX2 kernels
//! (in `tinyblas/avx2.rs`).

use super::legacy::{
    Q4_0_BYTES, Q8_0_BYTES, QK, bf16_to_f32, check_blocks, check_floats, f16_to_f32,
};
use super::{DotFn, Isa, Kernels, SumOrder};
use crate::GgmlType;

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;
#[cfg(target_arch = "aarch64")]
pub(super) mod neon;

/// Lanes of the accumulator (AVX2: one `__m256`).
pub(super) const LANES: usize = 8;

/// The horizontal sum of tinyBLAS's accumulator: halves, then pairs, then the last two.
#[inline(always)]
pub(super) fn hsum8(v: &[f32; LANES]) -> f32 {
    let t = [v[4] + v[0], v[5] + v[1], v[6] + v[2], v[7] + v[3]];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// One output in tinyBLAS order over elements of `S` bytes, widened by `f`.
#[inline(always)]
fn dot_lanes<const S: usize>(n: usize, w: &[u8], a: &[u8], f: impl Fn([u8; S]) -> f32) -> f32 {
    check_floats(n, w, a, S);
    let (w, _) = w.as_chunks::<S>();
    let (a, _) = a.as_chunks::<S>();
    let mut acc = [0f32; LANES];
    for (i, (x, y)) in w.iter().zip(a).enumerate() {
        let l = &mut acc[i % LANES];
        *l = f(*x).mul_add(f(*y), *l);
    }
    hsum8(&acc)
}

fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_lanes::<4>(n, w, a, f32::from_le_bytes)
}

fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_lanes::<2>(n, w, a, |b| f16_to_f32(u16::from_le_bytes(b)))
}

fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_lanes::<2>(n, w, a, |b| bf16_to_f32(u16::from_le_bytes(b)))
}

/// The order of llama.cpp's aarch64 tinyBLAS for quantized weights (`tinyBLAS_Q0_ARM`, built
/// with the dot-product extension), which `llamafile_sgemm` takes for a plain product of a
/// Q4_0 or Q8_0 weight the repack declines (row count not a multiple of 4), or one outside
/// the repacked buffer (the per-head matrices of MLA), from two activation rows on:
///
/// * one 4-lane f32 accumulator per output; lane `t` takes, per block, the exact integer sum
///   of elements `4t..4t+4` and `16+4t..16+4t+4` (two `sdot`s), converted to f32, times the
///   block's `d_w · d_a` (rounded to f32), **then** added (`fmul` and `fadd`: the compiled
///   reference does not fuse them);
/// * the lanes are added as `vaddvq_f32`: `(l0 + l1) + (l2 + l3)`.
///
/// This scalar kernel is the reference of the NEON one (`tinyblas/neon.rs`) and runs on every
/// target; `w` is Q4_0 or Q8_0, the activation Q8_0. `None` for other types.
pub fn arm_q0_reference(w: GgmlType) -> Option<DotFn> {
    match w {
        GgmlType::Q8_0 => Some(arm_q0_q8_0),
        GgmlType::Q4_0 => Some(arm_q0_q4_0),
        _ => None,
    }
}

/// One output of `tinyBLAS_Q0_ARM` over blocks of `WB` bytes, element `j` of a weight block
/// given by `q(block, j)`.
#[inline(always)]
fn arm_q0<const WB: usize>(
    n: usize,
    w: &[u8],
    a: &[u8],
    q: impl Fn(&[u8; WB], usize) -> i32,
) -> f32 {
    check_blocks(n, w, WB, a, Q8_0_BYTES);
    let (w, _) = w.as_chunks::<WB>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut lanes = [0f32; 4];
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(u16::from_le_bytes([x[0], x[1]]))
            * f16_to_f32(u16::from_le_bytes([y[0], y[1]]));
        for (t, lane) in lanes.iter_mut().enumerate() {
            let s: i32 = (0..4)
                .flat_map(|i| [4 * t + i, QK / 2 + 4 * t + i])
                .map(|j| q(x, j) * i32::from(y[2 + j] as i8))
                .sum();
            *lane += s as f32 * d;
        }
    }
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
}

fn arm_q0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    arm_q0::<Q8_0_BYTES>(n, w, a, |x, j| i32::from(x[2 + j] as i8))
}

fn arm_q0_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    arm_q0::<Q4_0_BYTES>(n, w, a, |x, j| {
        let b = x[2 + j % (QK / 2)];
        i32::from(if j < QK / 2 { b & 0x0f } else { b >> 4 }) - 8
    })
}

pub(super) fn register(k: &mut Kernels) {
    use GgmlType::*;
    k.set_dot_in(SumOrder::TinyBlas, F32, dot_f32);
    k.set_dot_in(SumOrder::TinyBlas, F16, dot_f16);
    k.set_dot_in(SumOrder::TinyBlas, BF16, dot_bf16);
    if k.isa() == Isa::Avx2 {
        #[cfg(target_arch = "x86_64")]
        avx2::register(k);
    }
    // llama.cpp's aarch64 build sums F32 and F16 in its own tinyBLAS order (4 f32 lanes; 8 f16
    // lanes): the NEON table holds those (`tinyblas/neon.rs`) and BF16 keeps the order above
    // (Kernels::order_for never picks tinyBLAS for it on ARM).
    if k.isa() == Isa::Neon {
        #[cfg(target_arch = "aarch64")]
        neon::register(k);
    }
}
