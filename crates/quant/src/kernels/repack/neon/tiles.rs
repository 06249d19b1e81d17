//! Multi-row and multi-token NEON kernels in llama.cpp's ARM 4x4 orders (Q4_0, Q8_0, IQ4_NL,
//! MXFP4; see `repack/neon.rs` for the orders): four weight rows, one f32 lane each, against
//! `T` activation rows.
//!
//! The single-row kernels keep one scalar running sum per output and change it once per
//! block, `fma(Σ, d_a · d_w, acc)` or `acc + (d_w · d_a) · Σ`. Here the four rows' sums of
//! one token are the four lanes of one f32x4 and each of those scalar operations is the same
//! IEEE operation lane by lane (the products commute exactly), so every output has the bits
//! of the single-row kernel. Per block, the weight quants and scales of the four rows are
//! unpacked once for the `T` tokens, and each activation block is loaded once for the four
//! rows. The integer sums run on over the blocks (one accumulator per row and token, never
//! zeroed), and a block's four totals are the difference of two pairwise reductions: exact
//! modulo 2^32, and every block's true total fits in an i32.
//!
//! `T = 1` is the multi-row kernel of a one-token product (decoding), `T = 4` the tile of a
//! batched one.

use std::arch::aarch64::*;

use crate::kernels::legacy::neon::{arr, f16_at, load_s8, load_table, load_u8, nibbles, sdot};
use crate::kernels::legacy::{IQ4_NL_BYTES, MXFP4_BYTES, Q4_0_BYTES, Q8_0_BYTES, QK};
use crate::kernels::{DotRows, DotRowsFn, DotTokens, DotTokensFn};
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half};

/// Weight rows per call: one f32 lane each.
pub(super) const ROWS: usize = 4;
/// Activation rows per call of the multi-token kernels.
pub(super) const TOKENS: usize = 4;

/// The float step of one block: `acc = fma(Σ, d, acc)` or `acc = acc + d · Σ`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Fused,
    MulAdd,
}

/// `T` activation rows of `nb` Q8_0 blocks.
type Acts<'a, const T: usize> = [&'a [[u8; Q8_0_BYTES]]; T];

/// The totals of four i32x4 vectors, one per lane (exact, as integers).
#[inline]
#[target_feature(enable = "neon")]
fn totals4(v: [int32x4_t; ROWS]) -> int32x4_t {
    vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]))
}

/// Four f32 as a vector.
#[inline]
#[target_feature(enable = "neon")]
fn f32x4(v: [f32; ROWS]) -> float32x4_t {
    // SAFETY: `v` is four readable f32; `vld1q_f32` needs only f32 alignment.
    unsafe { vld1q_f32(v.as_ptr()) }
}

/// The f16 scales at the start of four blocks as f32 (exact: four lane loads, one `fcvtl`).
#[inline]
#[target_feature(enable = "neon")]
fn f16_scales<const WB: usize>(x: [&[u8; WB]; ROWS]) -> float32x4_t {
    const { assert!(WB >= 2) };
    let f: float32x4_t;
    // SAFETY: reads two bytes at the start of each block (`WB >= 2`, checked at compile
    // time); single-lane loads have no alignment requirement; registers only otherwise.
    unsafe {
        std::arch::asm!(
            "ld1 {{{h:v}.h}}[0], [{p0}]",
            "ld1 {{{h:v}.h}}[1], [{p1}]",
            "ld1 {{{h:v}.h}}[2], [{p2}]",
            "ld1 {{{h:v}.h}}[3], [{p3}]",
            "fcvtl {f:v}.4s, {h:v}.4h",
            p0 = in(reg) x[0].as_ptr(),
            p1 = in(reg) x[1].as_ptr(),
            p2 = in(reg) x[2].as_ptr(),
            p3 = in(reg) x[3].as_ptr(),
            h = out(vreg) _,
            f = lateout(vreg) f,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    f
}

/// The tile of [`ROWS`] weight rows (blocks of `WB` bytes; `quants` gives a block's 32 quants
/// as signed bytes, times 16 if `FRAC16`, `scales` the four blocks' scales) × `T` activation rows,
/// with the block step `step`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
#[allow(clippy::too_many_arguments)]
fn tile<const T: usize, const WB: usize, const FRAC16: bool>(
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    quants: impl Fn(&[u8; WB]) -> (int8x16_t, int8x16_t),
    scales: impl Fn([&[u8; WB]; ROWS]) -> float32x4_t,
    step: Step,
) {
    let nb = n / QK;
    assert!(
        n.is_multiple_of(QK)
            && w.len() == ROWS * nb * WB
            && a.len() == T * nb * Q8_0_BYTES
            && out.len() == ROWS * T,
        "repacked-order tile contract violated: n = {n}, weight bytes {} ({ROWS} rows), \
         activation bytes {} ({T} rows), {} outputs",
        w.len(),
        a.len(),
        out.len()
    );
    let rows: [&[[u8; WB]]; ROWS] =
        std::array::from_fn(|r| w[r * nb * WB..(r + 1) * nb * WB].as_chunks::<WB>().0);
    let acts: Acts<'_, T> = std::array::from_fn(|t| {
        a[t * nb * Q8_0_BYTES..(t + 1) * nb * Q8_0_BYTES]
            .as_chunks::<Q8_0_BYTES>()
            .0
    });
    let mut acc = [vdupq_n_f32(0.0); T];
    // Per token and row, the running integer dot product over the blocks so far (modulo
    // 2^32), and per token the rows' totals after the previous block: a block's totals are
    // the difference (exact modulo 2^32, and each block's true total fits in an i32), which
    // spares zeroing an accumulator per row and block.
    let mut run = [[vdupq_n_s32(0); ROWS]; T];
    let mut prev = [vdupq_n_s32(0); T];
    let blocks = rows[0].iter().zip(rows[1]).zip(rows[2]).zip(rows[3]);
    for (b, (((x0, x1), x2), x3)) in blocks.enumerate() {
        let x = [x0, x1, x2, x3];
        let q = x.map(&quants);
        let dx = scales(x);
        for (((acc, act), run), prev) in acc.iter_mut().zip(&acts).zip(&mut run).zip(&mut prev) {
            let y = &act[b];
            let (ylo, yhi) = (load_s8(arr(&y[2..])), load_s8(arr(&y[18..])));
            for (run, (lo, hi)) in run.iter_mut().zip(q) {
                *run = sdot(sdot(*run, lo, ylo), hi, yhi);
            }
            let total = totals4(*run);
            let s = vsubq_s32(total, *prev);
            *prev = total;
            // Σ (exact; 16 Σ converted with 4 fraction bits where the quants are 16 q)
            let s = if FRAC16 {
                vcvtq_n_f32_s32::<4>(s)
            } else {
                vcvtq_f32_s32(s)
            };
            // d_w · d_a
            let d = vmulq_n_f32(dx, f16_at(y, 0));
            *acc = match step {
                Step::Fused => vfmaq_f32(*acc, s, d),
                Step::MulAdd => vaddq_f32(*acc, vmulq_f32(d, s)),
            };
        }
    }
    for (o, acc) in out.as_chunks_mut::<ROWS>().0.iter_mut().zip(acc) {
        // SAFETY: `o` is four writable f32.
        unsafe { vst1q_f32(o.as_mut_ptr(), acc) }
    }
}

#[target_feature(enable = "neon,dotprod")]
fn q4_0<const T: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    // the nibbles q with 8 flipped are q - 8 as 4-bit two's complement; in the high half of
    // a byte, 16 · (q - 8)
    let quants = |x: &[u8; Q4_0_BYTES]| {
        let v = veorq_u8(load_u8(arr(&x[2..])), vdupq_n_u8(0x88));
        (
            vreinterpretq_s8_u8(vshlq_n_u8::<4>(v)),
            vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0xf0))),
        )
    };
    tile::<T, Q4_0_BYTES, true>(n, w, a, out, quants, |x| f16_scales(x), Step::Fused);
}

#[inline]
#[target_feature(enable = "neon")]
fn q8_0_quants(x: &[u8; Q8_0_BYTES]) -> (int8x16_t, int8x16_t) {
    (load_s8(arr(&x[2..])), load_s8(arr(&x[18..])))
}

#[target_feature(enable = "neon,dotprod")]
fn q8_0_gemv<const T: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    tile::<T, Q8_0_BYTES, false>(
        n,
        w,
        a,
        out,
        |x| q8_0_quants(x),
        |x| f16_scales(x),
        Step::Fused,
    );
}

#[target_feature(enable = "neon,dotprod")]
fn q8_0_gemm<const T: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    tile::<T, Q8_0_BYTES, false>(
        n,
        w,
        a,
        out,
        |x| q8_0_quants(x),
        |x| f16_scales(x),
        Step::MulAdd,
    );
}

#[target_feature(enable = "neon,dotprod")]
fn iq4_nl<const T: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let table = load_table(&KVALUES_IQ4NL);
    let quants = |x: &[u8; IQ4_NL_BYTES]| {
        let (lo, hi) = nibbles(arr(&x[2..]));
        (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi))
    };
    tile::<T, IQ4_NL_BYTES, false>(n, w, a, out, quants, |x| f16_scales(x), Step::MulAdd);
}

#[target_feature(enable = "neon,dotprod")]
fn mxfp4<const T: usize>(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    let table = load_table(&KVALUES_MXFP4);
    let quants = |x: &[u8; MXFP4_BYTES]| {
        let (lo, hi) = nibbles(arr(&x[1..]));
        (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi))
    };
    let scales = |x: [&[u8; MXFP4_BYTES]; ROWS]| f32x4(x.map(|x| e8m0_to_f32_half(x[0])));
    tile::<T, MXFP4_BYTES, false>(n, w, a, out, quants, scales, Step::MulAdd);
}

// Entry points with the `DotRowsFn` / `DotTokensFn` signature. They are registered only in a
// table built for `Isa::Neon`, which `Kernels::detect` builds only after it detected NEON,
// the dot product and FP16 at run time.

macro_rules! entries {
    ($($rows:ident, $tokens:ident => $imp:ident);* $(;)?) => {$(
        fn $rows(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
            // SAFETY: only reachable through a NEON table (see above).
            unsafe { $imp::<1>(n, w, a, out) }
        }
        fn $tokens(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
            // SAFETY: only reachable through a NEON table (see above).
            unsafe { $imp::<TOKENS>(n, w, a, out) }
        }
    )*};
}

entries! {
    rows_q4_0, tokens_q4_0 => q4_0;
    rows_q8_0, tokens_q8_0 => q8_0_gemv;
    rows_q8_0_gemm, tokens_q8_0_gemm => q8_0_gemm;
    rows_iq4_nl, tokens_iq4_nl => iq4_nl;
    rows_mxfp4, tokens_mxfp4 => mxfp4;
}

/// The multi-row and multi-token kernels of a type's gemv order (`gemm` false) or Q8_0's gemm
/// order (`gemm` true).
pub(super) fn kernels(ty: crate::GgmlType, gemm: bool) -> Option<(DotRows, DotTokens)> {
    use crate::GgmlType::*;
    let (r, t): (DotRowsFn, DotTokensFn) = match (ty, gemm) {
        (Q4_0, false) => (rows_q4_0, tokens_q4_0),
        (Q8_0, false) => (rows_q8_0, tokens_q8_0),
        (Q8_0, true) => (rows_q8_0_gemm, tokens_q8_0_gemm),
        (IQ4_NL, false) => (rows_iq4_nl, tokens_iq4_nl),
        (MXFP4, false) => (rows_mxfp4, tokens_mxfp4),
        _ => return None,
    };
    Some((
        DotRows { rows: ROWS, f: r },
        DotTokens {
            rows: ROWS,
            tokens: TOKENS,
            f: t,
        },
    ))
}
