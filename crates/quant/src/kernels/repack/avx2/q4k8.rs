//! The 8-row Q4_K kernels of [`SumOrder::Repacked`](crate::kernels::SumOrder::Repacked)
//! (gemv and gemm order).
//!
//! Lane `r` of every float vector belongs to weight row `r`, and performs the scalar
//! kernel's fused multiply-adds on that row in the scalar kernel's order. Only the integer
//! totals, which are exact, are formed differently:
//!
//! * the rows' scale bytes are unpacked two rows (`r`, `r + 4`) per vector, and the sub-block
//!   scales go to a small buffer as 32-bit words (the scale twice as 16-bit values), from
//!   which the inner loop broadcasts them with plain loads (no shuffle per sub-block);
//! * each row accumulates its `scale · Σ q·a` products in eight i32 lanes over the whole
//!   float step (a super-block for the gemv order, a pair of sub-blocks for the gemm order),
//!   and one transposing reduction turns the eight rows' vectors into one vector of row
//!   totals;
//! * the minimums of rows `r` and `r + 4` meet the activation sub-block sums in one
//!   `vpmaddwd`, and three horizontal adds (gemv) or a 4 × 4 transpose (gemm) put them in
//!   row lanes.
//!
//! The kernel also prefetches the first line of the current block of each of the next
//! call's rows (matrix × vector callers take consecutive groups of eight rows), as the
//! VecDot multi-row kernels do: every row is its own stream of addresses, which the hardware
//! prefetchers pick up slowly.

use std::arch::x86_64::*;

use super::super::{Q4K_BYTES, Q4K_D, Q4K_QS, Q4K_SCALES, Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
use super::{Rows, load128, load256, store};
use crate::QK_K;

const ROWS: usize = 8;

/// A buffer on a cache-line boundary: vectors stored to it and read back with scalar-sized
/// loads are forwarded only when the store does not straddle two lines.
#[repr(C, align(64))]
struct Aligned<T>(T);

/// `body` four times with `j` = 0, 1, 2, 3 as constants.
macro_rules! unroll4 {
    ($j:ident => $body:block) => {{
        {
            let $j: usize = 0;
            $body
        }
        {
            let $j: usize = 1;
            $body
        }
        {
            let $j: usize = 2;
            $body
        }
        {
            let $j: usize = 3;
            $body
        }
    }};
}

/// The first 16 bytes of the Q4_K blocks `x0` (low 128-bit lane) and `x1` (high lane):
/// `d`, `dmin` and the 12 scale bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn heads_x2(x0: &[u8; Q4K_BYTES], x1: &[u8; Q4K_BYTES]) -> __m256i {
    const { assert!(Q4K_D == 0 && super::super::Q4K_DMIN == 2 && Q4K_SCALES == 4) };
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(load128(x0)), load128(x1))
}

/// The 12 scale bytes of each 128-bit lane of `v` (block heads as [`heads_x2`] loads them)
/// unpacked into 16 bytes: eight 6-bit scales, then eight 6-bit mins.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales_mins_x2(v: __m256i) -> __m256i {
    // Words of `a`: s[0..4], s[8..12], s[4..8], s[8..12] (s = bytes 4..16 of the head).
    let a = _mm256_shuffle_epi8(
        v,
        _mm256_broadcastsi128_si256(_mm_setr_epi8(
            4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15,
        )),
    );
    // Words of `h`: 0, s[0..4], 0, s[4..8] (their top two bits are the high bits of scales
    // 4..8 and mins 4..8).
    let h = _mm256_shuffle_epi8(
        v,
        _mm256_broadcastsi128_si256(_mm_setr_epi8(
            -1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11,
        )),
    );
    let low = _mm256_and_si256(
        _mm256_srlv_epi32(a, _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4)),
        _mm256_broadcastsi128_si256(_mm_setr_epi32(
            0x3f3f_3f3f,
            0x0f0f_0f0f,
            0x3f3f_3f3f,
            0x0f0f_0f0f,
        )),
    );
    let high = _mm256_and_si256(_mm256_srli_epi32::<2>(h), _mm256_set1_epi8(0x30));
    _mm256_or_si256(low, high)
}

/// `vpshufb` control (both lanes) that turns unpacked scale bytes `4h..4h + 4` into four
/// 32-bit words, each the scale twice as 16-bit values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_words_ctl(h: i8) -> __m256i {
    let b = 4 * h;
    _mm256_broadcastsi128_si256(_mm_setr_epi8(
        b,
        -1,
        b,
        -1,
        b + 1,
        -1,
        b + 1,
        -1,
        b + 2,
        -1,
        b + 2,
        -1,
        b + 3,
        -1,
        b + 3,
        -1,
    ))
}

/// `vpshufb` control (both lanes) that zero-extends unpacked bytes 8..16 (the mins) to 16
/// bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mins_ctl() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_setr_epi8(
        8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15, -1,
    ))
}

/// Lane `r` of the result is the sum of the eight i32 lanes of `v[r]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce8(v: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // Both 128-bit lanes of g0 hold rows 0-3 (elements 0-3 in the low one, 4-7 in the
    // high one); g1 likewise rows 4-7.
    let g0 = _mm256_hadd_epi32(h01, h23);
    let g1 = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_blend_epi32::<0xf0>(g0, g1),
        _mm256_permute2x128_si256::<0x21>(g0, g1),
    )
}

/// `(d · da, dmin · da)` of eight blocks, row `r`'s in lane `r` of each, from their heads
/// (rows p and p + 4 in `heads[p]`, as [`heads_x2`] loads them).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn d_dmin(heads: &[__m256i; 4], da: __m256) -> (__m256, __m256) {
    // The first word (d, dmin) of each lane: rows 0..4 in the low lane, 4..8 in the high.
    let v = _mm256_unpacklo_epi64(
        _mm256_unpacklo_epi32(heads[0], heads[1]),
        _mm256_unpacklo_epi32(heads[2], heads[3]),
    );
    // Per 128-bit lane: the four d, then the four dmin.
    let s = _mm256_shuffle_epi8(
        v,
        _mm256_broadcastsi128_si256(_mm_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
        )),
    );
    // The eight d in the low lane, the eight dmin in the high lane.
    let s = _mm256_permute4x64_epi64::<0xd8>(s);
    (
        _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(s)), da),
        _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256::<1>(s)), da),
    )
}

/// 8 rows of Q4_K against one Q8_K row; `PAIRS` selects the gemm order (float steps per
/// pair of sub-blocks) over the gemv order (per super-block).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4_k_rows8<const PAIRS: bool>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let rows = Rows::<ROWS, Q4K_BYTES>::new(n, QK_K, w, a.len(), Q8K_BYTES, out.len());
    let (a, _) = a.as_chunks::<Q8K_BYTES>();
    let nb = a.len();
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = _mm256_setzero_ps();
    // Scale words of rows p and p + 4: sbuf[2p] sub-blocks 0..4, sbuf[2p + 1] sub-blocks
    // 4..8; row p's in words 0..4, row p + 4's in words 4..8.
    let mut sbuf = Aligned([[0i32; 8]; 8]);
    for (b, y) in a.iter().enumerate() {
        let x: [&[u8; Q4K_BYTES]; ROWS] = std::array::from_fn(|r| &rows.rows[r][b]);
        for xr in x {
            // A prefetch is a hint: it never faults, whatever the address (past the end of
            // the matrix it is merely wasted).
            _mm_prefetch::<_MM_HINT_T0>(xr.as_ptr().wrapping_add(ROWS * nb * Q4K_BYTES).cast());
        }

        // Sums of the activation quants per 32-element sub-block (i16), both lanes.
        let bs = load256(&y[Q8K_BSUMS..]);
        let q8s = _mm256_broadcastsi128_si256(_mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        ));
        // Per pair of sub-blocks j: min · sum + min · sum of row p (lanes 0..4) and row
        // p + 4 (lanes 4..8).
        let heads: [__m256i; 4] = std::array::from_fn(|p| heads_x2(x[p], x[p + 4]));
        let mut mp = [_mm256_setzero_si256(); 4];
        for (p, m) in mp.iter_mut().enumerate() {
            let sm = scales_mins_x2(heads[p]);
            for h in 0..2 {
                let words = _mm256_shuffle_epi8(sm, scale_words_ctl(h as i8));
                // SAFETY: `sbuf[2p + h]` is 32 writable bytes; `storeu` has no alignment
                // requirement.
                unsafe { _mm256_storeu_si256(sbuf.0[2 * p + h].as_mut_ptr().cast(), words) };
            }
            *m = _mm256_madd_epi16(_mm256_shuffle_epi8(sm, mins_ctl()), q8s);
        }
        let da = _mm256_set1_ps(f32::from_le_bytes([y[0], y[1], y[2], y[3]]));
        let (d, dmin) = d_dmin(&heads, da);
        // Read the scale words back from memory: a broadcast load costs no shuffle.
        let sb = std::hint::black_box(&sbuf.0);
        let sw =
            |r: usize, i: usize| _mm256_set1_epi32(sb[2 * (r % 4) + i / 4][4 * (r / 4) + i % 4]);
        // `scale · Σ q·a` of sub-blocks 2j and 2j + 1 of row r, in eight i32 lanes.
        let pair = |r: usize, j: usize, q8l: __m256i, q8h: __m256i| {
            let bits = load256(&x[r][Q4K_QS + 32 * j..]);
            let ql = _mm256_and_si256(bits, m4);
            let qh = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            // Nibbles (0..=15) times activation quants: pair sums at most 2 · 15 · 128.
            let pl = _mm256_madd_epi16(sw(r, 2 * j), _mm256_maddubs_epi16(ql, q8l));
            let ph = _mm256_madd_epi16(sw(r, 2 * j + 1), _mm256_maddubs_epi16(qh, q8h));
            _mm256_add_epi32(pl, ph)
        };
        if PAIRS {
            // Row r's pair-j min term in lane r of min_pairs[j].
            let t0 = _mm256_unpacklo_epi32(mp[0], mp[1]);
            let t1 = _mm256_unpacklo_epi32(mp[2], mp[3]);
            let t2 = _mm256_unpackhi_epi32(mp[0], mp[1]);
            let t3 = _mm256_unpackhi_epi32(mp[2], mp[3]);
            let min_pairs = [
                _mm256_unpacklo_epi64(t0, t1),
                _mm256_unpackhi_epi64(t0, t1),
                _mm256_unpacklo_epi64(t2, t3),
                _mm256_unpackhi_epi64(t2, t3),
            ];
            unroll4!(j => {
                let q8l = load256(&y[Q8K_QS + 64 * j..]);
                let q8h = load256(&y[Q8K_QS + 64 * j + 32..]);
                let s: [__m256i; ROWS] = std::array::from_fn(|r| pair(r, j, q8l, q8h));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(&s)), d, acc);
                acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_pairs[j]), dmin, acc_min);
            });
        } else {
            let mins = _mm256_hadd_epi32(
                _mm256_hadd_epi32(mp[0], mp[1]),
                _mm256_hadd_epi32(mp[2], mp[3]),
            );
            let mut sumi = [_mm256_setzero_si256(); ROWS];
            unroll4!(j => {
                let q8l = load256(&y[Q8K_QS + 64 * j..]);
                let q8h = load256(&y[Q8K_QS + 64 * j + 32..]);
                for (r, s) in sumi.iter_mut().enumerate() {
                    *s = _mm256_add_epi32(*s, pair(r, j, q8l, q8h));
                }
            });
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(&sumi)), d, acc);
            acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), dmin, acc_min);
        }
    }
    store::<ROWS>(_mm256_sub_ps(acc, acc_min), out);
}
