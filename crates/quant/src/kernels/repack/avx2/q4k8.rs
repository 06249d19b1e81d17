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
//! * one token (the multi-row kernel): each row forms the `scale · Σ q·a` products of a pair
//!   of sub-blocks in eight i32 lanes, and a transposing reduction (horizontal adds, two rows
//!   at a time as soon as they are formed, so that few vectors stay live in AVX2's sixteen
//!   registers) turns the eight rows' vectors into one vector of row totals;
//! * several tokens (the tile): the rows' nibbles of a pair of sub-blocks are transposed once
//!   (8 × 8 32-bit words), so that vector `g` holds weights `4g..4g + 4` of every row in that
//!   row's lane; each token's activation words are broadcast against them, the eight
//!   `vpmaddubsw` products of a sub-block add up in 16 bits (at most 8 · 2 · 15 · 128, exact),
//!   and one `vpmaddwd` by the rows' scales (in row lanes) gives the row totals: half the
//!   multiplications of the one-token way, and no horizontal adds;
//! * the gemv order adds the four pairs' totals before its float step per super-block, the
//!   gemm order takes a float step per pair;
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
use super::{Rows, load128, load256, reduce8, store};
use crate::QK_K;
use crate::kernels::kquants::x86::{add_madd, add_madd_avx_vnni, add_madd_vnni};

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

/// `(d, dmin)` of eight blocks as f32, row `r`'s in lane `r` of each, from their heads (rows
/// p and p + 4 in `heads[p]`, as [`heads_x2`] loads them).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn d_dmin_w(heads: &[__m256i; 4]) -> (__m256, __m256) {
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
        _mm256_cvtph_ps(_mm256_castsi256_si128(s)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(s)),
    )
}

/// 8 rows of Q4_K against one Q8_K row; `PAIRS` selects the gemm order (float steps per
/// pair of sub-blocks) over the gemv order (per super-block).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4_k_rows8<const PAIRS: bool>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    q4_k_tile8::<PAIRS, 1>(n, w, a, out);
}

/// `w[g]` holds 32-bit word `g` of every `v[r]` in its lane `r` (an 8 × 8 transpose of words).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose8(v: [__m256i; 8]) -> [__m256i; 8] {
    // Per 128-bit lane: words 0, 1 (and 4, 5 in the high lane) of rows r, r + 1 interleaved...
    let t: [__m256i; 8] = std::array::from_fn(|i| {
        let (a, b) = (v[2 * (i / 2)], v[2 * (i / 2) + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    // ... then four rows' word k (and k + 4 in the high lane) together: u[4h + k] for rows
    // 4h..4h + 4.
    let u: [__m256i; 8] = std::array::from_fn(|i| {
        let (h, k) = (i / 4, i % 4);
        let (a, b) = (t[4 * h + k / 2], t[4 * h + 2 + k / 2]);
        if k % 2 == 0 {
            _mm256_unpacklo_epi64(a, b)
        } else {
            _mm256_unpackhi_epi64(a, b)
        }
    });
    std::array::from_fn(|g| {
        if g < 4 {
            _mm256_permute2x128_si256::<0x20>(u[g], u[4 + g])
        } else {
            _mm256_permute2x128_si256::<0x31>(u[g - 4], u[g])
        }
    })
}

/// The sub-block scales of eight rows in row lanes: word `r` of `sc[s]` is row `r`'s scale of
/// sub-block `s` twice as 16-bit values, from the rows' unpacked scale bytes as
/// [`scales_mins_x2`] gives them (rows `p` and `p + 4` in `sms[p]`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn row_lane_scales(sms: &[__m256i; 4]) -> [__m256i; 8] {
    // Bytes of rows p, p + 1 interleaved per sub-block, then four rows per sub-block: word s
    // of `c[0]` is sub-block s of rows 0..4 (low lane) and 4..8 (high lane); `c[1]` sub-blocks
    // 4..8.
    let a01 = _mm256_unpacklo_epi8(sms[0], sms[1]);
    let a23 = _mm256_unpacklo_epi8(sms[2], sms[3]);
    let c = [
        _mm256_unpacklo_epi16(a01, a23),
        _mm256_unpackhi_epi16(a01, a23),
    ];
    std::array::from_fn(|s| _mm256_shuffle_epi8(c[s / 4], scale_words_ctl((s % 4) as i8)))
}

/// `Σ_g maddubs(q[g], the activation quants at + 4g..at + 4g + 4 in every word)`: in row lanes
/// (`q` as [`transpose8`] gives a sub-block's nibbles), the 16-bit sums of products of the
/// sub-block's 32 weights of each row, two per row. Each product sum is at most 2 · 15 · 128,
/// so the eight add up exactly in 16 bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn group_sums(q: &[__m256i; 8], y: &[u8; Q8K_BYTES], at: usize) -> __m256i {
    let p: [__m256i; 8] = std::array::from_fn(|g| {
        let i = at + 4 * g;
        let a = _mm256_set1_epi32(i32::from_le_bytes([y[i], y[i + 1], y[i + 2], y[i + 3]]));
        _mm256_maddubs_epi16(q[g], a)
    });
    _mm256_add_epi16(
        _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
        _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])),
    )
}

/// Defines the tile kernel `$name` for the target features `$features`: the same source for
/// AVX2's sixteen vector registers and for AVX-512VL's thirty-two (same operations on 256-bit
/// vectors, so the same bits; only the register allocation, and so the spilling, differs).
///
/// `$add_madd` applies the scales (`acc + vpmaddwd(scales, sums)`, [`add_madd`], or its one
/// VNNI instruction [`add_madd_vnni`]); with `$row_sums` (VNNI only) the one-token gemv order
/// keeps one vector per row for the whole super-block and reduces the rows once per
/// super-block instead of once per pair of sub-blocks (see the note there).
macro_rules! q4_k_tile8 {
    ($(#[$doc:meta])* $name:ident, $features:literal, $add_madd:ident, $row_sums:literal) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub(super) fn $name<const PAIRS: bool, const T: usize>(
            n: usize,
            w: &[u8],
            a: &[u8],
            out: &mut [f32],
        ) {
            assert!(
                T > 0 && a.len().is_multiple_of(T) && out.len() == ROWS * T,
                "Q4_K tile contract violated: {} activation bytes for {T} rows, {} outputs",
                a.len(),
                out.len()
            );
            let rows = Rows::<ROWS, Q4K_BYTES>::new(n, QK_K, w, a.len() / T, Q8K_BYTES, ROWS);
            let nb = n / QK_K;
            // The T activation rows' blocks one after the other: token t's block b at t * nb + b.
            let (acts, _) = a.as_chunks::<Q8K_BYTES>();
            let m4 = _mm256_set1_epi8(0x0f);
            let mut acc = [_mm256_setzero_ps(); T];
            let mut acc_min = [_mm256_setzero_ps(); T];
            // Scale words of rows p and p + 4: sbuf[2p] sub-blocks 0..4, sbuf[2p + 1] sub-blocks
            // 4..8; row p's in words 0..4, row p + 4's in words 4..8.
            let mut sbuf = Aligned([[0i32; 8]; 8]);
            for b in 0..nb {
                let x: [&[u8; Q4K_BYTES]; ROWS] = std::array::from_fn(|r| &rows.rows[r][b]);
                for xr in x {
                    // A prefetch is a hint: it never faults, whatever the address (past the end of
                    // the matrix it is merely wasted).
                    _mm_prefetch::<_MM_HINT_T0>(xr.as_ptr().wrapping_add(ROWS * nb * Q4K_BYTES).cast());
                }
                let y: [&[u8; Q8K_BYTES]; T] = std::array::from_fn(|t| &acts[t * nb + b]);

                // Per pair of sub-blocks: the minimums of row p (lanes 0..4) and row p + 4 (lanes
                // 4..8) as i16, to meet the activation sub-block sums.
                let heads: [__m256i; 4] = std::array::from_fn(|p| heads_x2(x[p], x[p + 4]));
                let mut mins16 = [_mm256_setzero_si256(); 4];
                let sms: [__m256i; 4] = heads.map(|h| scales_mins_x2(h));
                for (p, m) in mins16.iter_mut().enumerate() {
                    let sm = sms[p];
                    for h in 0..2 {
                        let words = _mm256_shuffle_epi8(sm, scale_words_ctl(h as i8));
                        // SAFETY: `sbuf[2p + h]` is 32 writable bytes; `storeu` has no alignment
                        // requirement.
                        unsafe { _mm256_storeu_si256(sbuf.0[2 * p + h].as_mut_ptr().cast(), words) };
                    }
                    *m = _mm256_shuffle_epi8(sm, mins_ctl());
                }
                let (dw, dminw) = d_dmin_w(&heads);
                // Per token: min · sum + min · sum of each pair of sub-blocks, rows p and p + 4 in
                // mp[p]; the scales times the activation scale.
                let mp: [[__m256i; 4]; T] = y.map(|y| {
                    // Sums of the activation quants per 32-element sub-block (i16), both lanes.
                    let bs = load256(&y[Q8K_BSUMS..]);
                    let q8s = _mm256_broadcastsi128_si256(_mm_hadd_epi16(
                        _mm256_castsi256_si128(bs),
                        _mm256_extracti128_si256::<1>(bs),
                    ));
                    mins16.map(|m| _mm256_madd_epi16(m, q8s))
                });
                let da = y.map(|y| _mm256_set1_ps(f32::from_le_bytes([y[0], y[1], y[2], y[3]])));
                let d = da.map(|da| _mm256_mul_ps(dw, da));
                let dmin = da.map(|da| _mm256_mul_ps(dminw, da));
                // Read the scale words back from memory: a broadcast load costs no shuffle.
                let sb = std::hint::black_box(&sbuf.0);
                let sw =
                    |r: usize, i: usize| _mm256_set1_epi32(sb[2 * (r % 4) + i / 4][4 * (r / 4) + i % 4]);
                // The nibbles of sub-blocks 2j (low) and 2j + 1 (high) of row r.
                let nibbles = |r: usize, j: usize| {
                    let bits = load256(&x[r][Q4K_QS + 32 * j..]);
                    (
                        _mm256_and_si256(bits, m4),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
                    )
                };
                // `scale · Σ q·a` of sub-blocks 2j and 2j + 1 of row r, in eight i32 lanes.
                let pair = |r: usize, j: usize, (ql, qh): (__m256i, __m256i), q8l, q8h| {
                    // Nibbles (0..=15) times activation quants: pair sums at most 2 · 15 · 128.
                    let pl = _mm256_madd_epi16(sw(r, 2 * j), _mm256_maddubs_epi16(ql, q8l));
                    $add_madd(pl, sw(r, 2 * j + 1), _mm256_maddubs_epi16(qh, q8h))
                };
                // Row r's pair-j min term in lane r of min_pairs[t][j] (the gemm order); the
                // gemv order adds the four pairs' terms at once.
                let min_pairs = mp.map(|mp| {
                    let t0 = _mm256_unpacklo_epi32(mp[0], mp[1]);
                    let t1 = _mm256_unpacklo_epi32(mp[2], mp[3]);
                    let t2 = _mm256_unpackhi_epi32(mp[0], mp[1]);
                    let t3 = _mm256_unpackhi_epi32(mp[2], mp[3]);
                    [
                        _mm256_unpacklo_epi64(t0, t1),
                        _mm256_unpackhi_epi64(t0, t1),
                        _mm256_unpacklo_epi64(t2, t3),
                        _mm256_unpackhi_epi64(t2, t3),
                    ]
                });
                let mut sumi = [_mm256_setzero_si256(); T];
                // Token t's row totals of pair j: the gemm order's float step per pair, or
                // into the gemv order's integer sum of the super-block.
                let mut fold = |t: usize, j: usize, tot: __m256i| {
                    if PAIRS {
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), d[t], acc[t]);
                        acc_min[t] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_pairs[t][j]), dmin[t], acc_min[t]);
                    } else {
                        sumi[t] = _mm256_add_epi32(sumi[t], tot);
                    }
                };
                if T > 1 {
                    // Several tokens: the rows' nibbles transposed into row lanes once per pair
                    // of sub-blocks, so that each token's products land in row lanes directly
                    // (no horizontal adds) and the 16-bit products of a sub-block add up before
                    // one multiplication by the scales (see `row_lane_scales`).
                    let sc = row_lane_scales(&sms);
                    unroll4!(j => {
                        let w = transpose8(std::array::from_fn(|r| load256(&x[r][Q4K_QS + 32 * j..])));
                        let lo = w.map(|v| _mm256_and_si256(v, m4));
                        let hi = w.map(|v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4));
                        // Sub-block 2j (low nibbles), then 2j + 1 (high), each token's total in
                        // row lanes.
                        let lo_tot: [__m256i; T] = std::array::from_fn(|t| {
                            _mm256_madd_epi16(group_sums(&lo, y[t], Q8K_QS + 64 * j), sc[2 * j])
                        });
                        for t in 0..T {
                            let tot = $add_madd(
                                lo_tot[t],
                                group_sums(&hi, y[t], Q8K_QS + 64 * j + 32),
                                sc[2 * j + 1],
                            );
                            fold(t, j, tot);
                        }
                    });
                } else if $row_sums && !PAIRS {
                    // One token, gemv order: the super-block's integer total of row r is all
                    // the float step needs, so each row sums its eight sub-blocks' scaled
                    // products in one vector of eight i32 lanes (`vpdpwssd` adds a
                    // `vpmaddwd` into it in one instruction) and one transposing reduction
                    // per super-block puts the eight rows' totals in row lanes. The same
                    // exact integer as the per-pair reductions: no lane can overflow, a
                    // super-block's total being at most 8 · 63 · 32 · 15 · 128 < 2^25 in
                    // magnitude, and every 16-bit `vpmaddubsw` sum at most 2 · 15 · 128.
                    let y = y[0];
                    let mut rs = [_mm256_setzero_si256(); ROWS];
                    unroll4!(j => {
                        let q8l = load256(&y[Q8K_QS + 64 * j..]);
                        let q8h = load256(&y[Q8K_QS + 64 * j + 32..]);
                        for (r, s) in rs.iter_mut().enumerate() {
                            let (ql, qh) = nibbles(r, j);
                            *s = $add_madd(*s, sw(r, 2 * j), _mm256_maddubs_epi16(ql, q8l));
                            *s = $add_madd(*s, sw(r, 2 * j + 1), _mm256_maddubs_epi16(qh, q8h));
                        }
                    });
                    fold(0, 0, reduce8(&rs));
                } else {
                unroll4!(j => {
                    // The eight rows' totals of pair j in row lanes, per token: rows two at a time
                    // (their nibbles unpacked once for the T tokens), each two rows' vectors folded
                    // into the reduction at once (two horizontal adds per four rows, then the two
                    // halves' 128-bit lanes added), so that only two partial vectors per token stay
                    // live: sixteen vector registers hold no more without spilling.
                    let mut h = [_mm256_setzero_si256(); T];
                    let mut g0 = [_mm256_setzero_si256(); T];
                    for rp in 0..ROWS / 2 {
                        let (ra, rb) = (2 * rp, 2 * rp + 1);
                        let (qa, qb) = (nibbles(ra, j), nibbles(rb, j));
                        for t in 0..T {
                            let q8l = load256(&y[t][Q8K_QS + 64 * j..]);
                            let q8h = load256(&y[t][Q8K_QS + 64 * j + 32..]);
                            let hh = _mm256_hadd_epi32(pair(ra, j, qa, q8l, q8h), pair(rb, j, qb, q8l, q8h));
                            if rp % 2 == 0 {
                                h[t] = hh;
                            } else if rp == 1 {
                                g0[t] = _mm256_hadd_epi32(h[t], hh);
                            } else {
                                let g1 = _mm256_hadd_epi32(h[t], hh);
                                let tot = _mm256_add_epi32(
                                    _mm256_blend_epi32::<0xf0>(g0[t], g1),
                                    _mm256_permute2x128_si256::<0x21>(g0[t], g1),
                                );
                                fold(t, j, tot);
                            }
                        }
                    }
                });
                }
                if !PAIRS {
                    for t in 0..T {
                        let mp = mp[t];
                        let mins = _mm256_hadd_epi32(
                            _mm256_hadd_epi32(mp[0], mp[1]),
                            _mm256_hadd_epi32(mp[2], mp[3]),
                        );
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), d[t], acc[t]);
                        acc_min[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), dmin[t], acc_min[t]);
                    }
                }
            }
            for t in 0..T {
                store::<ROWS>(
                    _mm256_sub_ps(acc[t], acc_min[t]),
                    &mut out[t * ROWS..(t + 1) * ROWS],
                );
            }
        }
    };
}

q4_k_tile8! {
    /// 8 rows of Q4_K against `T` Q8_K rows (`out[t * 8 + r]`), each output in the order of
    /// [`q4_k_rows8`] (`PAIRS` as there): the weight side of a super-block (scales and
    /// minimums, f16 scales, the nibbles of each pair of sub-blocks) is unpacked once for the
    /// `T` tokens.
    q4_k_tile8, "avx2,fma,f16c", add_madd, false
}

q4_k_tile8! {
    /// [`q4_k_tile8`] compiled with AVX-512VL and AVX-512BW, which give the compiler 32 vector
    /// registers instead of 16: for CPUs that have them. Same bits per output.
    q4_k_tile8_wide, "avx2,fma,f16c,avx512f,avx512vl,avx512bw", add_madd, false
}

q4_k_tile8! {
    /// [`q4_k_tile8_wide`] with AVX-512 VNNI: `vpdpwssd` applies the scales and adds in one
    /// instruction, and one token in the gemv order reduces its rows once per super-block.
    /// For CPUs with AVX-512 VNNI and VL. Same bits per output.
    q4_k_tile8_vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni", add_madd_vnni, true
}

q4_k_tile8! {
    /// [`q4_k_tile8_vnni`] in AVX-VNNI's VEX encoding, with AVX2's sixteen registers: for
    /// CPUs with VNNI but no AVX-512. Same bits per output.
    q4_k_tile8_avx_vnni, "avx2,fma,f16c,avxvnni", add_madd_avx_vnni, true
}
