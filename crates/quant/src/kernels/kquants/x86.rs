//! AVX2/FMA kernels: k-quant / IQ4_XS weights × Q8_K activations.
//!
//! Same integer arithmetic as the scalar kernels: unsigned weight quants times signed
//! activation quants with `vpmaddubsw` (no saturation is possible: at most
//! `2 · 63 · 128 < 2^15`), sub-block scales applied with `vpmaddwd`, minimums and offsets
//! from the activation group sums. Every super-block ends in eight i32 lanes that are
//! converted to f32 and accumulated with one FMA by `d_weight · d_activation`; the lanes
//! are summed at the end of the row. The lane layout and the order of the float
//! operations (including which products are fused) follow ggml's AVX2 kernels, so a row
//! gives the same f32 as ggml's x86 build of `vec_dot_*_q8_K`.

use std::arch::x86_64::*;

use super::layout::{
    iq1m, iq1s, iq2s, iq2xs, iq2xxs, iq3s, iq3xxs, iq4xs, q2k, q3k, q4k, q5k, q6k, tq10, tq20,
};
use super::{Q8K_BSUMS, Q8K_BYTES, Q8K_QS, check_dot, f32_at, iq1m_d_bits, u32_at};
use crate::GgmlType;
use crate::iq_tables::{
    IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
};
use crate::kernels::Kernels;
use crate::tables::KVALUES_IQ4NL;

pub(super) type Q8KBlock = [u8; Q8K_BYTES];

pub(super) fn register(k: &mut Kernels) {
    k.set_dot(GgmlType::Q2_K, dot_q2_k);
    k.set_dot(GgmlType::Q3_K, dot_q3_k);
    k.set_dot(GgmlType::Q4_K, dot_q4_k);
    k.set_dot(GgmlType::Q5_K, dot_q5_k);
    k.set_dot(GgmlType::Q6_K, dot_q6_k);
    k.set_dot(GgmlType::IQ4_XS, dot_iq4_xs);
    k.set_dot(GgmlType::TQ2_0, dot_tq2_0);
    k.set_dot(GgmlType::TQ1_0, dot_tq1_0);
    k.set_dot(GgmlType::IQ2_XXS, dot_iq2_xxs);
    k.set_dot(GgmlType::IQ2_XS, dot_iq2_xs);
    k.set_dot(GgmlType::IQ2_S, dot_iq2_s);
    k.set_dot(GgmlType::IQ3_XXS, dot_iq3_xxs);
    k.set_dot(GgmlType::IQ3_S, dot_iq3_s);
    k.set_dot(GgmlType::IQ1_S, dot_iq1_s);
    k.set_dot(GgmlType::IQ1_M, dot_iq1_m);
    if k.wide() {
        k.set_dot(GgmlType::IQ2_XXS, dot_iq2_xxs_wide);
        k.set_dot(GgmlType::IQ2_XS, dot_iq2_xs_wide);
        k.set_dot(GgmlType::IQ2_S, dot_iq2_s_wide);
        k.set_dot(GgmlType::IQ3_XXS, dot_iq3_xxs_wide);
        k.set_dot(GgmlType::IQ3_S, dot_iq3_s_wide);
    }
    if k.vnni() {
        k.set_dot(GgmlType::Q5_K, dot_q5_k_vnni);
        k.set_dot(GgmlType::Q6_K, dot_q6_k_vnni);
        k.set_dot(GgmlType::TQ2_0, dot_tq2_0_vnni);
        k.set_dot(GgmlType::TQ1_0, dot_tq1_0_vnni);
    }
    if k.pdep() {
        k.set_dot(GgmlType::IQ1_S, dot_iq1_s_bmi2);
        k.set_dot(GgmlType::IQ1_M, dot_iq1_m_bmi2);
        if k.wide() {
            k.set_dot(GgmlType::IQ1_S, dot_iq1_s_wide);
            k.set_dot(GgmlType::IQ1_M, dot_iq1_m_wide);
        }
        if k.vnni() {
            k.set_dot(GgmlType::IQ1_S, dot_iq1_s_vnni);
            k.set_dot(GgmlType::IQ1_M, dot_iq1_m_vnni);
        }
    }
}

/// Plain-`fn` entry points with the `DotFn` signature, for kernels that need the CPU features
/// listed (AVX2, FMA and F16C when none are). Each is registered only in a table that
/// [`Kernels::detect`] builds after detecting those features at run time: the AVX2 table
/// (AVX2, FMA, F16C), and within it the BMI2 kernels only with [`Kernels::pdep`], the wide
/// builds ([`narrow_and_wide`]) only with [`Kernels::wide`] (AVX-512F, VL and BW) and the VNNI
/// kernels only with [`Kernels::vnni`].
macro_rules! entry {
    ($name:ident, $ty:expr, $bytes:expr, $kernel:ident) => {
        entry!(@features $name, $ty, $bytes, $kernel, "avx2", "fma", "f16c");
    };
    ($name:ident, $ty:expr, $bytes:expr, $kernel:ident, bmi2) => {
        entry!(@features $name, $ty, $bytes, $kernel, "avx2", "fma", "f16c", "bmi2");
    };
    ($name:ident, $ty:expr, $bytes:expr, $kernel:ident, wide) => {
        entry!(
            @features $name, $ty, $bytes, $kernel,
            "avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512bw"
        );
    };
    ($name:ident, $ty:expr, $bytes:expr, $kernel:ident, bmi2 wide) => {
        entry!(
            @features $name, $ty, $bytes, $kernel,
            "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vl", "avx512bw"
        );
    };
    ($name:ident, $ty:expr, $bytes:expr, $kernel:ident, vnni) => {
        entry!(
            @features $name, $ty, $bytes, $kernel,
            "avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512bw", "avx512vnni"
        );
    };
    ($name:ident, $ty:expr, $bytes:expr, $kernel:ident, bmi2 vnni) => {
        entry!(
            @features $name, $ty, $bytes, $kernel,
            "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vl", "avx512bw", "avx512vnni"
        );
    };
    (@features $name:ident, $ty:expr, $bytes:expr, $kernel:ident, $($feature:tt),+) => {
        fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            check_dot($ty, n, w, a);
            debug_assert!($(is_x86_feature_detected!($feature))&&+);
            let (w, _) = w.as_chunks::<{ $bytes }>();
            let (a, _) = a.as_chunks::<Q8K_BYTES>();
            // SAFETY: this function is only reachable through a kernel table built after run-time
            // detection of the features `$kernel` enables (see the macro's documentation).
            unsafe { $kernel(w, a) }
        }
    };
}

entry!(dot_q2_k, GgmlType::Q2_K, q2k::BYTES, q2k_avx2);
entry!(dot_q3_k, GgmlType::Q3_K, q3k::BYTES, q3k_avx2);
entry!(dot_q4_k, GgmlType::Q4_K, q4k::BYTES, q4k_avx2);
entry!(dot_q5_k, GgmlType::Q5_K, q5k::BYTES, q5k_avx2);
entry!(dot_q6_k, GgmlType::Q6_K, q6k::BYTES, q6k_avx2);
entry!(dot_iq4_xs, GgmlType::IQ4_XS, iq4xs::BYTES, iq4xs_avx2);
entry!(dot_tq2_0, GgmlType::TQ2_0, tq20::BYTES, tq20_avx2);
entry!(dot_tq1_0, GgmlType::TQ1_0, tq10::BYTES, tq10_avx2);
entry!(dot_iq2_xxs, GgmlType::IQ2_XXS, iq2xxs::BYTES, iq2xxs_avx2);
entry!(dot_iq2_xs, GgmlType::IQ2_XS, iq2xs::BYTES, iq2xs_avx2);
entry!(dot_iq2_s, GgmlType::IQ2_S, iq2s::BYTES, iq2s_avx2);
entry!(dot_iq3_xxs, GgmlType::IQ3_XXS, iq3xxs::BYTES, iq3xxs_avx2);
entry!(dot_iq3_s, GgmlType::IQ3_S, iq3s::BYTES, iq3s_avx2);
entry!(dot_iq1_s, GgmlType::IQ1_S, iq1s::BYTES, iq1s_avx2);
entry!(dot_iq1_m, GgmlType::IQ1_M, iq1m::BYTES, iq1m_avx2);

entry!(
    dot_iq1_s_bmi2,
    GgmlType::IQ1_S,
    iq1s::BYTES,
    iq1s_avx2_bmi2,
    bmi2
);
entry!(
    dot_iq1_m_bmi2,
    GgmlType::IQ1_M,
    iq1m::BYTES,
    iq1m_avx2_bmi2,
    bmi2
);

entry!(
    dot_iq2_xxs_wide,
    GgmlType::IQ2_XXS,
    iq2xxs::BYTES,
    iq2xxs_avx2_wide,
    wide
);
entry!(
    dot_iq2_xs_wide,
    GgmlType::IQ2_XS,
    iq2xs::BYTES,
    iq2xs_avx2_wide,
    wide
);
entry!(
    dot_iq2_s_wide,
    GgmlType::IQ2_S,
    iq2s::BYTES,
    iq2s_avx2_wide,
    wide
);
entry!(
    dot_iq3_xxs_wide,
    GgmlType::IQ3_XXS,
    iq3xxs::BYTES,
    iq3xxs_avx2_wide,
    wide
);
entry!(
    dot_iq3_s_wide,
    GgmlType::IQ3_S,
    iq3s::BYTES,
    iq3s_avx2_wide,
    wide
);
entry!(dot_iq1_s_wide, GgmlType::IQ1_S, iq1s::BYTES, iq1s_avx2_wide, bmi2 wide);
entry!(dot_iq1_m_wide, GgmlType::IQ1_M, iq1m::BYTES, iq1m_avx2_wide, bmi2 wide);
entry!(dot_q5_k_vnni, GgmlType::Q5_K, q5k::BYTES, q5k_vnni, vnni);
entry!(dot_q6_k_vnni, GgmlType::Q6_K, q6k::BYTES, q6k_vnni, vnni);
entry!(
    dot_tq2_0_vnni,
    GgmlType::TQ2_0,
    tq20::BYTES,
    tq20_vnni,
    vnni
);
entry!(
    dot_tq1_0_vnni,
    GgmlType::TQ1_0,
    tq10::BYTES,
    tq10_vnni,
    vnni
);
entry!(dot_iq1_s_vnni, GgmlType::IQ1_S, iq1s::BYTES, iq1s_vnni, bmi2 vnni);
entry!(dot_iq1_m_vnni, GgmlType::IQ1_M, iq1m::BYTES, iq1m_vnni, bmi2 vnni);

/// A kernel compiled twice from one body: `$name` for AVX2, FMA and F16C, and `$wide` also
/// for AVX-512F, VL and BW, whose 32 vector registers (AVX2 has 16) spare the kernels that
/// hold many vectors live their spills. The same 256-bit operations, the same bits; the wide
/// build is registered only in a table with [`Kernels::wide`].
macro_rules! narrow_and_wide {
    ($(#[$doc:meta])* fn $name:ident / $wide:ident ($($arg:tt)*) -> $ret:ty $body:block) => {
        $(#[$doc])*
        #[target_feature(enable = "avx2,fma,f16c")]
        fn $name($($arg)*) -> $ret $body

        #[doc = concat!("[`", stringify!($name), "`] built also for AVX-512F, VL and BW.")]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
        fn $wide($($arg)*) -> $ret $body
    };
}

/// 32 bytes of `b` from `off`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load256(b: &[u8], off: usize) -> __m256i {
    let s = &b[off..off + 32];
    // SAFETY: `s` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// 16 bytes of `b` from `off`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load128(b: &[u8], off: usize) -> __m128i {
    let s = &b[off..off + 16];
    // SAFETY: `s` is 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// The f16 pair `(d, dmin)` at `b[off..off + 4]` converted exactly and multiplied by `y`:
/// `(d · y, dmin · y)`, each in all eight lanes.
///
/// Broadcasting the pair before converting keeps every lane in use; converting only the
/// needed halves makes the compiler insert them into a stale vector register, which can be
/// the loop's accumulator and then chains the iterations together.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16_pair_times(b: &[u8], off: usize, y: f32) -> (__m256, __m256) {
    let pair = _mm_set1_epi32(u32_at(b, off) as i32);
    let v = _mm256_mul_ps(_mm256_cvtph_ps(pair), _mm256_set1_ps(y));
    (_mm256_moveldup_ps(v), _mm256_movehdup_ps(v))
}

/// `f16(b[off..off + 2]) · y` in all eight lanes (the f16 conversion is exact).
///
/// Converting a broadcast half keeps every lane in use (see [`f16_pair_times`]).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16_times(b: &[u8], off: usize, y: f32) -> __m256 {
    f16_bits_times(u16::from_le_bytes([b[off], b[off + 1]]), y)
}

/// The f16 of bits `h`, times `y`, in all eight lanes (as [`f16_times`]).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16_bits_times(h: u16, y: f32) -> __m256 {
    _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16(h as i16)), _mm256_set1_ps(y))
}

/// The 12 scale bytes of a Q4_K / Q5_K block at `b[off..off + 12]` unpacked into 16 bytes:
/// the eight 6-bit scales, then the eight 6-bit minimums (the same bytes as
/// [`super::unpack_scales_mins_k4`]). Reads 16 bytes from `off`.
#[inline]
#[target_feature(enable = "avx2")]
fn k4_scales_mins(b: &[u8], off: usize) -> __m128i {
    let v = load128(b, off);
    // Words (4 bytes each) of `a`: s[0..4], s[8..12], s[4..8], s[8..12].
    let a = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
    );
    // Words of `h`: 0, s[0..4], 0, s[4..8] (their top two bits are the high bits of
    // scales 4..8 and minimums 4..8).
    let h = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7),
    );
    let low = _mm_and_si128(
        _mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
        _mm_setr_epi32(0x3f3f_3f3f, 0x0f0f_0f0f, 0x3f3f_3f3f, 0x0f0f_0f0f),
    );
    let high = _mm_and_si128(_mm_srli_epi32::<2>(h), _mm_set1_epi8(0x30));
    _mm_or_si128(low, high)
}

/// The 12 scale bytes of a Q3_K block at `b[off..off + 12]` unpacked into the 16 sub-block
/// scales as stored (`0..=63`; the same bytes as [`super::unpack_scales_q3k`]). Reads
/// 16 bytes from `off - 2`.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::kernels) fn q3k_scales(b: &[u8], off: usize) -> __m128i {
    let v = load128(b, off - 2);
    // Words of `a`: s[0..4], s[4..8], s[0..4], s[4..8] (low nibbles, then high nibbles).
    let a = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9),
    );
    // s[8..12] in every word: bit pairs 0-1, 2-3, 4-5, 6-7 are the high bits of scales
    // 0..4, 4..8, 8..12, 12..16.
    let h = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(
            10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13,
        ),
    );
    let low = _mm_and_si128(
        _mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 4, 4)),
        _mm_set1_epi8(0x0f),
    );
    let high = _mm_and_si128(
        _mm_srlv_epi32(
            _mm_sllv_epi32(h, _mm_setr_epi32(4, 2, 0, 0)),
            _mm_setr_epi32(0, 0, 0, 2),
        ),
        _mm_set1_epi8(0x30),
    );
    _mm_or_si128(low, high)
}

/// Sum of the eight lanes: high half + low half, then pairs, then the last two.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_ps(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// `vpshufb` controls: `WORD_CTL[i]` broadcasts 16-bit element `i` (0..8) of each 128-bit
/// lane.
///
/// The kernels take them through `black_box` once per block. With visible constants the
/// compiler rewrites each `vpshufb` as a shift plus a broadcast (two shuffles instead of
/// one); with the table hoisted out of the loop it keeps all eight controls in registers and
/// spills them to the stack on every call, which costs short rows.
pub(in crate::kernels) static WORD_CTL: [[u8; 32]; 8] = word_controls();

const fn word_controls() -> [[u8; 32]; 8] {
    let mut t = [[0u8; 32]; 8];
    let mut i = 0;
    while i < 8 {
        let mut b = 0;
        while b < 32 {
            t[i][b] = (2 * i + b % 2) as u8;
            b += 1;
        }
        i += 1;
    }
    t
}

/// Broadcast 32-bit element `i` (0..4) within each 128-bit lane.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::kernels) fn splat32(v: __m256i, i: usize) -> __m256i {
    match i {
        0 => _mm256_shuffle_epi32::<0x00>(v),
        1 => _mm256_shuffle_epi32::<0x55>(v),
        2 => _mm256_shuffle_epi32::<0xAA>(v),
        _ => _mm256_shuffle_epi32::<0xFF>(v),
    }
}

/// Eight signed byte scales `s[8h..8h + 8]` of `s` (16 bytes) as 16-bit values arranged for
/// [`splat32`]: the low lane holds `s[8h], s[8h], s[8h+2], s[8h+2], …` (even ones, each twice),
/// the high lane the odd ones. `splat32(result, k)` then multiplies a 32-element chunk whose
/// first 16 elements use scale `8h + 2k` and last 16 use `8h + 2k + 1`.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::kernels) fn group16_scales(s: __m128i, h: usize) -> __m256i {
    let ctl = if h == 0 {
        _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 1, 1, 3, 3, 5, 5, 7, 7)
    } else {
        _mm_setr_epi8(8, 8, 10, 10, 12, 12, 14, 14, 9, 9, 11, 11, 13, 13, 15, 15)
    };
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s, ctl))
}

/// The four 2-bit fields of every byte of `bits` (bits 0-1, 2-3, 4-5, 6-7), each as bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::kernels) fn crumbs(bits: __m256i) -> [__m256i; 4] {
    let m3 = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(bits, m3),
        _mm256_and_si256(_mm256_srli_epi16::<2>(bits), m3),
        _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m3),
        _mm256_and_si256(_mm256_srli_epi16::<6>(bits), m3),
    ]
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q2k_avx2(w: &[[u8; q2k::BYTES]], a: &[Q8KBlock]) -> f32 {
    let m4 = _mm_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        const _: () = assert!(q2k::DMIN == q2k::D + 2);
        let (d, dmin) = f16_pair_times(x, q2k::D, f32_at(y, 0));

        let mins_and_scales = load128(x, q2k::SCALES);
        let scales8 = _mm_and_si128(mins_and_scales, m4);
        let mins8 = _mm_and_si128(_mm_srli_epi16::<4>(mins_and_scales), m4);
        let mins = _mm256_cvtepi8_epi16(mins8);
        let prod = _mm256_madd_epi16(mins, load256(y, Q8K_BSUMS));
        acc = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(prod), acc);

        let scales = [group16_scales(scales8, 0), group16_scales(scales8, 1)];

        let mut sumi = _mm256_setzero_si256();
        for (j, sc) in scales.iter().enumerate() {
            let bits = load256(x, q2k::QS + 32 * j);
            let q8 = |k: usize| load256(y, Q8K_QS + 128 * j + 32 * k);
            let q2 = crumbs(bits);
            let p = |k: usize| {
                let p16 = _mm256_maddubs_epi16(q2[k], q8(k));
                _mm256_madd_epi16(splat32(*sc, k), p16)
            };
            let p01 = _mm256_add_epi32(p(0), p(1));
            let p23 = _mm256_add_epi32(p(2), p(3));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p01, p23));
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q3k_avx2(w: &[[u8; q3k::BYTES]], a: &[Q8KBlock]) -> f32 {
    let four = _mm256_set1_epi8(4);
    let zero = _mm256_setzero_si256();
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = f16_times(x, q3k::D, f32_at(y, 0));

        let scales128 = _mm_sub_epi8(q3k_scales(x, q3k::SCALES), _mm_set1_epi8(32));
        let scales = [group16_scales(scales128, 0), group16_scales(scales128, 1)];

        let hbits = load256(x, q3k::HMASK);
        // Bit (e / 32) of hmask[e % 32] is the high bit of element e; this byte mask walks
        // 1, 2, 4, ..., 128 over the eight 32-element groups.
        let mut hm = _mm256_set1_epi8(1);

        let mut sumi = _mm256_setzero_si256();
        for (j, sc) in scales.iter().enumerate() {
            let bits = load256(x, q3k::QS + 32 * j);
            let q3l = crumbs(bits);
            let mut p = [_mm256_setzero_si256(); 4];
            for (k, pk) in p.iter_mut().enumerate() {
                // 4 where the high bit is clear, else 0: the amount to subtract.
                let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, hm), zero);
                let q3h = _mm256_and_si256(clear, four);
                hm = _mm256_add_epi8(hm, hm);
                let q8 = load256(y, Q8K_QS + 128 * j + 32 * k);
                let p16 = _mm256_sub_epi16(
                    _mm256_maddubs_epi16(q3l[k], q8),
                    _mm256_maddubs_epi16(q3h, q8),
                );
                *pk = _mm256_madd_epi16(splat32(*sc, k), p16);
            }
            let p01 = _mm256_add_epi32(p[0], p[1]);
            let p23 = _mm256_add_epi32(p[2], p[3]);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p01, p23));
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_avx2(w: &[[u8; q4k::BYTES]], a: &[Q8KBlock]) -> f32 {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        const _: () = assert!(q4k::DMIN == q4k::D + 2);
        let (d, dmin) = f16_pair_times(x, q4k::D, f32_at(y, 0));

        let mins_and_scales = _mm256_cvtepu8_epi16(k4_scales_mins(x, q4k::SCALES));

        // Minimum terms: each 32-element sub-block has two adjacent group sums.
        let q8sums = load256(y, Q8K_BSUMS);
        let q8s = _mm_hadd_epi16(
            _mm256_castsi256_si128(q8sums),
            _mm256_extracti128_si256::<1>(q8sums),
        );
        let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(mins_and_scales), q8s);
        acc_m = _mm_fnmadd_ps(_mm256_castps256_ps128(dmin), _mm_cvtepi32_ps(prod), acc_m);

        let scales = _mm256_permute4x64_epi64::<0x44>(mins_and_scales);

        let ctl = std::hint::black_box(&WORD_CTL);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let scale_l = _mm256_shuffle_epi8(scales, load256(&ctl[2 * j], 0));
            let scale_h = _mm256_shuffle_epi8(scales, load256(&ctl[2 * j + 1], 0));
            let bits = load256(x, q4k::QS + 32 * j);
            let q4l = _mm256_and_si256(bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            let q8l = load256(y, Q8K_QS + 64 * j);
            let q8h = load256(y, Q8K_QS + 64 * j + 32);
            let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
            let ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    let m = _mm_add_ss(m, _mm_movehdup_ps(m));
    hsum_ps(acc) + _mm_cvtss_f32(m)
}

/// Defines `$name` for the target features `$features`, with `$add_madd` ([`add_madd`], or
/// its VNNI form [`add_madd_vnni`]: the same 32-bit lanes) applying a sub-block's scales.
macro_rules! q5k_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $add_madd:ident) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        fn $name(w: &[[u8; q5k::BYTES]], a: &[Q8KBlock]) -> f32 {
            let m4 = _mm256_set1_epi8(0xF);
            let sixteen = _mm256_set1_epi8(16);
            let zero = _mm256_setzero_si256();
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0.0f32;
            for (x, y) in w.iter().zip(a) {
                const _: () = assert!(q5k::DMIN == q5k::D + 2);
                let (d, dmin) = f16_pair_times(x, q5k::D, f32_at(y, 0));

                let mins_and_scales = _mm256_cvtepu8_epi16(k4_scales_mins(x, q5k::SCALES));

                let q8sums = load256(y, Q8K_BSUMS);
                let q8s = _mm_hadd_epi16(
                    _mm256_castsi256_si128(q8sums),
                    _mm256_extracti128_si256::<1>(q8sums),
                );
                let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(mins_and_scales), q8s);
                let prod = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
                let prod = _mm_add_epi32(prod, _mm_shuffle_epi32::<0b01>(prod));
                // summs − dmin · Σ (fused), as ggml's build computes summs + (−dmin) · Σ.
                summs = (-_mm256_cvtss_f32(dmin)).mul_add(_mm_cvtsi128_si32(prod) as f32, summs);

                let scales = _mm256_permute4x64_epi64::<0x44>(mins_and_scales);
                let hbits = load256(x, q5k::QH);
                // Bit (e / 32) of qh[e % 32] is the fifth bit of element e.
                let mut hm = _mm256_set1_epi8(1);

                let ctl = std::hint::black_box(&WORD_CTL);
                let mut sumi = _mm256_setzero_si256();
                for j in 0..4 {
                    let scale_0 = _mm256_shuffle_epi8(scales, load256(&ctl[2 * j], 0));
                    let scale_1 = _mm256_shuffle_epi8(scales, load256(&ctl[2 * j + 1], 0));
                    let bits = load256(x, q5k::QS + 32 * j);

                    let h0 = _mm256_andnot_si256(
                        _mm256_cmpeq_epi8(_mm256_and_si256(hbits, hm), zero),
                        sixteen,
                    );
                    hm = _mm256_add_epi8(hm, hm);
                    let h1 = _mm256_andnot_si256(
                        _mm256_cmpeq_epi8(_mm256_and_si256(hbits, hm), zero),
                        sixteen,
                    );
                    hm = _mm256_add_epi8(hm, hm);
                    let q5_0 = _mm256_or_si256(_mm256_and_si256(bits, m4), h0);
                    let q5_1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4), h1);

                    let q8_0 = load256(y, Q8K_QS + 64 * j);
                    let q8_1 = load256(y, Q8K_QS + 64 * j + 32);
                    let p0 = _mm256_madd_epi16(scale_0, _mm256_maddubs_epi16(q5_0, q8_0));
                    let p = $add_madd(p0, scale_1, _mm256_maddubs_epi16(q5_1, q8_1));
                    sumi = _mm256_add_epi32(sumi, p);
                }
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum_ps(acc) + summs
        }
    };
}

q5k_kernel!(q5k_avx2, "avx2,fma,f16c", add_madd);
q5k_kernel!(
    /// [`q5k_avx2`] with AVX-512 VNNI: `vpdpwssd` scales and adds a sub-block's products in
    /// one instruction. Same bits.
    q5k_vnni,
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    add_madd_vnni
);

/// Defines `$name` for the target features `$features`, with `$add_madd` ([`add_madd`], or
/// its VNNI form [`add_madd_vnni`]: the same 32-bit lanes) applying a sub-block's scales.
macro_rules! q6k_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $add_madd:ident) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        fn $name(w: &[[u8; q6k::BYTES]], a: &[Q8KBlock]) -> f32 {
            let m3 = _mm256_set1_epi8(3);
            let m15 = _mm256_set1_epi8(15);
            let mut acc = _mm256_setzero_ps();
            for (x, y) in w.iter().zip(a) {
                let d = f16_times(x, q6k::D, f32_at(y, 0));

                // The -32 offset of every quant, applied once per 16-element group through the
                // activation group sums: 32 · Σ scale · bsum.
                let q8sums = load256(y, Q8K_BSUMS);
                let scales = load128(x, q6k::SCALES);
                let scales16 = _mm256_cvtepi8_epi16(scales);
                let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales16));
                let group_scales = [group16_scales(scales, 0), group16_scales(scales, 1)];

                let mut sumi = _mm256_setzero_si256();
                for (j, gs) in group_scales.iter().enumerate() {
                    let bits1 = load256(x, q6k::QL + 64 * j);
                    let bits2 = load256(x, q6k::QL + 64 * j + 32);
                    let bits_h = load256(x, q6k::QH + 32 * j);

                    let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(bits_h, m3));
                    let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(bits_h, _mm256_set1_epi8(12)));
                    let h2 = _mm256_and_si256(bits_h, _mm256_set1_epi8(48));
                    let h3 = _mm256_srli_epi16::<2>(_mm256_and_si256(bits_h, _mm256_set1_epi8(-64)));

                    let q = [
                        _mm256_or_si256(_mm256_and_si256(bits1, m15), h0),
                        _mm256_or_si256(_mm256_and_si256(bits2, m15), h1),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits1), m15), h2),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits2), m15), h3),
                    ];
                    let p16: [__m256i; 4] = std::array::from_fn(|k| {
                        _mm256_maddubs_epi16(q[k], load256(y, Q8K_QS + 128 * j + 32 * k))
                    });
                    let p0 = _mm256_madd_epi16(splat32(*gs, 0), p16[0]);
                    let p2 = _mm256_madd_epi16(splat32(*gs, 2), p16[2]);
                    sumi = _mm256_add_epi32(sumi, $add_madd(p0, splat32(*gs, 1), p16[1]));
                    sumi = _mm256_add_epi32(sumi, $add_madd(p2, splat32(*gs, 3), p16[3]));
                }
                let sumi = _mm256_sub_epi32(sumi, offset);
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum_ps(acc)
        }
    };
}

q6k_kernel!(q6k_avx2, "avx2,fma,f16c", add_madd);
q6k_kernel!(
    /// [`q6k_avx2`] with AVX-512 VNNI: `vpdpwssd` scales and adds a sub-block's products in
    /// one instruction. Same bits.
    q6k_vnni,
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    add_madd_vnni
);

/// The eight signed sub-block scales of an IQ4_XS block (6 bits minus 32) as 16-bit values,
/// repeated in both 128-bit lanes.
///
/// Sub-block `s` has its low four bits in nibble `s` of `scales_l` and its high two bits in
/// bits `2s..2s + 2` of `scales_h`; a 16-bit multiply by a power of two moves each lane's
/// field to the top, and a shift brings it down.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::kernels) fn iq4xs_scales(b: &[u8]) -> __m256i {
    let l = _mm_cvtsi32_si128(u32_at(b, iq4xs::SCALES_L) as i32);
    let l = _mm_unpacklo_epi16(l, l);
    // Low 16 bits of scales_l in lanes 0..4, high 16 bits in lanes 4..8.
    let l = _mm_unpacklo_epi32(l, l);
    let low = _mm_srli_epi16::<12>(_mm_mullo_epi16(
        l,
        _mm_setr_epi16(1 << 12, 1 << 8, 1 << 4, 1, 1 << 12, 1 << 8, 1 << 4, 1),
    ));
    let h = _mm_set1_epi16(i16::from_le_bytes([
        b[iq4xs::SCALES_H],
        b[iq4xs::SCALES_H + 1],
    ]));
    let high = _mm_and_si128(
        _mm_srli_epi16::<10>(_mm_mullo_epi16(
            h,
            _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1),
        )),
        _mm_set1_epi16(0x30),
    );
    let ls = _mm_sub_epi16(_mm_or_si128(low, high), _mm_set1_epi16(32));
    _mm256_broadcastsi128_si256(ls)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4xs_avx2(w: &[[u8; iq4xs::BYTES]], a: &[Q8KBlock]) -> f32 {
    let values = _mm256_broadcastsi128_si256(load128(&KVALUES_IQ4NL.map(|v| v as u8), 0));
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let scales = iq4xs_scales(x);
        let ctl = std::hint::black_box(&WORD_CTL);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in 0..4 {
            // Two 32-element sub-blocks: 16 packed bytes each, low nibbles first; the low
            // lane takes the low nibbles, the high lane the high ones.
            let nib = |off: usize| {
                let bits = load128(x, off);
                let idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(bits), bits), m4);
                _mm256_shuffle_epi8(values, idx)
            };
            let q4_1 = nib(iq4xs::QS + 32 * ib);
            let q4_2 = nib(iq4xs::QS + 32 * ib + 16);
            let q8_1 = load256(y, Q8K_QS + 64 * ib);
            let q8_2 = load256(y, Q8K_QS + 64 * ib + 32);
            // Signed × signed through vpmaddubsw: |w| times the activation carrying w's sign.
            let p16_1 =
                _mm256_maddubs_epi16(_mm256_sign_epi8(q4_1, q4_1), _mm256_sign_epi8(q8_1, q4_1));
            let p16_2 =
                _mm256_maddubs_epi16(_mm256_sign_epi8(q4_2, q4_2), _mm256_sign_epi8(q8_2, q4_2));
            let ls1 = _mm256_shuffle_epi8(scales, load256(&ctl[2 * ib], 0));
            let ls2 = _mm256_shuffle_epi8(scales, load256(&ctl[2 * ib + 1], 0));
            sumi1 = _mm256_add_epi32(_mm256_madd_epi16(p16_1, ls1), sumi1);
            sumi2 = _mm256_add_epi32(_mm256_madd_epi16(p16_2, ls2), sumi2);
        }
        let d = f16_times(x, iq4xs::D, f32_at(y, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2)), acc);
    }
    hsum_ps(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has_avx2() -> bool {
        is_x86_feature_detected!("avx2")
    }

    fn to_bytes(v: __m128i) -> [u8; 16] {
        let mut out = [0u8; 16];
        // SAFETY: `out` is 16 writable bytes; `storeu` has no alignment requirement.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), v) };
        out
    }

    #[test]
    fn simd_scale_unpacking_matches_the_scalar_one() {
        if !has_avx2() {
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut b = [0u8; 20];
            for v in &mut b {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *v = state as u8;
            }
            // SAFETY: AVX2 was detected above.
            let (k4, q3) = unsafe { (k4_scales_mins(&b, 2), q3k_scales(&b, 4)) };
            assert_eq!(to_bytes(k4), super::super::unpack_scales_mins_k4(&b[2..14]));
            assert_eq!(to_bytes(q3), super::super::unpack_scales_q3k(&b[4..16]));
        }
    }

    /// [`tq10_digits`] gives [`super::super::tq1_digit`]'s digits, in the activations'
    /// order, for every byte value in every position.
    #[test]
    fn tq1_digits_are_the_formula_for_every_byte() {
        if !has_avx2() {
            return;
        }
        let digit = super::super::tq1_digit;
        for start in 0..=255u8 {
            let mut x = [0u8; tq10::BYTES];
            for (i, b) in x[tq10::QS..tq10::QH + 4].iter_mut().enumerate() {
                *b = start.wrapping_add(i as u8);
            }
            let (qs, qh) = (&x[tq10::QS..tq10::QS + 48], &x[tq10::QH..tq10::QH + 4]);
            let mut want = [0u8; 256];
            for (e, w) in want.iter_mut().enumerate() {
                let (k, i) = (e / 32, e % 32);
                *w = match k {
                    0..5 => digit(qs[i], k as u32),
                    // bytes 32..48, two digits a vector; then digit 4 and the 4 bytes' digits
                    5 | 6 => digit(qs[32 + i % 16], (2 * (k - 5) + i / 16) as u32),
                    _ if i < 16 => digit(qs[32 + i], 4),
                    _ => digit(qh[(i - 16) % 4], ((i - 16) / 4) as u32),
                };
            }
            let mut got = [0u8; 256];
            // SAFETY: AVX2 was detected above.
            let v = unsafe { tq10_digits(&x) };
            for (k, v) in v.into_iter().enumerate() {
                // SAFETY: AVX2 was detected above; `got[32k..]` is 32 writable bytes.
                unsafe { _mm256_storeu_si256(got[32 * k..].as_mut_ptr().cast(), v) };
            }
            assert_eq!(got, want, "bytes from {start}");
        }
    }

    #[test]
    fn iq4xs_scale_unpacking_matches_the_format() {
        if !has_avx2() {
            return;
        }
        let mut block = [0u8; iq4xs::BYTES];
        let mut state = 0x9e37_79b9u32;
        for _ in 0..2000 {
            for v in &mut block[..8] {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                *v = (state >> 24) as u8;
            }
            let h = u16::from_le_bytes([block[2], block[3]]);
            let mut want = [0u8; 32];
            for s in 0..8 {
                let low = (block[4 + s / 2] >> (4 * (s % 2))) & 0xF;
                let high = ((h >> (2 * s)) & 3) as u8;
                let v = (i16::from(low | (high << 4)) - 32).to_le_bytes();
                want[2 * s..2 * s + 2].copy_from_slice(&v);
                want[16 + 2 * s..16 + 2 * s + 2].copy_from_slice(&v);
            }
            let mut got = [0u8; 32];
            // SAFETY: AVX2 was detected above; `got` is 32 writable bytes.
            unsafe { _mm256_storeu_si256(got.as_mut_ptr().cast(), iq4xs_scales(&block)) };
            assert_eq!(got, want);
        }
    }

    #[test]
    fn f16_conversion_is_exact_for_every_half() {
        if !(has_avx2() && is_x86_feature_detected!("f16c")) {
            return;
        }
        for bits in 0..=u16::MAX {
            let want = half::f16::from_bits(bits).to_f32();
            // SAFETY: AVX2 and F16C were detected above.
            let got = unsafe { _mm256_cvtss_f32(f16_times(&bits.to_le_bytes(), 0, 1.0)) };
            assert_eq!(got.to_bits(), want.to_bits(), "{bits:#06x}");
        }
    }
}

/// TQ2_0 as ggml's AVX2 kernel: the products summed in 16-bit lanes (at most
/// `4 · 2 · 3 · 127` a lane), the -1 offset taken off with the activation group sums (lane
/// `m` of the group sums against lane `m` of the products: only the lane pairs' totals are
/// kept), pairs of lanes widened to eight i32 lanes, each times `d` into its accumulator.
#[target_feature(enable = "avx2,fma,f16c")]
fn tq20_avx2(w: &[[u8; tq20::BYTES]], a: &[Q8KBlock]) -> f32 {
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let mut sumi0 = _mm256_setzero_si256();
        let mut sumi1 = _mm256_setzero_si256();
        for j in 0..2 {
            let q = crumbs(load256(x, tq20::QS + 32 * j));
            let p = |k: usize| _mm256_maddubs_epi16(q[k], load256(y, Q8K_QS + 128 * j + 32 * k));
            sumi0 = _mm256_add_epi16(sumi0, _mm256_add_epi16(p(0), p(1)));
            sumi1 = _mm256_add_epi16(sumi1, _mm256_add_epi16(p(2), p(3)));
        }
        let d = f16_times(x, tq20::D, f32_at(y, 0));
        let s = _mm256_sub_epi16(_mm256_add_epi16(sumi0, sumi1), load256(y, Q8K_BSUMS));
        let s = _mm256_madd_epi16(s, ones);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
    }
    hsum_ps(acc)
}

/// [`tq20_avx2`] with AVX-512 VNNI: each of the eight crumb vectors times its activations by
/// one `vpdpbusd`, which adds the four products of elements `4m..4m + 4` into 32-bit lane
/// `m`: the lanes `vpmaddubsw` and `vpmaddwd` pair into, the same integers (no 16-bit lane of
/// ggml's overflows: eight pair sums of at most `2 · 3 · 128` each, less the group sums). The
/// group sums are paired into the same lanes and taken off at the end.
///
/// Four accumulators of two products each: in two chains of four `vpdpbusd` a block, the
/// kernel kept up hot but ran 50 % slower cold on a Zen 4 (docs/performance.md, "VNNI for the
/// ternary types and IQ1").
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
fn tq20_vnni(w: &[[u8; tq20::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let [q0, q1, q2, q3] = crumbs(load256(x, tq20::QS));
        let [q4, q5, q6, q7] = crumbs(load256(x, tq20::QS + 32));
        let s = ternary_lanes_vnni([q0, q1, q2, q3, q4, q5, q6, q7], y);
        let d = f16_times(x, tq20::D, f32_at(y, 0));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
    }
    hsum_ps(acc)
}

/// A ternary block's eight 32-bit lanes by `vpdpbusd`: `q[k]` (the stored digits, 0..=2, of
/// elements `32k..32k + 32`) times the activations, in four accumulators of two products each,
/// less the activation group sums paired into the same lanes (the digits' offset of -1).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
fn ternary_lanes_vnni(q: [__m256i; 8], y: &Q8KBlock) -> __m256i {
    let p = |k: usize| {
        let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[k], load256(y, Q8K_QS + 32 * k));
        _mm256_dpbusd_epi32(s, q[k + 4], load256(y, Q8K_QS + 32 * (k + 4)))
    };
    let s = _mm256_add_epi32(_mm256_add_epi32(p(0), p(1)), _mm256_add_epi32(p(2), p(3)));
    let b = _mm256_madd_epi16(load256(y, Q8K_BSUMS), _mm256_set1_epi16(1));
    _mm256_sub_epi32(s, b)
}

narrow_and_wide! {
    /// IQ2_XXS as ggml's AVX2 kernel: per pair of 32-element groups, the four grid entries of
    /// each group gathered into a vector, the activations' signs flipped by the group's
    /// patterns (`vpsignb`), the products paired by `vpmaddubsw` and scaled by `2s + 1` with
    /// `vpmaddwd`; the block's eight i32 lanes times `d` into the accumulators, and 1/8 of the
    /// lanes' total (even and odd groups in two sums of lanes, as ggml, the same integers). The
    /// sign patterns of four groups at a time come from [`even_patterns4`].
    fn iq2xxs_avx2 / iq2xxs_avx2_wide(w: &[[u8; iq2xxs::BYTES]], a: &[Q8KBlock]) -> f32 {
        let grid = |i: u8| IQ2XXS_GRID[usize::from(i)] as i64;
        let mut acc = _mm256_setzero_ps();
        // the next block's sign patterns are put together while this one is multiplied
        let mut next = w
            .first()
            .map_or([_mm_setzero_si128(); 2], |x| iq2xxs_patterns(x));
        for (i, (x, y)) in w.iter().zip(a).enumerate() {
            let patterns = next;
            if let Some(n) = w.get(i + 1) {
                next = iq2xxs_patterns(n);
            }
            let d = f16_times(x, iq2xxs::D, f32_at(y, 0));
            let mut sumi1 = _mm256_setzero_si256();
            let mut sumi2 = _mm256_setzero_si256();
            // four groups at a time
            for (q, &patterns) in patterns.iter().enumerate() {
                for (k, sg) in spread_signs4(patterns).into_iter().enumerate() {
                    let g = 4 * q + k;
                    let b = |l: usize| x[iq2xxs::QS + 8 * g + l];
                    let q2 = _mm256_set_epi64x(grid(b(3)), grid(b(2)), grid(b(1)), grid(b(0)));
                    let q8 = _mm256_sign_epi8(load256(y, Q8K_QS + 32 * g), sg);
                    let dot = _mm256_maddubs_epi16(q2, q8);
                    let p = _mm256_madd_epi16(dot, odd_scale(usize::from(b(7) >> 4)));
                    if g % 2 == 0 {
                        sumi1 = _mm256_add_epi32(sumi1, p);
                    } else {
                        sumi2 = _mm256_add_epi32(sumi2, p);
                    }
                }
            }
            let lanes = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
            acc = _mm256_fmadd_ps(d, lanes, acc);
        }
        0.125 * hsum_ps(acc)
    }
}

/// An IQ2_XXS block's sign patterns ([`even_patterns4`]), four groups to a vector: their
/// sign words are every other 32-bit word of `qs` (index, signs, index, signs, ...).
#[inline]
#[target_feature(enable = "avx2")]
fn iq2xxs_patterns(x: &[u8; iq2xxs::BYTES]) -> [__m128i; 2] {
    [0, 1].map(|q| {
        let o = iq2xxs::QS + 32 * q;
        let (lo, hi) = (load128(x, o), load128(x, o + 16));
        even_patterns4(_mm_castps_si128(_mm_shuffle_ps::<0b11_01_11_01>(
            _mm_castsi128_ps(lo),
            _mm_castsi128_ps(hi),
        )))
    })
}

/// The 16 sign patterns of four groups of 32 from their four sign words (`words`, one per
/// 32-bit lane): four 7-bit indices of [`crate::iq_tables::KSIGNS_IQ2XS`] at bits 0, 7, 14
/// and 21, each the sign pattern of 8 elements less its eighth bit, which makes the parity
/// even. Pattern `l` of group `k` goes to byte `4k + l`; [`spread_signs4`] makes the sign
/// bytes of them.
///
/// The four groups' 16 patterns are put together in one vector (as bytes, the parity bit
/// from a table of 16) and spread with shuffles, instead of 16 table loads. The kernels put
/// a block's patterns together while they multiply the block before it: the chain is long,
/// and every group's product waits for it.
#[inline]
#[target_feature(enable = "avx2")]
fn even_patterns4(words: __m128i) -> __m128i {
    let field = |shift: __m128i, mask: i32| {
        _mm_and_si128(_mm_sll_epi32(words, shift), _mm_set1_epi32(mask))
    };
    // pattern `l` of group `k` to byte `4k + l`
    let t = _mm_or_si128(
        _mm_or_si128(
            field(_mm_cvtsi32_si128(0), 0x7f),
            field(_mm_cvtsi32_si128(1), 0x7f00),
        ),
        _mm_or_si128(
            field(_mm_cvtsi32_si128(2), 0x7f_0000),
            field(_mm_cvtsi32_si128(3), 0x7f00_0000),
        ),
    );
    // the parity of bits 0..7 is that of (bits 0..4) XOR (bits 4..8)
    let parity = _mm_setr_epi8(
        0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,
    );
    let nibbles = _mm_and_si128(
        _mm_xor_si128(t, _mm_srli_epi16::<4>(t)),
        _mm_set1_epi8(0x0f),
    );
    _mm_or_si128(t, _mm_shuffle_epi8(parity, nibbles))
}

/// The sign bytes (1 or -1) of four groups from their [`even_patterns4`]: entry `k` holds
/// group `k`'s 32.
#[inline]
#[target_feature(enable = "avx2")]
fn spread_signs4(patterns: __m128i) -> [__m256i; 4] {
    let full = _mm256_broadcastsi128_si256(patterns);
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let ones = _mm256_set1_epi8(1);
    // group `k`: patterns `4k`, `4k + 1` (low lane) and `4k + 2`, `4k + 3` (high lane), each
    // eight times
    let spread = |k: i8| {
        let (a, b, c, e) = (4 * k, 4 * k + 1, 4 * k + 2, 4 * k + 3);
        _mm256_setr_epi8(
            a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b, c, c, c, c, c, c, c, c, e, e, e, e, e,
            e, e, e,
        )
    };
    [0, 1, 2, 3].map(|k| {
        let s = _mm256_shuffle_epi8(full, spread(k));
        _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(s, bits), bits), ones)
    })
}

narrow_and_wide! {
    /// IQ2_XS with the integer lanes of ggml's AVX2 kernel (each group's grid entries gathered,
    /// `vpsignb`, `vpmaddubsw`, `vpmaddwd` by the two 16-element scales) and its float order: the
    /// block's eight i32 lanes times `d` into the accumulators, and 1/8 of the lanes' total.
    ///
    /// Four groups' 16 words at a time: their grid indices masked in one vector and taken out
    /// 64 bits (four indices) at a time, their sign patterns completed in one vector (the eighth
    /// bit is the parity of the seven stored) and spread to sign bytes with shuffles. Index and
    /// sign work done word by word in general registers took twice the instructions.
    fn iq2xs_avx2 / iq2xs_avx2_wide(w: &[[u8; iq2xs::BYTES]], a: &[Q8KBlock]) -> f32 {
        // parity of a 4-bit value, as 0x80 (twice, one per 128-bit lane)
        let parity = _mm256_setr_epi8(
            0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0, 0, -128, -128, 0,
            -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,
        );
        // byte `j` of a sign pattern selects bit `j % 8`
        let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        // a 128-bit half of the patterns (the low bytes of eight words: two groups), copied to
        // both lanes: `spread[0]` repeats each of the first group's four patterns 8 times (two in
        // each lane), `spread[1]` the second group's
        let spread = [
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6,
                6, 6, 6,
            ),
            _mm256_setr_epi8(
                8, 8, 8, 8, 8, 8, 8, 8, 10, 10, 10, 10, 10, 10, 10, 10, 12, 12, 12, 12, 12, 12, 12, 12,
                14, 14, 14, 14, 14, 14, 14, 14,
            ),
        ];
        let ones = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_ps();
        for (x, y) in w.iter().zip(a) {
            let d = f16_times(x, iq2xs::D, f32_at(y, 0));
            let mut sumi = _mm256_setzero_si256();
            // four groups (16 words) at a time
            for q in 0..2 {
                let words = load256(x, iq2xs::QS + 32 * q);
                let idx = words64(_mm256_and_si256(words, _mm256_set1_epi16(511)));
                // the 7 stored sign bits, and the eighth (even parity) from the XOR of bits
                // 0..3 with bits 4..6
                let part = _mm256_srli_epi16::<9>(words);
                let odd = _mm256_shuffle_epi8(
                    parity,
                    _mm256_xor_si256(part, _mm256_srli_epi16::<13>(words)),
                );
                let full = _mm256_or_si256(part, odd);
                let halves = [
                    _mm256_permute2x128_si256::<0x00>(full, full),
                    _mm256_permute2x128_si256::<0x11>(full, full),
                ];
                for k in 0..4 {
                    let g = 4 * q + k;
                    let grid = |l: usize| IQ2XS_GRID[((idx[k] >> (16 * l)) & 511) as usize] as i64;
                    let q2 = _mm256_set_epi64x(grid(3), grid(2), grid(1), grid(0));
                    let s = _mm256_shuffle_epi8(halves[k / 2], spread[k % 2]);
                    let s = _mm256_cmpeq_epi8(_mm256_and_si256(s, bits), bits);
                    let q8 = _mm256_sign_epi8(load256(y, Q8K_QS + 32 * g), _mm256_or_si256(s, ones));
                    let dot = _mm256_maddubs_epi16(q2, q8);
                    sumi = _mm256_add_epi32(sumi, scaled_halves(dot, x[iq2xs::SCALES + g]));
                }
            }
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        0.125 * hsum_ps(acc)
    }
}

/// The four 64-bit words of `v`, low first.
#[inline]
#[target_feature(enable = "avx2")]
fn words64(v: __m256i) -> [u64; 4] {
    let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    [
        _mm_cvtsi128_si64(lo) as u64,
        _mm_extract_epi64::<1>(lo) as u64,
        _mm_cvtsi128_si64(hi) as u64,
        _mm_extract_epi64::<1>(hi) as u64,
    ]
}

/// `f` for the eight 32-element groups of a super-block, written out: the compiler kept the
/// loop, and the IQ2_S and IQ3_S kernels run faster without it.
#[inline(always)]
fn for_each_group(mut f: impl FnMut(usize)) {
    f(0);
    f(1);
    f(2);
    f(3);
    f(4);
    f(5);
    f(6);
    f(7);
}

/// `vpmaddwd` of a group's 16 pair products by its two scales `2s + 1` (the low nibble of
/// `sc` for the first 16 elements, the high one for the last 16).
#[inline]
#[target_feature(enable = "avx2")]
fn scaled_halves(dot: __m256i, sc: u8) -> __m256i {
    _mm256_madd_epi16(dot, odd_scales(usize::from(sc & 15), usize::from(sc >> 4)))
}

/// `2k + 1` in eight 16-bit lanes, for `k` = 0..16: the scales of the i-quants below IQ4.
static ODD_SCALES: [[i16; 8]; 16] = {
    let mut t = [[0i16; 8]; 16];
    let mut k = 0;
    while k < 16 {
        t[k] = [2 * k as i16 + 1; 8];
        k += 1;
    }
    t
};

/// Eight lanes of `2k + 1` (`k` below 16).
#[inline]
#[target_feature(enable = "avx2")]
fn odd_scale128(k: usize) -> __m128i {
    // SAFETY: an entry of `ODD_SCALES` is 16 readable bytes; `loadu` has no alignment
    // requirement.
    unsafe { _mm_loadu_si128(ODD_SCALES[k & 15].as_ptr().cast()) }
}

/// `2k + 1` in all sixteen 16-bit lanes, for a `vpmaddwd` by a group's scale. Loaded from a
/// table: a broadcast from a general register would take two shuffle-port operations per
/// group, and the i-quant kernels are short of those.
#[inline]
#[target_feature(enable = "avx2")]
fn odd_scale(k: usize) -> __m256i {
    _mm256_broadcastsi128_si256(odd_scale128(k))
}

/// `2 lo + 1` in the low eight 16-bit lanes and `2 hi + 1` in the high eight: the scales of a
/// group's two halves (loaded, as [`odd_scale`]).
#[inline]
#[target_feature(enable = "avx2")]
fn odd_scales(lo: usize, hi: usize) -> __m256i {
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(odd_scale128(lo)), odd_scale128(hi))
}

/// The sign bytes (0 or -1) of 32 elements from four pattern bytes at `b[off..off + 4]`: bit
/// `j` of byte `l` is element `8l + j`'s.
#[inline]
#[target_feature(enable = "avx2")]
fn sign_masks(b: &[u8], off: usize) -> __m256i {
    let bytes = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let v = _mm256_shuffle_epi8(_mm256_set1_epi32(u32_at(b, off) as i32), bytes);
    _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits)
}

narrow_and_wide! {
    /// IQ2_S as ggml's AVX2 kernel: as [`iq2xs_avx2`], with the signs flipped by xor and
    /// subtract from the sign bytes (the same as `vpsignb`: -128 stays -128). The block's 32 grid
    /// indices are put together in vector registers, four groups at a time, and taken out four at
    /// a time (a quarter fewer instructions than index by index in general registers).
    fn iq2s_avx2 / iq2s_avx2_wide(w: &[[u8; iq2s::BYTES]], a: &[Q8KBlock]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        // the indices of the next block are put together while this one is multiplied: every grid
        // load of a block waits for them, and their chain is long (shuffle, multiply, extract)
        let mut next = w.first().map_or([0; 8], |x| iq2s_indices(x));
        for (i, (x, y)) in w.iter().zip(a).enumerate() {
            let idx = next;
            if let Some(n) = w.get(i + 1) {
                next = iq2s_indices(n);
            }
            let d = f16_times(x, iq2s::D, f32_at(y, 0));
            let mut sumi = _mm256_setzero_si256();
            for_each_group(|g: usize| {
                // SAFETY: the indices have 10 bits ([`iq2s_indices`]), the grid 1024 entries.
                let grid = |l: usize| unsafe {
                    grid_entry(&IQ2S_GRID, usize::from((idx[g] >> (16 * l)) as u16)) as i64
                };
                let q2 = _mm256_set_epi64x(grid(3), grid(2), grid(1), grid(0));
                let s = sign_masks(x, iq2s::SIGNS + 4 * g);
                let q8 = load256(y, Q8K_QS + 32 * g);
                let q8 = _mm256_sub_epi8(_mm256_xor_si256(s, q8), s);
                let dot = _mm256_maddubs_epi16(q2, q8);
                sumi = _mm256_add_epi32(sumi, scaled_halves(dot, x[iq2s::SCALES + g]));
            });
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        0.125 * hsum_ps(acc)
    }
}

/// An IQ2_S block's 32 grid indices, four to a word (group `g`'s in word `g`, index `l` in
/// bits `16l..16l + 10`), put together in vector registers four groups at a time: bytes of
/// `qs`, two bits of the group's `qh` byte above each (index `l` takes bits `2l, 2l + 1`,
/// moved up by `8 - 2l`).
#[inline]
#[target_feature(enable = "avx2")]
fn iq2s_indices(x: &[u8; iq2s::BYTES]) -> [u64; 8] {
    let ctl = _mm256_setr_epi8(
        0, -1, 0, -1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1, 2, -1, 2, -1, 2, -1, 2, -1, 3, -1,
        3, -1, 3, -1, 3, -1,
    );
    let mul = _mm256_set1_epi64x(0x0004_0010_0040_0100);
    let qh = _mm256_broadcastsi128_si256(_mm_cvtsi64_si128(i64::from_le_bytes(
        x[iq2s::QH..].as_chunks::<8>().0[0],
    )));
    let mut idx = [0u64; 8];
    for h in 0..2 {
        let c = _mm256_add_epi8(ctl, _mm256_set1_epi8(4 * h as i8));
        let c = _mm256_or_si256(c, _mm256_cmpgt_epi8(_mm256_setzero_si256(), ctl));
        let top = _mm256_mullo_epi16(_mm256_shuffle_epi8(qh, c), mul);
        let top = _mm256_and_si256(top, _mm256_set1_epi16(0x300));
        let v = _mm256_or_si256(top, _mm256_cvtepu8_epi16(load128(x, iq2s::QS + 16 * h)));
        idx[4 * h..4 * h + 4].copy_from_slice(&words64(v));
    }
    idx
}

narrow_and_wide! {
    /// IQ3_XXS as ggml's AVX2 kernel: eight grid entries of four magnitudes per group, the sign
    /// patterns with `vpsignb`, `vpmaddubsw`, `vpmaddwd` by the group's `2s + 1`; the block's
    /// lanes times `d` into the accumulators, and 1/4 of the lanes' total. The sign bytes of four
    /// groups at a time come from [`even_patterns4`].
    fn iq3xxs_avx2 / iq3xxs_avx2_wide(w: &[[u8; iq3xxs::BYTES]], a: &[Q8KBlock]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        // the next block's sign patterns are put together while this one is multiplied
        let patterns = |x: &[u8]| [0, 1].map(|q| even_patterns4(load128(x, iq3xxs::SIGNS + 16 * q)));
        let mut next = w.first().map_or([_mm_setzero_si128(); 2], |x| patterns(x));
        for (i, (x, y)) in w.iter().zip(a).enumerate() {
            let cur = next;
            if let Some(n) = w.get(i + 1) {
                next = patterns(n);
            }
            let d = f16_times(x, iq3xxs::D, f32_at(y, 0));
            let mut sumi = _mm256_setzero_si256();
            // four groups at a time
            for (q, &patterns) in cur.iter().enumerate() {
                for (k, sg) in spread_signs4(patterns).into_iter().enumerate() {
                    let g = 4 * q + k;
                    let grid = |k: usize| IQ3XXS_GRID[usize::from(x[iq3xxs::QS + 8 * g + k])] as i32;
                    let q3 = _mm256_set_epi32(
                        grid(7),
                        grid(6),
                        grid(5),
                        grid(4),
                        grid(3),
                        grid(2),
                        grid(1),
                        grid(0),
                    );
                    let q8 = _mm256_sign_epi8(load256(y, Q8K_QS + 32 * g), sg);
                    let dot = _mm256_maddubs_epi16(q3, q8);
                    let ls = odd_scale(usize::from(x[iq3xxs::SIGNS + 4 * g + 3] >> 4));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(dot, ls));
                }
            }
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        0.25 * hsum_ps(acc)
    }
}

narrow_and_wide! {
    /// IQ3_S as ggml's AVX2 kernel: 9-bit grid indices, the sign bytes by xor and subtract, a
    /// scale `2s + 1` per group; the block's lanes times `d` into the accumulators. The next
    /// block's indices are put together ([`iq3s_indices`]) while this one is multiplied.
    fn iq3s_avx2 / iq3s_avx2_wide(w: &[[u8; iq3s::BYTES]], a: &[Q8KBlock]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut next = w.first().map_or([0; 16], |x| iq3s_indices(x));
        for (i, (x, y)) in w.iter().zip(a).enumerate() {
            let idx = next;
            if let Some(n) = w.get(i + 1) {
                next = iq3s_indices(n);
            }
            let d = f16_times(x, iq3s::D, f32_at(y, 0));
            let mut sumi = _mm256_setzero_si256();
            for_each_group(|g: usize| {
                // SAFETY: the indices have 9 bits ([`iq3s_indices`]), the grid 512 entries.
                let grid = |k: usize| unsafe {
                    grid_entry(
                        &IQ3S_GRID,
                        usize::from((idx[2 * g + k / 4] >> (16 * (k % 4))) as u16),
                    ) as i32
                };
                let q3 = _mm256_set_epi32(
                    grid(7),
                    grid(6),
                    grid(5),
                    grid(4),
                    grid(3),
                    grid(2),
                    grid(1),
                    grid(0),
                );
                let s = sign_masks(x, iq3s::SIGNS + 4 * g);
                let q8 = load256(y, Q8K_QS + 32 * g);
                let q8 = _mm256_sub_epi8(_mm256_xor_si256(s, q8), s);
                let dot = _mm256_maddubs_epi16(q3, q8);
                let ls = 2 * i16::from((x[iq3s::SCALES + g / 2] >> (4 * (g % 2))) & 15) + 1;
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(dot, _mm256_set1_epi16(ls)));
            });
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc)
    }
}

/// An IQ3_S block's 64 grid indices, four to a word (element `k` of group `g` in word
/// `2g + k / 4`, bits `16(k % 4)..`): byte `k` of the group's `qs` with bit `k` of its `qh`
/// byte above, two groups at a time in vector registers.
#[inline]
#[target_feature(enable = "avx2")]
fn iq3s_indices(x: &[u8; iq3s::BYTES]) -> [u64; 16] {
    let qh = _mm256_set1_epi64x(i64::from_le_bytes(x[iq3s::QH..].as_chunks::<8>().0[0]));
    // bit `k` of a group's `qh` byte, at bit `8 + k` of 16-bit lane `k`
    let bit = _mm256_setr_epi16(
        0x100, 0x200, 0x400, 0x800, 0x1000, 0x2000, 0x4000, -0x8000, 0x100, 0x200, 0x400, 0x800,
        0x1000, 0x2000, 0x4000, -0x8000,
    );
    let mut idx = [0u64; 16];
    for p in 0..4 {
        // group `2p`'s `qh` byte to the high byte of every 16-bit lane of the low half, group
        // `2p + 1`'s of the high half
        let (a, b) = (2 * p as i8, 2 * p as i8 + 1);
        let ctl = _mm256_setr_epi8(
            -1, a, -1, a, -1, a, -1, a, -1, a, -1, a, -1, a, -1, a, -1, b, -1, b, -1, b, -1, b, -1,
            b, -1, b, -1, b, -1, b,
        );
        let h = _mm256_and_si256(_mm256_shuffle_epi8(qh, ctl), bit);
        let h = _mm256_and_si256(_mm256_cmpeq_epi16(h, bit), _mm256_set1_epi16(0x100));
        let v = _mm256_or_si256(h, _mm256_cvtepu8_epi16(load128(x, iq3s::QS + 16 * p)));
        idx[4 * p..4 * p + 4].copy_from_slice(&words64(v));
    }
    idx
}

/// `2k + 1` in all 32 bytes, `ODD_BYTES[k]`: an IQ1_S group's scale, the unsigned operand
/// of [`add_scaled`].
static ODD_BYTES: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut k = 0;
    while k < 8 {
        t[k] = [2 * k as u8 + 1; 32];
        k += 1;
    }
    t
};

/// The IQ1 kernels' products: activations `q8` already carrying the grid's signs (-1, 0, 1 by
/// `vpsignb`, which keeps -128), times the unsigned scale bytes `sc` (`2s + 1`, at most 15),
/// added into `acc` as 16-bit lanes: each pair at most `2 · 15 · 128`, so eight groups' worth
/// fit a lane exactly, and [`lanes16`] pairs them once a block. ggml takes `vpmaddubsw` by the
/// grid's magnitudes, `vpmaddwd` by the scale and an add, per group: the same integers in the
/// same 32-bit lanes (elements `4m..4m + 4` in lane `m`), with two instructions fewer.
#[inline]
#[target_feature(enable = "avx2")]
fn add_scaled(acc: __m256i, sc: __m256i, q8: __m256i) -> __m256i {
    _mm256_add_epi16(acc, _mm256_maddubs_epi16(sc, q8))
}

/// The 32-bit lanes of [`add_scaled`]'s 16-bit ones.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes16(acc: __m256i) -> __m256i {
    _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
}

/// [`add_scaled`] with AVX-512 VNNI: one `vpdpbusd` adds the four products of each 32-bit
/// lane into it.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
fn add_scaled_vnni(acc: __m256i, sc: __m256i, q8: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, sc, q8)
}

/// `acc + vpmaddwd(a, b)`: each 32-bit lane of `acc` plus the two products of its 16-bit
/// halves (the way the AVX2 kernels apply 16-bit sub-block scales to `vpmaddubsw` sums).
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::kernels) fn add_madd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
}

/// [`add_madd`] in one AVX-512 VNNI `vpdpwssd`: the same two products per lane (exact: each
/// at most 2^30 in magnitude) added to the lane with the same wrap-around addition, so the
/// same 32-bit lanes whatever the inputs.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
pub(in crate::kernels) fn add_madd_vnni(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, a, b)
}

/// [`add_madd_vnni`] in AVX-VNNI's VEX encoding (`{vex} vpdpwssd`): the same operation on
/// CPUs that have VNNI without AVX-512.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
pub(in crate::kernels) fn add_madd_avx_vnni(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpwssd_avx_epi32(acc, a, b)
}

/// The lanes of [`add_scaled_vnni`]: already 32-bit.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes32(acc: __m256i) -> __m256i {
    acc
}

/// An IQ1_S kernel: `$grid4` puts a group's grid vector together, `$add` and `$lanes` sum the
/// products ([`add_scaled`] and [`lanes16`], or the VNNI pair).
macro_rules! iq1s_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $grid4:expr, $add:ident, $lanes:ident) => {
$(#[$doc])*
#[target_feature(enable = $features)]
fn $name(w: &[[u8; iq1s::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc1 = 0f32;
    for (x, y) in w.iter().zip(a) {
        // group `g`'s scale bytes and signed activations
        let group = |g: usize| {
            let word = u16::from_le_bytes([x[iq1s::QH + 2 * g], x[iq1s::QH + 2 * g + 1]]);
            let q1 = $grid4(u32_at(x, iq1s::QS + 4 * g), word);
            let q8 = _mm256_sign_epi8(load256(y, Q8K_QS + 32 * g), q1);
            (load256(&ODD_BYTES[usize::from(word >> 12) & 7], 0), q8)
        };
        // two accumulators, even and odd groups: short chains (see `tq20_vnni`); named, not
        // an array, which a loop the compiler does not unroll would keep in memory
        let mut even = _mm256_setzero_si256();
        let mut odd = _mm256_setzero_si256();
        for p in 0..4 {
            let (ls, q8) = group(2 * p);
            even = $add(even, ls, q8);
            let (ls, q8) = group(2 * p + 1);
            odd = $add(odd, ls, q8);
        }
        let sumi = _mm256_add_epi32($lanes(even), $lanes(odd));
        // Σ_g (bsum[2g] + bsum[2g + 1]) · ±(2s_g + 1), the sign the group word's top bit
        let qh = load128(x, iq1s::QH);
        let ls = _mm_or_si128(
            _mm_and_si128(_mm_srli_epi16::<11>(qh), _mm_set1_epi16(14)),
            _mm_set1_epi16(1),
        );
        let ls = _mm_sign_epi16(ls, _mm_or_si128(qh, _mm_set1_epi16(1)));
        let ls = _mm256_set_m128i(_mm_unpackhi_epi16(ls, ls), _mm_unpacklo_epi16(ls, ls));
        let shifts = hsum_epi32(_mm256_madd_epi16(load256(y, Q8K_BSUMS), ls));
        let d = f16_times(x, iq1s::D, f32_at(y, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        acc1 = _mm256_cvtss_f32(d).mul_add(shifts as f32, acc1);
    }
    hsum_ps(acc) + IQ1S_DELTA * acc1
}
    };
}

iq1s_kernel!(
    /// [`iq1s_avx2_bmi2`] with the indices put together by shifts and masks.
    iq1s_avx2,
    "avx2,fma,f16c",
    iq1_grid4::<3>,
    add_scaled,
    lanes16
);
iq1s_kernel!(
    /// IQ1_S in the lanes of ggml's AVX2 kernel: the activations with the grid's signs times
    /// each group's `2s + 1` ([`add_scaled`]), the block's lanes times `d` into the
    /// accumulators; the shifts from the activation group sums into one f32, added at the
    /// end. The shifts' integer total is one `vpmaddwd` of the group sums by the signed scales.
    /// The grid indices are put together with BMI2's `pdep` ([`iq1_grid4_bmi2`]).
    iq1s_avx2_bmi2,
    "avx2,fma,f16c,bmi2",
    iq1_grid4_bmi2::<3>,
    add_scaled,
    lanes16
);

iq1s_kernel!(
    /// [`iq1s_avx2_bmi2`] built also for AVX-512F, VL and BW, for their 32 vector registers
    /// ([`narrow_and_wide`]).
    iq1s_avx2_wide,
    "avx2,fma,f16c,bmi2,avx512f,avx512vl,avx512bw",
    iq1_grid4_bmi2::<3>,
    add_scaled,
    lanes16
);

iq1s_kernel!(
    /// [`iq1s_avx2_bmi2`] with AVX-512 VNNI's `vpdpbusd` for the products
    /// ([`add_scaled_vnni`]).
    iq1s_vnni,
    "avx2,fma,f16c,bmi2,avx512f,avx512vl,avx512bw,avx512vnni",
    iq1_grid4_bmi2::<3>,
    add_scaled_vnni,
    lanes32
);

/// The sum of the eight 32-bit lanes (exact: the totals here fit).
#[inline]
#[target_feature(enable = "avx2")]
fn hsum_epi32(v: __m256i) -> i32 {
    let r = _mm_add_epi32(_mm256_extracti128_si256::<1>(v), _mm256_castsi256_si128(v));
    let r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
    let r = _mm_add_epi32(r, _mm_shuffle_epi32::<1>(r));
    _mm_cvtsi128_si32(r)
}

/// An IQ1_M kernel: `$grid4` puts a group's grid vector together, `$add` and `$lanes` sum the
/// products ([`add_scaled`] and [`lanes16`], or the VNNI pair).
macro_rules! iq1m_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $grid4:expr, $add:ident, $lanes:ident) => {
$(#[$doc])*
#[target_feature(enable = $features)]
fn $name(w: &[[u8; iq1m::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut acc1 = _mm256_setzero_ps();
    let mut acc2 = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        // the 16 scales `2s + 1` in the low bytes of words: the four scale words shifted by 0
        // and 6 (the first halves of even and odd groups, low lane), 3 and 9 (second halves,
        // high lane)
        let sc = _mm256_set1_epi64x(i64::from_le_bytes(x[iq1m::SCALES..].as_chunks::<8>().0[0]));
        let sc = _mm256_srlv_epi64(sc, _mm256_setr_epi64x(0, 6, 3, 9));
        let scales = _mm256_or_si256(
            _mm256_slli_epi16::<1>(_mm256_and_si256(sc, _mm256_set1_epi16(7))),
            _mm256_set1_epi16(1),
        );
        let signs = iq1m_shift_signs(x);
        // group `g` with the control broadcasting its scale bytes: (scale bytes, activations
        // with the grid's signs, activations with the shifts' signs)
        let group = |g: usize, ctl: __m256i| {
            // the group's four nibbles: three top index bits and the sign, per 8 elements
            let word = u16::from_le_bytes([x[iq1m::QH + 2 * g], x[iq1m::QH + 2 * g + 1]]);
            let q1 = $grid4(u32_at(x, iq1m::QS + 4 * g), word);
            let sg = _mm256_shuffle_epi8(signs, load256(&SIGN_PICK[g], 0));
            let q8 = load256(y, Q8K_QS + 32 * g);
            let sc = _mm256_shuffle_epi8(scales, ctl);
            (sc, _mm256_sign_epi8(q8, q1), _mm256_sign_epi8(q8, sg))
        };
        // (grid products, shift products), each in two accumulators, even and odd groups:
        // short chains (see `tq20_vnni`), named (see `iq1s_kernel`)
        let z = _mm256_setzero_si256();
        let (mut grid_even, mut grid_odd, mut shift_even, mut shift_odd) = (z, z, z, z);
        // group 2p's scales are byte 2p of each lane, group 2p + 1's byte 8 + 2p
        let mut ctl = z;
        for p in 0..4 {
            let (sc, q1, sg) = group(2 * p, ctl);
            grid_even = $add(grid_even, sc, q1);
            shift_even = $add(shift_even, sc, sg);
            let (sc, q1, sg) = group(2 * p + 1, _mm256_add_epi8(ctl, _mm256_set1_epi8(8)));
            grid_odd = $add(grid_odd, sc, q1);
            shift_odd = $add(shift_odd, sc, sg);
            ctl = _mm256_add_epi8(ctl, _mm256_set1_epi8(2));
        }
        let d = f16_bits_times(iq1m_d_bits(x), f32_at(y, 0));
        let sumi1 = _mm256_add_epi32($lanes(grid_even), $lanes(grid_odd));
        let sumi2 = _mm256_add_epi32($lanes(shift_even), $lanes(shift_odd));
        acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), acc1);
        acc2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), acc2);
    }
    hsum_ps(acc1) + IQ1S_DELTA * hsum_ps(acc2)
}
    };
}

iq1m_kernel!(
    /// [`iq1m_avx2_bmi2`] with the indices put together by shifts and masks.
    iq1m_avx2,
    "avx2,fma,f16c",
    iq1_grid4::<4>,
    add_scaled,
    lanes16
);
iq1m_kernel!(
    /// IQ1_M in the lanes of ggml's AVX2 kernel: as [`iq1s_avx2`] with a scale per 16
    /// elements, and the shifts as the activations with the shift's sign per 8 elements
    /// (`vpsignb`), scaled, in lanes and accumulators of their own.
    ///
    /// The shift signs of a group are shuffled out of a vector built once a block
    /// ([`iq1m_shift_signs`]), its scales out of one of the block's 16; the grid indices are
    /// put together with BMI2's `pdep` ([`iq1_grid4_bmi2`]).
    iq1m_avx2_bmi2,
    "avx2,fma,f16c,bmi2",
    iq1_grid4_bmi2::<4>,
    add_scaled,
    lanes16
);

iq1m_kernel!(
    /// [`iq1m_avx2_bmi2`] built also for AVX-512F, VL and BW, for their 32 vector registers
    /// ([`narrow_and_wide`]).
    iq1m_avx2_wide,
    "avx2,fma,f16c,bmi2,avx512f,avx512vl,avx512bw",
    iq1_grid4_bmi2::<4>,
    add_scaled,
    lanes16
);

iq1m_kernel!(
    /// [`iq1m_avx2_bmi2`] with AVX-512 VNNI's `vpdpbusd` for the products
    /// ([`add_scaled_vnni`]).
    iq1m_vnni,
    "avx2,fma,f16c,bmi2,avx512f,avx512vl,avx512bw,avx512vnni",
    iq1_grid4_bmi2::<4>,
    add_scaled_vnni,
    lanes32
);

/// The grid entries of an IQ1_S or IQ1_M group as one vector: index `l` is byte `l` of `qs`
/// (the group's four low index bytes) with three bits of the group's word `qh` above it, bits
/// `S·l..S·l + 3` (`S` 3 for IQ1_S, 4 for IQ1_M, whose fourth bits are the shifts' signs). Put
/// together in general registers by shifts and masks (in vector registers, as the compiler
/// otherwise does, their inserts and extracts ran out of shuffle ports first).
#[inline]
#[target_feature(enable = "avx2")]
fn iq1_grid4<const S: usize>(qs: u32, qh: u16) -> __m256i {
    let grid = |l: usize| {
        let lo = (qs as usize >> (8 * l)) & 0xff;
        let hi = ((usize::from(qh) >> (S * l)) & 7) << 8;
        IQ1S_GRID[lo | hi] as i64
    };
    _mm256_set_epi64x(grid(3), grid(2), grid(1), grid(0))
}

/// [`iq1_grid4`] with the four indices deposited into 16-bit fields by two `pdep`.
#[inline]
#[target_feature(enable = "avx2,bmi2")]
fn iq1_grid4_bmi2<const S: usize>(qs: u32, qh: u16) -> __m256i {
    // the index bits of `qh`, and where they go: 3 bits per field
    let (bits, fields) = if S == 3 {
        (0x0fff, 0x0700_0700_0700_0700)
    } else {
        (0x7777, 0x0f00_0f00_0f00_0f00)
    };
    let idx =
        _pdep_u64(u64::from(qs), 0x00ff_00ff_00ff_00ff) | _pdep_u64(u64::from(qh & bits), fields);
    // SAFETY: field `l` of `idx` holds 8 bits of `qs` and 3 of `qh` (the masks above), so
    // each index is below 2048, the grid's length.
    let grid =
        |l: usize| unsafe { grid_entry(&IQ1S_GRID, usize::from((idx >> (16 * l)) as u16)) as i64 };
    _mm256_set_epi64x(grid(3), grid(2), grid(1), grid(0))
}

/// Entry `i` of a grid table, without the bounds check (the callers' indices are 16-bit
/// fields whose other bits are known zero; masking them again costs an instruction per
/// index, and the grid loads are these kernels' longest chain).
///
/// # Safety
/// `i < table.len()`.
#[inline(always)]
unsafe fn grid_entry<T: Copy>(table: &[T], i: usize) -> T {
    debug_assert!(i < table.len());
    // SAFETY: the caller's promise.
    unsafe { *table.get_unchecked(i) }
}

/// An IQ1_M block's 32 shift signs as bytes whose sign is the shift's and which are never
/// zero, for [`SIGN_PICK`]: the low half holds `qh[2g] << 4` and `qh[2g]` at bytes `2g` and
/// `2g + 1` (the signs of a group's elements 0..8 and 8..16, bits 3 and 7), the high half
/// the same of `qh[2g + 1]` (elements 16..32), each with bit 0 set.
#[inline]
#[target_feature(enable = "avx2")]
fn iq1m_shift_signs(x: &[u8; iq1m::BYTES]) -> __m256i {
    let qh = load128(x, iq1m::QH);
    // even bytes, then odd bytes
    let qh = _mm_shuffle_epi8(
        qh,
        _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15),
    );
    // bit 3 of each byte to bit 7 (the bits crossing from the byte below are don't-cares)
    let up = _mm_slli_epi16::<4>(qh);
    let v = _mm256_set_m128i(_mm_unpackhi_epi8(up, qh), _mm_unpacklo_epi8(up, qh));
    _mm256_or_si256(v, _mm256_set1_epi8(1))
}

/// The `vpshufb` controls that spread group `g`'s four shift signs from
/// [`iq1m_shift_signs`] over its 32 elements: bytes `2g` (8 elements) and `2g + 1` (8
/// elements) of each half.
static SIGN_PICK: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut g = 0;
    while g < 8 {
        let mut e = 0;
        while e < 32 {
            t[g][e] = (2 * g + (e / 8) % 2) as u8;
            e += 1;
        }
        g += 1;
    }
    t
};

/// The digits of a TQ1_0 block, as bytes 0..=2, in the order of the activations they
/// multiply: 32 bytes each for elements `32k..32k + 32`.
///
/// Digit `n` of byte `b` is `(b · 3^n mod 256) · 3 >> 8` ([`super::tq1_digit`]): 1 from
/// 86 up and 2 from 171 up. ggml takes it with a saturating subtract, two rounding halving
/// adds, a shift and a mask; here each byte is flipped by 0x80 once, which makes the two
/// thresholds signed compares (`b · 3^n + 128` is `(b + 128) · 3^n` mod 256, 3^n being
/// odd), and the digit is the magnitude of the two compares' sum: four operations instead of
/// five, none on the shift ports. The powers are taken by adding each byte twice to itself.
#[inline]
#[target_feature(enable = "avx2")]
fn tq10_digits(x: &[u8; tq10::BYTES]) -> [__m256i; 8] {
    // 85 and 170 flipped: the largest bytes of digits 0 and 1
    let lo = _mm256_set1_epi8((85u8 ^ 0x80) as i8);
    let hi = _mm256_set1_epi8((170u8 ^ 0x80) as i8);
    let digit = |s: __m256i| {
        _mm256_abs_epi8(_mm256_add_epi8(
            _mm256_cmpgt_epi8(s, lo),
            _mm256_cmpgt_epi8(s, hi),
        ))
    };
    let times3 = |s: __m256i| _mm256_add_epi8(s, _mm256_add_epi8(s, s));
    let flip = _mm256_set1_epi8(-128);
    // bytes 32..48 (five digits each) in both lanes: digits 0 and 1, then 2 and 3, in the low
    // and high lanes, and digit 4 beside the 4 bytes of `qh` (four digits each) times 1, 3, 9
    // and 27 (in 16-bit lanes, the low bytes kept)
    let h0 = _mm256_xor_si256(_mm256_broadcastsi128_si256(load128(x, tq10::QS + 32)), flip);
    let h1 = times3(h0);
    // (h0, h1), (h2, h3) in the low and high lanes
    let h01 = _mm256_blend_epi32::<0xf0>(h0, h1);
    let h23 = times3(times3(h01));
    let h4 = times3(times3(h23));
    let qh = _mm256_cvtepu8_epi16(_mm_set1_epi32(u32_at(x, tq10::QH) as i32));
    let mul = _mm256_set_epi16(27, 27, 27, 27, 9, 9, 9, 9, 3, 3, 3, 3, 1, 1, 1, 1);
    let qh = _mm256_and_si256(_mm256_mullo_epi16(qh, mul), _mm256_set1_epi16(0xff));
    let h5 = _mm_packus_epi16(
        _mm256_castsi256_si128(qh),
        _mm256_extracti128_si256::<1>(qh),
    );
    let h45 = _mm256_inserti128_si256::<1>(h4, _mm_xor_si128(h5, _mm256_castsi256_si128(flip)));
    // the first 32 bytes: five digits each
    let q0 = _mm256_xor_si256(load256(x, tq10::QS), flip);
    let q1 = times3(q0);
    let q2 = times3(q1);
    let q3 = times3(q2);
    let q4 = times3(q3);
    [
        digit(q0),
        digit(q1),
        digit(q2),
        digit(q3),
        digit(q4),
        digit(h01),
        digit(h23),
        digit(h45),
    ]
}

/// TQ1_0 as ggml's AVX2 kernel: the digits ([`tq10_digits`]) times the activations summed
/// in 16-bit lanes, the activation sums taken off, the lanes paired, and each times `d` into
/// its accumulator. The 16-bit lanes are exact (at most `8 · 2 · 2 · 128` less the sums), so
/// the order of their additions is free.
#[target_feature(enable = "avx2,fma,f16c")]
fn tq10_avx2(w: &[[u8; tq10::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let q = tq10_digits(x);
        let p = |k: usize| _mm256_maddubs_epi16(q[k], load256(y, Q8K_QS + 32 * k));
        let sumi0 = _mm256_add_epi16(_mm256_add_epi16(p(0), p(1)), p(5));
        let sumi1 = _mm256_add_epi16(_mm256_add_epi16(p(2), p(3)), p(6));
        let sumi2 = _mm256_add_epi16(p(4), p(7));
        let d = f16_times(x, tq10::D, f32_at(y, 0));
        let s = _mm256_sub_epi16(sumi0, load256(y, Q8K_BSUMS));
        let s = _mm256_add_epi16(s, _mm256_add_epi16(sumi1, sumi2));
        let s = _mm256_madd_epi16(s, _mm256_set1_epi16(1));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
    }
    hsum_ps(acc)
}

/// [`tq10_avx2`] with AVX-512 VNNI: the products summed into the 32-bit lanes by
/// `vpdpbusd` ([`ternary_lanes_vnni`]), as [`tq20_vnni`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
fn tq10_vnni(w: &[[u8; tq10::BYTES]], a: &[Q8KBlock]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let s = ternary_lanes_vnni(tq10_digits(x), y);
        let d = f16_times(x, tq10::D, f32_at(y, 0));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
    }
    hsum_ps(acc)
}
