//! Scalar reference dequantization of every ggml block format.
//!
//! Each format is decoded block by block from little-endian bytes, with the same
//! arithmetic as ggml's reference `dequantize_row_*` functions: the same operation order,
//! f32 throughout, f16 scales widened exactly. The results are therefore bit-identical to
//! ggml (and to the `gguf` Python package's numpy decoders), which the fixture tests in
//! `tests/dequant_reference.rs` check.
//!
//! These functions are the specification the SIMD kernels are tested against; they are
//! written for clarity, not speed.

use crate::{GgmlType, QuantError};

mod floats;
mod iquants;
pub(crate) mod kquants;
mod legacy;
mod ternary;

/// Decodes one block: `src.len() == ty.type_size()`, `dst.len() == ty.block_size()`.
type BlockFn = fn(src: &[u8], dst: &mut [f32]);

/// The block decoder of a type, or `None` when this crate cannot dequantize it.
fn block_fn(ty: GgmlType) -> Option<BlockFn> {
    use GgmlType as T;
    Some(match ty {
        T::F32 => floats::f32_block,
        T::F16 => floats::f16_block,
        T::BF16 => floats::bf16_block,
        T::F64 => floats::f64_block,
        T::I8 => floats::i8_block,
        T::I16 => floats::i16_block,
        T::I32 => floats::i32_block,
        T::I64 => floats::i64_block,
        T::Q4_0 => legacy::q4_0,
        T::Q4_1 => legacy::q4_1,
        T::Q5_0 => legacy::q5_0,
        T::Q5_1 => legacy::q5_1,
        T::Q8_0 => legacy::q8_0,
        T::Q8_1 => legacy::q8_1,
        T::IQ4_NL => legacy::iq4_nl,
        T::MXFP4 => legacy::mxfp4,
        T::Q2_K => kquants::q2_k,
        T::Q3_K => kquants::q3_k,
        T::Q4_K => kquants::q4_k,
        T::Q5_K => kquants::q5_k,
        T::Q6_K => kquants::q6_k,
        T::Q8_K => kquants::q8_k,
        T::IQ4_XS => kquants::iq4_xs,
        T::IQ2_XXS => iquants::iq2_xxs,
        T::IQ2_XS => iquants::iq2_xs,
        T::IQ2_S => iquants::iq2_s,
        T::IQ3_XXS => iquants::iq3_xxs,
        T::IQ3_S => iquants::iq3_s,
        T::IQ1_S => iquants::iq1_s,
        T::IQ1_M => iquants::iq1_m,
        T::TQ1_0 => ternary::tq1_0,
        T::TQ2_0 => ternary::tq2_0,
        _ => return None,
    })
}

/// Whether [`dequantize_row`] supports `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    block_fn(ty).is_some()
}

/// Check that `n` elements of `ty` are whole blocks and occupy exactly `bytes` bytes.
pub(crate) fn check_row(
    ty: GgmlType,
    n: usize,
    bytes: usize,
    what: &'static str,
) -> Result<(), QuantError> {
    let block = ty.block_size();
    if !n.is_multiple_of(block) {
        return Err(QuantError::NotBlockMultiple { ty, n, block });
    }
    let expected = (n / block)
        .checked_mul(ty.type_size())
        .ok_or(QuantError::NotBlockMultiple { ty, n, block })?;
    if bytes != expected {
        return Err(QuantError::LengthMismatch {
            ty,
            what,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// Dequantize one row: `src` holds the blocks of `dst.len()` elements of type `ty`.
///
/// `dst.len()` must be a whole number of blocks ([`QuantError::NotBlockMultiple`]) and
/// `src.len()` must be `ty.row_bytes(dst.len())` ([`QuantError::LengthMismatch`]).
/// NVFP4 and Q1_0 are [`QuantError::Unsupported`].
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let f = block_fn(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "dequantize",
    })?;
    check_row(ty, dst.len(), src.len(), "source")?;
    for (b, out) in src
        .chunks_exact(ty.type_size())
        .zip(dst.chunks_exact_mut(ty.block_size()))
    {
        f(b, out);
    }
    Ok(())
}

/// Dequantize whole blocks into a new vector; the element count follows from `src.len()`.
///
/// `src.len()` must be a multiple of the type's block byte size
/// ([`QuantError::LengthMismatch`] otherwise).
pub fn dequantize_to_vec(ty: GgmlType, src: &[u8]) -> Result<Vec<f32>, QuantError> {
    let ts = ty.type_size();
    if !src.len().is_multiple_of(ts) {
        return Err(QuantError::LengthMismatch {
            ty,
            what: "source (whole blocks)",
            expected: src.len() / ts * ts,
            got: src.len(),
        });
    }
    let mut out = vec![0f32; src.len() / ts * ty.block_size()];
    dequantize_row(ty, src, &mut out)?;
    Ok(out)
}

/// Little-endian f16 at `at`, widened exactly to f32 (NaNs come out quiet, as in ggml).
#[inline]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

#[inline]
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_through_mxfp4_is_supported() {
        for &ty in GgmlType::ALL {
            let expect = !matches!(ty, GgmlType::NVFP4 | GgmlType::Q1_0);
            assert_eq!(can_dequantize(ty), expect, "{ty}");
        }
    }

    #[test]
    fn length_errors() {
        let mut out = [0f32; 64];
        assert_eq!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 35], &mut out),
            Err(QuantError::LengthMismatch {
                ty: GgmlType::Q4_0,
                what: "source",
                expected: 36,
                got: 35
            })
        );
        assert_eq!(
            dequantize_row(GgmlType::Q4_K, &[0u8; 144], &mut out),
            Err(QuantError::NotBlockMultiple {
                ty: GgmlType::Q4_K,
                n: 64,
                block: 256
            })
        );
        assert!(matches!(
            dequantize_row(GgmlType::NVFP4, &[0u8; 36], &mut out),
            Err(QuantError::Unsupported { .. })
        ));
        assert!(dequantize_to_vec(GgmlType::Q8_0, &[0u8; 35]).is_err());
        assert_eq!(
            dequantize_to_vec(GgmlType::Q8_0, &[]).unwrap(),
            Vec::<f32>::new()
        );
    }

    #[test]
    fn zero_blocks_decode_to_zero() {
        // An all-zero block has a zero scale, so every element is +-0, for every type.
        for &ty in GgmlType::ALL {
            if !can_dequantize(ty) {
                continue;
            }
            let src = vec![0u8; ty.type_size() * 2];
            let out = dequantize_to_vec(ty, &src).unwrap();
            assert_eq!(out.len(), ty.block_size() * 2);
            assert!(out.iter().all(|&v| v == 0.0), "{ty}: {out:?}");
        }
    }
}
