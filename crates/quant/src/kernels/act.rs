//! Activation quantizers: f32 rows into the activation types the dot kernels pair with
//! (Q8_0, Q8_1, F16, BF16, F32).
//!
//! These reproduce the bytes ggml's x86 CPU backend produces, because reference logits
//! were computed with it:
//!
//! * Q8_0 / Q8_1: `amax` = max |x| of the block, `d = amax / 127`, multiplier
//!   `id = 127 / amax` (0 when `amax == 0`), `q = round_half_even(x * id)` (AVX
//!   `round_ps` nearest mode, not C `roundf`), stored scale `fp16(d)` rounded to nearest
//!   even. Q8_1 also stores `s = fp16(d * Σq)` with the f32 `d`. ggml converts these two
//!   scalars with its portable routine, which writes every NaN as the canonical quiet NaN
//!   `0x7e00` (with the sign); finite values round exactly like F16C.
//! * F16: round to nearest even. ggml converts groups of 8 and then of 4 with F16C (a NaN
//!   keeps the top bits of its payload) and the last `n % 4` elements with the portable
//!   routine (canonical NaN); we do the same.
//! * BF16: round to nearest even, a NaN keeps its top bits and is made quiet.
//! * F32: the bytes of the input.
//!
//! The scalar and the AVX2 quantizers produce identical bytes for every input, NaN and
//! infinity included: the scalar code follows the SIMD max-reduction tree and the x86
//! float-to-int conversion (out of range or NaN gives `i32::MIN`, then saturation).

use super::legacy::{Q8_0_BYTES, Q8_1_BYTES, QK, f32_to_f16};
use super::{Isa, Kernels};
use crate::GgmlType;

/// ggml's portable f32 to f16 conversion: round to nearest even like F16C, but every NaN
/// becomes the canonical quiet NaN (keeping the sign).
#[inline]
fn f32_to_f16_portable(x: f32) -> u16 {
    if x.is_nan() {
        ((x.to_bits() >> 16) as u16 & 0x8000) | 0x7e00
    } else {
        f32_to_f16(x)
    }
}

/// x86 `maxps` on one lane: the second operand unless the first is greater (so a NaN in
/// either operand yields the second).
#[inline]
fn maxps(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// max |x| over a 32-element block, reduced in the same lane order as the AVX code
/// (identical to a plain max unless the block holds a NaN).
#[inline]
fn block_amax(x: &[f32; QK]) -> f32 {
    let mut lane = [0f32; 8];
    for (l, m) in lane.iter_mut().enumerate() {
        *m = x[l].abs();
        for v in 1..4 {
            *m = maxps(*m, x[8 * v + l].abs());
        }
    }
    let mut m4 = [0f32; 4];
    for (l, m) in m4.iter_mut().enumerate() {
        *m = maxps(lane[4 + l], lane[l]);
    }
    let m2 = [maxps(m4[0], m4[2]), maxps(m4[1], m4[3])];
    maxps(m2[0], m2[1])
}

/// x86 `cvtps2dq`: NaN and values outside the i32 range give `i32::MIN`.
#[inline]
fn cvt_i32(v: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        v as i32
    } else {
        i32::MIN
    }
}

/// The block's f32 scale `d` and its quants as i32 (before saturation to i8).
#[inline]
fn q8_block(x: &[f32; QK]) -> (f32, [i32; QK]) {
    let amax = block_amax(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut q = [0i32; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = cvt_i32((v * id).round_ties_even());
    }
    (d, q)
}

#[inline]
fn sat_i8(v: i32) -> u8 {
    v.clamp(-128, 127) as i8 as u8
}

/// Asserts the [`super::QuantizeFn`] contract: whole blocks in, `row_bytes` out.
fn check_act(x: &[f32], out: &[u8], ty: GgmlType, block: usize, bytes: usize) {
    assert!(
        x.len().is_multiple_of(block) && out.len() == x.len() / block * bytes,
        "{ty} quantizer contract violated: {} inputs, {} output bytes",
        x.len(),
        out.len()
    );
}

fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    check_act(x, out, GgmlType::Q8_0, QK, Q8_0_BYTES);
    let (x, _) = x.as_chunks::<QK>();
    let (out, _) = out.as_chunks_mut::<Q8_0_BYTES>();
    for (x, o) in x.iter().zip(out) {
        let (d, q) = q8_block(x);
        o[..2].copy_from_slice(&f32_to_f16_portable(d).to_le_bytes());
        for (b, &v) in o[2..].iter_mut().zip(&q) {
            *b = sat_i8(v);
        }
    }
}

fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
    check_act(x, out, GgmlType::Q8_1, QK, Q8_1_BYTES);
    let (x, _) = x.as_chunks::<QK>();
    let (out, _) = out.as_chunks_mut::<Q8_1_BYTES>();
    for (x, o) in x.iter().zip(out) {
        let (d, q) = q8_block(x);
        let sum = q.iter().fold(0i32, |s, &v| s.wrapping_add(v));
        o[..2].copy_from_slice(&f32_to_f16_portable(d).to_le_bytes());
        o[2..4].copy_from_slice(&f32_to_f16_portable(d * sum as f32).to_le_bytes());
        for (b, &v) in o[4..].iter_mut().zip(&q) {
            *b = sat_i8(v);
        }
    }
}

/// f32 to bfloat16 bits: round to nearest even; NaN keeps its upper bits and is made quiet.
#[inline]
pub(super) fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

fn quantize_f16(x: &[f32], out: &mut [u8]) {
    check_act(x, out, GgmlType::F16, 1, 2);
    let (out, _) = out.as_chunks_mut::<2>();
    let bulk = x.len() - x.len() % 4;
    for (i, (&v, o)) in x.iter().zip(out).enumerate() {
        let h = if i < bulk {
            f32_to_f16(v)
        } else {
            f32_to_f16_portable(v)
        };
        *o = h.to_le_bytes();
    }
}

fn quantize_bf16(x: &[f32], out: &mut [u8]) {
    check_act(x, out, GgmlType::BF16, 1, 2);
    let (out, _) = out.as_chunks_mut::<2>();
    for (&v, o) in x.iter().zip(out) {
        *o = f32_to_bf16(v).to_le_bytes();
    }
}

fn quantize_f32(x: &[f32], out: &mut [u8]) {
    check_act(x, out, GgmlType::F32, 1, 4);
    let (out, _) = out.as_chunks_mut::<4>();
    for (&v, o) in x.iter().zip(out) {
        *o = v.to_le_bytes();
    }
}

pub(super) fn register(k: &mut Kernels) {
    k.set_quantize(GgmlType::Q8_0, quantize_q8_0);
    k.set_quantize(GgmlType::Q8_1, quantize_q8_1);
    k.set_quantize(GgmlType::F16, quantize_f16);
    k.set_quantize(GgmlType::BF16, quantize_bf16);
    k.set_quantize(GgmlType::F32, quantize_f32);
    if k.isa() == Isa::Avx2 {
        #[cfg(target_arch = "x86_64")]
        avx2::register(k);
    }
    if k.isa() == Isa::Neon {
        #[cfg(target_arch = "aarch64")]
        neon::register(k);
    }
}

/// ggml's ARM activation quantizers (`arch/arm/quants.c`). Q8_0 / Q8_1 differ from the x86
/// ones in the multiplier: `id = 1 / d` with `d = amax / 127` (x86: `127 / amax`), and the
/// quants are `vcvtnq` conversions (round half to even; NaN gives 0, out of range saturates)
/// whose low byte is stored. The f16 scale is the hardware conversion (round to nearest
/// even). Q8_K, F16 and BF16 are the portable ones, as on ARM.
/// ggml's ARM Q8_0 activation quantizer (also what its repacked ARM kernels quantize with).
#[cfg(target_arch = "aarch64")]
pub(super) use neon::quantize_q8_0 as quantize_q8_0_neon;

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    use super::super::legacy::{Q8_0_BYTES, Q8_1_BYTES, QK, f32_to_f16};
    use super::{Kernels, check_act};
    use crate::GgmlType;

    pub(super) fn register(k: &mut Kernels) {
        k.set_quantize(GgmlType::Q8_0, quantize_q8_0);
        k.set_quantize(GgmlType::Q8_1, quantize_q8_1);
    }

    /// One block: the f32 scale and the quants as eight vectors of i32.
    #[inline]
    #[target_feature(enable = "neon")]
    fn q8_block(x: &[f32; QK]) -> (f32, [int32x4_t; 8]) {
        let (v, _) = x.as_chunks::<4>();
        // SAFETY: each `v[j]` is 4 readable f32.
        let src: [float32x4_t; 8] = std::array::from_fn(|j| unsafe { vld1q_f32(v[j].as_ptr()) });
        let a: [float32x4_t; 8] = std::array::from_fn(|j| vabsq_f32(src[j]));
        // ggml's reduction tree: pairs, then pairs of pairs, then the two halves
        let m: [float32x4_t; 4] = std::array::from_fn(|j| vmaxq_f32(a[2 * j], a[2 * j + 1]));
        let m = [vmaxq_f32(m[0], m[1]), vmaxq_f32(m[2], m[3])];
        let amax = vmaxvq_f32(vmaxq_f32(m[0], m[1]));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        (
            d,
            std::array::from_fn(|j| vcvtnq_s32_f32(vmulq_n_f32(src[j], id))),
        )
    }

    /// The low bytes of the quants (ggml stores `int32 -> int8` conversions).
    #[inline]
    #[target_feature(enable = "neon")]
    fn store(q: &[int32x4_t; 8], out: &mut [u8]) {
        for (o, v) in out.chunks_exact_mut(4).zip(q) {
            let mut l = [0i32; 4];
            // SAFETY: `l` is 4 writable i32.
            unsafe { vst1q_s32(l.as_mut_ptr(), *v) };
            for (b, &x) in o.iter_mut().zip(&l) {
                *b = x as u8;
            }
        }
    }

    pub(in crate::kernels) fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
        // SAFETY: NEON is part of the aarch64 baseline every aarch64 target has.
        unsafe { quantize_q8_0_neon(x, out) }
    }

    fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
        // SAFETY: as for `quantize_q8_0`.
        unsafe { quantize_q8_1_neon(x, out) }
    }

    #[target_feature(enable = "neon")]
    fn quantize_q8_0_neon(x: &[f32], out: &mut [u8]) {
        check_act(x, out, GgmlType::Q8_0, QK, Q8_0_BYTES);
        let (x, _) = x.as_chunks::<QK>();
        let (out, _) = out.as_chunks_mut::<Q8_0_BYTES>();
        for (x, o) in x.iter().zip(out) {
            let (d, q) = q8_block(x);
            o[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
            store(&q, &mut o[2..]);
        }
    }

    #[target_feature(enable = "neon")]
    fn quantize_q8_1_neon(x: &[f32], out: &mut [u8]) {
        check_act(x, out, GgmlType::Q8_1, QK, Q8_1_BYTES);
        let (x, _) = x.as_chunks::<QK>();
        let (out, _) = out.as_chunks_mut::<Q8_1_BYTES>();
        for (x, o) in x.iter().zip(out) {
            let (d, q) = q8_block(x);
            let acc = q.iter().fold(vdupq_n_s32(0), |s, &v| vaddq_s32(s, v));
            o[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
            o[2..4].copy_from_slice(&f32_to_f16(d * vaddvq_s32(acc) as f32).to_le_bytes());
            store(&q, &mut o[4..]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::legacy::{Q8_0_BYTES, Q8_1_BYTES, QK};
    use super::{Kernels, check_act, f32_to_bf16, f32_to_f16_portable};
    use crate::GgmlType;

    pub(super) fn register(k: &mut Kernels) {
        k.set_quantize(GgmlType::Q8_0, quantize_q8_0);
        k.set_quantize(GgmlType::Q8_1, quantize_q8_1);
        k.set_quantize(GgmlType::F16, quantize_f16);
        k.set_quantize(GgmlType::BF16, quantize_bf16);
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load8(x: &[f32; 8]) -> __m256 {
        // SAFETY: `x` is 8 readable f32; `loadu` has no alignment requirement.
        unsafe { _mm256_loadu_ps(x.as_ptr()) }
    }

    /// One block: the f32 scale, the 32 quants as four vectors of i32 (not yet saturated).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q8_block(x: &[f32; QK]) -> (f32, [__m256i; 4]) {
        let (v, _) = x.as_chunks::<8>();
        let v = [load8(&v[0]), load8(&v[1]), load8(&v[2]), load8(&v[3])];
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for vi in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
        }
        let mut m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let amax = _mm_cvtss_f32(m4);
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let q = v.map(|vi| {
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm256_mul_ps(vi, id));
            _mm256_cvtps_epi32(r)
        });
        (d, q)
    }

    /// Saturate 32 i32 to i8 and store them in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn store_q(q: [__m256i; 4], out: &mut [u8; 32]) {
        let a = _mm256_packs_epi32(q[0], q[1]);
        let b = _mm256_packs_epi32(q[2], q[3]);
        let p = _mm256_packs_epi16(a, b);
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: `out` is 32 writable bytes; `storeu` has no alignment requirement.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), p) }
    }

    /// A block scale as f16: F16C rounding, canonical NaN (see the module docs).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn f16_scale(x: f32) -> u16 {
        if x.is_nan() {
            return f32_to_f16_portable(x);
        }
        _mm_extract_epi16::<0>(_mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm_set_ss(x))) as u16
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn q8_0_avx2(x: &[f32], out: &mut [u8]) {
        check_act(x, out, GgmlType::Q8_0, QK, Q8_0_BYTES);
        let (x, _) = x.as_chunks::<QK>();
        let (out, _) = out.as_chunks_mut::<Q8_0_BYTES>();
        for (x, o) in x.iter().zip(out) {
            let (d, q) = q8_block(x);
            o[..2].copy_from_slice(&f16_scale(d).to_le_bytes());
            store_q(q, &mut o[2..].as_chunks_mut::<32>().0[0]);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn q8_1_avx2(x: &[f32], out: &mut [u8]) {
        check_act(x, out, GgmlType::Q8_1, QK, Q8_1_BYTES);
        let (x, _) = x.as_chunks::<QK>();
        let (out, _) = out.as_chunks_mut::<Q8_1_BYTES>();
        for (x, o) in x.iter().zip(out) {
            let (d, q) = q8_block(x);
            let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
            let sum = _mm_cvtsi128_si32(s);
            o[..2].copy_from_slice(&f16_scale(d).to_le_bytes());
            o[2..4].copy_from_slice(&f16_scale(d * sum as f32).to_le_bytes());
            store_q(q, &mut o[4..].as_chunks_mut::<32>().0[0]);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn f16_avx2(x: &[f32], out: &mut [u8]) {
        check_act(x, out, GgmlType::F16, 1, 2);
        let (xv, xt) = x.as_chunks::<8>();
        let (ov, ot) = out.as_chunks_mut::<16>();
        for (x, o) in xv.iter().zip(ov.iter_mut()) {
            let h = _mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(load8(x));
            // SAFETY: `o` is 16 writable bytes; `storeu` has no alignment requirement.
            unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), h) }
        }
        let (x4, xt) = xt.as_chunks::<4>();
        let (o4, ot) = ot.as_chunks_mut::<8>();
        if let (Some(x), Some(o)) = (x4.first(), o4.first_mut()) {
            // SAFETY: `x` is 4 readable f32; `loadu` has no alignment requirement.
            let v = unsafe { _mm_loadu_ps(x.as_ptr()) };
            let h = _mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(v);
            // SAFETY: `o` is 8 writable bytes, exactly what `storel_epi64` writes.
            unsafe { _mm_storel_epi64(o.as_mut_ptr().cast(), h) }
        }
        for (&v, o) in xt.iter().zip(ot.chunks_exact_mut(2)) {
            o.copy_from_slice(&f32_to_f16_portable(v).to_le_bytes());
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn bf16_avx2(x: &[f32], out: &mut [u8]) {
        check_act(x, out, GgmlType::BF16, 1, 2);
        let (xv, xt) = x.as_chunks::<16>();
        let (ov, ot) = out.as_chunks_mut::<32>();
        let abs = _mm256_set1_epi32(0x7fff_ffff);
        let inf = _mm256_set1_epi32(0x7f80_0000);
        let bias = _mm256_set1_epi32(0x7fff);
        let one = _mm256_set1_epi32(1);
        let quiet = _mm256_set1_epi32(64);
        let round = |v: __m256i| {
            let nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, abs), inf);
            let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(v), one);
            let r = _mm256_srli_epi32::<16>(_mm256_add_epi32(v, _mm256_add_epi32(bias, lsb)));
            let n = _mm256_or_si256(_mm256_srli_epi32::<16>(v), quiet);
            _mm256_blendv_epi8(r, n, nan)
        };
        for (x, o) in xv.iter().zip(ov.iter_mut()) {
            let (h, _) = x.as_chunks::<8>();
            let a = round(_mm256_castps_si256(load8(&h[0])));
            let b = round(_mm256_castps_si256(load8(&h[1])));
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b));
            // SAFETY: `o` is 32 writable bytes; `storeu` has no alignment requirement.
            unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), p) }
        }
        for (&v, o) in xt.iter().zip(ot.chunks_exact_mut(2)) {
            o.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
        }
    }

    // The wrappers below are registered only in a table built for `Isa::Avx2`, which
    // `Kernels::detect` builds only after it detected AVX2, FMA and F16C at run time.

    fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
        // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the features.
        unsafe { q8_0_avx2(x, out) }
    }

    fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
        // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the features.
        unsafe { q8_1_avx2(x, out) }
    }

    fn quantize_f16(x: &[f32], out: &mut [u8]) {
        // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the features.
        unsafe { f16_avx2(x, out) }
    }

    fn quantize_bf16(x: &[f32], out: &mut [u8]) {
        // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the features.
        unsafe { bf16_avx2(x, out) }
    }
}
