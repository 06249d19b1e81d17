//! Multi-row AVX2 kernels ([`crate::kernels::DotRowsFn`]): several consecutive weight
//! rows, read in place, against one activation row.
//!
//! Each row keeps the exact floating-point operations of its single-row kernel in
//! `avx2.rs` (same accumulators, same block order, same FMA operands, same lane
//! reductions), so every result is bit-identical to the single-row one. The rows share
//! what depends only on the activation: the load of its quants, the conversion of its
//! block scale, and (F16) the conversion of its elements.
//!
//! The integer block sums may be formed differently from the single-row kernels as long as
//! they are the same integers in the same lanes (lane i holds the sum over elements
//! 4i..4i+4), because converting such small integers to f32 is exact:
//! * IQ4_NL: `|x|` comes from a second table instead of `sign(x, x)`.
//! * Q4_0 and MXFP4: the weight is looked up with a non-negative offset `c` added (the bare
//!   nibble for Q4_0, table value + 12 for MXFP4), multiplied by the activation with
//!   `maddubs`, and `c · (y0 + y1)`, computed once per activation block for all rows, is
//!   subtracted from each 16-bit pair sum. No pair sum can saturate (at most 24 · 128 · 2).
//!   This saves both sign operations per row and block, and equals the sign trick except
//!   for an activation quant of -128 (only a NaN input makes one), where the sign trick
//!   wraps: a call whose activation row holds a -128 computes its rows with the
//!   single-row kernel instead.
//!
//! Rows per call were chosen by measurement (`examples/rows_bench.rs`): the one-accumulator
//! types (Q8_0, Q4_0) gain up to 8 rows; the paired-accumulator types (IQ4_NL, MXFP4)
//! need 8 registers for 4 rows; F16 needs 4 accumulators per row and 4 rows would spill.

use std::arch::x86_64::*;

use super::super::{F16_TO_F32, IQ4_NL_BYTES, MXFP4_BYTES, Q4_0_BYTES, Q8_0_BYTES, QK};
use super::{
    E8M0_HALF, arr, f16_finish, fma_ss, hsum, load128, load256, mul_sum_i8, mul_sum_i8_avx_vnni,
    mul_sum_i8_vnni, mxfp4_avx2, q4_0_avx2,
};
use crate::GgmlType;
use crate::kernels::Kernels;
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4};

/// Rows per call, by type.
const Q8_0_ROWS: usize = 8;
const Q4_0_ROWS: usize = 8;
const IQ4_NL_ROWS: usize = 4;
const MXFP4_ROWS: usize = 4;
const F16_ROWS: usize = 3;

pub(super) fn register(k: &mut Kernels) {
    use GgmlType::*;
    k.set_dot_rows(Q8_0, Q8_0_ROWS, dot_rows_q8_0);
    k.set_dot_rows(Q4_0, Q4_0_ROWS, dot_rows_q4_0);
    k.set_dot_rows(IQ4_NL, IQ4_NL_ROWS, dot_rows_iq4_nl);
    k.set_dot_rows(MXFP4, MXFP4_ROWS, dot_rows_mxfp4);
    k.set_dot_rows(F16, F16_ROWS, dot_rows_f16);
    if k.avx_vnni() {
        k.set_dot_rows(Q8_0, Q8_0_ROWS, dot_rows_q8_0_avx_vnni);
    }
    if k.vnni() {
        k.set_dot_rows(Q8_0, Q8_0_ROWS, dot_rows_q8_0_vnni);
    }
}

// ---------------------------------------------------------------------------------------
// Helpers.

/// Asserts the [`crate::kernels::DotRowsFn`] contract for a 32-element block type and
/// returns the number of blocks per row.
#[inline]
fn check_rows(n: usize, w: &[u8], w_bytes: usize, a: &[u8], out: &[f32], rows: usize) -> usize {
    let nb = n / QK;
    assert!(
        n.is_multiple_of(QK)
            && out.len() == rows
            && w.len() == rows * nb * w_bytes
            && a.len() == nb * Q8_0_BYTES,
        "dot_rows kernel contract violated: n = {n}, {} rows (kernel takes {rows}), weight bytes {}, activation bytes {}",
        out.len(),
        w.len(),
        a.len()
    );
    nb
}

/// `R` consecutive rows of `stride` bytes, each starting with `nb` blocks of `WB` bytes.
#[derive(Clone, Copy)]
struct Rows<'a, const R: usize, const WB: usize> {
    w: &'a [u8],
    stride: usize,
    nb: usize,
}

impl<'a, const R: usize, const WB: usize> Rows<'a, R, WB> {
    #[inline(always)]
    fn new(w: &'a [u8], stride: usize, nb: usize) -> Self {
        assert!(w.len() == R * stride && nb * WB <= stride);
        Rows { w, stride, nb }
    }

    /// Row `r`.
    #[inline(always)]
    fn row(&self, r: usize) -> &'a [u8] {
        &self.w[r * self.stride..(r + 1) * self.stride]
    }

    /// Block `b` of row `r`. (The kernels' loops run to `R` and `nb`, so the assert
    /// mostly folds away; it makes the unchecked access below sound.)
    #[inline(always)]
    fn block(&self, r: usize, b: usize) -> &'a [u8; WB] {
        assert!(r < R && b < self.nb);
        let at = r * self.stride + b * WB;
        // SAFETY: r < R and b < nb give at + WB <= (R - 1) * stride + nb * WB
        // <= R * stride == w.len() (checked in `new`); [u8; WB] has alignment 1.
        unsafe { &*self.w.as_ptr().add(at).cast::<[u8; WB]>() }
    }
}

/// `v` unchanged, but opaque to the optimizer (so that a product with a splat stays a
/// vector multiply fed by a broadcast load instead of a scalar multiply and a broadcast).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn opaque(mut v: __m256) -> __m256 {
    // SAFETY: an empty assembly block that reads and writes one register.
    unsafe {
        std::arch::asm!("/* {0} */", inout(ymm_reg) v, options(pure, nomem, nostack, preserves_flags));
    }
    v
}

/// IEEE half bits to f32, in all 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn splat_f16(bits: u16) -> __m256 {
    _mm256_set1_ps(F16_TO_F32[usize::from(bits)])
}

#[inline(always)]
fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(*arr(&b[at..]))
}

/// 16 bytes of packed nibbles to 32 bytes, as `super::nibbles` lays them out (low nibbles
/// in the low 128-bit lane, high nibbles in the high lane), from one broadcast load.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(b: &[u8; 16]) -> __m256i {
    let v = _mm256_broadcastsi128_si256(load128(b));
    let v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// Eight i16 pairs of `p` summed in pairs to eight i32, as f32 (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pairs_to_f32(p: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

/// A 16-entry byte table in both 128-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lut(t: [i8; 16]) -> __m256i {
    let b: [u8; 16] = t.map(|v| v as u8);
    _mm256_broadcastsi128_si256(load128(&b))
}

/// Whether any quant of the Q8_0 activation row is -128.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn has_minus_128(act: Rows<'_, 1, Q8_0_BYTES>) -> bool {
    let mut low = _mm256_setzero_si256();
    for b in 0..act.nb {
        low = _mm256_min_epi8(low, load256(arr(&act.block(0, b)[2..])));
    }
    _mm256_movemask_epi8(_mm256_cmpeq_epi8(low, _mm256_set1_epi8(i8::MIN))) != 0
}

// ---------------------------------------------------------------------------------------
// Q8_0: one accumulator per row, `acc += (dx·dy) · Σ` per block, as `q8_0_avx2`.

/// Defines `$name`, `R` rows of Q8_0, for the target features `$features` with `$mul_sum`
/// forming a block's sums ([`mul_sum_i8`] or its VNNI form, the same lanes).
macro_rules! q8_0_rows {
    ($name:ident, $features:literal, $mul_sum:ident) => {
        #[target_feature(enable = $features)]
        fn $name<const R: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
            let nb = check_rows(n, w, Q8_0_BYTES, a, out, R);
            let rows = Rows::<R, Q8_0_BYTES>::new(w, nb * Q8_0_BYTES, nb);
            let act = Rows::<1, Q8_0_BYTES>::new(a, a.len(), nb);
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..nb {
                let y = act.block(0, b);
                let yq = load256(arr(&y[2..]));
                let dy = opaque(splat_f16(le16(y, 0)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = rows.block(r, b);
                    let d = _mm256_mul_ps(splat_f16(le16(x, 0)), dy);
                    *acc = _mm256_fmadd_ps(d, $mul_sum(load256(arr(&x[2..])), yq), *acc);
                }
            }
            for (o, acc) in out.iter_mut().zip(acc) {
                *o = hsum(acc);
            }
        }
    };
}

q8_0_rows!(q8_0_rows, "avx2,fma,f16c", mul_sum_i8);
q8_0_rows!(
    q8_0_rows_vnni,
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    mul_sum_i8_vnni
);
q8_0_rows!(
    q8_0_rows_avx_vnni,
    "avx2,fma,f16c,avxvnni",
    mul_sum_i8_avx_vnni
);

// ---------------------------------------------------------------------------------------
// Q4_0: one accumulator per row, as `q4_0_avx2`; quants as nibble · y − 8 · y.

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_rows<const R: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let nb = check_rows(n, w, Q4_0_BYTES, a, out, R);
    let rows = Rows::<R, Q4_0_BYTES>::new(w, nb * Q4_0_BYTES, nb);
    let act = Rows::<1, Q8_0_BYTES>::new(a, a.len(), nb);
    if has_minus_128(act) {
        for (r, o) in out.iter_mut().enumerate() {
            *o = q4_0_avx2(n, rows.row(r), a);
        }
        return;
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let y = act.block(0, b);
        let yq = load256(arr(&y[2..]));
        let off = _mm256_maddubs_epi16(_mm256_set1_epi8(8), yq);
        let dy = opaque(splat_f16(le16(y, 0)));
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = rows.block(r, b);
            let d = _mm256_mul_ps(splat_f16(le16(x, 0)), dy);
            let p = _mm256_maddubs_epi16(nibbles(arr(&x[2..])), yq);
            *acc = _mm256_fmadd_ps(d, pairs_to_f32(_mm256_sub_epi16(p, off)), *acc);
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        *o = hsum(acc);
    }
}

// ---------------------------------------------------------------------------------------
// IQ4_NL and MXFP4: two accumulators per row (even and odd blocks) and a scalar FMA for an
// odd last block, as `blocks_paired`.

/// Per activation block: quants, scale splat, and what the weight sums need of it.
#[derive(Clone, Copy)]
struct Act {
    q: __m256i,
    d: __m256,
    /// `c · (y0 + y1)` per 16-bit pair for the offset form; unused by the sign form.
    off: __m256i,
}

/// The paired-accumulator loop over `R` rows. `dx(x)` is the weight block scale,
/// `prep(y)` the per-activation-block data, `sums(x, act)` the 8 lane sums of a block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn paired_rows<const R: usize, const WB: usize>(
    rows: Rows<'_, R, WB>,
    act: Rows<'_, 1, Q8_0_BYTES>,
    out: &mut [f32],
    dx: impl Fn(&[u8; WB]) -> f32,
    prep: impl Fn(&[u8; Q8_0_BYTES]) -> Act,
    sums: impl Fn(&[u8; WB], Act) -> __m256,
) {
    let nb = rows.nb;
    let mut acc0 = [_mm256_setzero_ps(); R];
    let mut acc1 = [_mm256_setzero_ps(); R];
    for p in 0..nb / 2 {
        // Block 2p into the even accumulators, then block 2p + 1 into the odd ones.
        for (b, acc) in [(2 * p, &mut acc0), (2 * p + 1, &mut acc1)] {
            let mut y = prep(act.block(0, b));
            y.d = opaque(y.d);
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = rows.block(r, b);
                let d = _mm256_mul_ps(y.d, _mm256_set1_ps(dx(x)));
                *acc = _mm256_fmadd_ps(d, sums(x, y), *acc);
            }
        }
    }
    let last = (nb % 2 == 1).then(|| prep(act.block(0, nb - 1)));
    for (r, o) in out.iter_mut().enumerate().take(R) {
        let mut sum = hsum(_mm256_add_ps(acc0[r], acc1[r]));
        if let Some(y) = last {
            let x = rows.block(r, nb - 1);
            let d = _mm256_cvtss_f32(y.d) * dx(x);
            sum = fma_ss(d, hsum(sums(x, y)), sum);
        }
        *o = sum;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl_rows<const R: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let nb = check_rows(n, w, IQ4_NL_BYTES, a, out, R);
    let rows = Rows::<R, IQ4_NL_BYTES>::new(w, nb * IQ4_NL_BYTES, nb);
    let act = Rows::<1, Q8_0_BYTES>::new(a, a.len(), nb);
    let table = lut(KVALUES_IQ4NL);
    let table_abs = lut(KVALUES_IQ4NL.map(i8::unsigned_abs).map(|v| v as i8));
    let zero = _mm256_setzero_si256();
    paired_rows(
        rows,
        act,
        out,
        |x| F16_TO_F32[usize::from(le16(x, 0))],
        |y| Act {
            q: load256(arr(&y[2..])),
            d: splat_f16(le16(y, 0)),
            off: zero,
        },
        |x, y| {
            let i = nibbles(arr(&x[2..]));
            let sy = _mm256_sign_epi8(y.q, _mm256_shuffle_epi8(table, i));
            pairs_to_f32(_mm256_maddubs_epi16(_mm256_shuffle_epi8(table_abs, i), sy))
        },
    );
}

/// Offset that makes every MXFP4 table value (doubled, -12..=12) non-negative.
const MXFP4_OFFSET: i8 = 12;

#[target_feature(enable = "avx2,fma,f16c")]
fn mxfp4_rows<const R: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let nb = check_rows(n, w, MXFP4_BYTES, a, out, R);
    let rows = Rows::<R, MXFP4_BYTES>::new(w, nb * MXFP4_BYTES, nb);
    let act = Rows::<1, Q8_0_BYTES>::new(a, a.len(), nb);
    if has_minus_128(act) {
        for (r, o) in out.iter_mut().enumerate() {
            *o = mxfp4_avx2(n, rows.row(r), a);
        }
        return;
    }
    let table = lut(KVALUES_MXFP4.map(|v| v + MXFP4_OFFSET));
    let offset = _mm256_set1_epi8(MXFP4_OFFSET);
    paired_rows(
        rows,
        act,
        out,
        |x| E8M0_HALF[usize::from(x[0])],
        |y| {
            let q = load256(arr(&y[2..]));
            Act {
                q,
                d: splat_f16(le16(y, 0)),
                off: _mm256_maddubs_epi16(offset, q),
            }
        },
        |x, y| {
            let xo = _mm256_shuffle_epi8(table, nibbles(arr(&x[1..])));
            pairs_to_f32(_mm256_sub_epi16(_mm256_maddubs_epi16(xo, y.q), y.off))
        },
    );
}

// ---------------------------------------------------------------------------------------
// F16: four accumulators per row over 32 elements per step, as `f16_avx2`; the
// activation's 8-element groups are converted once for all rows.

#[target_feature(enable = "avx2,fma,f16c")]
fn f16_rows<const R: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    assert!(
        out.len() == R && w.len() == R * n * 2 && a.len() == n * 2,
        "dot_rows kernel contract violated: n = {n}, {} rows (kernel takes {R}), weight bytes {}, activation bytes {}",
        out.len(),
        w.len(),
        a.len()
    );
    let steps = n / 32;
    let rows = Rows::<R, 64>::new(w, 2 * n, steps);
    let (av, _) = a.as_chunks::<64>();
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let cvt = |b: &[u8; 64], j: usize| -> __m256 { _mm256_cvtph_ps(load128(arr(&b[16 * j..]))) };
    for (s, y) in av.iter().enumerate().take(steps) {
        for j in 0..4 {
            let yj = cvt(y, j);
            for (r, acc) in acc.iter_mut().enumerate() {
                acc[j] = _mm256_fmadd_ps(cvt(rows.block(r, s), j), yj, acc[j]);
            }
        }
    }
    let done = 64 * steps;
    for (r, (o, acc)) in out.iter_mut().zip(acc).enumerate() {
        *o = f16_finish(acc, &rows.row(r)[done..], &a[done..]);
    }
}

// ---------------------------------------------------------------------------------------
// DotRowsFn wrappers, registered only in a table built for `Isa::Avx2` (see `avx2.rs`).

macro_rules! wrap_rows {
    ($($name:ident => $imp:ident, $r:ident);* $(;)?) => {$(
        fn $name(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
            // SAFETY: only reachable through an AVX2 table, so the CPU has the features
            // `$imp` is compiled for.
            unsafe { $imp::<{ $r }>(n, w, a, out) }
        }
    )*};
}

wrap_rows! {
    dot_rows_q8_0 => q8_0_rows, Q8_0_ROWS;
    dot_rows_q4_0 => q4_0_rows, Q4_0_ROWS;
    dot_rows_iq4_nl => iq4_nl_rows, IQ4_NL_ROWS;
    dot_rows_mxfp4 => mxfp4_rows, MXFP4_ROWS;
    dot_rows_f16 => f16_rows, F16_ROWS;
}

// Registered only in a table with `Kernels::vnni`, built only after run-time detection of
// AVX-512F, VL, BW and VNNI as well.
wrap_rows! {
    dot_rows_q8_0_vnni => q8_0_rows_vnni, Q8_0_ROWS;
}

// Registered only in a table with `Kernels::avx_vnni`, built only after run-time detection of
// AVX-VNNI as well.
wrap_rows! {
    dot_rows_q8_0_avx_vnni => q8_0_rows_avx_vnni, Q8_0_ROWS;
}
