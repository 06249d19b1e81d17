//! Dot kernels for the k-quants (Q2_K … Q6_K), IQ4_XS, the 1- to 3-bit i-quants (IQ1_S,
//! IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) and the ternary TQ1_0 and TQ2_0 against Q8_K
//! activations, and the Q8_K activation quantizer.
//!
//! All of these types use 256-element super-blocks. The activation block (Q8_K) is an f32
//! scale `d`, 256 signed bytes and 16 `i16` sums of consecutive groups of 16 bytes; the
//! sums let the kernels apply a weight block's per-group minimum or offset with 16
//! multiplications instead of 256.
//!
//! Each weight type has a portable scalar kernel (integer sums per sub-block, then one
//! float multiply-add per super-block) and, on x86-64, an AVX2/FMA kernel with the same
//! integer arithmetic; the two differ only in the order of float additions. The ternary
//! types' and the 1- to 3-bit i-quants' scalar kernels keep ggml's x86 lanes and float order
//! instead (the ternary types' lanes cancel each other, so another order would not stay within
//! rounding of ggml's result). On aarch64 the NEON table has kernels for every type here in
//! the order of ggml's ARM build (`neon.rs`, and `neon_iq.rs` for the ternary types and the
//! 1- to 3-bit i-quants, whose ARM kernels add exact integer totals).
//!
//! Numerics against ggml on x86: the Q8_K quantizer produces ggml's bytes; the AVX2
//! kernels keep the lane layout and float-operation order of ggml's AVX2 `vec_dot`
//! kernels, fused multiply-adds included, so a row gives the same f32 as ggml's
//! `vec_dot_*_q8_K`. llama.cpp does not always use those: with its default weight
//! repacking it stores Q4_K matrices (on AVX2; also Q2_K on AVX-512) whose row count is a
//! multiple of 8 as interleaved 8-row blocks with their own kernels, which add each
//! super-block's integer total in one float chain per row; those results differ from these
//! in the last bits (float order only).
//!
//! On x86-64 the AVX2 table also has multi-row kernels for Q4_K, Q5_K and Q6_K (several
//! consecutive rows against one activation row per call, `x86_rows.rs`), each result
//! bit-identical to the single-row AVX2 kernel on that row. The NEON table has them too
//! (`neon_rows.rs`), each bit-identical to the single-row NEON kernel.
//!
//! The kernels expect activation quants in `-127..=127`, which is what the Q8_K quantizer
//! produces. The AVX2 IQ4_XS kernel takes signs with `vpsignb`, which cannot represent
//! `-(-128)`; the 1- to 3-bit i-quant kernels (scalar too) flip signs as `vpsignb` does, so -128 stays
//! -128 as in ggml; the other kernels accept the full `i8` range.

/// `DotFn` entry points of the NEON kernels (`neon.rs`, `neon_iq.rs`): the length contract
/// checked, the rows cut into blocks. They are registered only in a table built for
/// `Isa::Neon`, which `Kernels::detect` builds only after it detected NEON and the dot product
/// at run time.
#[cfg(target_arch = "aarch64")]
macro_rules! neon_entry {
    ($name:ident, $ty:expr, $bytes:expr, $kernel:ident) => {
        fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            check_dot($ty, n, w, a);
            let (w, _) = w.as_chunks::<{ $bytes }>();
            let (a, _) = a.as_chunks::<Q8K_BYTES>();
            // SAFETY: only reachable through a NEON table (see above), so the CPU has the
            // features the kernel is compiled for.
            unsafe { $kernel(w, a) }
        }
    };
}

#[cfg(target_arch = "aarch64")]
pub(super) mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_iq;
#[cfg(target_arch = "aarch64")]
mod neon_rows;
#[cfg(target_arch = "aarch64")]
mod neon_tiles;
pub(crate) mod panel;
mod q8k;
pub use q8k::quantize_row_q8_k_fused;
mod scalar;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_rows;

use super::{Isa, Kernels};
use crate::{GgmlType, QK_K};

/// Bytes of one Q8_K block: `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]`.
const Q8K_BYTES: usize = 4 + QK_K + 2 * (QK_K / 16);
/// Offset of `qs` in a Q8_K block.
const Q8K_QS: usize = 4;
/// Offset of `bsums` in a Q8_K block.
const Q8K_BSUMS: usize = Q8K_QS + QK_K;

/// Block layouts (byte offsets inside one 256-element block).
mod layout {
    /// Q2_K: `scales[16]` (low nibble scale, high nibble min), `qs[64]`, `d`, `dmin`.
    pub mod q2k {
        pub const BYTES: usize = 84;
        pub const SCALES: usize = 0;
        pub const QS: usize = 16;
        pub const D: usize = 80;
        pub const DMIN: usize = 82;
    }
    /// Q3_K: `hmask[32]`, `qs[64]`, `scales[12]` (16 packed 6-bit values), `d`.
    pub mod q3k {
        pub const BYTES: usize = 110;
        pub const HMASK: usize = 0;
        pub const QS: usize = 32;
        pub const SCALES: usize = 96;
        pub const D: usize = 108;
    }
    /// Q4_K: `d`, `dmin`, `scales[12]` (8 scales and 8 mins, 6 bits each), `qs[128]`.
    pub mod q4k {
        pub const BYTES: usize = 144;
        pub const D: usize = 0;
        pub const DMIN: usize = 2;
        pub const SCALES: usize = 4;
        pub const QS: usize = 16;
    }
    /// Q5_K: `d`, `dmin`, `scales[12]`, `qh[32]`, `qs[128]`.
    pub mod q5k {
        pub const BYTES: usize = 176;
        pub const D: usize = 0;
        pub const DMIN: usize = 2;
        pub const SCALES: usize = 4;
        pub const QH: usize = 16;
        pub const QS: usize = 48;
    }
    /// Q6_K: `ql[128]`, `qh[64]`, `scales: [i8; 16]`, `d`.
    pub mod q6k {
        pub const BYTES: usize = 210;
        pub const QL: usize = 0;
        pub const QH: usize = 128;
        pub const SCALES: usize = 192;
        pub const D: usize = 208;
    }
    /// IQ4_XS: `d`, `scales_h: u16`, `scales_l[4]`, `qs[128]`.
    pub mod iq4xs {
        pub const BYTES: usize = 136;
        pub const D: usize = 0;
        pub const SCALES_H: usize = 2;
        pub const SCALES_L: usize = 4;
        pub const QS: usize = 8;
    }
    /// TQ2_0: `qs[64]` (ternary values 0, 1, 2 for -1, 0, +1 in 2-bit fields, laid out as
    /// Q2_K's), `d`.
    pub mod tq20 {
        pub const BYTES: usize = 66;
        pub const QS: usize = 0;
        pub const D: usize = 64;
    }
    /// IQ2_XXS: `d`, then per 32 elements two words: four grid indices (a byte each), and
    /// four 7-bit sign indices with the 4-bit scale in the top bits.
    pub mod iq2xxs {
        pub const BYTES: usize = 66;
        pub const D: usize = 0;
        pub const QS: usize = 2;
    }
    /// IQ2_XS: `d`, 32 `u16` (a 9-bit grid index and a 7-bit sign index each, four per 32
    /// elements), then per 32 elements a byte of two 4-bit scales (first 16, last 16).
    pub mod iq2xs {
        pub const BYTES: usize = 74;
        pub const D: usize = 0;
        pub const QS: usize = 2;
        pub const SCALES: usize = 66;
    }
    /// IQ2_S: `d`, 32 low bytes of the 10-bit grid indices, 32 sign bytes (one per 8
    /// elements), per 32 elements a byte of the indices' top bit pairs and a byte of two
    /// 4-bit scales.
    pub mod iq2s {
        pub const BYTES: usize = 82;
        pub const D: usize = 0;
        pub const QS: usize = 2;
        pub const SIGNS: usize = 34;
        pub const QH: usize = 66;
        pub const SCALES: usize = 74;
    }
    /// IQ3_XXS: `d`, 64 grid indices (one per 4 elements), then per 32 elements a word of
    /// four 7-bit sign indices and the 4-bit scale in the top bits.
    pub mod iq3xxs {
        pub const BYTES: usize = 98;
        pub const D: usize = 0;
        pub const QS: usize = 2;
        pub const SIGNS: usize = 66;
    }
    /// IQ3_S: `d`, 64 low bytes of the 9-bit grid indices, 8 bytes of their top bits, 32
    /// sign bytes, 4 bytes of two 4-bit scales (one per 32 elements).
    pub mod iq3s {
        pub const BYTES: usize = 110;
        pub const D: usize = 0;
        pub const QS: usize = 2;
        pub const QH: usize = 66;
        pub const SIGNS: usize = 74;
        pub const SCALES: usize = 106;
    }
    /// TQ1_0: 48 bytes of five base-3 digits (the first 32 bytes' digit `n` is element
    /// `32n + m`, the next 16 bytes' `160 + 16n + m`), 4 bytes of four digits (`240 + 4n + m`),
    /// `d`.
    pub mod tq10 {
        pub const BYTES: usize = 54;
        pub const QS: usize = 0;
        pub const QH: usize = 48;
        pub const D: usize = 52;
    }
    /// IQ1_S: `d`, 32 low bytes of the 11-bit grid indices, then per 32 elements a `u16`
    /// of the indices' top bits (3 per 8 elements), a 3-bit scale and the shift's sign.
    pub mod iq1s {
        pub const BYTES: usize = 50;
        pub const D: usize = 0;
        pub const QS: usize = 2;
        pub const QH: usize = 34;
    }
    /// IQ1_M: 32 low index bytes, 16 bytes of nibbles (3 top index bits and the shift's
    /// sign per 8 elements), four `u16` of 3-bit scales (two per 32 elements) with the f16
    /// `d` in their top nibbles.
    pub mod iq1m {
        pub const BYTES: usize = 56;
        pub const QS: usize = 0;
        pub const QH: usize = 32;
        pub const SCALES: usize = 48;
    }
}

/// IQ1_M's shift signs as bytes, `N` patterns of `B` bytes (the NEON kernel's table): entry
/// `s` holds -1 (0xff) in the 8 bytes `8l..8l + 8` where bit `l` of `s` is set, 1 elsewhere.
#[cfg(target_arch = "aarch64")]
const fn shift_signs<const N: usize, const B: usize>() -> [[u8; B]; N] {
    let mut t = [[1u8; B]; N];
    let mut s = 0;
    while s < N {
        let mut e = 0;
        while e < B {
            if (s >> (e / 8)) & 1 != 0 {
                t[s][e] = 0xff;
            }
            e += 1;
        }
        s += 1;
    }
    t
}

/// IQ1_M's f16 `d`, spread over the top nibbles of its four scale words.
#[inline]
fn iq1m_d(x: &[u8]) -> f32 {
    half::f16::from_bits(iq1m_d_bits(x)).to_f32()
}

/// The bits of [`iq1m_d`].
#[inline]
fn iq1m_d_bits(x: &[u8]) -> u16 {
    let w = |i: usize| {
        u16::from_le_bytes([
            x[layout::iq1m::SCALES + 2 * i],
            x[layout::iq1m::SCALES + 2 * i + 1],
        ])
    };
    (w(0) >> 12) | ((w(1) >> 8) & 0x00f0) | ((w(2) >> 4) & 0x0f00) | (w(3) & 0xf000)
}

/// IQ1_M's scale `2s + 1` of the 16 elements `h` (0 or 1) of 32-element group `g`.
#[inline]
fn iq1m_scale(x: &[u8], g: usize, h: usize) -> i32 {
    let o = layout::iq1m::SCALES + 2 * (g / 2);
    let s = u16::from_le_bytes([x[o], x[o + 1]]) >> (6 * (g % 2) + 3 * h);
    2 * i32::from(s & 7) + 1
}

/// IQ1_M's nibble of 8 elements `l` (0..4) of group `g`: 3 top index bits and the sign.
#[inline]
fn iq1m_nibble(x: &[u8], g: usize, l: usize) -> u8 {
    let b = x[layout::iq1m::QH + 2 * g + l / 2];
    if l.is_multiple_of(2) { b & 15 } else { b >> 4 }
}

/// The sum of eight lanes in the order of ggml's `hsum_float_8`, which is tinyBLAS's.
use super::tinyblas::hsum8;

pub(super) fn register(k: &mut Kernels) {
    k.set_quantize(GgmlType::Q8_K, q8k::quantize_row_q8_k);

    k.set_dot(GgmlType::Q2_K, scalar::dot_q2_k);
    k.set_dot(GgmlType::Q3_K, scalar::dot_q3_k);
    k.set_dot(GgmlType::Q4_K, scalar::dot_q4_k);
    k.set_dot(GgmlType::Q5_K, scalar::dot_q5_k);
    k.set_dot(GgmlType::Q6_K, scalar::dot_q6_k);
    k.set_dot(GgmlType::IQ4_XS, scalar::dot_iq4_xs);
    k.set_dot(GgmlType::TQ2_0, scalar::dot_tq2_0);
    k.set_dot(GgmlType::TQ1_0, scalar::dot_tq1_0);
    k.set_dot(GgmlType::IQ2_XXS, scalar::dot_iq2_xxs);
    k.set_dot(GgmlType::IQ2_XS, scalar::dot_iq2_xs);
    k.set_dot(GgmlType::IQ2_S, scalar::dot_iq2_s);
    k.set_dot(GgmlType::IQ3_XXS, scalar::dot_iq3_xxs);
    k.set_dot(GgmlType::IQ3_S, scalar::dot_iq3_s);
    k.set_dot(GgmlType::IQ1_S, scalar::dot_iq1_s);
    k.set_dot(GgmlType::IQ1_M, scalar::dot_iq1_m);
    panel::register(k);

    if k.isa() == Isa::Avx2 {
        #[cfg(target_arch = "x86_64")]
        {
            x86::register(k);
            x86_rows::register(k);
        }
    }
    if k.isa() == Isa::Neon {
        #[cfg(target_arch = "aarch64")]
        {
            neon::register(k);
            neon_iq::register(k);
            neon_rows::register(k);
            neon_tiles::register(k);
        }
    }
}

/// Assert the [`super::DotFn`] length contract for weight type `ty` × Q8_K and return the
/// number of super-blocks.
#[inline]
fn check_dot(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> usize {
    assert!(
        n.is_multiple_of(QK_K),
        "{ty} dot: n = {n} is not a multiple of {QK_K}"
    );
    let nb = n / QK_K;
    assert_eq!(w.len(), nb * ty.type_size(), "{ty} dot: weight row length");
    assert_eq!(
        a.len(),
        nb * Q8K_BYTES,
        "{ty} dot: q8_K activation row length"
    );
    nb
}

/// The f16 at `off` of `b`, as f32.
#[inline]
fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

/// The f32 at `off` of `b`.
#[inline]
fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// The little-endian u32 at `off` of `b`.
#[inline]
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Unpack the 12 scale bytes of a Q4_K / Q5_K block into four little-endian words holding
/// 16 bytes: the eight 6-bit sub-block scales followed by the eight 6-bit sub-block minimums.
#[inline]
fn unpack_scales_mins_k4_words(s: &[u8]) -> [u32; 4] {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let (a0, a1, a2) = (u32_at(s, 0), u32_at(s, 4), u32_at(s, 8));
    [
        a0 & LOW6,
        (a2 & LOW4) | (((a0 >> 6) & LOW2) << 4),
        a1 & LOW6,
        ((a2 >> 4) & LOW4) | (((a1 >> 6) & LOW2) << 4),
    ]
}

/// [`unpack_scales_mins_k4_words`] as bytes: `[scales[0..8], mins[0..8]]`.
#[inline]
fn unpack_scales_mins_k4(s: &[u8]) -> [u8; 16] {
    words_to_bytes(unpack_scales_mins_k4_words(s))
}

#[inline]
fn words_to_bytes(words: [u32; 4]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// Unpack the 12 scale bytes of a Q3_K block into four little-endian words holding the 16
/// sub-block scales as stored (6-bit, `0..=63`; the signed scale is this minus 32).
#[inline]
fn unpack_scales_q3k_words(s: &[u8]) -> [u32; 4] {
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let (a0, a1, a2) = (u32_at(s, 0), u32_at(s, 4), u32_at(s, 8));
    [
        (a0 & LOW4) | ((a2 & LOW2) << 4),
        (a1 & LOW4) | (((a2 >> 2) & LOW2) << 4),
        ((a0 >> 4) & LOW4) | (((a2 >> 4) & LOW2) << 4),
        ((a1 >> 4) & LOW4) | (((a2 >> 6) & LOW2) << 4),
    ]
}

/// [`unpack_scales_q3k_words`] as bytes.
#[inline]
fn unpack_scales_q3k(s: &[u8]) -> [u8; 16] {
    words_to_bytes(unpack_scales_q3k_words(s))
}

/// Base-3 digit `n` of a TQ1_0 byte: `(b · 3^n mod 256) · 3 >> 8`. (ggml's AVX2 kernel
/// takes one off with saturation, multiplies by 3/4 with two rounding halving adds and keeps
/// the top two bits: the same digit for every byte, invalid ones included; see the test.)
#[inline]
fn tq1_digit(b: u8, n: u32) -> u8 {
    let q = b.wrapping_mul(3u8.wrapping_pow(n));
    ((u16::from(q) * 3) >> 8) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's AVX2 digit extraction gives [`super::tq1_digit`]'s digit for every byte.
    #[test]
    fn the_avx2_digit_sequence_is_the_plain_formula() {
        for b in 0..=255u8 {
            for n in 0..5 {
                let q = b.wrapping_mul(3u8.wrapping_pow(n));
                let t = u16::from(q.saturating_sub(1));
                let avx2 = ((t + ((t + 1) >> 1) + 1) >> 1) >> 6;
                assert_eq!(avx2 as u8, super::tq1_digit(b, n), "byte {b} digit {n}");
            }
        }
    }

    /// The bit layout written out element by element, as the format describes it.
    fn k4_by_definition(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
        let mut sc = [0u8; 8];
        let mut mn = [0u8; 8];
        for j in 0..8 {
            if j < 4 {
                sc[j] = s[j] & 63;
                mn[j] = s[j + 4] & 63;
            } else {
                sc[j] = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
                mn[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            }
        }
        (sc, mn)
    }

    fn q3k_by_definition(s: &[u8; 12]) -> [u8; 16] {
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            let low = if i < 8 { s[i] & 0xF } else { s[i - 8] >> 4 };
            let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
            *o = low | (high << 4);
        }
        out
    }

    #[test]
    fn scale_unpacking_matches_the_bit_layout() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut s = [0u8; 12];
            for b in &mut s {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *b = (state >> 56) as u8;
            }
            let got = unpack_scales_mins_k4(&s);
            let (sc, mn) = k4_by_definition(&s);
            assert_eq!(got[..8], sc);
            assert_eq!(got[8..], mn);
            assert_eq!(unpack_scales_q3k(&s), q3k_by_definition(&s));
        }
    }
}
