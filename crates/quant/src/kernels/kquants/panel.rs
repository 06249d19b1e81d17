//! The order of llama.cpp's IQ panel product ([`SumOrder::IqPanel`]): batched products of
//! IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S and IQ4_XS weights.
//!
//! llama.cpp's x86 CPU backend (`ggml-cpu/iqp.cpp`, any build with AVX2) multiplies a weight of
//! these types whose row count is a multiple of 8 with a batch of at least 8 activation rows
//! (a plain product, `MUL_MAT`) or with the at least 8 rows routed to one expert
//! (`MUL_MAT_ID`) by decoding each super-block of the weight to 256 signed bytes, 16 integer
//! sub-block scales and one f32 factor, and summing, for each output, per super-block
//! `S = Σ_sub-block scale · Σ_16 weight byte · activation byte` in exact integers, then
//! `acc = fma(f32(S), factor · d_activation, acc)` over the super-blocks in order. Fewer rows
//! go through `vec_dot` (the [`SumOrder::VecDot`] kernels).
//!
//! The decoded bytes times the scales times the factor are the dequantized weights, bit for
//! bit (ggml checks this under `GGML_IQP_VERIFY`; the tests here check it too). Integer sums
//! do not depend on their order, so every kernel here gives the same bits as any other: the
//! scalar one, the AVX2 one, and the panel kernels (8 rows decoded once for a whole batch,
//! [`crate::kernels::DotPanel`]). That holds for activation bytes in `-127..=127`, which is
//! what the Q8_K quantizer writes (as for the other Q8_K kernels): a byte of -128 is outside
//! the contract, and the paths differ there (the sign trick of ggml's AVX2 build wraps
//! `-(-128)`, the unsigned-offset path of its VNNI build, and ours for the grid types, does
//! not).
//!
//! [`SumOrder::IqPanel`]: crate::SumOrder::IqPanel
//! [`SumOrder::VecDot`]: crate::SumOrder::VecDot

use super::{Q8K_BYTES, Q8K_QS, check_dot, f16_at, f32_at, u32_at};
use crate::iq_tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
use crate::kernels::{Kernels, SumOrder};
use crate::tables::KVALUES_IQ4NL;
use crate::{GgmlType, QK_K};

/// Weight rows per panel (llama.cpp's `IQP_NB_ROWS`).
const PANEL_ROWS: usize = 8;

/// One super-block decoded: `factor · scales[j / 16] · vals[j]` is weight `j`.
#[derive(Clone)]
pub(crate) struct Decoded {
    pub vals: [i8; QK_K],
    pub scales: [i8; QK_K / 16],
    pub factor: f32,
    /// `128 · Σ scale · Σ vals`: what feeding the activation bytes offset by 128 (as unsigned
    /// bytes) adds to the total (set by the kernels that use it, not by [`decode`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub bias: i32,
    /// Every byte is within ±63, so `(a + 128) · w` pairs fit `vpmaddubsw`'s i16 (all the
    /// grid types; not IQ4_XS).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub small: bool,
}

impl Decoded {
    pub(crate) const ZERO: Decoded = Decoded {
        vals: [0; QK_K],
        scales: [0; QK_K / 16],
        factor: 0.0,
        bias: 0,
        small: false,
    };
}

#[inline]
fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Per sign byte, the mask with 0xff in every byte whose sign bit is set.
static SIGN_MASKS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut j = 0;
        while j < 8 {
            if i & (1 << j) != 0 {
                t[i] |= 0xff << (8 * j);
            }
            j += 1;
        }
        i += 1;
    }
    t
};

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Eight signed grid bytes: byte `j` of `entry`, negated where bit `j` of `signs` is set.
/// Eight bytes at once: `(g ^ m) + (m & 1)` negates the masked bytes without a carry into
/// the next one, because every grid byte is in 1..=127 (the IQ2 and IQ3 grids are).
#[inline]
fn signed8(out: &mut [i8], entry: u64, signs: u8) {
    let m = SIGN_MASKS[usize::from(signs)];
    put8(out, (entry ^ m).wrapping_add(m & ONES));
}

/// The eight bytes of `v` (little-endian) as eight i8.
#[inline]
fn put8(out: &mut [i8], v: u64) {
    let b = v.to_le_bytes().map(|b| b as i8);
    out[..8].copy_from_slice(&b);
}

/// Eight signed bytes from two four-byte grid entries.
#[inline]
fn signed4x2(out: &mut [i8], g1: u32, g2: u32, signs: u8) {
    signed8(out, u64::from(g1) | (u64::from(g2) << 32), signs);
}

/// Eight IQ1 bytes `8 · grid[j] + delta` (grid bytes in {-1, 0, 1}): the bytes shifted left
/// by 3 (the bits that cross into the next byte masked off), then a byte-wise add.
#[inline]
fn iq1_8(out: &mut [i8], entry: u64, delta: i8) {
    let g = (entry << 3) & 0xf8f8_f8f8_f8f8_f8f8;
    let d = u64::from(delta as u8) * ONES;
    put8(out, ((g & !HIGH) + (d & !HIGH)) ^ ((g ^ d) & HIGH));
}

/// Decode super-block `b` of type `ty` (a type of the panel order) as llama.cpp's panel does.
pub(crate) fn decode(ty: GgmlType, b: &[u8], d: &mut Decoded) {
    match ty {
        GgmlType::IQ2_XXS => {
            d.factor = f16_at(b, 0) * 0.125;
            for ib in 0..8 {
                let at = 2 + 8 * ib;
                let aux = u32_at(b, at + 4);
                let ls = (2 * (aux >> 28) + 1) as i8;
                d.scales[2 * ib] = ls;
                d.scales[2 * ib + 1] = ls;
                for l in 0..4 {
                    let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                    let entry = IQ2XXS_GRID[usize::from(b[at + l])];
                    signed8(&mut d.vals[32 * ib + 8 * l..], entry, signs);
                }
            }
        }
        GgmlType::IQ2_XS => {
            d.factor = f16_at(b, 0) * 0.125;
            for ib in 0..8 {
                let sc = b[66 + ib];
                d.scales[2 * ib] = (2 * (sc & 15) + 1) as i8;
                d.scales[2 * ib + 1] = (2 * (sc >> 4) + 1) as i8;
                for l in 0..4 {
                    let q = u16_at(b, 2 + 2 * (4 * ib + l));
                    let entry = IQ2XS_GRID[usize::from(q & 511)];
                    signed8(
                        &mut d.vals[32 * ib + 8 * l..],
                        entry,
                        KSIGNS_IQ2XS[usize::from(q >> 9)],
                    );
                }
            }
        }
        GgmlType::IQ2_S => {
            d.factor = f16_at(b, 0) * 0.125;
            for ib in 0..8 {
                let sc = b[74 + ib];
                d.scales[2 * ib] = (2 * (sc & 15) + 1) as i8;
                d.scales[2 * ib + 1] = (2 * (sc >> 4) + 1) as i8;
                let qh = usize::from(b[66 + ib]);
                for l in 0..4 {
                    let idx = usize::from(b[2 + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300);
                    signed8(
                        &mut d.vals[32 * ib + 8 * l..],
                        IQ2S_GRID[idx],
                        b[34 + 4 * ib + l],
                    );
                }
            }
        }
        GgmlType::IQ3_XXS => {
            d.factor = f16_at(b, 0) * 0.25;
            for ib in 0..8 {
                let aux = u32_at(b, 66 + 4 * ib);
                let ls = (2 * (aux >> 28) + 1) as i8;
                d.scales[2 * ib] = ls;
                d.scales[2 * ib + 1] = ls;
                for l in 0..4 {
                    let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                    let g1 = IQ3XXS_GRID[usize::from(b[2 + 8 * ib + 2 * l])];
                    let g2 = IQ3XXS_GRID[usize::from(b[2 + 8 * ib + 2 * l + 1])];
                    signed4x2(&mut d.vals[32 * ib + 8 * l..], g1, g2, signs);
                }
            }
        }
        GgmlType::IQ3_S => {
            d.factor = f16_at(b, 0);
            for ib in 0..8 {
                let sc = b[106 + ib / 2];
                let s = if ib % 2 == 0 { sc & 15 } else { sc >> 4 };
                let s = (1 + 2 * s) as i8;
                d.scales[2 * ib] = s;
                d.scales[2 * ib + 1] = s;
                let h = usize::from(b[66 + ib]);
                let idx = |i: usize| usize::from(b[2 + 8 * ib + i]) | ((h << (8 - i)) & 256);
                for l in 0..4 {
                    let g1 = IQ3S_GRID[idx(2 * l)];
                    let g2 = IQ3S_GRID[idx(2 * l + 1)];
                    signed4x2(&mut d.vals[32 * ib + 8 * l..], g1, g2, b[74 + 4 * ib + l]);
                }
            }
        }
        GgmlType::IQ1_S => {
            d.factor = f16_at(b, 0) * 0.125;
            for ib in 0..8 {
                let qh = u16_at(b, 34 + 2 * ib);
                let s = (2 * ((qh >> 12) & 7) + 1) as i8;
                d.scales[2 * ib] = s;
                d.scales[2 * ib + 1] = s;
                let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
                for l in 0..4 {
                    let idx =
                        usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
                    iq1_8(&mut d.vals[32 * ib + 8 * l..], IQ1S_GRID[idx], delta);
                }
            }
        }
        GgmlType::IQ1_M => {
            let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
            let bits = (sc[0] >> 12)
                | ((sc[1] >> 8) & 0x00f0)
                | ((sc[2] >> 4) & 0x0f00)
                | (sc[3] & 0xf000);
            d.factor = half::f16::from_bits(bits).to_f32() * 0.125;
            for ib in 0..8 {
                let s = sc[ib / 2] >> (6 * (ib % 2));
                d.scales[2 * ib] = (2 * (s & 7) + 1) as i8;
                d.scales[2 * ib + 1] = (2 * ((s >> 3) & 7) + 1) as i8;
                let qh = [usize::from(b[32 + 2 * ib]), usize::from(b[32 + 2 * ib + 1])];
                for l in 0..4 {
                    let h = qh[l / 2];
                    let shift = if l % 2 == 0 { 8 } else { 4 };
                    let idx = usize::from(b[4 * ib + l]) | ((h << shift) & 0x700);
                    let bit = if l % 2 == 0 { 0x08 } else { 0x80 };
                    let delta = if h & bit != 0 { -1 } else { 1 };
                    iq1_8(&mut d.vals[32 * ib + 8 * l..], IQ1S_GRID[idx], delta);
                }
            }
        }
        GgmlType::IQ4_XS => {
            d.factor = f16_at(b, 0);
            let scales_h = u16_at(b, 2);
            for ib in 0..8 {
                let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 15;
                let high = ((scales_h >> (2 * ib)) & 3) as u8;
                let s = (low | (high << 4)) as i8 - 32;
                d.scales[2 * ib] = s;
                d.scales[2 * ib + 1] = s;
                for j in 0..16 {
                    let q = b[8 + 16 * ib + j];
                    d.vals[32 * ib + j] = KVALUES_IQ4NL[usize::from(q & 15)];
                    d.vals[32 * ib + 16 + j] = KVALUES_IQ4NL[usize::from(q >> 4)];
                }
            }
        }
        _ => unreachable!("{ty} is not a type of the panel order"),
    }
    d.small = ty != GgmlType::IQ4_XS;
}

/// The super-block's integer total against the 256 activation bytes `q`.
#[inline]
fn block_total(d: &Decoded, q: &[u8]) -> i32 {
    let mut total = 0i32;
    for (sb, &s) in d.scales.iter().enumerate() {
        let mut sum = 0i32;
        for k in 0..16 {
            sum += i32::from(d.vals[16 * sb + k]) * i32::from(q[16 * sb + k] as i8);
        }
        total += sum * i32::from(s);
    }
    total
}

/// One output: the fused chain over the super-blocks.
#[inline(always)]
fn dot_with(
    ty: GgmlType,
    n: usize,
    w: &[u8],
    a: &[u8],
    total: impl Fn(&Decoded, &[u8]) -> i32,
) -> f32 {
    let nb = check_dot(ty, n, w, a);
    let bs = ty.type_size();
    let mut d = Decoded::ZERO;
    let mut acc = 0f32;
    for l in 0..nb {
        decode(ty, &w[l * bs..(l + 1) * bs], &mut d);
        let ab = &a[l * Q8K_BYTES..(l + 1) * Q8K_BYTES];
        let t = total(&d, &ab[Q8K_QS..Q8K_QS + QK_K]);
        acc = (t as f32).mul_add(d.factor * f32_at(ab, 0), acc);
    }
    acc
}

/// A panel: `PANEL_ROWS` weight rows decoded once, then every activation row of `a` (any
/// whole number of them), four at a time through `total4` (which must give `total`'s four
/// values), the rest one by one. `out[t * PANEL_ROWS + r]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn panel_with(
    ty: GgmlType,
    n: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
    total: impl Fn(&Decoded, &[u8]) -> i32,
    total4: impl Fn(&Decoded, [&[u8]; 4]) -> [i32; 4],
    decode: impl Fn(GgmlType, &[u8], &mut Decoded),
) {
    assert!(n.is_multiple_of(QK_K), "{ty} panel: n = {n}");
    let nb = n / QK_K;
    let bs = ty.type_size();
    let (wrb, arb) = (nb * bs, nb * Q8K_BYTES);
    assert_eq!(w.len(), PANEL_ROWS * wrb, "{ty} panel: weight rows");
    assert!(
        arb > 0 && a.len().is_multiple_of(arb),
        "{ty} panel: activation rows"
    );
    let n_tok = a.len() / arb;
    assert_eq!(out.len(), PANEL_ROWS * n_tok, "{ty} panel: outputs");
    let mut decoded = vec![Decoded::ZERO; PANEL_ROWS * nb];
    for (r, row) in decoded.chunks_exact_mut(nb).enumerate() {
        for (l, d) in row.iter_mut().enumerate() {
            let at = r * wrb + l * bs;
            decode(ty, &w[at..at + bs], d);
        }
    }
    // block `l` of activation row `t`: its scale and its 256 bytes
    let block = |t: usize, l: usize| {
        let ab = &a[t * arb + l * Q8K_BYTES..t * arb + (l + 1) * Q8K_BYTES];
        (f32_at(ab, 0), &ab[Q8K_QS..Q8K_QS + QK_K])
    };
    for (r, row) in decoded.chunks_exact(nb).enumerate() {
        let mut t = 0;
        while t + 4 <= n_tok {
            let mut acc = [0f32; 4];
            for (l, d) in row.iter().enumerate() {
                let b = [
                    block(t, l),
                    block(t + 1, l),
                    block(t + 2, l),
                    block(t + 3, l),
                ];
                let s = total4(d, [b[0].1, b[1].1, b[2].1, b[3].1]);
                for u in 0..4 {
                    acc[u] = (s[u] as f32).mul_add(d.factor * b[u].0, acc[u]);
                }
            }
            for (u, v) in acc.into_iter().enumerate() {
                out[(t + u) * PANEL_ROWS + r] = v;
            }
            t += 4;
        }
        for t in t..n_tok {
            let mut acc = 0f32;
            for (l, d) in row.iter().enumerate() {
                let (da, q) = block(t, l);
                acc = (total(d, q) as f32).mul_add(d.factor * da, acc);
            }
            out[t * PANEL_ROWS + r] = acc;
        }
    }
}

/// [`block_total`] for four activation rows.
#[inline]
fn block_totals4(d: &Decoded, q: [&[u8]; 4]) -> [i32; 4] {
    q.map(|q| block_total(d, q))
}

/// Calls macro `$m` with every panel type: the names of its dot and panel functions, and the
/// type.
macro_rules! panel_types {
    ($m:ident) => {
        $m! {
            dot_iq1_s, panel_iq1_s, GgmlType::IQ1_S;
            dot_iq1_m, panel_iq1_m, GgmlType::IQ1_M;
            dot_iq2_xxs, panel_iq2_xxs, GgmlType::IQ2_XXS;
            dot_iq2_xs, panel_iq2_xs, GgmlType::IQ2_XS;
            dot_iq2_s, panel_iq2_s, GgmlType::IQ2_S;
            dot_iq3_xxs, panel_iq3_xxs, GgmlType::IQ3_XXS;
            dot_iq3_s, panel_iq3_s, GgmlType::IQ3_S;
            dot_iq4_xs, panel_iq4_xs, GgmlType::IQ4_XS;
        }
    };
}

macro_rules! scalar_entries {
    ($($dot:ident, $panel:ident, $ty:expr;)*) => {
        $(
            fn $dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
                dot_with($ty, n, w, a, block_total)
            }
            fn $panel(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
                panel_with($ty, n, w, a, out, block_total, block_totals4, decode)
            }
        )*
        fn register_scalar(k: &mut Kernels) {
            $(
                k.set_dot_in(SumOrder::IqPanel, $ty, $dot);
                k.set_dot_panel_in(SumOrder::IqPanel, $ty, PANEL_ROWS, $panel);
            )*
        }
    };
}

panel_types!(scalar_entries);

/// Registers the panel kernels: the scalar ones in every table, the AVX2 ones over them in
/// the AVX2 table. (The NEON table has them too but never uses them: llama.cpp's ARM build has
/// no panel path, and [`Kernels::order_for`] never picks the order there.)
pub(super) fn register(k: &mut Kernels) {
    register_scalar(k);
    #[cfg(target_arch = "x86_64")]
    if k.isa() == crate::Isa::Avx2 {
        x86::register(k);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The same sums with AVX2 integer products (`vpsignb`, `vpmaddubsw`, `vpmaddwd`, as
    //! ggml's non-VNNI panel kernel) and FMA.

    use std::arch::x86_64::*;

    use super::{Decoded, PANEL_ROWS, decode, dot_with, panel_with};
    use crate::GgmlType;
    use crate::kernels::{Kernels, SumOrder};
    use crate::tables::KVALUES_IQ4NL;

    /// [`super::block_total`] with AVX2: per 32 bytes (two sub-blocks) `vpmaddubsw` of
    /// |w| and the signed activations, then `vpmaddwd` with the two sub-block scales, which
    /// adds the pairs and applies the scales in one exact step (|pair| ≤ 2 · 127 · 127 fits
    /// an i16, times a scale ≤ 32 and summed in pairs it fits an i32).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn block_total_avx2(d: &Decoded, q: &[u8]) -> i32 {
        assert!(q.len() >= 256);
        // SAFETY: `d.scales` has 16 bytes; loadu has no alignment requirement.
        let sc = unsafe { _mm_loadu_si128(d.scales.as_ptr().cast()) };
        let mut acc = _mm256_setzero_si256();
        for i in 0..8 {
            // SAFETY: `d.vals` has 256 bytes and `q` at least 256 (asserted); loadu has no
            // alignment requirement.
            let (x, y) = unsafe {
                (
                    _mm256_loadu_si256(d.vals.as_ptr().add(32 * i).cast()),
                    _mm256_loadu_si256(q.as_ptr().add(32 * i).cast()),
                )
            };
            let s16 = scales16(sc, i);
            let p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, s16));
        }
        hsum_i32(acc)
    }

    /// [`block_total_avx2`] for four activation rows, sharing the weight loads, |w| and the
    /// scales.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn block_totals4_avx2(d: &Decoded, q: [&[u8]; 4]) -> [i32; 4] {
        assert!(q.iter().all(|q| q.len() >= 256));
        // SAFETY: `d.scales` has 16 bytes; loadu has no alignment requirement.
        let sc = unsafe { _mm_loadu_si128(d.scales.as_ptr().cast()) };
        let mut acc = [_mm256_setzero_si256(); 4];
        for i in 0..8 {
            // SAFETY: `d.vals` has 256 bytes; loadu has no alignment requirement.
            let x = unsafe { _mm256_loadu_si256(d.vals.as_ptr().add(32 * i).cast()) };
            let ax = _mm256_sign_epi8(x, x);
            let s16 = scales16(sc, i);
            for (acc, q) in acc.iter_mut().zip(q) {
                // SAFETY: every `q` has at least 256 bytes (asserted).
                let y = unsafe { _mm256_loadu_si256(q.as_ptr().add(32 * i).cast()) };
                let p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x));
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(p, s16));
            }
        }
        acc.map(|a| hsum_i32(a))
    }

    /// [`block_totals4_avx2`] for blocks whose bytes are within ±63 ([`Decoded::small`]): the
    /// activation bytes offset by 128 go in as the unsigned operand of `vpmaddubsw` (no sign
    /// steps; `255 · 63 · 2` fits its i16), and the offset's share, [`Decoded::bias`], comes
    /// off the exact total.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn block_totals4_small_avx2(d: &Decoded, q: [&[u8]; 4]) -> [i32; 4] {
        assert!(d.small && q.iter().all(|q| q.len() >= 256));
        // SAFETY: `d.scales` has 16 bytes; loadu has no alignment requirement.
        let sc = unsafe { _mm_loadu_si128(d.scales.as_ptr().cast()) };
        let offset = _mm256_set1_epi8(-128);
        let mut acc = [_mm256_setzero_si256(); 4];
        for i in 0..8 {
            // SAFETY: `d.vals` has 256 bytes; loadu has no alignment requirement.
            let x = unsafe { _mm256_loadu_si256(d.vals.as_ptr().add(32 * i).cast()) };
            let s16 = scales16(sc, i);
            for (acc, q) in acc.iter_mut().zip(q) {
                // SAFETY: every `q` has at least 256 bytes (asserted).
                let y = unsafe { _mm256_loadu_si256(q.as_ptr().add(32 * i).cast()) };
                let p = _mm256_maddubs_epi16(_mm256_xor_si256(y, offset), x);
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(p, s16));
            }
        }
        acc.map(|acc| hsum_i32(acc) - d.bias)
    }

    /// [`super::decode`] of an IQ4_XS block, its nibbles looked up with `vpshufb`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn decode_iq4_xs_avx2(b: &[u8], d: &mut Decoded) {
        assert!(b.len() >= 136);
        d.factor = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        let scales_h = u16::from_le_bytes([b[2], b[3]]);
        // SAFETY: the table has 16 bytes; loadu has no alignment requirement.
        let lut = unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) };
        let m4 = _mm_set1_epi8(15);
        for ib in 0..8 {
            let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 15;
            let high = ((scales_h >> (2 * ib)) & 3) as u8;
            let s = (low | (high << 4)) as i8 - 32;
            d.scales[2 * ib] = s;
            d.scales[2 * ib + 1] = s;
            // SAFETY: bytes 8 + 16 * ib .. + 16 are in the block (asserted), and
            // `d.vals[32 * ib..32 * ib + 32]` is in the array; unaligned loads and stores.
            unsafe {
                let q = _mm_loadu_si128(b.as_ptr().add(8 + 16 * ib).cast());
                let lo = _mm_shuffle_epi8(lut, _mm_and_si128(q, m4));
                let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
                let out = d.vals.as_mut_ptr().add(32 * ib);
                _mm_storeu_si128(out.cast(), lo);
                _mm_storeu_si128(out.add(16).cast(), hi);
            }
        }
        d.small = false;
    }

    /// [`Decoded::bias`]: `128 · Σ scale · Σ vals` (`vpmaddubsw` of 128 and the bytes:
    /// pairs of at most `2 · 128 · 127` fit its i16).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn block_bias_avx2(d: &Decoded) -> i32 {
        // SAFETY: `d.scales` has 16 bytes; loadu has no alignment requirement.
        let sc = unsafe { _mm_loadu_si128(d.scales.as_ptr().cast()) };
        let offset = _mm256_set1_epi8(-128);
        let mut acc = _mm256_setzero_si256();
        for i in 0..8 {
            // SAFETY: `d.vals` has 256 bytes; loadu has no alignment requirement.
            let x = unsafe { _mm256_loadu_si256(d.vals.as_ptr().add(32 * i).cast()) };
            let s16 = scales16(sc, i);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(offset, x), s16));
        }
        hsum_i32(acc)
    }

    /// The scales of sub-blocks `2i` and `2i + 1` (bytes of `sc`) widened to i16, each filling
    /// the eight lanes that hold its sub-block's 16 bytes as pair sums.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn scales16(sc: __m128i, i: usize) -> __m256i {
        let (a, b) = ((2 * i) as i8, (2 * i + 1) as i8);
        let pick = _mm_setr_epi8(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
        _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pick))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum_i32(acc: __m256i) -> i32 {
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(acc),
            _mm256_extracti128_si256(acc, 1),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    fn dot_avx2(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
        dot_with(ty, n, w, a, |d, q| block_total_avx2(d, q))
    }

    #[target_feature(enable = "avx2,fma")]
    fn panel_avx2(ty: GgmlType, n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
        panel_with(
            ty,
            n,
            w,
            a,
            out,
            |d, q| block_total_avx2(d, q),
            |d, q| {
                if d.small {
                    block_totals4_small_avx2(d, q)
                } else {
                    block_totals4_avx2(d, q)
                }
            },
            |ty, b, d| {
                if ty == GgmlType::IQ4_XS {
                    decode_iq4_xs_avx2(b, d);
                } else {
                    decode(ty, b, d);
                }
                if d.small {
                    d.bias = block_bias_avx2(d);
                }
            },
        )
    }

    macro_rules! entries {
        ($($dot:ident, $panel:ident, $ty:expr;)*) => {
            $(
                fn $dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
                    // SAFETY: registered only in the AVX2 table, built after run-time
                    // detection of avx2 and fma.
                    unsafe { dot_avx2($ty, n, w, a) }
                }
                fn $panel(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
                    // SAFETY: as above.
                    unsafe { panel_avx2($ty, n, w, a, out) }
                }
            )*
            pub(super) fn register(k: &mut Kernels) {
                $(
                    k.set_dot_in(SumOrder::IqPanel, $ty, $dot);
                    k.set_dot_panel_in(SumOrder::IqPanel, $ty, PANEL_ROWS, $panel);
                )*
            }
        };
    }

    panel_types!(entries);
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPES: [GgmlType; 8] = [
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ4_XS,
    ];

    /// A random block with a finite f16 scale of moderate size (IQ1_M keeps it in the top
    /// nibbles of its scale words).
    fn random_block(ty: GgmlType, state: &mut u64) -> Vec<u8> {
        let mut next = || {
            *state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*state >> 33) as u32
        };
        let mut b: Vec<u8> = (0..ty.type_size()).map(|_| next() as u8).collect();
        // sign, exponent 2^-14 .. 2^1, random mantissa
        let d = ((next() & 1) << 15) as u16
            | (((1 + next() % 16) as u16) << 10)
            | (next() as u16 & 0x3ff);
        if ty == GgmlType::IQ1_M {
            for i in 0..4 {
                let o = 48 + 2 * i;
                let w =
                    u16::from_le_bytes([b[o], b[o + 1]]) & 0x0fff | (((d >> (4 * i)) & 15) << 12);
                b[o..o + 2].copy_from_slice(&w.to_le_bytes());
            }
        } else {
            b[0..2].copy_from_slice(&d.to_le_bytes());
        }
        b
    }

    /// As ggml's `GGML_IQP_VERIFY` checks: factor · scale · byte is the dequantized weight,
    /// bit for bit.
    #[test]
    fn a_decoded_block_is_the_dequantized_block() {
        let mut state = 0x5eed_1e55_u64;
        for ty in TYPES {
            for _ in 0..500 {
                let b = random_block(ty, &mut state);
                let mut want = [0f32; QK_K];
                crate::dequantize_row(ty, &b, &mut want).expect("dequantize");
                let mut d = Decoded::ZERO;
                decode(ty, &b, &mut d);
                for (j, &w) in want.iter().enumerate() {
                    let scale = d.factor * f32::from(d.scales[j / 16]);
                    let got = scale * f32::from(d.vals[j]);
                    assert_eq!(got.to_bits(), w.to_bits(), "{ty} element {j}: {got} vs {w}");
                }
            }
        }
    }
}
