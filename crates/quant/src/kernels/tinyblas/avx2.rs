//! AVX2 + FMA + F16C kernels of the tinyBLAS order (see `tinyblas.rs` for the order).
//!
//! The single-row kernel keeps the one `__m256` accumulator of tinyBLAS, so it is bound by
//! the latency of the FMA chain. The multi-row kernels run one such chain per weight row side
//! by side (the chains are independent, so several are in flight at once) and share the load
//! and widening of the activation; each row's operations are exactly those of the single-row
//! kernel, so the results are the same bits.

use std::arch::x86_64::*;

use super::super::legacy::{bf16_to_f32, check_floats, f16_to_f32};
use super::super::{Kernels, SumOrder};
use super::{LANES, hsum8};
use crate::GgmlType;

/// Weight rows per multi-row call, by type: 4 chains hide most of the FMA latency; 8 measured
/// no faster with `matvec_bench` (2048x2048 and 1024x512, one thread).
const F32_ROWS: usize = 4;
const F16_ROWS: usize = 4;
const BF16_ROWS: usize = 4;

pub(super) fn register(k: &mut Kernels) {
    use GgmlType::*;
    let o = SumOrder::TinyBlas;
    k.set_dot_in(o, F32, dot_f32);
    k.set_dot_in(o, F16, dot_f16);
    k.set_dot_in(o, BF16, dot_bf16);
    k.set_dot_rows_in(o, F32, F32_ROWS, dot_rows_f32);
    k.set_dot_rows_in(o, F16, F16_ROWS, dot_rows_f16);
    k.set_dot_rows_in(o, BF16, BF16_ROWS, dot_rows_bf16);
}

/// 8 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::kernels) fn load_f32(b: &[u8; 32]) -> __m256 {
    // SAFETY: `b` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_ps(b.as_ptr().cast()) }
}

/// 8 IEEE halves widened to f32 (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::kernels) fn load_f16(b: &[u8; 16]) -> __m256 {
    // SAFETY: `b` is 16 readable bytes; `loadu` has no alignment requirement.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(b.as_ptr().cast()) })
}

/// 8 bfloat16 widened to f32 (exact: the bits moved to the top half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::kernels) fn load_bf16(b: &[u8; 16]) -> __m256 {
    // SAFETY: `b` is 16 readable bytes; `loadu` has no alignment requirement.
    let h = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

/// tinyBLAS's horizontal sum of the accumulator (the same adds as [`hsum8`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::kernels) fn hsum(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)))
}

/// The lane sum of `acc` after the `n % 8` tail elements (`wt`, `at`, `S` bytes each) went
/// into its first lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::kernels) fn finish<const S: usize>(
    acc: __m256,
    wt: &[u8],
    at: &[u8],
    elem: impl Fn([u8; S]) -> f32,
) -> f32 {
    if wt.is_empty() {
        return hsum(acc);
    }
    let mut lanes = [0f32; LANES];
    // SAFETY: `lanes` is 8 writable f32; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    let (wt, _) = wt.as_chunks::<S>();
    let (at, _) = at.as_chunks::<S>();
    for ((l, x), y) in lanes.iter_mut().zip(wt).zip(at) {
        *l = elem(*x).mul_add(elem(*y), *l);
    }
    hsum8(&lanes)
}

/// One output: `S` bytes per element, `G = 8 * S` bytes per group of 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn one_row<const S: usize, const G: usize>(
    n: usize,
    w: &[u8],
    a: &[u8],
    load: impl Fn(&[u8; G]) -> __m256,
    elem: impl Fn([u8; S]) -> f32,
) -> f32 {
    check_floats(n, w, a, S);
    let (wg, wt) = w.as_chunks::<G>();
    let (ag, at) = a.as_chunks::<G>();
    let mut acc = _mm256_setzero_ps();
    for (x, y) in wg.iter().zip(ag) {
        acc = _mm256_fmadd_ps(load(x), load(y), acc);
    }
    finish(acc, wt, at, elem)
}

/// `R` consecutive weight rows against one activation row, each row summed exactly as
/// [`one_row`] sums it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows<const S: usize, const G: usize, const R: usize>(
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    load: impl Fn(&[u8; G]) -> __m256,
    elem: impl Fn([u8; S]) -> f32 + Copy,
) {
    let rb = n * S;
    assert!(
        out.len() == R && w.len() == R * rb && a.len() == rb,
        "dot_rows kernel contract violated: n = {n}, {} rows (kernel takes {R}), weight bytes {}, activation bytes {}",
        out.len(),
        w.len(),
        a.len()
    );
    let (ag, at) = a.as_chunks::<G>();
    let ng = ag.len();
    let mut acc = [_mm256_setzero_ps(); R];
    for (g, y) in ag.iter().enumerate() {
        let y = load(y);
        for (r, c) in acc.iter_mut().enumerate() {
            // SAFETY: g < ng = n / 8 and r < R, so the group's bytes r * rb + g * G ..
            // + G lie within row r (r * rb + ng * G <= r * rb + rb <= R * rb == w.len(),
            // asserted above); [u8; G] has alignment 1.
            let x = unsafe { &*w.as_ptr().add(r * rb + g * G).cast::<[u8; G]>() };
            *c = _mm256_fmadd_ps(load(x), y, *c);
        }
    }
    for (r, (o, c)) in out.iter_mut().zip(acc).enumerate() {
        let row = &w[r * rb..(r + 1) * rb];
        *o = finish(c, &row[ng * G..], at, elem);
    }
}

fn f32_elem(b: [u8; 4]) -> f32 {
    f32::from_le_bytes(b)
}

fn f16_elem(b: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

fn bf16_elem(b: [u8; 2]) -> f32 {
    bf16_to_f32(u16::from_le_bytes(b))
}

// The wrappers below are registered only in a table built for `Isa::Avx2`, which
// `Kernels::detect` builds only after it detected AVX2, FMA and F16C at run time.

fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the features.
    unsafe { one_row::<4, 32>(n, w, a, |b| load_f32(b), f32_elem) }
}

fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the features.
    unsafe { one_row::<2, 16>(n, w, a, |b| load_f16(b), f16_elem) }
}

fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the features.
    unsafe { one_row::<2, 16>(n, w, a, |b| load_bf16(b), bf16_elem) }
}

fn dot_rows_f32(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the features.
    unsafe { rows::<4, 32, F32_ROWS>(n, w, a, out, |b| load_f32(b), f32_elem) }
}

fn dot_rows_f16(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the features.
    unsafe { rows::<2, 16, F16_ROWS>(n, w, a, out, |b| load_f16(b), f16_elem) }
}

fn dot_rows_bf16(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the features.
    unsafe { rows::<2, 16, BF16_ROWS>(n, w, a, out, |b| load_bf16(b), bf16_elem) }
}
