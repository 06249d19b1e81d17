//! AVX2/FMA multi-row kernels: several consecutive k-quant weight rows (plain GGUF layout,
//! read in place) × one Q8_K activation row.
//!
//! Each row goes through exactly the float operations of its single-row kernel in
//! `x86.rs` (same lanes, same fused multiply-adds, same final reduction), so every result
//! is bit-identical to `dot` on that row. The integer sums of a super-block are exact, so
//! they may be formed differently as long as each of the eight i32 lanes ends with the same
//! total; the kernels use that to spend fewer instructions per block than the single-row
//! ones:
//!
//! * Q4_K / Q5_K: the sub-block scales of two rows are unpacked in one 256-bit vector and
//!   stored as 32-bit words (the scale twice as 16-bit values) that the inner loop
//!   broadcasts with plain loads instead of one shuffle per sub-block; the minimums of two
//!   rows meet the activation pair sums in one `vpmaddwd`; the f16 `(d, dmin)` pairs of
//!   four rows are converted at once. Q5_K's fifth bits are moved into place with one
//!   shift and one mask per sub-block.
//! * Q6_K: a chunk's two group scales come from the sign-extended scales (needed anyway for
//!   the −32 offset) with one shuffle; the f16 scales of four rows are converted at once.
//!
//! The rows also share the activation loads, the activation group sums, the loop and the
//! call, and the kernels prefetch the rows of the next call (see [`prefetch_next_rows`]).

use std::arch::x86_64::*;

use super::layout::{q4k, q5k, q6k};
use super::x86::{Q8KBlock, add_madd, add_madd_vnni, hsum_ps, load128, load256};
use super::{Q8K_BSUMS, Q8K_QS, check_dot, f32_at, u32_at};
use crate::kernels::Kernels;
use crate::{GgmlType, QK_K};

// Rows per call, and lines of the next rows prefetched per block and row (see
// `prefetch_next_rows`), chosen by measurement (`examples/rows_bench_k.rs`) on rows of 768
// to 2048 elements: fewer rows share less, more rows spill registers; more prefetches cost
// more than they save.
const ROWS_Q4K: usize = 8;
const ROWS_Q5K: usize = 8;
const ROWS_Q6K: usize = 4;
const PREFETCH_Q4K: usize = 1;
const PREFETCH_Q5K: usize = 1;
const PREFETCH_Q6K: usize = 2;
/// Distance between prefetched addresses: two lines, as the L2 cache fetches lines in
/// aligned pairs.
const PREFETCH_STEP: usize = 128;

pub(super) fn register(k: &mut Kernels) {
    k.set_dot_rows(GgmlType::Q4_K, ROWS_Q4K, dot_rows_q4_k);
    k.set_dot_rows(GgmlType::Q5_K, ROWS_Q5K, dot_rows_q5_k);
    k.set_dot_rows(GgmlType::Q6_K, ROWS_Q6K, dot_rows_q6_k);
    if k.vnni() {
        k.set_dot_rows(GgmlType::Q6_K, ROWS_Q6K, dot_rows_q6_k_vnni);
    }
}

/// Split `w` into `R` rows of whole blocks after checking the [`super::super::DotRowsFn`]
/// contract (each row against `a` as [`check_dot`] does for one row).
#[inline]
fn split_rows<'w, const R: usize, const B: usize>(
    ty: GgmlType,
    n: usize,
    w: &'w [u8],
    a: &[u8],
    out: &[f32],
) -> [&'w [[u8; B]]; R] {
    assert_eq!(out.len(), R, "{ty} dot_rows: takes {R} rows per call");
    let row_bytes = n / QK_K * B;
    assert_eq!(w.len(), R * row_bytes, "{ty} dot_rows: weight rows length");
    std::array::from_fn(|r| {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        check_dot(ty, n, row, a);
        row.as_chunks::<B>().0
    })
}

/// Plain-`fn` entry points with the `DotRowsFn` signature. They are registered only in the
/// AVX2 table, which [`Kernels::detect`] builds only after runtime detection of AVX2, FMA
/// and F16C; the `vnni` ones only in a table with [`Kernels::vnni`], built only after
/// runtime detection of AVX-512F, VL, BW and VNNI too.
macro_rules! entry {
    ($name:ident, $ty:expr, $rows:expr, $bytes:expr, $kernel:ident) => {
        entry!(@features $name, $ty, $rows, $bytes, $kernel, "avx2", "fma", "f16c");
    };
    ($name:ident, $ty:expr, $rows:expr, $bytes:expr, $kernel:ident, vnni) => {
        entry!(
            @features $name, $ty, $rows, $bytes, $kernel,
            "avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512bw", "avx512vnni"
        );
    };
    (@features $name:ident, $ty:expr, $rows:expr, $bytes:expr, $kernel:ident, $($feature:tt),+) => {
        fn $name(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
            let rows = split_rows::<{ $rows }, { $bytes }>($ty, n, w, a, out);
            debug_assert!($(is_x86_feature_detected!($feature))&&+);
            let (a, _) = a.as_chunks::<{ super::Q8K_BYTES }>();
            let out: &mut [f32; $rows] = out.try_into().expect("length checked above");
            // SAFETY: this function is only reachable through a kernel table built after run-time
            // detection of the features `$kernel` enables (see the macro's documentation).
            unsafe { $kernel(rows, a, out) }
        }
    };
}

entry!(
    dot_rows_q4_k,
    GgmlType::Q4_K,
    ROWS_Q4K,
    q4k::BYTES,
    q4k_rows
);
entry!(
    dot_rows_q5_k,
    GgmlType::Q5_K,
    ROWS_Q5K,
    q5k::BYTES,
    q5k_rows
);
entry!(
    dot_rows_q6_k,
    GgmlType::Q6_K,
    ROWS_Q6K,
    q6k::BYTES,
    q6k_rows
);
entry!(
    dot_rows_q6_k_vnni,
    GgmlType::Q6_K,
    ROWS_Q6K,
    q6k::BYTES,
    q6k_rows_vnni,
    vnni
);

/// `body` four times with `j` = 0, 1, 2, 3 (constants, so that per-`j` choices such as shift
/// counts fold; the compiler does not always unroll the loop by itself).
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

/// `body` for `r` = 0, 1, …, `R - 1` (up to 8) as separate copies: each row's loads then
/// come from their own instructions, which the hardware stride prefetcher tracks separately.
macro_rules! unroll_rows {
    ($rows:expr, $r:ident => $body:block) => {{
        unroll_rows!(@ $rows, $r, $body, 0 1 2 3 4 5 6 7)
    }};
    (@ $rows:expr, $r:ident, $body:block, $($k:literal)*) => {{
        $(
            if $k < $rows {
                let $r: usize = $k;
                $body
            }
        )*
    }};
}

/// Prefetch the start of block `b` (`lines` addresses, [`PREFETCH_STEP`] apart) of each of
/// the `R` rows that follow the kernel's rows in memory, given block `b` of each of its rows
/// (`nb` blocks per row).
///
/// Callers of a multi-row kernel take consecutive groups of rows (a matrix times a vector),
/// so these are the next call's rows. Each row of a group is a separate stream of
/// addresses, and the hardware prefetchers start every stream with a few misses; when the
/// matrix is not in the core's own cache these cost more than the sharing saves, while one
/// row at a time reads the matrix as a single stream. Prefetch instructions never fault and
/// do not change any result; past the end of the matrix they are merely wasted.
#[inline]
#[target_feature(enable = "avx2")]
fn prefetch_next_rows<const R: usize, const B: usize>(x: [&[u8; B]; R], nb: usize, lines: usize) {
    for xr in x {
        let next = xr.as_ptr().wrapping_add(R * nb * B);
        for k in 0..lines {
            let off = (PREFETCH_STEP * k).min(B - 1);
            // A prefetch is a hint, not an access: it never faults, whatever the address.
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(off).cast());
        }
    }
}

/// A buffer on a cache-line boundary. The kernels store vectors to small buffers and read
/// them back with scalar-sized loads; a vector stored across two lines is not forwarded to
/// those loads (they wait until the store reaches the cache), which made the kernels up to
/// 15% slower depending on where the stack happened to be.
#[repr(C, align(64))]
struct Aligned<T>(T);

/// The final reduction of the Q4_K kernel's minimum accumulator (four lanes), as the
/// single-row kernel does it.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum4_ps(m: __m128) -> f32 {
    let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_add_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// Lane of row `i` (of a group of four) in the vector made by [`f16_pairs_times`]: the
/// rows are converted in the order 0, 2, 1, 3 so that rows 0 and 1 land in different
/// 128-bit lanes (as do rows 2 and 3).
const PAIR_LANE: [usize; 4] = [0, 4, 2, 6];

/// `(d · yd, dmin · yd)` of the blocks of up to four rows (the f16 pair at `off` of each),
/// row `i`'s `d` in lane `PAIR_LANE[i]` and its `dmin` in the next lane. The conversion from
/// f16 is exact and the product is the single-row kernel's.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16_pairs_times<const N: usize>(x: [&[u8]; N], off: usize, yd: __m256) -> __m256 {
    let mut p = [0i32; 4];
    for (i, x) in x.iter().enumerate() {
        p[PAIR_LANE[i] / 2] = u32_at(x, off) as i32;
    }
    let h = _mm_setr_epi32(p[0], p[1], p[2], p[3]);
    _mm256_mul_ps(_mm256_cvtph_ps(h), yd)
}

/// [`super::x86::k4_scales_mins`] for two blocks at once: the low 128-bit lane holds `x0`'s
/// sixteen unpacked bytes (eight scales, eight minimums), the high lane `x1`'s.
#[inline]
#[target_feature(enable = "avx2")]
fn k4_scales_mins_x2(x0: &[u8], x1: &[u8], off: usize) -> __m256i {
    let v =
        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(load128(x0, off)), load128(x1, off));
    let a = _mm256_shuffle_epi8(
        v,
        _mm256_broadcastsi128_si256(_mm_setr_epi8(
            0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11,
        )),
    );
    let h = _mm256_shuffle_epi8(
        v,
        _mm256_broadcastsi128_si256(_mm_setr_epi8(
            -1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7,
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
/// 32-bit words, each the scale twice as 16-bit values: the word broadcast to a whole vector
/// multiplies a 32-element sub-block in `vpmaddwd`.
#[inline]
#[target_feature(enable = "avx2")]
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

/// `vpshufb` control (both lanes) that zero-extends unpacked bytes 8..16 (the minimums) to
/// 16 bits.
#[inline]
#[target_feature(enable = "avx2")]
fn mins_ctl() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_setr_epi8(
        8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15, -1,
    ))
}

/// The fifth bits of sub-block `i` (0..8) of a Q5_K block as 16 (or 0) per byte, from the
/// 32 `qh` bytes (bit `i` of byte `e` belongs to element `32 i + e`). The 16-bit shifts
/// move bit `i` of every byte to bit 4 of the same byte.
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

/// `R` rows of Q4_K (`Q5 = false`) or Q5_K (`Q5 = true`) blocks of `B` bytes.
///
/// Per super-block and pair of rows, the scale bytes of both rows are unpacked in one
/// 256-bit vector; the sub-block scales go to a small buffer as 32-bit words (the scale
/// twice as 16-bit values) from which the inner loop broadcasts them with plain loads, and
/// the minimums meet the activation pair sums in one `vpmaddwd` for both rows. The f16
/// `(d, dmin)` pairs of four rows are converted in one instruction.
///
/// Per row, the float steps are the single-row kernel's: `acc = fma(d·yd, sumi, acc)` in
/// eight lanes; for Q4_K `acc_m = acc_m − dmin·yd · prod` (fused) in four lanes, for Q5_K
/// `summs = summs − dmin·yd · Σprod` (fused) in one; then the same final reductions.
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_rows<const R: usize, const B: usize, const Q5: bool>(
    w: [&[[u8; B]]; R],
    a: &[Q8KBlock],
    out: &mut [f32; R],
) {
    const { assert!(R == 2 || R == 4 || R == 8) };
    const { assert!(B == if Q5 { q5k::BYTES } else { q4k::BYTES }) };
    const { assert!(q4k::DMIN == q4k::D + 2 && q5k::DMIN == q5k::D + 2) };
    let (d_off, scales_off, qs_off, qh_off) = if Q5 {
        (q5k::D, q5k::SCALES, q5k::QS, q5k::QH)
    } else {
        (q4k::D, q4k::SCALES, q4k::QS, 0)
    };
    let nb = a.len();
    let mut rows = w;
    for r in 0..R {
        rows[r] = &w[r][..nb];
    }

    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); R];
    // Q4_K: pair p (rows 2p, 2p + 1) in the low and high four lanes of acc_m[p].
    let mut acc_m = [_mm256_setzero_ps(); R];
    // Q5_K: group g (rows 4g..4g + 4) in the dmin lanes of its (d, dmin) vector.
    let mut summs = [_mm256_setzero_ps(); R];
    // Scale words of pair p: sbuf[2p] sub-blocks 0..4, sbuf[2p + 1] sub-blocks 4..8, the
    // row 2p's in words 0..4, row 2p + 1's in words 4..8.
    let mut sbuf = Aligned([[0i32; 8]; R]);
    let mut dbuf = Aligned([[0f32; 8]; R]);
    for b in 0..nb {
        let y = &a[b];
        let mut x = [&rows[0][b]; R];
        for r in 1..R {
            x[r] = &rows[r][b];
        }

        prefetch_next_rows(x, nb, if Q5 { PREFETCH_Q5K } else { PREFETCH_Q4K });
        let yd = _mm256_set1_ps(f32_at(y, 0));
        let mut dm = [_mm256_setzero_ps(); R];
        for g in 0..R.div_ceil(4) {
            dm[g] = if R - 4 * g >= 4 {
                f16_pairs_times(
                    [x[4 * g], x[4 * g + 1], x[4 * g + 2], x[4 * g + 3]],
                    d_off,
                    yd,
                )
            } else {
                f16_pairs_times([x[4 * g], x[4 * g + 1]], d_off, yd)
            };
            // SAFETY: `dbuf[g]` is 32 writable bytes; `storeu` has no alignment requirement.
            unsafe { _mm256_storeu_ps(dbuf.0[g].as_mut_ptr(), dm[g]) };
        }

        // The activation group sums added in pairs (one per 32-element sub-block), both
        // lanes.
        let q8sums = load256(y, Q8K_BSUMS);
        let q8s = _mm256_broadcastsi128_si256(_mm_hadd_epi16(
            _mm256_castsi256_si128(q8sums),
            _mm256_extracti128_si256::<1>(q8sums),
        ));
        let mut tot = [_mm256_setzero_si256(); R];
        for p in 0..R / 2 {
            let sm = k4_scales_mins_x2(x[2 * p], x[2 * p + 1], scales_off);
            for h in 0..2 {
                let words = _mm256_shuffle_epi8(sm, scale_words_ctl(h as i8));
                // SAFETY: `sbuf[2 * p + h]` is 32 writable bytes; `storeu` has no alignment
                // requirement.
                unsafe { _mm256_storeu_si256(sbuf.0[2 * p + h].as_mut_ptr().cast(), words) };
            }
            let prod = _mm256_madd_epi16(_mm256_shuffle_epi8(sm, mins_ctl()), q8s);
            if Q5 {
                // Each row's total in every lane of its half.
                let t = _mm256_add_epi32(prod, _mm256_shuffle_epi32::<0x4E>(prod));
                tot[p] = _mm256_add_epi32(t, _mm256_shuffle_epi32::<0xB1>(t));
            } else {
                let dmin = if p % 2 == 0 {
                    _mm256_permutevar8x32_ps(dm[p / 2], _mm256_setr_epi32(1, 1, 1, 1, 5, 5, 5, 5))
                } else {
                    _mm256_permutevar8x32_ps(dm[p / 2], _mm256_setr_epi32(3, 3, 3, 3, 7, 7, 7, 7))
                };
                acc_m[p] = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(prod), acc_m[p]);
            }
        }
        if Q5 {
            for g in 0..R.div_ceil(4) {
                // Rows 4g, 4g + 2, 4g + 1, 4g + 3 to lanes 1, 3, 5, 7 (their dmin lanes).
                let t = if R - 4 * g >= 4 {
                    _mm256_blend_epi32::<0b1100_1100>(tot[2 * g], tot[2 * g + 1])
                } else {
                    tot[2 * g]
                };
                summs[g] = _mm256_fnmadd_ps(dm[g], _mm256_cvtepi32_ps(t), summs[g]);
            }
        }
        // Read the scale words and d factors back from memory: a broadcast load costs no
        // shuffle.
        let sb = std::hint::black_box(&sbuf.0);
        let db = std::hint::black_box(&dbuf.0);

        let mut sumi = [_mm256_setzero_si256(); R];
        unroll4!(j => {
            let q8l = load256(y, Q8K_QS + 64 * j);
            let q8h = load256(y, Q8K_QS + 64 * j + 32);
            for r in 0..R {
                let bits = load256(x[r], qs_off + 32 * j);
                let mut ql = _mm256_and_si256(bits, m4);
                let mut qh = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                if Q5 {
                    let hb = load256(x[r], qh_off);
                    ql = _mm256_or_si256(ql, q5_high(hb, 2 * j));
                    qh = _mm256_or_si256(qh, q5_high(hb, 2 * j + 1));
                }
                let sw = |i: usize| sb[2 * (r / 2) + i / 4][4 * (r % 2) + i % 4];
                let scale_l = _mm256_set1_epi32(sw(2 * j));
                let scale_h = _mm256_set1_epi32(sw(2 * j + 1));
                let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(ql, q8l));
                let ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(qh, q8h));
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(pl, ph));
            }
        });
        for r in 0..R {
            let d = _mm256_set1_ps(db[r / 4][PAIR_LANE[r % 4]]);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }

    let mut sm = [[0f32; 8]; R];
    if Q5 {
        for g in 0..R.div_ceil(4) {
            // SAFETY: `sm[g]` is 32 writable bytes; `storeu` has no alignment requirement.
            unsafe { _mm256_storeu_ps(sm[g].as_mut_ptr(), summs[g]) };
        }
    }
    for r in 0..R {
        out[r] = if Q5 {
            hsum_ps(acc[r]) + sm[r / 4][PAIR_LANE[r % 4] + 1]
        } else {
            let m = acc_m[r / 2];
            let m = if r % 2 == 0 {
                _mm256_castps256_ps128(m)
            } else {
                _mm256_extractf128_ps::<1>(m)
            };
            hsum_ps(acc[r]) + hsum4_ps(m)
        };
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_rows<const R: usize>(w: [&[[u8; q4k::BYTES]]; R], a: &[Q8KBlock], out: &mut [f32; R]) {
    k4_rows::<R, { q4k::BYTES }, false>(w, a, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5k_rows<const R: usize>(w: [&[[u8; q5k::BYTES]]; R], a: &[Q8KBlock], out: &mut [f32; R]) {
    k4_rows::<R, { q5k::BYTES }, true>(w, a, out)
}

/// `d · yd` of the blocks of up to four rows (the f16 at `off` of each), row `i`'s in lane
/// `i` (the conversion is exact and the product is the single-row kernel's).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16s_times<const N: usize>(x: [&[u8]; N], off: usize, yd: __m128) -> __m128 {
    let mut h = [0i16; 4];
    for (h, x) in h.iter_mut().zip(x) {
        *h = i16::from_le_bytes([x[off], x[off + 1]]);
    }
    let h = _mm_setr_epi16(h[0], h[1], h[2], h[3], 0, 0, 0, 0);
    _mm_mul_ps(_mm_cvtph_ps(h), yd)
}

/// `vpshufb` controls: `CHUNK_CTL[k]` broadcasts 16-bit element `2k` of the low lane over
/// the low lane and element `2k + 1` over the high lane.
static CHUNK_CTL: [[u8; 32]; 4] = chunk_controls();

const fn chunk_controls() -> [[u8; 32]; 4] {
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
}

/// The 16-bit scales of chunk `k` (32 elements: two groups of 16) from `g` holding scales
/// `s[0..8]` of a half block in both lanes: `s[2k]` in the low lane, `s[2k + 1]` in the high
/// one (the vector the single-row kernel makes with `group16_scales` and `splat32`).
#[inline]
#[target_feature(enable = "avx2")]
fn chunk_scales(g: __m256i, k: usize) -> __m256i {
    _mm256_shuffle_epi8(g, load256(&CHUNK_CTL[k], 0))
}

/// Defines `$name`, `R` rows of Q6_K blocks for the target features `$features`: per row the
/// single-row kernel's steps except for how the group scales are spread (see
/// [`chunk_scales`]); the f16 scales of four rows are converted in one instruction.
/// `$add_madd` applies a chunk's scales ([`add_madd`], or its VNNI form [`add_madd_vnni`]:
/// the same 32-bit lanes).
macro_rules! q6k_rows {
    ($(#[$doc:meta])* $name:ident, $features:literal, $add_madd:ident) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        fn $name<const R: usize>(
            w: [&[[u8; q6k::BYTES]]; R],
            a: &[Q8KBlock],
            out: &mut [f32; R],
        ) {
            const { assert!(R == 2 || R == 4 || R == 8) };
            let nb = a.len();
            let mut rows = w;
            for r in 0..R {
                rows[r] = &w[r][..nb];
            }
            let m15 = _mm256_set1_epi8(15);
            let mut acc = [_mm256_setzero_ps(); R];
            let mut dbuf = Aligned([[0f32; 4]; R]);
            for b in 0..nb {
                let y = &a[b];
                let mut x = [&rows[0][b]; R];
                for r in 1..R {
                    x[r] = &rows[r][b];
                }
                prefetch_next_rows(x, nb, PREFETCH_Q6K);
                let yd = _mm_set1_ps(f32_at(y, 0));
                for g in 0..R.div_ceil(4) {
                    let d = if R - 4 * g >= 4 {
                        f16s_times(
                            [x[4 * g], x[4 * g + 1], x[4 * g + 2], x[4 * g + 3]],
                            q6k::D,
                            yd,
                        )
                    } else {
                        f16s_times([x[4 * g], x[4 * g + 1]], q6k::D, yd)
                    };
                    // SAFETY: `dbuf[g]` is 16 writable bytes; `storeu` has no alignment requirement.
                    unsafe { _mm_storeu_ps(dbuf.0[g].as_mut_ptr(), d) };
                }

                let db = std::hint::black_box(&dbuf.0);

                // One row at a time (the activation vectors are reloaded from L1 for each row; keeping
                // them in registers for all rows would spill the per-row scale vectors).
                let mut sumi = [_mm256_setzero_si256(); R];
                unroll_rows!(R, r => {
                    // Through `black_box` the compiler cannot hoist the activation loads out of this
                    // loop (it would copy them to the stack on every block).
                    let y = std::hint::black_box(y);
                    // The -32 offset of every quant, through the activation group sums (subtracted
                    // first: the integer total is the same).
                    let scales = load128(x[r], q6k::SCALES);
                    let q8sums = load256(y, Q8K_BSUMS);
                    let s16 = _mm256_cvtepi8_epi16(scales);
                    let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, s16));
                    // Scales 8j..8j + 8 as 16-bit values in both lanes; `chunk_scales` picks a
                    // chunk's two from it.
                    let gs = [
                        _mm256_permute4x64_epi64::<0x44>(s16),
                        _mm256_permute4x64_epi64::<0xEE>(s16),
                    ];
                    let mut si = _mm256_sub_epi32(_mm256_setzero_si256(), offset);
                    for (j, &g) in gs.iter().enumerate() {
                        let q8 = |k: usize| load256(y, Q8K_QS + 128 * j + 32 * k);
                        let bits1 = load256(x[r], q6k::QL + 64 * j);
                        let bits2 = load256(x[r], q6k::QL + 64 * j + 32);
                        let bits_h = load256(x[r], q6k::QH + 32 * j);
                        // Bits 2k, 2k + 1 of each qh byte are the high bits of chunk k, moved to
                        // bits 4 and 5.
                        let m = _mm256_set1_epi8(0x30);
                        let h0 = _mm256_and_si256(_mm256_slli_epi16::<4>(bits_h), m);
                        let h1 = _mm256_and_si256(_mm256_slli_epi16::<2>(bits_h), m);
                        let h2 = _mm256_and_si256(bits_h, m);
                        let h3 = _mm256_and_si256(_mm256_srli_epi16::<2>(bits_h), m);
                        let q0 = _mm256_or_si256(_mm256_and_si256(bits1, m15), h0);
                        let q1 = _mm256_or_si256(_mm256_and_si256(bits2, m15), h1);
                        let q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits1), m15), h2);
                        let q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits2), m15), h3);
                        let p0 = _mm256_madd_epi16(chunk_scales(g, 0), _mm256_maddubs_epi16(q0, q8(0)));
                        let p2 = _mm256_madd_epi16(chunk_scales(g, 2), _mm256_maddubs_epi16(q2, q8(2)));
                        let p01 = $add_madd(p0, chunk_scales(g, 1), _mm256_maddubs_epi16(q1, q8(1)));
                        let p23 = $add_madd(p2, chunk_scales(g, 3), _mm256_maddubs_epi16(q3, q8(3)));
                        si = _mm256_add_epi32(si, p01);
                        si = _mm256_add_epi32(si, p23);
                    }
                    sumi[r] = si;
                });
                for r in 0..R {
                    let d = _mm256_set1_ps(db[r / 4][r % 4]);
                    acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                }
            }
            for r in 0..R {
                out[r] = hsum_ps(acc[r]);
            }
        }
    };
}

q6k_rows!(q6k_rows, "avx2,fma,f16c", add_madd);
q6k_rows!(
    /// [`q6k_rows`] with AVX-512 VNNI: `vpdpwssd` scales and adds a chunk's products in one
    /// instruction. Same bits.
    q6k_rows_vnni,
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    add_madd_vnni
);

#[cfg(test)]
mod tests {
    //! Every supported row count (the table registers one per type), against the
    //! single-row kernel; `tests/kernels_rows_kquants.rs` covers the registered kernels
    //! more widely.

    use super::super::Q8K_BYTES;
    use super::super::q8k::quantize_row_q8_k;
    use super::*;
    use crate::kernels::Isa;

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// Uniform in [-1, 1).
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }
    }

    /// `rows` rows of `nb` random blocks of `ty` with moderate f16 scales at `scales`.
    fn weights(ty: GgmlType, rows: usize, nb: usize, scales: &[usize], rng: &mut Rng) -> Vec<u8> {
        let mut w: Vec<u8> = (0..rows * nb * ty.type_size())
            .map(|_| rng.next() as u8)
            .collect();
        for b in w.chunks_exact_mut(ty.type_size()) {
            for &off in scales {
                let v = half::f16::from_f32(0.01 * rng.unit());
                b[off..off + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        w
    }

    fn check<const R: usize, const B: usize>(
        ty: GgmlType,
        scales: &[usize],
        kernel: impl Fn([&[[u8; B]]; R], &[Q8KBlock], &mut [f32; R]),
    ) {
        let dot = Kernels::detect().dot(ty).expect("single-row kernel");
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (R * B) as u64);
        for nb in [1, 3, 5, 8] {
            let n = nb * QK_K;
            let w = weights(ty, R, nb, scales, &mut rng);
            let x: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
            let mut a = vec![0u8; nb * Q8K_BYTES];
            quantize_row_q8_k(&x, &mut a);
            let rows: [&[[u8; B]]; R] =
                std::array::from_fn(|r| w[r * nb * B..(r + 1) * nb * B].as_chunks::<B>().0);
            let mut out = [f32::NAN; R];
            kernel(rows, a.as_chunks::<Q8K_BYTES>().0, &mut out);
            for (r, got) in out.iter().enumerate() {
                let want = dot(n, &w[r * nb * B..(r + 1) * nb * B], &a);
                assert_eq!(got.to_bits(), want.to_bits(), "{ty} R={R} nb={nb} row {r}");
            }
        }
    }

    #[test]
    fn every_row_count_matches_the_single_row_kernel() {
        if Kernels::detect().isa() != Isa::Avx2 {
            return;
        }
        macro_rules! for_rows {
            ($($r:literal)*) => {$(
                check::<$r, { q4k::BYTES }>(GgmlType::Q4_K, &[q4k::D, q4k::DMIN], |w, a, o| {
                    // SAFETY: the AVX2 table exists, so AVX2, FMA and F16C were detected.
                    unsafe { q4k_rows::<$r>(w, a, o) }
                });
                check::<$r, { q5k::BYTES }>(GgmlType::Q5_K, &[q5k::D, q5k::DMIN], |w, a, o| {
                    // SAFETY: as above.
                    unsafe { q5k_rows::<$r>(w, a, o) }
                });
                check::<$r, { q6k::BYTES }>(GgmlType::Q6_K, &[q6k::D], |w, a, o| {
                    // SAFETY: as above.
                    unsafe { q6k_rows::<$r>(w, a, o) }
                });
            )*};
        }
        for_rows!(2 4 8);
    }
}
