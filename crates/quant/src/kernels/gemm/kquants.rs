//! AVX2 multi-token kernels of the k-quants Q4_K, Q5_K and Q6_K against Q8_K activations
//! (VecDot order).
//!
//! Per output, the float steps are those of the single-row kernels (`kquants/x86.rs`): per
//! super-block `acc = fma(d·yd, sumi, acc)` in eight lanes; for Q4_K also
//! `acc_m = acc_m − dmin·yd · prod` (fused) in four lanes, for Q5_K
//! `summs = summs − dmin·yd · Σprod` (fused) in one; then the same final reductions. The
//! integer sums are exact and are formed as in the multi-row kernels (`kquants/x86_rows.rs`).
//!
//! The kernels walk the tile one weight row at a time: each super-block of the row is unpacked
//! once (quants, sub-block scales and minimums, f16 scales) and multiplied with the same block
//! of the `T` activation rows, which stay in the L1 cache from one row to the next.

use std::arch::x86_64::*;

use super::check_tile;
use crate::kernels::kquants::x86::{
    WORD_CTL, crumbs, group16_scales, iq4xs_scales, q3k_scales, splat32,
};
use crate::kernels::{Kernels, SumOrder};
use crate::tables::KVALUES_IQ4NL;
use crate::{GgmlType, QK_K};

/// Bytes of one Q8_K block: `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]`.
const Q8K_BYTES: usize = 4 + QK_K + 2 * (QK_K / 16);
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = Q8K_QS + QK_K;

/// Q4_K block: `d`, `dmin`, `scales[12]`, `qs[128]`.
const Q4K_BYTES: usize = 144;
const Q4K_SCALES: usize = 4;
const Q4K_QS: usize = 16;
/// Q5_K block: `d`, `dmin`, `scales[12]`, `qh[32]`, `qs[128]`.
const Q5K_BYTES: usize = 176;
const Q5K_SCALES: usize = 4;
const Q5K_QH: usize = 16;
const Q5K_QS: usize = 48;
/// Q6_K block: `ql[128]`, `qh[64]`, `scales[16]` (i8), `d`.
const Q6K_BYTES: usize = 210;
const Q6K_QL: usize = 0;
const Q6K_QH: usize = 128;
const Q6K_SCALES: usize = 192;
const Q6K_D: usize = 208;

/// Tiles (weight rows × tokens), by type. The rows of a tile are walked one after the other,
/// so `R` only sets how many rows a call covers; `T` is the number of activation blocks each
/// unpacked weight block serves. Chosen by measurement (one thread, CPU time of `matmul_with`
/// on 82 tokens against the multi-row path): Q6_K 1536×8960 gains 1.27× with T = 2, 1.49×
/// with 4, 1.38× with 8; Q5_K 1536×1536 1.06×, 1.1-1.3× (noisy), 1.37×; Q4_K 1544×1536
/// 0.9×, 0.7-1.0×, 1.05-1.1× (the Q4_K multi-row kernel already shares most of the work).
const Q4K_TILE: (usize, usize) = (4, 8);
const Q5K_TILE: (usize, usize) = (4, 8);
const Q6K_TILE: (usize, usize) = (4, 4);
/// Q2_K, Q3_K and IQ4_XS: as Q6_K's (not tuned by measurement).
const Q2K_TILE: (usize, usize) = (4, 4);
const Q3K_TILE: (usize, usize) = (4, 4);
const IQ4XS_TILE: (usize, usize) = (4, 4);

/// Q2_K block: `scales[16]` (low nibble scale, high nibble min), `qs[64]`, `d`, `dmin`.
const Q2K_BYTES: usize = 84;
const Q2K_SCALES: usize = 0;
const Q2K_QS: usize = 16;
const Q2K_D: usize = 80;
/// Q3_K block: `hmask[32]`, `qs[64]`, `scales[12]`, `d`.
const Q3K_BYTES: usize = 110;
const Q3K_HMASK: usize = 0;
const Q3K_QS: usize = 32;
const Q3K_SCALES: usize = 96;
const Q3K_D: usize = 108;
/// IQ4_XS block: `d`, `scales_h`, `scales_l[4]`, `qs[128]`.
const IQ4XS_BYTES: usize = 136;
const IQ4XS_D: usize = 0;
const IQ4XS_QS: usize = 8;

pub(super) fn register(k: &mut Kernels) {
    let o = SumOrder::VecDot;
    k.set_dot_tokens_in(o, GgmlType::Q4_K, Q4K_TILE.0, Q4K_TILE.1, dot_tokens_q4_k);
    k.set_dot_tokens_in(o, GgmlType::Q5_K, Q5K_TILE.0, Q5K_TILE.1, dot_tokens_q5_k);
    k.set_dot_tokens_in(o, GgmlType::Q6_K, Q6K_TILE.0, Q6K_TILE.1, dot_tokens_q6_k);
    k.set_dot_tokens_in(o, GgmlType::Q2_K, Q2K_TILE.0, Q2K_TILE.1, dot_tokens_q2_k);
    k.set_dot_tokens_in(o, GgmlType::Q3_K, Q3K_TILE.0, Q3K_TILE.1, dot_tokens_q3_k);
    k.set_dot_tokens_in(
        o,
        GgmlType::IQ4_XS,
        IQ4XS_TILE.0,
        IQ4XS_TILE.1,
        dot_tokens_iq4_xs,
    );
}

/// 32 bytes of `b` from `off`.
#[inline]
#[target_feature(enable = "avx2")]
fn load256(b: &[u8], off: usize) -> __m256i {
    let s = &b[off..off + 32];
    // SAFETY: `s` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// 16 bytes of `b` from `off`.
#[inline]
#[target_feature(enable = "avx2")]
fn load128(b: &[u8], off: usize) -> __m128i {
    let s = &b[off..off + 16];
    // SAFETY: `s` is 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// The `T` activation blocks `b` of a tile: `a` holds `T` rows of `nb` Q8_K blocks.
#[inline(always)]
fn act_blocks<const T: usize>(a: &[u8], nb: usize, b: usize) -> [&[u8; Q8K_BYTES]; T] {
    assert!(b < nb && a.len() == T * nb * Q8K_BYTES);
    let mut ys = [&[0u8; Q8K_BYTES]; T];
    for (t, y) in ys.iter_mut().enumerate() {
        let at = (t * nb + b) * Q8K_BYTES;
        // SAFETY: t < T and b < nb give at + Q8K_BYTES <= T * nb * Q8K_BYTES == a.len()
        // (asserted above); [u8; Q8K_BYTES] has alignment 1.
        *y = unsafe { &*a.as_ptr().add(at).cast::<[u8; Q8K_BYTES]>() };
    }
    ys
}

/// 32 bytes of a block from `off` (`off + 32 <= N`, checked at compile time where `off` is
/// constant).
#[inline]
#[target_feature(enable = "avx2")]
fn ld<const N: usize>(b: &[u8; N], off: usize) -> __m256i {
    assert!(off + 32 <= N);
    // SAFETY: bytes off..off + 32 of `b` are in bounds (asserted); `loadu` has no alignment
    // requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().add(off).cast()) }
}

#[inline(always)]
fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline(always)]
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Sum of the eight lanes: high half + low half, then pairs, then the last two (the
/// single-row kernels' reduction).
#[inline]
#[target_feature(enable = "avx2")]
fn hsum_ps(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// Sum of four lanes as the single-row Q4_K kernel reduces its minimum accumulator.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum4_ps(m: __m128) -> f32 {
    let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_add_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// The 12 scale bytes of a Q4_K / Q5_K block at `b[off..off + 12]` unpacked into 16 bytes:
/// the eight 6-bit scales, then the eight 6-bit minimums. Reads 16 bytes from `off`.
#[inline]
#[target_feature(enable = "avx2")]
fn k4_scales_mins(b: &[u8], off: usize) -> __m128i {
    let v = load128(b, off);
    // Words of `a`: s[0..4], s[8..12], s[4..8], s[8..12].
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

/// The activation group sums of a Q8_K block added in pairs (one per 32-element sub-block).
#[inline]
#[target_feature(enable = "avx2")]
fn pair_sums(y: &[u8]) -> __m128i {
    let q8sums = load256(y, Q8K_BSUMS);
    _mm_hadd_epi16(
        _mm256_castsi256_si128(q8sums),
        _mm256_extracti128_si256::<1>(q8sums),
    )
}

/// The fifth bits of sub-block `i` (0..8) of a Q5_K block as 16 (or 0) per byte, from the
/// 32 `qh` bytes (bit `i` of byte `e` belongs to element `32 i + e`).
#[inline]
#[target_feature(enable = "avx2")]
fn q5_high(qh: __m256i, i: usize) -> __m256i {
    let v = match i {
        0 => _mm256_slli_epi16::<4>(qh),
        1 => _mm256_slli_epi16::<3>(qh),
        2 => _mm256_slli_epi16::<2>(qh),
        3 => _mm256_slli_epi16::<1>(qh),
        4 => qh,
        5 => _mm256_srli_epi16::<1>(qh),
        6 => _mm256_srli_epi16::<2>(qh),
        _ => _mm256_srli_epi16::<3>(qh),
    };
    _mm256_and_si256(v, _mm256_set1_epi8(16))
}

/// `T` tokens' worth of one weight row of Q4_K (`Q5 = false`) or Q5_K (`Q5 = true`) blocks
/// of `B` bytes; writes `out[t * stride]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_row<const T: usize, const B: usize, const Q5: bool>(
    x_row: &[u8],
    a: &[u8],
    nb: usize,
    out: &mut [f32],
    stride: usize,
) {
    let (scales_off, qs_off) = if Q5 {
        (Q5K_SCALES, Q5K_QS)
    } else {
        (Q4K_SCALES, Q4K_QS)
    };
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_m = [_mm_setzero_ps(); T];
    let mut summs = [0f32; T];
    let (x_row, _) = x_row.as_chunks::<B>();
    for (b, x) in x_row.iter().enumerate().take(nb) {
        let ys = act_blocks::<T>(a, nb, b);
        let mins_and_scales = _mm256_cvtepu8_epi16(k4_scales_mins(x, scales_off));
        let scales = _mm256_permute4x64_epi64::<0x44>(mins_and_scales);
        let ctl = std::hint::black_box(&WORD_CTL);
        let hb = if Q5 {
            ld(x, Q5K_QH)
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = [_mm256_setzero_si256(); T];
        for j in 0..4 {
            let scale_l = _mm256_shuffle_epi8(scales, ld(&ctl[2 * j], 0));
            let scale_h = _mm256_shuffle_epi8(scales, ld(&ctl[2 * j + 1], 0));
            let bits = ld(x, qs_off + 32 * j);
            let mut ql = _mm256_and_si256(bits, m4);
            let mut qh = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            if Q5 {
                ql = _mm256_or_si256(ql, q5_high(hb, 2 * j));
                qh = _mm256_or_si256(qh, q5_high(hb, 2 * j + 1));
            }
            for t in 0..T {
                let q8l = ld(ys[t], Q8K_QS + 64 * j);
                let q8h = ld(ys[t], Q8K_QS + 64 * j + 32);
                let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(ql, q8l));
                let ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(qh, q8h));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
            }
        }
        // (d, dmin) as an f16 pair in every 64-bit element, converted exactly.
        let pair = _mm256_cvtph_ps(_mm_set1_epi32(u32_at(x, 0) as i32));
        let mins = _mm256_extracti128_si256::<1>(mins_and_scales);
        for t in 0..T {
            let v = _mm256_mul_ps(pair, _mm256_set1_ps(f32_at(ys[t], 0)));
            let d = _mm256_moveldup_ps(v);
            let dmin = _mm256_movehdup_ps(v);
            let prod = _mm_madd_epi16(mins, pair_sums(ys[t]));
            if Q5 {
                let p = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
                let p = _mm_add_epi32(p, _mm_shuffle_epi32::<0b01>(p));
                let dmin = _mm256_cvtss_f32(dmin);
                summs[t] = (-dmin).mul_add(_mm_cvtsi128_si32(p) as f32, summs[t]);
            } else {
                let dmin = _mm256_castps256_ps128(dmin);
                acc_m[t] = _mm_fnmadd_ps(dmin, _mm_cvtepi32_ps(prod), acc_m[t]);
            }
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    for t in 0..T {
        out[t * stride] = if Q5 {
            hsum_ps(acc[t]) + summs[t]
        } else {
            hsum_ps(acc[t]) + hsum4_ps(acc_m[t])
        };
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn k4_tile<const R: usize, const T: usize, const B: usize, const Q5: bool>(
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
) {
    let nb = n / QK_K;
    check_tile(n, QK_K, w, nb * B, a, nb * Q8K_BYTES, out, (R, T));
    for r in 0..R {
        k4_row::<T, B, Q5>(&w[r * nb * B..(r + 1) * nb * B], a, nb, &mut out[r..], R);
    }
}

/// `vpshufb` controls: `CHUNK_CTL[k]` broadcasts 16-bit element `2k` of the low lane over the
/// low lane and element `2k + 1` over the high lane (the two group scales of 32-element chunk
/// `k` of a half block, given the half's eight scales as 16-bit values in both lanes).
static CHUNK_CTL: [[u8; 32]; 4] = {
    let mut t = [[0u8; 32]; 4];
    let mut k = 0;
    while k < 4 {
        let mut b = 0;
        while b < 32 {
            t[k][b] = (4 * k + 2 * (b / 16) + b % 2) as u8;
            b += 1;
        }
        k += 1;
    }
    t
};

/// `T` tokens' worth of one Q6_K weight row; writes `out[t * stride]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6k_row<const T: usize>(x_row: &[u8], a: &[u8], nb: usize, out: &mut [f32], stride: usize) {
    let m15 = _mm256_set1_epi8(15);
    let m = _mm256_set1_epi8(0x30);
    let mut acc = [_mm256_setzero_ps(); T];
    let (x_row, _) = x_row.as_chunks::<Q6K_BYTES>();
    for (b, x) in x_row.iter().enumerate().take(nb) {
        let ys = act_blocks::<T>(a, nb, b);
        let s16 = _mm256_cvtepi8_epi16(load128(x, Q6K_SCALES));
        let ctl = std::hint::black_box(&CHUNK_CTL);
        // The -32 offset of every quant, through the activation group sums.
        let mut sumi = [_mm256_setzero_si256(); T];
        for t in 0..T {
            let off = _mm256_madd_epi16(ld(ys[t], Q8K_BSUMS), s16);
            sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32::<5>(off));
        }
        for j in 0..2 {
            let g = if j == 0 {
                _mm256_permute4x64_epi64::<0x44>(s16)
            } else {
                _mm256_permute4x64_epi64::<0xEE>(s16)
            };
            let bits1 = ld(x, Q6K_QL + 64 * j);
            let bits2 = ld(x, Q6K_QL + 64 * j + 32);
            let bits_h = ld(x, Q6K_QH + 32 * j);
            for (k, ctl) in ctl.iter().enumerate() {
                let (bits, h) = match k {
                    0 => (bits1, _mm256_slli_epi16::<4>(bits_h)),
                    1 => (bits2, _mm256_slli_epi16::<2>(bits_h)),
                    2 => (_mm256_srli_epi16::<4>(bits1), bits_h),
                    _ => (
                        _mm256_srli_epi16::<4>(bits2),
                        _mm256_srli_epi16::<2>(bits_h),
                    ),
                };
                let q = _mm256_or_si256(_mm256_and_si256(bits, m15), _mm256_and_si256(h, m));
                let cs = _mm256_shuffle_epi8(g, ld(ctl, 0));
                for t in 0..T {
                    let q8 = ld(ys[t], Q8K_QS + 128 * j + 32 * k);
                    let p = _mm256_madd_epi16(cs, _mm256_maddubs_epi16(q, q8));
                    sumi[t] = _mm256_add_epi32(sumi[t], p);
                }
            }
        }
        let h = i16::from_le_bytes([x[Q6K_D], x[Q6K_D + 1]]);
        let dx = _mm256_cvtph_ps(_mm_set1_epi16(h));
        for t in 0..T {
            let d = _mm256_mul_ps(dx, _mm256_set1_ps(f32_at(ys[t], 0)));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    for t in 0..T {
        out[t * stride] = hsum_ps(acc[t]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q6k_tile<const R: usize, const T: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let nb = n / QK_K;
    let rb = nb * Q6K_BYTES;
    check_tile(n, QK_K, w, rb, a, nb * Q8K_BYTES, out, (R, T));
    for r in 0..R {
        q6k_row::<T>(&w[r * rb..(r + 1) * rb], a, nb, &mut out[r..], R);
    }
}

// ---------------------------------------------------------------------------------------
// Q2_K, Q3_K, IQ4_XS: the float steps of `kquants/x86.rs` (`q2k_avx2`, `q3k_avx2`,
// `iq4xs_avx2`) per output: per super-block Q2_K `acc = fnmadd(dmin·yd, mins, acc)` then
// `acc = fma(d·yd, sumi, acc)` in eight lanes, Q3_K and IQ4_XS `acc = fma(d·yd, sumi, acc)`;
// then the eight lanes' sum.

/// `T` tokens' worth of one Q2_K weight row; writes `out[t * stride]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q2k_row<const T: usize>(x_row: &[u8], a: &[u8], nb: usize, out: &mut [f32], stride: usize) {
    let m4 = _mm_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); T];
    let (x_row, _) = x_row.as_chunks::<Q2K_BYTES>();
    for (b, x) in x_row.iter().enumerate().take(nb) {
        let ys = act_blocks::<T>(a, nb, b);
        // (d, dmin) as an f16 pair in every 64-bit element, converted exactly.
        let pair = _mm256_cvtph_ps(_mm_set1_epi32(u32_at(x, Q2K_D) as i32));
        let mins_and_scales = load128(x, Q2K_SCALES);
        let scales8 = _mm_and_si128(mins_and_scales, m4);
        let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(mins_and_scales), m4));
        let mut d = [_mm256_setzero_ps(); T];
        for t in 0..T {
            let v = _mm256_mul_ps(pair, _mm256_set1_ps(f32_at(ys[t], 0)));
            d[t] = _mm256_moveldup_ps(v);
            let dmin = _mm256_movehdup_ps(v);
            let prod = _mm256_madd_epi16(mins, ld(ys[t], Q8K_BSUMS));
            acc[t] = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(prod), acc[t]);
        }
        let scales = [group16_scales(scales8, 0), group16_scales(scales8, 1)];
        let mut sumi = [_mm256_setzero_si256(); T];
        for (j, sc) in scales.iter().enumerate() {
            let bits = ld(x, Q2K_QS + 32 * j);
            let q2 = crumbs(bits);
            for (k, &q) in q2.iter().enumerate() {
                let s = splat32(*sc, k);
                for t in 0..T {
                    let p16 = _mm256_maddubs_epi16(q, ld(ys[t], Q8K_QS + 128 * j + 32 * k));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(s, p16));
                }
            }
        }
        for t in 0..T {
            acc[t] = _mm256_fmadd_ps(d[t], _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    for t in 0..T {
        out[t * stride] = hsum_ps(acc[t]);
    }
}

/// `T` tokens' worth of one Q3_K weight row; writes `out[t * stride]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q3k_row<const T: usize>(x_row: &[u8], a: &[u8], nb: usize, out: &mut [f32], stride: usize) {
    let four = _mm256_set1_epi8(4);
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); T];
    let (x_row, _) = x_row.as_chunks::<Q3K_BYTES>();
    for (b, x) in x_row.iter().enumerate().take(nb) {
        let ys = act_blocks::<T>(a, nb, b);
        let scales128 = _mm_sub_epi8(q3k_scales(x, Q3K_SCALES), _mm_set1_epi8(32));
        let scales = [group16_scales(scales128, 0), group16_scales(scales128, 1)];
        let hbits = ld(x, Q3K_HMASK);
        // Bit (e / 32) of hmask[e % 32] is the high bit of element e; this byte mask walks
        // 1, 2, 4, ..., 128 over the eight 32-element groups.
        let mut hm = _mm256_set1_epi8(1);
        let mut sumi = [_mm256_setzero_si256(); T];
        for (j, sc) in scales.iter().enumerate() {
            let bits = ld(x, Q3K_QS + 32 * j);
            let q3l = crumbs(bits);
            for (k, &ql) in q3l.iter().enumerate() {
                // 4 where the high bit is clear, else 0: the amount to subtract.
                let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, hm), zero);
                let qh = _mm256_and_si256(clear, four);
                hm = _mm256_add_epi8(hm, hm);
                let s = splat32(*sc, k);
                for t in 0..T {
                    let q8 = ld(ys[t], Q8K_QS + 128 * j + 32 * k);
                    let p16 = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(ql, q8),
                        _mm256_maddubs_epi16(qh, q8),
                    );
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(s, p16));
                }
            }
        }
        let h = i16::from_le_bytes([x[Q3K_D], x[Q3K_D + 1]]);
        let dx = _mm256_cvtph_ps(_mm_set1_epi16(h));
        for t in 0..T {
            let d = _mm256_mul_ps(dx, _mm256_set1_ps(f32_at(ys[t], 0)));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    for t in 0..T {
        out[t * stride] = hsum_ps(acc[t]);
    }
}

/// `T` tokens' worth of one IQ4_XS weight row; writes `out[t * stride]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4xs_row<const T: usize>(x_row: &[u8], a: &[u8], nb: usize, out: &mut [f32], stride: usize) {
    let values = _mm256_broadcastsi128_si256(load128(&KVALUES_IQ4NL.map(|v| v as u8), 0));
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); T];
    let (x_row, _) = x_row.as_chunks::<IQ4XS_BYTES>();
    for (b, x) in x_row.iter().enumerate().take(nb) {
        let ys = act_blocks::<T>(a, nb, b);
        let scales = iq4xs_scales(x);
        let ctl = std::hint::black_box(&WORD_CTL);
        let mut sumi = [_mm256_setzero_si256(); T];
        for ib in 0..4 {
            // Two 32-element sub-blocks: 16 packed bytes each, low nibbles first; the low
            // lane takes the low nibbles, the high lane the high ones.
            let nib = |off: usize| {
                let bits = load128(x, off);
                let idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(bits), bits), m4);
                _mm256_shuffle_epi8(values, idx)
            };
            let q4_1 = nib(IQ4XS_QS + 32 * ib);
            let q4_2 = nib(IQ4XS_QS + 32 * ib + 16);
            let (abs_1, abs_2) = (_mm256_sign_epi8(q4_1, q4_1), _mm256_sign_epi8(q4_2, q4_2));
            let ls1 = _mm256_shuffle_epi8(scales, ld(&ctl[2 * ib], 0));
            let ls2 = _mm256_shuffle_epi8(scales, ld(&ctl[2 * ib + 1], 0));
            for t in 0..T {
                let q8_1 = ld(ys[t], Q8K_QS + 64 * ib);
                let q8_2 = ld(ys[t], Q8K_QS + 64 * ib + 32);
                // Signed × signed through vpmaddubsw: |w| times the activation carrying w's
                // sign.
                let p16_1 = _mm256_maddubs_epi16(abs_1, _mm256_sign_epi8(q8_1, q4_1));
                let p16_2 = _mm256_maddubs_epi16(abs_2, _mm256_sign_epi8(q8_2, q4_2));
                let p =
                    _mm256_add_epi32(_mm256_madd_epi16(p16_1, ls1), _mm256_madd_epi16(p16_2, ls2));
                sumi[t] = _mm256_add_epi32(sumi[t], p);
            }
        }
        let h = i16::from_le_bytes([x[IQ4XS_D], x[IQ4XS_D + 1]]);
        let dx = _mm256_cvtph_ps(_mm_set1_epi16(h));
        for t in 0..T {
            let d = _mm256_mul_ps(dx, _mm256_set1_ps(f32_at(ys[t], 0)));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    for t in 0..T {
        out[t * stride] = hsum_ps(acc[t]);
    }
}

/// A tile of `R` rows × `T` tokens of blocks of `B` bytes, one row at a time through `row`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_tile<const R: usize, const B: usize>(
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    tokens: usize,
    row: impl Fn(&[u8], &[u8], usize, &mut [f32], usize),
) {
    let nb = n / QK_K;
    let rb = nb * B;
    check_tile(n, QK_K, w, rb, a, nb * Q8K_BYTES, out, (R, tokens));
    for r in 0..R {
        row(&w[r * rb..(r + 1) * rb], a, nb, &mut out[r..], R);
    }
}

// Entry points with the `DotTokensFn` signature. They are registered only in the AVX2 table,
// which `Kernels::detect` builds only after it detected AVX2, FMA and F16C at run time.

fn dot_tokens_q4_k(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: only reachable through the AVX2 table (see above).
    unsafe { k4_tile::<{ Q4K_TILE.0 }, { Q4K_TILE.1 }, Q4K_BYTES, false>(n, w, a, out) }
}

fn dot_tokens_q5_k(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: only reachable through the AVX2 table (see above).
    unsafe { k4_tile::<{ Q5K_TILE.0 }, { Q5K_TILE.1 }, Q5K_BYTES, true>(n, w, a, out) }
}

fn dot_tokens_q6_k(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: only reachable through the AVX2 table (see above).
    unsafe { q6k_tile::<{ Q6K_TILE.0 }, { Q6K_TILE.1 }>(n, w, a, out) }
}

fn dot_tokens_q2_k(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    const T: usize = Q2K_TILE.1;
    // SAFETY: only reachable through the AVX2 table (see above).
    unsafe {
        rows_tile::<{ Q2K_TILE.0 }, Q2K_BYTES>(n, w, a, out, T, |x, a, nb, o, s| {
            q2k_row::<T>(x, a, nb, o, s)
        })
    }
}

fn dot_tokens_q3_k(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    const T: usize = Q3K_TILE.1;
    // SAFETY: only reachable through the AVX2 table (see above).
    unsafe {
        rows_tile::<{ Q3K_TILE.0 }, Q3K_BYTES>(n, w, a, out, T, |x, a, nb, o, s| {
            q3k_row::<T>(x, a, nb, o, s)
        })
    }
}

fn dot_tokens_iq4_xs(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    const T: usize = IQ4XS_TILE.1;
    // SAFETY: only reachable through the AVX2 table (see above).
    unsafe {
        rows_tile::<{ IQ4XS_TILE.0 }, IQ4XS_BYTES>(n, w, a, out, T, |x, a, nb, o, s| {
            iq4xs_row::<T>(x, a, nb, o, s)
        })
    }
}
