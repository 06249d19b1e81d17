//! Dequantization must equal the references bit for bit.
//!
//! Two fixtures (see `tests/fixtures/README.md`): random valid blocks of every type with
//! their dequantization by the `gguf` Python package's numpy code, and by ggml itself.
//! Q8_1, which neither reference can dequantize, is checked against Q8_0 (same scale and
//! quants, already checked against both) on ggml-produced and random blocks.

use std::collections::BTreeSet;

use gguf::GgufFile;
use quant::{GgmlType, can_dequantize, dequantize_row, dequantize_to_vec};

fn open(name: &str) -> GgufFile {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn f32_bits(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Check every `<type>.q` / `<type>.f32` pair of a fixture; returns the types checked.
fn check_fixture(file: &str) -> BTreeSet<GgmlType> {
    let f = open(file);
    let mut covered = BTreeSet::new();
    for info in f.tensors() {
        let Some(prefix) = info.name.strip_suffix(".q") else {
            continue;
        };
        let ty = info.ggml_type().expect("known tensor type");
        assert_eq!(
            ty.name(),
            prefix,
            "{file}: tensor {} has type {ty}",
            info.name
        );
        let src = f.tensor_data(info).unwrap();
        let want_info = f
            .tensor(&format!("{prefix}.f32"))
            .unwrap_or_else(|| panic!("{file}: no {prefix}.f32"));
        assert_eq!(want_info.ggml_type(), Some(GgmlType::F32));
        let want = f32_bits(f.tensor_data(want_info).unwrap());
        let n = usize::try_from(info.n_elements()).unwrap();
        assert_eq!(want.len(), n, "{file}: {ty} element count");
        assert!(n >= 256, "{file}: {ty}: too few elements to mean anything");

        let mut got = vec![f32::NAN; n];
        dequantize_row(ty, src, &mut got).unwrap();
        let bad: Vec<usize> = (0..n).filter(|&i| got[i].to_bits() != want[i]).collect();
        if let Some(&i) = bad.first() {
            panic!(
                "{file}: {ty}: {} of {n} elements differ; first at {i} (block {}): got {:e} ({:#010x}), want {:e} ({:#010x})",
                bad.len(),
                i / ty.block_size(),
                got[i],
                got[i].to_bits(),
                f32::from_bits(want[i]),
                want[i],
            );
        }
        covered.insert(ty);
    }
    covered
}

use GgmlType as T;

/// Types gguf-py 0.19.0 dequantizes (NVFP4 aside), plus the plain integer and f64 types
/// that the fixture checks against numpy's conversion.
const GGUF_PY_TYPES: &[GgmlType] = &[
    T::F32,
    T::F16,
    T::BF16,
    T::Q4_0,
    T::Q4_1,
    T::Q5_0,
    T::Q5_1,
    T::Q8_0,
    T::Q2_K,
    T::Q3_K,
    T::Q4_K,
    T::Q5_K,
    T::Q6_K,
    T::IQ2_XXS,
    T::IQ2_XS,
    T::IQ3_XXS,
    T::IQ1_S,
    T::IQ4_NL,
    T::IQ3_S,
    T::IQ2_S,
    T::IQ4_XS,
    T::IQ1_M,
    T::TQ1_0,
    T::TQ2_0,
    T::MXFP4,
    T::I8,
    T::I16,
    T::I32,
    T::I64,
    T::F64,
];

/// Types with a ggml dequantizer (F32 has none: it is never converted).
const GGML_TYPES: &[GgmlType] = &[
    T::F16,
    T::BF16,
    T::Q4_0,
    T::Q4_1,
    T::Q5_0,
    T::Q5_1,
    T::Q8_0,
    T::Q2_K,
    T::Q3_K,
    T::Q4_K,
    T::Q5_K,
    T::Q6_K,
    T::Q8_K,
    T::IQ2_XXS,
    T::IQ2_XS,
    T::IQ3_XXS,
    T::IQ1_S,
    T::IQ4_NL,
    T::IQ3_S,
    T::IQ2_S,
    T::IQ4_XS,
    T::IQ1_M,
    T::TQ1_0,
    T::TQ2_0,
    T::MXFP4,
];

#[test]
fn dequant_matches_gguf_py_bit_for_bit() {
    let covered = check_fixture("quant_gguf_py.gguf");
    let want: BTreeSet<GgmlType> = GGUF_PY_TYPES.iter().copied().collect();
    assert_eq!(covered, want);
}

#[test]
fn dequant_matches_ggml_bit_for_bit() {
    let covered = check_fixture("quant_ggml.gguf");
    let want: BTreeSet<GgmlType> = GGML_TYPES.iter().copied().collect();
    assert_eq!(covered, want);
}

/// Every type `dequantize_row` accepts is checked against an outside reference: one of the
/// fixtures, or (Q8_1 only) the Q8_0 equivalence below.
#[test]
fn every_supported_type_has_a_reference() {
    let mut referenced: BTreeSet<GgmlType> = GGUF_PY_TYPES.iter().copied().collect();
    referenced.extend(GGML_TYPES.iter().copied());
    referenced.insert(T::Q8_1);
    let supported: BTreeSet<GgmlType> = GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| can_dequantize(t))
        .collect();
    assert_eq!(supported, referenced);
}

/// A Q8_1 block (f16 d, f16 s, 32 x i8) dequantizes like the Q8_0 block (f16 d, 32 x i8)
/// with the same d and quants: `s` only serves dot products.
fn assert_q8_1_like_q8_0(q8_1: &[u8]) {
    let n_blocks = q8_1.len() / 36;
    let mut q8_0 = Vec::with_capacity(n_blocks * 34);
    for b in q8_1.chunks_exact(36) {
        q8_0.extend_from_slice(&b[0..2]);
        q8_0.extend_from_slice(&b[4..36]);
    }
    let got = dequantize_to_vec(T::Q8_1, q8_1).unwrap();
    let want = dequantize_to_vec(T::Q8_0, &q8_0).unwrap();
    assert_eq!(got.len(), n_blocks * 32);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "element {i}");
    }
}

#[test]
fn q8_1_dequant_equals_q8_0_of_same_scale_and_quants() {
    // Blocks produced by ggml's quantize_row_q8_1_ref.
    let f = open("quant_ggml.gguf");
    let info = f.tensor("act.q8_1").unwrap();
    assert_eq!(info.ggml_type(), Some(T::Q8_1));
    let blocks = f.tensor_data(info).unwrap();
    assert!(blocks.len() >= 36 * 64);
    assert_q8_1_like_q8_0(blocks);

    // Random blocks whose f16 scales are finite (exponent field below 31).
    let mut state = 0x0123_4567_89AB_CDEFu64;
    let mut random = vec![0u8; 36 * 64];
    for byte in random.iter_mut() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *byte = (state >> 56) as u8;
    }
    for b in random.chunks_exact_mut(36) {
        b[1] &= 0xBB; // clears exponent bits of d: never all ones
        b[3] &= 0xBB;
    }
    assert_q8_1_like_q8_0(&random);
}
