//! AVX2 + FMA + F16C versions of the [`SumOrder::Repacked`] kernels.
//!
//! Each kernel works on 8 consecutive weight rows at once (or one), one row per f32 lane,
//! the way llama.cpp's interleaved kernels do: per float step (a block; for Q4_K a
//! super-block or a pair of sub-blocks), every row's exact integer total is formed, the
//! eight rows' totals are put into one vector holding one row total per lane, and one vector
//! FMA applies the scales. Lane `r` therefore performs exactly the scalar kernel's float
//! operations on row `r`, so every row gives the same bits whichever kernel computes it.
//!
//! The single-row kernels are the generic code of this file with one row; the 8-row kernels
//! (the ones a matrix × vector product uses) are tuned separately in `avx2/lut8.rs` (Q4_0,
//! IQ4_NL, MXFP4) and `avx2/q4k8.rs` (Q4_K): there the integer work of two rows shares one
//! vector or the scale loads are broadcasts, and the rows' partial sums meet in one
//! transposing reduction per float step.
//!
//! Integer products are exact for every input, an activation quant of -128 included (see
//! each kernel for its ranges): no 16-bit sum saturates.

use std::arch::x86_64::*;

mod lut8;
mod q4k8;

use super::super::legacy::{IQ4_NL_BYTES, MXFP4_BYTES, Q4_0_BYTES, Q8_0_BYTES, QK, f16_to_f32};
use super::{
    GroupedDot, Q4_0_VALUES, Q4K_BYTES, Q4K_D, Q4K_DMIN, Q4K_QS, Q4K_SCALES, Q8K_BSUMS, Q8K_BYTES,
    Q8K_QS,
};
use crate::kernels::kquants::x86::WORD_CTL;
use crate::kernels::{DotRows, DotTokens, Kernels, SumOrder};
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::{GgmlType, QK_K};

/// Rows per call of the multi-row and multi-token kernels.
const ROWS: usize = 8;
/// Activation rows per call of the multi-token kernels.
const TOKENS: usize = 4;

pub(super) fn register(k: &mut Kernels) {
    use GgmlType::*;
    let r = SumOrder::Repacked;
    k.set_dot_in(r, Q4_0, dot_q4_0);
    k.set_dot_rows_in(r, Q4_0, ROWS, dot_rows_q4_0);
    k.set_dot_tokens_in(r, Q4_0, ROWS, TOKENS, dot_tokens_q4_0);
    k.set_dot_in(r, IQ4_NL, dot_iq4_nl);
    k.set_dot_rows_in(r, IQ4_NL, ROWS, dot_rows_iq4_nl);
    k.set_dot_tokens_in(r, IQ4_NL, ROWS, TOKENS, dot_tokens_iq4_nl);
    k.set_dot_in(r, MXFP4, dot_mxfp4);
    k.set_dot_rows_in(r, MXFP4, ROWS, dot_rows_mxfp4);
    k.set_dot_tokens_in(r, MXFP4, ROWS, TOKENS, dot_tokens_mxfp4);
    k.set_dot_in(r, Q4_K, dot_q4_k);
    k.set_dot_rows_in(r, Q4_K, ROWS, dot_rows_q4_k);
    k.set_dot_tokens_in(r, Q4_K, ROWS, TOKENS, dot_tokens_q4_k);
    if k.wide() {
        k.set_dot_tokens_in(r, Q4_K, ROWS, TOKENS, dot_tokens_q4_k_wide);
    }
    if k.avx_vnni() {
        k.set_dot_rows_in(r, Q4_K, ROWS, dot_rows_q4_k_avx_vnni);
        k.set_dot_tokens_in(r, Q4_K, ROWS, TOKENS, dot_tokens_q4_k_avx_vnni);
    }
    if k.vnni() {
        k.set_dot_rows_in(r, Q4_K, ROWS, dot_rows_q4_k_vnni);
        k.set_dot_tokens_in(r, Q4_K, ROWS, TOKENS, dot_tokens_q4_k_vnni);
    }
}

/// The grouped (gemm-order) Q4_K kernels of this instruction set; the quantizer stays the
/// portable one of `scalar`.
/// (`wide`, `vnni` and `avx_vnni` as [`Kernels::wide`], [`Kernels::vnni`] and
/// [`Kernels::avx_vnni`] of the table).
pub(super) fn grouped_q4_k(
    scalar: GroupedDot,
    wide: bool,
    (vnni, avx_vnni): (bool, bool),
) -> GroupedDot {
    GroupedDot {
        dot: dot_q4_k_pairs,
        dot_rows: Some(DotRows {
            rows: ROWS,
            f: if vnni {
                dot_rows_q4_k_pairs_vnni
            } else if avx_vnni {
                dot_rows_q4_k_pairs_avx_vnni
            } else {
                dot_rows_q4_k_pairs
            },
        }),
        dot_tokens: Some(DotTokens {
            rows: ROWS,
            tokens: TOKENS,
            f: if vnni {
                dot_tokens_q4_k_pairs_vnni
            } else if avx_vnni {
                dot_tokens_q4_k_pairs_avx_vnni
            } else if wide {
                dot_tokens_q4_k_pairs_wide
            } else {
                dot_tokens_q4_k_pairs
            },
        }),
        ..scalar
    }
}

// ---------------------------------------------------------------------------------------
// Helpers.

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load256(b: &[u8]) -> __m256i {
    let b: &[u8; 32] = &b.as_chunks::<32>().0[0];
    // SAFETY: `b` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load128(b: &[u8]) -> __m128i {
    let b: &[u8; 16] = &b.as_chunks::<16>().0[0];
    // SAFETY: `b` is 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[inline]
fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Lane `r` of the result is the sum of the eight i32 lanes of `v[r]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce8(v: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // Low 128 bits: rows 0-3 (g0) / 4-7 (g1), elements 0-3 of each; high: elements 4-7.
    let g0 = _mm256_hadd_epi32(h01, h23);
    let g1 = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(g0, g1),
        _mm256_permute2x128_si256::<0x31>(g0, g1),
    )
}

/// `R` consecutive weight rows of `nb` blocks of `WB` bytes each.
struct Rows<'a, const R: usize, const WB: usize> {
    rows: [&'a [[u8; WB]]; R],
}

impl<'a, const R: usize, const WB: usize> Rows<'a, R, WB> {
    /// Splits `w` (`R` rows of `nb` blocks) and checks the activation and output lengths;
    /// a violation is a caller bug (see the kernel contracts).
    #[inline]
    fn new(n: usize, qk: usize, w: &'a [u8], a_len: usize, ab: usize, out_len: usize) -> Self {
        let nb = n / qk;
        assert!(
            n.is_multiple_of(qk) && w.len() == R * nb * WB && a_len == nb * ab && out_len == R,
            "repacked-order kernel contract violated: n = {n}, {out_len} outputs for {R} rows, weight bytes {}, activation bytes {a_len}",
            w.len()
        );
        let (blocks, _) = w.as_chunks::<WB>();
        Rows {
            rows: std::array::from_fn(|r| &blocks[r * nb..(r + 1) * nb]),
        }
    }
}

/// Reads the 32-bit word at one byte offset of block `b` of each of 8 rows with one gather
/// instruction (far cheaper than eight scalar loads put together in a vector).
#[derive(Clone, Copy)]
struct RowWords {
    /// Byte distance of each row's start from row 0's, when all fit in an i32.
    offsets: Option<__m256i>,
}

impl RowWords {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn new<const WB: usize>(rows: &Rows<'_, 8, WB>) -> RowWords {
        let base = rows.rows[0].as_ptr() as isize;
        let off = |r: usize| i32::try_from(rows.rows[r].as_ptr() as isize - base).ok();
        let offsets = (1..8).all(|r| off(r).is_some()).then(|| {
            let o = |r: usize| off(r).unwrap_or(0);
            _mm256_setr_epi32(o(0), o(1), o(2), o(3), o(4), o(5), o(6), o(7))
        });
        RowWords { offsets }
    }

    /// Lane `r`: the little-endian u32 at bytes `at..at + 4` of block `b` of row `r`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn get<const WB: usize>(&self, rows: &Rows<'_, 8, WB>, b: usize, at: usize) -> __m256i {
        assert!(at + 4 <= WB, "word at {at} beyond a block of {WB} bytes");
        let word = |r: usize| {
            let x = &rows.rows[r][b];
            i32::from_le_bytes([x[at], x[at + 1], x[at + 2], x[at + 3]])
        };
        match self.offsets {
            Some(offsets) => {
                let base: *const u8 = rows.rows[0][b][at..].as_ptr();
                // SAFETY: lane r reads the 4 bytes at `base + offsets[r]`, which is byte
                // `at` (at most WB - 4) of block `b` of row `r`: every row has the same
                // number of blocks (`Rows::new`), so block `b` exists in each, and
                // `offsets[r]` is row r's distance from row 0.
                unsafe { _mm256_i32gather_epi32::<1>(base.cast(), offsets) }
            }
            None => _mm256_setr_epi32(
                word(0),
                word(1),
                word(2),
                word(3),
                word(4),
                word(5),
                word(6),
                word(7),
            ),
        }
    }
}

/// Lanes `0..R` of `v` to `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store<const R: usize>(v: __m256, out: &mut [f32]) {
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` is 8 writable f32; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
    out[..R].copy_from_slice(&lanes[..R]);
}

/// The 16-entry table in both 128-bit lanes, for `shuffle_epi8` lookups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lut(t: &[i8; 16]) -> __m256i {
    let b: [u8; 16] = t.map(|v| v as u8);
    _mm256_broadcastsi128_si256(load128(&b))
}

// ---------------------------------------------------------------------------------------
// Q4_0, IQ4_NL, MXFP4: one running total per row.

/// How a 32-element lookup-table type turns its nibbles into products with the activation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Decode {
    /// Values `table[q] - c` with `table[q]` in `0..=24`: `maddubs(table[q], a)` is exact,
    /// and `c · Σa` is subtracted once per block for all rows.
    Offset(i32),
    /// Signed values up to 127 in magnitude: `maddubs(|a|, sign(table[q], a))`.
    Signed,
}

/// Sum of the eight i32 lanes of `v`, in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn splat_sum(v: __m256i) -> __m256i {
    let t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0x4e>(t));
    let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0xb1>(t));
    _mm256_broadcastd_epi32(t)
}

/// The f16 at byte `at` of block `b` of each of the `R` rows as 8 f32 lanes (0 beyond `R`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_lanes<const R: usize, const WB: usize>(
    rows: &Rows<'_, R, WB>,
    b: usize,
    at: usize,
) -> __m256 {
    let h = |r: usize| {
        if r < R {
            le16(&rows.rows[r][b], at) as i16
        } else {
            0
        }
    };
    _mm256_cvtph_ps(_mm_setr_epi16(
        h(0),
        h(1),
        h(2),
        h(3),
        h(4),
        h(5),
        h(6),
        h(7),
    ))
}

/// The halved E8M0 scale at byte `at` of block `b` of each of the `R` rows as 8 f32 lanes
/// (as [`e8m0_to_f32_half`]: `2^(e-128)`, subnormal for e < 2).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn e8m0_lanes<const R: usize, const WB: usize>(
    rows: &Rows<'_, R, WB>,
    b: usize,
    at: usize,
) -> __m256 {
    let e = |r: usize| {
        if r < R {
            i32::from(rows.rows[r][b][at])
        } else {
            0
        }
    };
    let e = _mm256_setr_epi32(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7));
    let one = _mm256_set1_epi32(1);
    let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, one));
    let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let bits = _mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(e, one));
    _mm256_castsi256_ps(bits)
}

/// `R` rows of a 32-element lookup-table type (quants from byte `qs` of each block, decoded
/// by `table` as `decode` says, block scales from `d_w`) against one Q8_0 row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn lut4_rows<const R: usize, const WB: usize>(
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    qs: usize,
    table: Option<&[i8; 16]>,
    decode: Decode,
    d_w: impl Fn(&Rows<'_, R, WB>, usize) -> __m256,
) {
    let rows = Rows::<R, WB>::new(n, QK, w, a.len(), Q8_0_BYTES, out.len());
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let table = table.map(|t| lut(t));
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (b, y) in a.iter().enumerate() {
        let ya = load256(&y[2..]);
        let ya_abs = _mm256_sign_epi8(ya, ya);
        let mut sums = [_mm256_setzero_si256(); 8];
        for (r, s) in sums.iter_mut().enumerate().take(R) {
            let raw = load128(&rows.rows[r][b][qs..]);
            // Elements 0..16 are the low nibbles, 16..32 the high nibbles.
            let nib = _mm256_and_si256(
                _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(raw), _mm_srli_epi16::<4>(raw)),
                m4,
            );
            let xv = table.map_or(nib, |t| _mm256_shuffle_epi8(t, nib));
            let p = match decode {
                Decode::Offset(_) => _mm256_maddubs_epi16(xv, ya),
                Decode::Signed => _mm256_maddubs_epi16(ya_abs, _mm256_sign_epi8(xv, ya)),
            };
            *s = _mm256_madd_epi16(p, ones);
        }
        let mut total = reduce8(&sums);
        if let Decode::Offset(c) = decode {
            let ca = _mm256_maddubs_epi16(_mm256_set1_epi8(c as i8), ya);
            total = _mm256_sub_epi32(total, splat_sum(_mm256_madd_epi16(ca, ones)));
        }
        let scale = _mm256_mul_ps(d_w(&rows, b), _mm256_set1_ps(f16_to_f32(le16(y, 0))));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), scale, acc);
    }
    store::<R>(acc, out);
}

/// MXFP4 values plus 12 (all in `0..=24`).
const MXFP4_PLUS_12: [i8; 16] = {
    let mut t = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = KVALUES_MXFP4[i] + 12;
        i += 1;
    }
    t
};

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_rows<const R: usize, const T: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // several tokens only through the 8-row tile
    const { assert!(R == ROWS || T == 1) };
    const _: () = assert!(Q4_0_VALUES[0] == -8);
    if R == ROWS {
        return lut8::lut4_tile8::<Q4_0_BYTES, T>(
            n,
            w,
            a,
            out,
            2,
            None,
            Decode::Offset(8),
            |x, _, _, _| lut8::f16_lanes8(x, 0),
        );
    }
    lut4_rows::<R, Q4_0_BYTES>(n, w, a, out, 2, None, Decode::Offset(8), |rows, b| {
        f16_lanes(rows, b, 0)
    });
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl_rows<const R: usize, const T: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // several tokens only through the 8-row tile
    const { assert!(R == ROWS || T == 1) };
    if R == ROWS {
        return lut8::lut4_tile8::<IQ4_NL_BYTES, T>(
            n,
            w,
            a,
            out,
            2,
            Some(&KVALUES_IQ4NL),
            Decode::Signed,
            |x, _, _, _| lut8::f16_lanes8(x, 0),
        );
    }
    lut4_rows::<R, IQ4_NL_BYTES>(
        n,
        w,
        a,
        out,
        2,
        Some(&KVALUES_IQ4NL),
        Decode::Signed,
        |rows, b| f16_lanes(rows, b, 0),
    );
}

#[target_feature(enable = "avx2,fma,f16c")]
fn mxfp4_rows<const R: usize, const T: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // several tokens only through the 8-row tile
    const { assert!(R == ROWS || T == 1) };
    if R == ROWS {
        return lut8::lut4_tile8::<MXFP4_BYTES, T>(
            n,
            w,
            a,
            out,
            1,
            Some(&MXFP4_PLUS_12),
            Decode::Offset(12),
            |_, g, rows, b| lut8::e8m0_lanes8(g, rows, b, 0),
        );
    }
    lut4_rows::<R, MXFP4_BYTES>(
        n,
        w,
        a,
        out,
        1,
        Some(&MXFP4_PLUS_12),
        Decode::Offset(12),
        |rows, b| e8m0_lanes(rows, b, 0),
    );
}

// ---------------------------------------------------------------------------------------
// Q4_K.

/// The 12 scale bytes of a Q4_K block at `b[off..off + 12]` unpacked into 16 bytes: the
/// eight 6-bit scales, then the eight 6-bit mins (as [`q4_k_scales_mins`]). Reads 16 bytes
/// from `off`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_scales_mins(b: &[u8], off: usize) -> __m128i {
    let v = load128(&b[off..]);
    // Words of `a`: s[0..4], s[8..12], s[4..8], s[8..12].
    let a = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
    );
    // Words of `h`: 0, s[0..4], 0, s[4..8] (their top two bits are the high bits of
    // scales 4..8 and mins 4..8).
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

/// Lane `r` of result `p` is lane `p` of `m[r]` (four pair-sums of each of 8 rows to one
/// vector per pair).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose_pairs(m: &[__m128i; 8]) -> [__m256i; 4] {
    let v = |r: usize| _mm256_set_m128i(m[r + 4], m[r]);
    let (v0, v1, v2, v3) = (v(0), v(1), v(2), v(3));
    let t0 = _mm256_unpacklo_epi32(v0, v1);
    let t1 = _mm256_unpacklo_epi32(v2, v3);
    let t2 = _mm256_unpackhi_epi32(v0, v1);
    let t3 = _mm256_unpackhi_epi32(v2, v3);
    [
        _mm256_unpacklo_epi64(t0, t1),
        _mm256_unpackhi_epi64(t0, t1),
        _mm256_unpacklo_epi64(t2, t3),
        _mm256_unpackhi_epi64(t2, t3),
    ]
}

/// Eight i32 partial sums of `scale · Σ q·a` over sub-blocks `2p` and `2p + 1` of the Q4_K
/// block `x` against the Q8_K block `y` (`scales`: the block's eight scales as i16 in both
/// 128-bit lanes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k_pair(
    x: &[u8; Q4K_BYTES],
    y: &[u8; Q8K_BYTES],
    p: usize,
    scales: __m256i,
    m4: __m256i,
) -> __m256i {
    let ya = load256(&y[Q8K_QS + 64 * p..]);
    let yb = load256(&y[Q8K_QS + 64 * p + 32..]);
    let raw = load256(&x[Q4K_QS + 32 * p..]);
    let lo = _mm256_and_si256(raw, m4);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
    // Nibbles (0..=15) times activation quants: pair sums at most 2 · 15 · 128.
    let plo = _mm256_maddubs_epi16(lo, ya);
    let phi = _mm256_maddubs_epi16(hi, yb);
    // Through `black_box`: with visible constants the compiler turns each `vpshufb` into two
    // shuffles.
    let ctl = std::hint::black_box(&WORD_CTL);
    _mm256_add_epi32(
        _mm256_madd_epi16(plo, _mm256_shuffle_epi8(scales, load256(&ctl[2 * p]))),
        _mm256_madd_epi16(phi, _mm256_shuffle_epi8(scales, load256(&ctl[2 * p + 1]))),
    )
}

/// `R` rows of Q4_K against one Q8_K row; `PAIRS` selects the gemm order (float steps per
/// pair of sub-blocks) over the gemv order (per super-block).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k_rows<const R: usize, const PAIRS: bool>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let rows = Rows::<R, Q4K_BYTES>::new(n, QK_K, w, a.len(), Q8K_BYTES, out.len());
    let (a, _) = a.as_chunks::<Q8K_BYTES>();
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = _mm256_setzero_ps();
    for (b, y) in a.iter().enumerate() {
        // Sums of the activation quants per 32-element sub-block (i16, at most 32 · 128).
        let bs = load256(&y[Q8K_BSUMS..]);
        let sub_sums = _mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        );
        let mut scales = [_mm256_setzero_si256(); 8];
        let mut mins = [_mm_setzero_si128(); 8];
        for r in 0..R {
            let sm = k4_scales_mins(&rows.rows[r][b], Q4K_SCALES);
            scales[r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
            // Per pair of sub-blocks: min · sum + min · sum.
            mins[r] = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128::<8>(sm)), sub_sums);
        }
        let da = _mm256_set1_ps(f32::from_le_bytes([y[0], y[1], y[2], y[3]]));
        let d = _mm256_mul_ps(f16_lanes(&rows, b, Q4K_D), da);
        let dmin = _mm256_mul_ps(f16_lanes(&rows, b, Q4K_DMIN), da);
        let min_pairs = transpose_pairs(&mins);
        if PAIRS {
            for (p, &mp) in min_pairs.iter().enumerate() {
                let mut sums = [_mm256_setzero_si256(); 8];
                for (r, s) in sums.iter_mut().enumerate().take(R) {
                    *s = q4_k_pair(&rows.rows[r][b], y, p, scales[r], m4);
                }
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(&sums)), d, acc);
                acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mp), dmin, acc_min);
            }
        } else {
            // One integer total per row over the whole super-block, one reduction.
            let mut sums = [_mm256_setzero_si256(); 8];
            for (r, s) in sums.iter_mut().enumerate().take(R) {
                let x = &rows.rows[r][b];
                let p01 = _mm256_add_epi32(
                    q4_k_pair(x, y, 0, scales[r], m4),
                    q4_k_pair(x, y, 1, scales[r], m4),
                );
                let p23 = _mm256_add_epi32(
                    q4_k_pair(x, y, 2, scales[r], m4),
                    q4_k_pair(x, y, 3, scales[r], m4),
                );
                *s = _mm256_add_epi32(p01, p23);
            }
            let [m0, m1, m2, m3] = min_pairs;
            let m = _mm256_add_epi32(_mm256_add_epi32(m0, m1), _mm256_add_epi32(m2, m3));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(&sums)), d, acc);
            acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dmin, acc_min);
        }
    }
    store::<R>(_mm256_sub_ps(acc, acc_min), out);
}

// ---------------------------------------------------------------------------------------
// DotFn / DotRowsFn wrappers. They are registered only in a table built for `Isa::Avx2`,
// which `Kernels::detect` builds only after it detected AVX2, FMA and F16C at run time.

macro_rules! wrap {
    ($($one:ident, $many:ident => $imp:ident $(::<$pairs:literal>)?;)*) => {$(
        fn $one(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let mut out = [0f32];
            // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the
            // features the kernel is compiled for.
            unsafe { $imp::<1 $(, $pairs)?>(n, w, a, &mut out) };
            out[0]
        }
        fn $many(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
            // SAFETY: as above.
            unsafe { $imp::<ROWS $(, $pairs)?>(n, w, a, out) }
        }
    )*};
}

wrap! {
    dot_q4_0, dot_rows_q4_0 => q4_0_rows::<1>;
    dot_iq4_nl, dot_rows_iq4_nl => iq4_nl_rows::<1>;
    dot_mxfp4, dot_rows_mxfp4 => mxfp4_rows::<1>;
}

fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    // SAFETY: only reachable through an AVX2 table (see above), so the CPU has the features
    // the kernel is compiled for.
    unsafe { q4_k_rows::<1, false>(n, w, a, &mut out) };
    out[0]
}

fn dot_q4_k_pairs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    // SAFETY: as in `dot_q4_k`.
    unsafe { q4_k_rows::<1, true>(n, w, a, &mut out) };
    out[0]
}

fn dot_rows_q4_k(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_q4_k`.
    unsafe { q4k8::q4_k_rows8::<false>(n, w, a, out) }
}

fn dot_rows_q4_k_pairs(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_q4_k`.
    unsafe { q4k8::q4_k_rows8::<true>(n, w, a, out) }
}

fn dot_tokens_q4_k(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_q4_k`.
    unsafe { q4k8::q4_k_tile8::<false, TOKENS>(n, w, a, out) }
}

fn dot_tokens_q4_k_pairs(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_q4_k`.
    unsafe { q4k8::q4_k_tile8::<true, TOKENS>(n, w, a, out) }
}

// The wide builds: registered only in an AVX2 table built with `wide`, which
// `Kernels::detect` builds only after it detected AVX-512F, VL and BW at run time.

fn dot_tokens_q4_k_wide(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_q4_k`, and the CPU has AVX-512F, VL and BW (see above).
    unsafe { q4k8::q4_k_tile8_wide::<false, TOKENS>(n, w, a, out) }
}

fn dot_tokens_q4_k_pairs_wide(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_tokens_q4_k_wide`.
    unsafe { q4k8::q4_k_tile8_wide::<true, TOKENS>(n, w, a, out) }
}

// The VNNI builds: registered only in an AVX2 table built with `vnni`, which
// `Kernels::detect` builds only after it detected AVX-512F, VL, BW and VNNI at run time.

fn dot_rows_q4_k_vnni(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_q4_k`, and the CPU has AVX-512F, VL, BW and VNNI (see above).
    unsafe { q4k8::q4_k_tile8_vnni::<false, 1>(n, w, a, out) }
}

fn dot_rows_q4_k_pairs_vnni(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_rows_q4_k_vnni`.
    unsafe { q4k8::q4_k_tile8_vnni::<true, 1>(n, w, a, out) }
}

fn dot_tokens_q4_k_vnni(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_rows_q4_k_vnni`.
    unsafe { q4k8::q4_k_tile8_vnni::<false, TOKENS>(n, w, a, out) }
}

fn dot_tokens_q4_k_pairs_vnni(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_rows_q4_k_vnni`.
    unsafe { q4k8::q4_k_tile8_vnni::<true, TOKENS>(n, w, a, out) }
}

// The AVX-VNNI builds: registered only in an AVX2 table built with `avx_vnni`, which
// `Kernels::detect` builds only after it detected AVX-VNNI at run time.

fn dot_rows_q4_k_avx_vnni(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_q4_k`, and the CPU has AVX-VNNI (see above).
    unsafe { q4k8::q4_k_tile8_avx_vnni::<false, 1>(n, w, a, out) }
}

fn dot_rows_q4_k_pairs_avx_vnni(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_rows_q4_k_avx_vnni`.
    unsafe { q4k8::q4_k_tile8_avx_vnni::<true, 1>(n, w, a, out) }
}

fn dot_tokens_q4_k_avx_vnni(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_rows_q4_k_avx_vnni`.
    unsafe { q4k8::q4_k_tile8_avx_vnni::<false, TOKENS>(n, w, a, out) }
}

fn dot_tokens_q4_k_pairs_avx_vnni(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_rows_q4_k_avx_vnni`.
    unsafe { q4k8::q4_k_tile8_avx_vnni::<true, TOKENS>(n, w, a, out) }
}

fn dot_tokens_q4_0(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_q4_k`.
    unsafe { q4_0_rows::<ROWS, TOKENS>(n, w, a, out) }
}

fn dot_tokens_iq4_nl(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_q4_k`.
    unsafe { iq4_nl_rows::<ROWS, TOKENS>(n, w, a, out) }
}

fn dot_tokens_mxfp4(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // SAFETY: as in `dot_q4_k`.
    unsafe { mxfp4_rows::<ROWS, TOKENS>(n, w, a, out) }
}
