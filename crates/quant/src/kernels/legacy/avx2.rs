//! AVX2 + FMA + F16C versions of the kernels in `legacy.rs`.
//!
//! Quantized types: per block, the 32 weight quants are expanded to signed (or, with a
//! separate min term, unsigned) bytes, multiplied with the activation bytes by `maddubs`
//! (sign trick: |x| times y carrying x's sign), pair-summed to eight i32 by `madd`,
//! converted to f32 and accumulated with one FMA against the broadcast block scale.
//! Float types: four 8-lane FMA accumulators over 32 elements per iteration.
//!
//! The accumulation structure is the one of ggml's x86 AVX2 kernels, so that with the same
//! inputs the results are the same floats: one accumulator for Q8_0 / Q4_0 / Q5_0 / Q4_1 /
//! Q5_1 (the Q4_1 / Q5_1 min terms summed apart with scalar FMA and added last), two
//! accumulators for even and odd blocks of IQ4_NL / MXFP4 with an odd last block added by
//! a scalar FMA, the same lane reductions, and f64 tails for F16 / BF16. (ggml's compiler
//! decides whether an F32 tail, `n % 32` elements, uses FMA; we multiply then add.)
//!
//! The integer block sums are exact for activations quantized from finite inputs (quants
//! in -127..=127): then no `maddubs` pair sum saturates and the sign trick is exact even
//! for a weight byte of -128. (A -128 activation, which only a NaN input produces, times a
//! -128 Q8_0 weight comes out negated, as in ggml.) So results differ from the scalar
//! kernels only in float rounding and summation order.

use std::arch::x86_64::*;

use super::{
    IQ4_NL_BYTES, MXFP4_BYTES, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES,
    Q8_1_BYTES, check_blocks, check_floats, f16_to_f32,
};
use crate::GgmlType;
use crate::kernels::Kernels;
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4};

mod rows;

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
    rows::register(k);
}

// ---------------------------------------------------------------------------------------
// Small helpers.

/// The `M`-byte array at the start of `s` (panics only on a caller bug: `s` too short).
#[inline(always)]
fn arr<const M: usize>(s: &[u8]) -> &[u8; M] {
    &s.as_chunks::<M>().0[0]
}

#[inline(always)]
fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..].as_chunks::<2>().0[0])
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load256(b: &[u8; 32]) -> __m256i {
    // SAFETY: `b` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load128(b: &[u8; 16]) -> __m128i {
    // SAFETY: `b` is 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// `f16(x) * f16(y)` in f32.
#[inline(always)]
fn scale_f16_f16(x: u16, y: u16) -> f32 {
    f16_to_f32(x) * f16_to_f32(y)
}

/// `2^(e-128)` for every E8M0 byte (the halved MXFP4 block scale, as in
/// [`crate::tables::e8m0_to_f32_half`]), so a block scale is one broadcast load.
static E8M0_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut e = 0;
    while e < 256 {
        let bits: u32 = if e < 2 {
            0x0020_0000 << e
        } else {
            (e as u32 - 1) << 23
        };
        t[e] = f32::from_bits(bits);
        e += 1;
    }
    t
};

/// Signed bytes times signed bytes, summed in groups of four into 8 x f32 (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256 {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

/// [`mul_sum_i8`] with AVX-512 VNNI, as ggml's `mul_sum_us8_pairs_float` under
/// `__AVX512VNNI__`: one `vpdpbusd` adds the four products of each 32-bit lane. The same
/// lanes: with the sign trick the unsigned operand is at most 128, so no `vpmaddubsw` pair
/// sum saturates (at most 2 · 128 · 127, at least 2 · 128 · -128) and both forms add the same
/// four exact products.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
fn mul_sum_i8_vnni(x: __m256i, y: __m256i) -> __m256 {
    let p = _mm256_dpbusd_epi32(
        _mm256_setzero_si256(),
        _mm256_sign_epi8(x, x),
        _mm256_sign_epi8(y, x),
    );
    _mm256_cvtepi32_ps(p)
}

/// [`mul_sum_i8_vnni`] in AVX-VNNI's VEX encoding, for CPUs without AVX-512 (ggml's
/// `__AVXVNNI__` form). The same lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
fn mul_sum_i8_avx_vnni(x: __m256i, y: __m256i) -> __m256 {
    let p = _mm256_dpbusd_avx_epi32(
        _mm256_setzero_si256(),
        _mm256_sign_epi8(x, x),
        _mm256_sign_epi8(y, x),
    );
    _mm256_cvtepi32_ps(p)
}

/// Unsigned bytes (< 128) times signed bytes, summed in groups of four into 8 x f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_u8(x: __m256i, y: __m256i) -> __m256 {
    let p = _mm256_maddubs_epi16(x, y);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

/// 16 bytes of packed nibbles to 32 bytes: low nibbles (elements 0..16) in the low lane,
/// high nibbles (elements 16..32) in the high lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(b: &[u8; 16]) -> __m256i {
    let v = load128(b);
    let both = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(v), _mm_srli_epi16::<4>(v));
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// 32 bits to 32 bytes: 0xff where bit j of `bits` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits_to_bytes(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask)
}

/// Sum of the 8 lanes: upper half plus lower half, then pairwise.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// `acc += scale · sums` over all blocks with one accumulator; returns the lane sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn blocks<const WB: usize, const AB: usize>(
    w: &[u8],
    a: &[u8],
    mut block: impl FnMut(&[u8; WB], &[u8; AB]) -> (f32, __m256),
) -> f32 {
    let (w, _) = w.as_chunks::<WB>();
    let (a, _) = a.as_chunks::<AB>();
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let (d, s) = block(x, y);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc);
    }
    hsum(acc)
}

/// Even blocks into one accumulator and odd blocks into another, lane sum of both; an odd
/// last block is then added as `fma(scale, Σ sums, total)` in scalar.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn blocks_paired<const WB: usize, const AB: usize>(
    w: &[u8],
    a: &[u8],
    block: impl Fn(&[u8; WB], &[u8; AB]) -> (f32, __m256),
) -> f32 {
    let (w, _) = w.as_chunks::<WB>();
    let (a, _) = a.as_chunks::<AB>();
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut wp = w.chunks_exact(2);
    let mut ap = a.chunks_exact(2);
    for (x, y) in (&mut wp).zip(&mut ap) {
        let (d0, s0) = block(&x[0], &y[0]);
        let (d1, s1) = block(&x[1], &y[1]);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), s0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), s1, acc1);
    }
    let mut sum = hsum(_mm256_add_ps(acc0, acc1));
    if let (Some(x), Some(y)) = (wp.remainder().first(), ap.remainder().first()) {
        let (d, s) = block(x, y);
        // The lanes hold exact integers and the block sum is below 2^24: the f32 sum is exact.
        sum = fma_ss(d, hsum(s), sum);
    }
    sum
}

/// `a * b + c` with one rounding (scalar FMA).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fma_ss(a: f32, b: f32, c: f32) -> f32 {
    _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)))
}

// ---------------------------------------------------------------------------------------
// Quantized kernels.

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q8_0_BYTES, a, Q8_0_BYTES);
    blocks::<Q8_0_BYTES, Q8_0_BYTES>(w, a, |x, y| {
        let d = scale_f16_f16(le16(x, 0), le16(y, 0));
        (d, mul_sum_i8(load256(arr(&x[2..])), load256(arr(&y[2..]))))
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q4_0_BYTES, a, Q8_0_BYTES);
    blocks::<Q4_0_BYTES, Q8_0_BYTES>(w, a, |x, y| {
        let d = scale_f16_f16(le16(x, 0), le16(y, 0));
        let qx = _mm256_sub_epi8(nibbles(arr(&x[2..])), _mm256_set1_epi8(8));
        (d, mul_sum_i8(qx, load256(arr(&y[2..]))))
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q5_0_BYTES, a, Q8_0_BYTES);
    blocks::<Q5_0_BYTES, Q8_0_BYTES>(w, a, |x, y| {
        let d = scale_f16_f16(le16(x, 0), le16(y, 0));
        let qh = u32::from_le_bytes(*arr(&x[2..]));
        // Without the fifth bit the value is nibble - 16: set the high nibble to 0xf.
        let hi = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(0xf0u8 as i8));
        let qx = _mm256_or_si256(nibbles(arr(&x[6..])), hi);
        (d, mul_sum_i8(qx, load256(arr(&y[2..]))))
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_1_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q4_1_BYTES, a, Q8_1_BYTES);
    // The min term m·s of each block is summed apart and added at the end.
    let mut mins = 0f32;
    let acc = blocks::<Q4_1_BYTES, Q8_1_BYTES>(w, a, |x, y| {
        mins = fma_ss(f16_to_f32(le16(x, 2)), f16_to_f32(le16(y, 2)), mins);
        let d = scale_f16_f16(le16(x, 0), le16(y, 0));
        (d, mul_sum_u8(nibbles(arr(&x[4..])), load256(arr(&y[4..]))))
    });
    acc + mins
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_1_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q5_1_BYTES, a, Q8_1_BYTES);
    let mut mins = 0f32;
    let acc = blocks::<Q5_1_BYTES, Q8_1_BYTES>(w, a, |x, y| {
        mins = fma_ss(f16_to_f32(le16(x, 2)), f16_to_f32(le16(y, 2)), mins);
        let d = scale_f16_f16(le16(x, 0), le16(y, 0));
        let qh = u32::from_le_bytes(*arr(&x[4..]));
        let hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
        let qx = _mm256_or_si256(nibbles(arr(&x[8..])), hi);
        (d, mul_sum_u8(qx, load256(arr(&y[4..]))))
    });
    acc + mins
}

/// The 16-entry table in both 128-bit lanes, for `shuffle_epi8` lookups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lut(t: &[i8; 16]) -> __m256i {
    let b: [u8; 16] = t.map(|v| v as u8);
    _mm256_broadcastsi128_si256(load128(&b))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, IQ4_NL_BYTES, a, Q8_0_BYTES);
    let table = lut(&KVALUES_IQ4NL);
    blocks_paired::<IQ4_NL_BYTES, Q8_0_BYTES>(w, a, |x, y| {
        let d = scale_f16_f16(le16(y, 0), le16(x, 0));
        let qx = _mm256_shuffle_epi8(table, nibbles(arr(&x[2..])));
        (d, mul_sum_i8(qx, load256(arr(&y[2..]))))
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn mxfp4_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, MXFP4_BYTES, a, Q8_0_BYTES);
    let table = lut(&KVALUES_MXFP4);
    blocks_paired::<MXFP4_BYTES, Q8_0_BYTES>(w, a, |x, y| {
        let d = f16_to_f32(le16(y, 0)) * E8M0_HALF[usize::from(x[0])];
        let qx = _mm256_shuffle_epi8(table, nibbles(arr(&x[1..])));
        (d, mul_sum_i8(qx, load256(arr(&y[2..]))))
    })
}

// ---------------------------------------------------------------------------------------
// Float kernels.

/// (s0 + s2) + (s1 + s3).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn add4(s: [__m256; 4]) -> __m256 {
    _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]))
}

/// Lane sum as ggml's F32 / F16 dot reduces: halves, then two horizontal adds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_hadd(v: __m256) -> f32 {
    let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let t = _mm_hadd_ps(t, t);
    _mm_cvtss_f32(_mm_hadd_ps(t, t))
}

/// Four FMA accumulators over 32 elements per step; `load(chunk, i)` converts the i-th
/// group of 8 elements of a step to f32. Returns the accumulators and the number of
/// elements consumed (a multiple of 32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fma4<const STEP: usize>(
    w: &[u8],
    a: &[u8],
    load: impl Fn(&[u8; STEP], usize) -> __m256,
) -> ([__m256; 4], usize) {
    let (wv, _) = w.as_chunks::<STEP>();
    let (av, _) = a.as_chunks::<STEP>();
    let mut s = [_mm256_setzero_ps(); 4];
    for (x, y) in wv.iter().zip(av) {
        for (j, acc) in s.iter_mut().enumerate() {
            *acc = _mm256_fmadd_ps(load(x, j), load(y, j), *acc);
        }
    }
    (s, wv.len() * 32)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f32_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_floats(n, w, a, 4);
    let (acc, done) = fma4::<128>(w, a, |b, j| {
        // SAFETY: bytes 32j..32j+32 of the 128-byte step are in bounds (j < 4).
        unsafe { _mm256_loadu_ps(b.as_ptr().add(32 * j).cast()) }
    });
    let mut sum = hsum_hadd(add4(acc));
    let (wt, _) = w[4 * done..].as_chunks::<4>();
    let (at, _) = a[4 * done..].as_chunks::<4>();
    // ggml's compiled tail rounds each product of the 4-aligned part before adding it, and
    // fuses the multiply-add for the last `n % 4` elements; doing the same keeps the result
    // bit-identical to llama.cpp's x86 backend.
    let fused_from = n - n % 4;
    for (i, (x, y)) in wt.iter().zip(at).enumerate() {
        let (x, y) = (f32::from_le_bytes(*x), f32::from_le_bytes(*y));
        if done + i >= fused_from {
            sum = x.mul_add(y, sum);
        } else {
            sum += x * y;
        }
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f16_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_floats(n, w, a, 2);
    let (acc, done) = fma4::<64>(w, a, |b, j| {
        // SAFETY: bytes 16j..16j+16 of the 64-byte step are in bounds (j < 4).
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(b.as_ptr().add(16 * j).cast()) })
    });
    f16_finish(acc, &w[2 * done..], &a[2 * done..])
}

/// Lane sum of the four F16 accumulators, then the `n % 32` tail elements in f64.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_finish(acc: [__m256; 4], w_tail: &[u8], a_tail: &[u8]) -> f32 {
    let mut sum = f64::from(hsum_hadd(add4(acc)));
    let (wt, _) = w_tail.as_chunks::<2>();
    let (at, _) = a_tail.as_chunks::<2>();
    for (x, y) in wt.iter().zip(at) {
        sum += f64::from(f16_to_f32(u16::from_le_bytes(*x)) * f16_to_f32(u16::from_le_bytes(*y)));
    }
    sum as f32
}

#[target_feature(enable = "avx2,fma,f16c")]
fn bf16_avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_floats(n, w, a, 2);
    let (acc, done) = fma4::<64>(w, a, |b, j| {
        // SAFETY: bytes 16j..16j+16 of the 64-byte step are in bounds (j < 4).
        let h = unsafe { _mm_loadu_si128(b.as_ptr().add(16 * j).cast()) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    });
    let mut sum = f64::from(hsum(add4(acc)));
    let (wt, _) = w[2 * done..].as_chunks::<2>();
    let (at, _) = a[2 * done..].as_chunks::<2>();
    for (x, y) in wt.iter().zip(at) {
        let x = f32::from_bits(u32::from(u16::from_le_bytes(*x)) << 16);
        let y = f32::from_bits(u32::from(u16::from_le_bytes(*y)) << 16);
        sum += f64::from(x * y);
    }
    sum as f32
}

// ---------------------------------------------------------------------------------------
// DotFn wrappers. They are registered only in a table built for `Isa::Avx2`, which
// `Kernels::detect` builds only after it detected AVX2, FMA and F16C at run time.

macro_rules! wrap {
    ($($name:ident => $imp:ident),* $(,)?) => {$(
        fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only reachable through an AVX2 table (see above), so the CPU has
            // the features `$imp` is compiled for.
            unsafe { $imp(n, w, a) }
        }
    )*};
}

wrap! {
    dot_f32 => f32_avx2,
    dot_f16 => f16_avx2,
    dot_bf16 => bf16_avx2,
    dot_q8_0 => q8_0_avx2,
    dot_q4_0 => q4_0_avx2,
    dot_q4_1 => q4_1_avx2,
    dot_q5_0 => q5_0_avx2,
    dot_q5_1 => q5_1_avx2,
    dot_iq4_nl => iq4_nl_avx2,
    dot_mxfp4 => mxfp4_avx2,
}

#[cfg(test)]
mod tests {
    use super::E8M0_HALF;
    use crate::tables::e8m0_to_f32_half;

    #[test]
    fn e8m0_table_matches_the_conversion() {
        for e in 0..=255u8 {
            assert_eq!(
                E8M0_HALF[usize::from(e)].to_bits(),
                e8m0_to_f32_half(e).to_bits()
            );
        }
    }
}
