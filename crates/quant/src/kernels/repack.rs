//! Kernels of [`SumOrder::Repacked`]: the summation order of llama.cpp's interleaved
//! ("CPU_REPACK") kernels for Q4_0, IQ4_NL, MXFP4 and Q4_K weights.
//!
//! On x86 with AVX2, llama.cpp rearranges each of these matrices whose row count is a multiple
//! of 8 into blocks of 8 interleaved rows when it loads the model, and multiplies them with
//! its own kernels: a "gemv" for one activation row and a "gemm" for four activation rows at
//! a time. A product `W · X` of a plain matrix (`MUL_MAT`) runs the gemm over the first
//! `n - n % 4` activation rows of the batch and the gemv over the remaining ones; an expert
//! stack (`MUL_MAT_ID`) runs the gemv for every row. The activations are quantized to the
//! same bytes as for the plain kernels, with one exception noted below.
//!
//! These kernels do not rearrange anything: they read sluice's row-major GGUF blocks and
//! reproduce, for every output element, the float operations that llama.cpp's kernels apply
//! to that element. Integer parts are exact, so only the float steps matter:
//!
//! * **Q4_0, IQ4_NL, MXFP4** (gemv and gemm alike): one running f32 total per output,
//!   `acc = fma(float(Σ w·a over the block), d_w · d_a, acc)` for each 32-element block in
//!   order, starting from 0. `d_w` is the weight block's f16 scale as f32 (for MXFP4 its
//!   E8M0 exponent as the halved power of two), `d_a` the Q8_0 activation block's scale.
//! * **Q4_K, gemv:** per 256-element super-block, the integer totals
//!   `S = Σ_j scale_j · (Σ q·a over sub-block j)` and `M = Σ_j min_j · (sum of the
//!   activation quants of sub-block j)` over its eight 32-element sub-blocks, then
//!   `acc = fma(float(S), d · d_a, acc)` and `acc_min = fma(float(M), dmin · d_a, acc_min)`;
//!   the output is `acc - acc_min`.
//! * **Q4_K, gemm:** the same, except that the two fused multiply-adds are applied once per
//!   *pair* of sub-blocks (0–1, 2–3, 4–5, 6–7) with that pair's integer totals, four times
//!   per super-block. [`grouped_kernels`] hands out these kernels with the group size 4; the
//!   matrix product uses them for the activation rows that llama.cpp's gemm takes
//!   ([`crate::matvec::RowKernel::grouped`]).
//!
//! The one difference in activation quantization: for the rows its Q4_K gemm takes,
//! llama.cpp quantizes to Q8_K with an interleaving quantizer that, when a block's largest
//! magnitude `m` occurs both as `+m` and as `-m`, scales by `+m` (`iscale = -127 / m`), where
//! the plain quantizer takes the sign of the first occurrence. [`quantize_row_q8_k_grouped`]
//! does the same; otherwise its bytes equal the plain quantizer's.
//!
//! Every kernel here has a portable scalar version (`f32::mul_add` for the fused steps), and
//! an AVX2 version that gives the same bits; both compute the true integer sums, also for
//! an activation quant of -128 (which only a NaN input produces), where llama.cpp's sign
//! trick wraps around.

use super::legacy::{
    IQ4_NL_BYTES, MXFP4_BYTES, Q4_0_BYTES, Q8_0_BYTES, QK, check_blocks, f16_to_f32,
};
use super::{DotFn, DotRows, DotTokens, Isa, Kernels, QuantizeFn, SumOrder};
use crate::tables::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half};
use crate::{GgmlType, QK_K};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "aarch64")]
mod neon;

/// Q4_K block: `d`, `dmin` (f16), `scales[12]` (8 scales and 8 mins, 6 bits each), `qs[128]`.
const Q4K_BYTES: usize = 144;
const Q4K_D: usize = 0;
const Q4K_DMIN: usize = 2;
const Q4K_SCALES: usize = 4;
const Q4K_QS: usize = 16;
/// Q8_K block: `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]`.
const Q8K_BYTES: usize = 4 + QK_K + 2 * (QK_K / 16);
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = Q8K_QS + QK_K;

/// The (de)quantization values of Q4_0 quants, as a table like those of IQ4_NL and MXFP4.
const Q4_0_VALUES: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];

pub(super) fn register(k: &mut Kernels) {
    use GgmlType::*;
    let r = SumOrder::Repacked;
    if k.isa() == Isa::Neon {
        // llama.cpp's ARM repacked orders are others: repack/neon.rs (Q4_0, Q8_0) and
        // kquants/neon.rs (Q4_K), registered there
        #[cfg(target_arch = "aarch64")]
        neon::register(k);
        return;
    }
    k.set_dot_in(r, Q4_0, dot_q4_0);
    k.set_dot_in(r, IQ4_NL, dot_iq4_nl);
    k.set_dot_in(r, MXFP4, dot_mxfp4);
    k.set_dot_in(r, Q4_K, dot_q4_k);
    if k.isa() == Isa::Avx2 {
        #[cfg(target_arch = "x86_64")]
        avx2::register(k);
    }
}

/// Kernels for the activation rows of a batched product that llama.cpp multiplies in groups
/// of `group` rows with a kernel of its own summation order (see [`grouped_kernels`]).
#[derive(Debug, Clone, Copy)]
pub struct GroupedDot {
    /// Activation rows per group: of a product over `n` rows, the first `n - n % group` use
    /// these kernels, the rest the ordinary ones.
    pub group: usize,
    /// Single-row kernel of the grouped order.
    pub dot: DotFn,
    /// Multi-row kernel of the grouped order (same bits per row as `dot`).
    pub dot_rows: Option<DotRows>,
    /// Multi-token kernel of the grouped order (same bits per output as `dot`), for the
    /// whole tiles among the grouped rows.
    pub dot_tokens: Option<DotTokens>,
    /// Activation quantizer for the grouped rows.
    pub quantize: QuantizeFn,
}

/// The grouped kernels of order `order` for plain (non-expert) products of weight type `w`
/// in a table built for `isa`, where that order has them: only [`SumOrder::Repacked`] Q4_K
/// (llama.cpp's Q4_K gemm sums differently from its gemv; for Q4_0, IQ4_NL and MXFP4 the two
/// agree).
/// (For an AVX2 table with wide, VNNI or AVX-VNNI builds, [`Kernels::grouped_in`] gives their
/// kernels.)
pub fn grouped_kernels(isa: Isa, order: SumOrder, w: GgmlType) -> Option<GroupedDot> {
    grouped_for(isa, (false, false, false), order, w)
}

fn grouped_for(
    isa: Isa,
    (wide, vnni, avx_vnni): (bool, bool, bool),
    order: SumOrder,
    w: GgmlType,
) -> Option<GroupedDot> {
    if order != SumOrder::Repacked {
        return None;
    }
    if isa == Isa::Neon {
        // llama.cpp's ARM order: Q8_0's and Q6_K's gemm sum differently from their gemv (Q4_0's,
        // Q4_K's and Q5_K's do not)
        #[cfg(target_arch = "aarch64")]
        match w {
            GgmlType::Q8_0 => return Some(neon::grouped_q8_0()),
            GgmlType::Q6_K => return Some(super::kquants::neon::grouped_q6_k()),
            _ => {}
        }
        return None;
    }
    if w != GgmlType::Q4_K {
        return None;
    }
    let scalar = GroupedDot {
        group: 4,
        dot: dot_q4_k_pairs,
        dot_rows: None,
        dot_tokens: None,
        quantize: quantize_row_q8_k_grouped,
    };
    match isa {
        Isa::Scalar => Some(scalar),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(avx2::grouped_q4_k(scalar, wide, (vnni, avx_vnni))),
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 => {
            let _ = (wide, vnni, avx_vnni); // no wide or VNNI builds off x86-64
            Some(scalar)
        }
        Isa::Neon => None, // returned above
    }
}

impl Kernels {
    /// [`grouped_kernels`] for this table's instruction set.
    pub fn grouped_in(&self, order: SumOrder, w: GgmlType) -> Option<GroupedDot> {
        grouped_for(
            self.isa,
            (self.wide(), self.vnni(), self.avx_vnni()),
            order,
            w,
        )
    }
}

#[inline]
fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// One running total over 32-element blocks whose quants are looked up in `table`:
/// `acc = fma(Σ table[q]·a, scale(block), acc)`.
#[inline]
fn lut4_running<const WB: usize>(
    w: &[u8],
    a: &[u8],
    qs: usize,
    table: &[i8; 16],
    d_w: impl Fn(&[u8; WB]) -> f32,
) -> f32 {
    let (w, _) = w.as_chunks::<WB>();
    let (a, _) = a.as_chunks::<Q8_0_BYTES>();
    let mut acc = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (xq, yq) = (&x[qs..qs + QK / 2], &y[2..]);
        let mut sum = 0i32;
        for j in 0..QK / 2 {
            sum += i32::from(table[usize::from(xq[j] & 0x0f)]) * i32::from(yq[j] as i8);
            sum += i32::from(table[usize::from(xq[j] >> 4)]) * i32::from(yq[j + QK / 2] as i8);
        }
        acc = (sum as f32).mul_add(d_w(x) * f16_to_f32(le16(y, 0)), acc);
    }
    acc
}

fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, Q4_0_BYTES, a, Q8_0_BYTES);
    lut4_running::<Q4_0_BYTES>(w, a, 2, &Q4_0_VALUES, |x| f16_to_f32(le16(x, 0)))
}

fn dot_iq4_nl(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, IQ4_NL_BYTES, a, Q8_0_BYTES);
    lut4_running::<IQ4_NL_BYTES>(w, a, 2, &KVALUES_IQ4NL, |x| f16_to_f32(le16(x, 0)))
}

fn dot_mxfp4(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_blocks(n, w, MXFP4_BYTES, a, Q8_0_BYTES);
    lut4_running::<MXFP4_BYTES>(w, a, 1, &KVALUES_MXFP4, |x| e8m0_to_f32_half(x[0]))
}

/// Asserts the [`super::DotFn`] contract for Q4_K × Q8_K and returns the super-block count.
#[inline]
fn check_q4_k(n: usize, w: &[u8], a: &[u8]) -> usize {
    let nb = n / QK_K;
    assert!(
        n.is_multiple_of(QK_K) && w.len() == nb * Q4K_BYTES && a.len() == nb * Q8K_BYTES,
        "q4_K dot kernel contract violated: n = {n}, weight bytes {}, activation bytes {}",
        w.len(),
        a.len()
    );
    nb
}

/// The eight 6-bit sub-block scales and the eight 6-bit mins of a Q4_K block's 12 scale bytes.
#[inline]
fn q4_k_scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, mn)
}

/// Sums of the activation quants of each 32-element sub-block of a Q8_K block.
#[inline]
fn q8_k_sub_sums(y: &[u8]) -> [i32; 8] {
    let mut s = [0i32; 8];
    for (j, v) in s.iter_mut().enumerate() {
        let at = Q8K_BSUMS + 4 * j;
        *v = i32::from(le16(y, at) as i16) + i32::from(le16(y, at + 2) as i16);
    }
    s
}

/// Integer terms of one Q4_K super-block against one Q8_K block, per 32-element sub-block
/// `j`: `scale_j · Σ q·a` and `min_j · Σ a`.
#[inline]
fn q4_k_terms(x: &[u8], y: &[u8]) -> ([i32; 8], [i32; 8]) {
    let (sc, mn) = q4_k_scales_mins(&x[Q4K_SCALES..Q4K_SCALES + 12]);
    let sums = q8_k_sub_sums(y);
    let qs = &x[Q4K_QS..Q4K_QS + QK_K / 2];
    let aq = &y[Q8K_QS..Q8K_BSUMS];
    let mut prod = [0i32; 8];
    let mut mins = [0i32; 8];
    for j in 0..8 {
        // Sub-blocks 2p and 2p + 1 are the low and high nibbles of qs[32p .. 32p + 32].
        let (src, shift) = (&qs[32 * (j / 2)..32 * (j / 2) + 32], 4 * (j % 2));
        let s: i32 = src
            .iter()
            .zip(&aq[32 * j..32 * j + 32])
            .map(|(&b, &q)| i32::from((b >> shift) & 0x0f) * i32::from(q as i8))
            .sum();
        prod[j] = i32::from(sc[j]) * s;
        mins[j] = i32::from(mn[j]) * sums[j];
    }
    (prod, mins)
}

/// Q4_K in the gemv order: one pair of fused multiply-adds per super-block.
fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_q4_k(n, w, a);
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (x, y) in w.chunks_exact(Q4K_BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let (prod, mins) = q4_k_terms(x, y);
        let da = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        let d = f16_to_f32(le16(x, Q4K_D)) * da;
        let dmin = f16_to_f32(le16(x, Q4K_DMIN)) * da;
        acc = (prod.iter().sum::<i32>() as f32).mul_add(d, acc);
        acc_min = (mins.iter().sum::<i32>() as f32).mul_add(dmin, acc_min);
    }
    acc - acc_min
}

/// Q4_K in the gemm order: one pair of fused multiply-adds per pair of sub-blocks.
fn dot_q4_k_pairs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check_q4_k(n, w, a);
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (x, y) in w.chunks_exact(Q4K_BYTES).zip(a.chunks_exact(Q8K_BYTES)) {
        let (prod, mins) = q4_k_terms(x, y);
        let da = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        let d = f16_to_f32(le16(x, Q4K_D)) * da;
        let dmin = f16_to_f32(le16(x, Q4K_DMIN)) * da;
        for p in 0..4 {
            acc = ((prod[2 * p] + prod[2 * p + 1]) as f32).mul_add(d, acc);
            acc_min = ((mins[2 * p] + mins[2 * p + 1]) as f32).mul_add(dmin, acc_min);
        }
    }
    acc - acc_min
}

/// `1.5 · 2^23`: added to an f32 below `2^22` in magnitude, it leaves the value rounded to
/// an integer (ties to even) in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Quantize `x` (whole 256-element blocks) to Q8_K as llama.cpp does for the activation rows
/// of its Q4_K gemm: like the plain Q8_K quantizer (`iscale = -127 / max`,
/// `q = min(127, round_half_even(iscale · x))`, `d = 1 / iscale`, sums of 16 quants), except
/// that `max` is `+m` whenever the largest magnitude `m` occurs with a plus sign in the block,
/// and `-m` otherwise. (NaN inputs: not reproduced.)
pub fn quantize_row_q8_k_grouped(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(QK_K) && out.len() == x.len() / QK_K * Q8K_BYTES,
        "q8_K quantize: {} elements into {} bytes",
        x.len(),
        out.len()
    );
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8K_BYTES)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 || amax.is_nan() {
            ob.fill(0);
            continue;
        }
        let max = if xb.contains(&amax) { amax } else { -amax };
        let iscale = -127.0f32 / max;
        ob[..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
        for (o, &v) in ob[Q8K_QS..Q8K_BSUMS].iter_mut().zip(xb) {
            let r = ((iscale * v + ROUND_MAGIC).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000;
            *o = r.min(127) as i8 as u8;
        }
        for g in 0..QK_K / 16 {
            let s: i16 = ob[Q8K_QS + 16 * g..Q8K_QS + 16 * g + 16]
                .iter()
                .map(|&q| i16::from(q as i8))
                .sum();
            ob[Q8K_BSUMS + 2 * g..Q8K_BSUMS + 2 * g + 2].copy_from_slice(&s.to_le_bytes());
        }
    }
}
