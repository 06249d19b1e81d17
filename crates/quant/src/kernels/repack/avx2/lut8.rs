//! The 8-row kernels of the 32-element lookup-table types (Q4_0, IQ4_NL, MXFP4) in the
//! [`SumOrder::Repacked`](crate::kernels::SumOrder::Repacked) order.
//!
//! Lane `r` of the float accumulator belongs to weight row `r` and performs the scalar
//! kernel's fused multiply-add per block. The exact integer block totals are formed two rows
//! per vector: the 16 quant bytes of rows `p` and `p + 4` fill the two 128-bit lanes, so
//! their low nibbles (elements 0..16) meet the broadcast activation quants 0..16 and their
//! high nibbles (elements 16..32) the quants 16..32, without a cross-lane shuffle per row.
//! Three horizontal adds then leave one row total per lane. The rows' block scales are
//! gathered through general-purpose registers (no per-row vector insert).
//!
//! Integer ranges: `Offset(c)` types multiply `table[q] + c` (at most 24) by the signed
//! activation with `maddubs` and subtract `c · Σa` from the 16-bit sums; every 16-bit value
//! stays below 2 · 2 · 24 · 128 in magnitude. `Signed` types multiply `|a|` by the weight
//! signed like `a` (at most 2 · 128 · 127 per pair, widened to 32 bits before adding).
//! Both are exact for every activation quant, -128 included.

use std::arch::x86_64::*;

use super::super::super::legacy::{Q8_0_BYTES, QK, f16_to_f32};
use super::{Decode, RowWords, Rows, load128, store};

const ROWS: usize = 8;

/// The f16 at byte `at` of each of the eight blocks `x` as f32, block `r` in lane `r`.
/// (Eight scalar loads put together in two general-purpose registers measured faster here
/// than [`RowWords`]' gather plus the shuffles to pack the halves.)
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_lanes8<const WB: usize>(x: &[&[u8; WB]; ROWS], at: usize) -> __m256 {
    let h = |r: usize| u64::from(u16::from_le_bytes([x[r][at], x[r][at + 1]]));
    let lo = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
    let hi = h(4) | h(5) << 16 | h(6) << 32 | h(7) << 48;
    _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
}

/// The halved E8M0 scale at byte `at` of block `b` of each of the eight rows as f32 (as
/// [`crate::tables::e8m0_to_f32_half`]: `2^(e-128)`, subnormal for e < 2).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn e8m0_lanes8<const WB: usize>(
    g: &RowWords,
    rows: &Rows<'_, ROWS, WB>,
    b: usize,
    at: usize,
) -> __m256 {
    let e = _mm256_and_si256(g.get(rows, b, at), _mm256_set1_epi32(0xff));
    let one = _mm256_set1_epi32(1);
    let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, one));
    let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let bits = _mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(e, one));
    _mm256_castsi256_ps(bits)
}

/// 8 rows of a 32-element lookup-table type (quants from byte `qs` of each block, decoded by
/// `table` as `decode` says, block scales from `d_w`) against `T` Q8_0 rows (`out[t * 8 + r]`;
/// `T = 1` is the multi-row kernel of a matrix × vector product): the quants and scales of
/// each block of the eight rows are decoded once for the `T` tokens.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) fn lut4_tile8<const WB: usize, const T: usize>(
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    qs: usize,
    table: Option<&[i8; 16]>,
    decode: Decode,
    d_w: impl Fn(&[&[u8; WB]; ROWS], &RowWords, &Rows<'_, ROWS, WB>, usize) -> __m256,
) {
    assert!(
        T > 0 && a.len().is_multiple_of(T) && out.len() == ROWS * T,
        "lookup-table tile contract violated: {} activation bytes for {T} rows, {} outputs",
        a.len(),
        out.len()
    );
    let rows = Rows::<ROWS, WB>::new(n, QK, w, a.len() / T, Q8_0_BYTES, ROWS);
    let nb = n / QK;
    // The T activation rows' blocks one after the other: token t's block b at t * nb + b.
    let (acts, _) = a.as_chunks::<Q8_0_BYTES>();
    let table = table.map(|t| {
        let b: [u8; 16] = t.map(|v| v as u8);
        _mm256_broadcastsi128_si256(load128(&b))
    });
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let words = RowWords::new(&rows);
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let x: [&[u8; WB]; ROWS] = std::array::from_fn(|r| &rows.rows[r][b]);
        if b % 2 == 0 {
            for xr in x {
                // A prefetch is a hint: it never faults, whatever the address (past the end
                // of the matrix it is merely wasted).
                _mm_prefetch::<_MM_HINT_T0>(xr.as_ptr().wrapping_add(ROWS * nb * WB).cast());
            }
        }
        // The decoded quants of rows p (low 128-bit lane) and p + 4 (high lane): elements
        // 0..16 (low nibbles) and 16..32 (high nibbles).
        let q: [(__m256i, __m256i); 4] = std::array::from_fn(|p| {
            let raw = _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(load128(&x[p][qs..])),
                load128(&x[p + 4][qs..]),
            );
            let lo = _mm256_and_si256(raw, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
            match table {
                Some(t) => (_mm256_shuffle_epi8(t, lo), _mm256_shuffle_epi8(t, hi)),
                None => (lo, hi),
            }
        });
        let dw = d_w(&x, &words, &rows, b);
        for (t, acc) in acc.iter_mut().enumerate() {
            let y = &acts[t * nb + b];
            // Activation quants 0..16 and 16..32, each in both 128-bit lanes.
            let ylo = _mm256_broadcastsi128_si256(load128(&y[2..]));
            let yhi = _mm256_broadcastsi128_si256(load128(&y[18..]));
            let v: [__m256i; 4] = match decode {
                Decode::Offset(c) => {
                    let c = _mm256_set1_epi8(c as i8);
                    let corr = _mm256_add_epi16(
                        _mm256_maddubs_epi16(c, ylo),
                        _mm256_maddubs_epi16(c, yhi),
                    );
                    q.map(|(lo, hi)| {
                        let p16 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, ylo),
                            _mm256_maddubs_epi16(hi, yhi),
                        );
                        _mm256_madd_epi16(_mm256_sub_epi16(p16, corr), ones)
                    })
                }
                Decode::Signed => {
                    let (ylo_abs, yhi_abs) =
                        (_mm256_sign_epi8(ylo, ylo), _mm256_sign_epi8(yhi, yhi));
                    q.map(|(lo, hi)| {
                        _mm256_add_epi32(
                            _mm256_madd_epi16(
                                _mm256_maddubs_epi16(ylo_abs, _mm256_sign_epi8(lo, ylo)),
                                ones,
                            ),
                            _mm256_madd_epi16(
                                _mm256_maddubs_epi16(yhi_abs, _mm256_sign_epi8(hi, yhi)),
                                ones,
                            ),
                        )
                    })
                }
            };
            // Rows p (low lane) and p + 4 (high lane) in v[p] → row r in lane r.
            let total =
                _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
            let scale = _mm256_mul_ps(
                dw,
                _mm256_set1_ps(f16_to_f32(u16::from_le_bytes([y[0], y[1]]))),
            );
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), scale, *acc);
        }
    }
    for (t, acc) in acc.into_iter().enumerate() {
        store::<ROWS>(acc, &mut out[t * ROWS..(t + 1) * ROWS]);
    }
}
