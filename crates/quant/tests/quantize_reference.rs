//! Quantization must equal the references byte for byte, and round-trip within bounds.
//!
//! Each fixture (see `tests/fixtures/README.md`) holds deterministic f32 inputs
//! (`quant.input`) and, per type, the reference quantization of them (`<type>.quant`):
//! ggml's `quantize_row_*_ref` (via `ggml_quantize_chunk` without importance matrix) in
//! `quant_ggml.gguf`, `gguf.quants.quantize` in `quant_gguf_py.gguf`.

use std::collections::BTreeSet;

use gguf::GgufFile;
use proptest::prelude::*;
use quant::{GgmlType, can_quantize, dequantize_to_vec, quantize_row, quantize_to_vec};

use GgmlType as T;

fn open(name: &str) -> GgufFile {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Quantize the fixture's input with every type it has a reference for; returns the types.
fn check_fixture(file: &str) -> BTreeSet<GgmlType> {
    let f = open(file);
    let input_info = f.tensor("quant.input").unwrap();
    assert_eq!(input_info.ggml_type(), Some(T::F32));
    let x: Vec<f32> = f
        .tensor_data(input_info)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(x.len() >= 16 * 256);
    let mut covered = BTreeSet::new();
    for info in f.tensors() {
        let Some(prefix) = info.name.strip_suffix(".quant") else {
            continue;
        };
        let ty = info.ggml_type().expect("known tensor type");
        assert_eq!(
            ty.name(),
            prefix,
            "{file}: tensor {} has type {ty}",
            info.name
        );
        assert_eq!(info.n_elements(), x.len() as u64);
        let want = f.tensor_data(info).unwrap();
        let mut got = vec![0xAAu8; want.len()];
        quantize_row(ty, &x, &mut got).unwrap();
        let ts = ty.type_size();
        let bad: Vec<usize> = (0..want.len() / ts)
            .filter(|&b| got[b * ts..(b + 1) * ts] != want[b * ts..(b + 1) * ts])
            .collect();
        if let Some(&b) = bad.first() {
            let bs = ty.block_size();
            panic!(
                "{file}: {ty}: {} of {} blocks differ; first is block {b}\n got  {:02x?}\n want {:02x?}\n input {:?}",
                bad.len(),
                want.len() / ts,
                &got[b * ts..(b + 1) * ts],
                &want[b * ts..(b + 1) * ts],
                &x[b * bs..(b + 1) * bs],
            );
        }
        covered.insert(ty);
    }
    covered
}

#[test]
fn quantize_matches_ggml_byte_for_byte() {
    let covered = check_fixture("quant_ggml.gguf");
    // Every type quantize_row supports has a ggml reference.
    let supported: BTreeSet<GgmlType> = GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| can_quantize(t))
        .collect();
    assert_eq!(covered, supported);
    for t in [T::Q8_0, T::Q4_0, T::Q4_K, T::Q5_K, T::Q6_K, T::MXFP4] {
        assert!(covered.contains(&t), "{t}");
    }
}

#[test]
fn quantize_matches_gguf_py_byte_for_byte() {
    let covered = check_fixture("quant_gguf_py.gguf");
    let want: BTreeSet<GgmlType> = [
        T::F16,
        T::BF16,
        T::Q4_0,
        T::Q4_1,
        T::Q5_0,
        T::Q5_1,
        T::Q8_0,
        T::MXFP4,
    ]
    .into_iter()
    .collect();
    assert_eq!(covered, want);
}

// ---------------------------------------------------------------------------------------
// Round trip: |x - dequantize(quantize(x))| within a bound per type.
//
// `amax` is the largest |x| of the block (32 elements, or 256 for the k-quants), `range`
// is max(x) - min(x) of the block. The bounds follow from each format:
//
// * Q8_0: scale amax/127, round to nearest: error <= amax/127 * (1/2 + 127 * 2^-11), the
//   second term from storing the scale as f16 (relative error 2^-11, or absolute 2^-25
//   when the scale is an f16 subnormal; the same holds for every f16 below).
// * Q4_0 / Q5_0: scale amax/8 (amax/16) with levels -8..7 (-16..15): the extreme of the
//   wrong sign is clipped by one step, so error <= amax/8 (amax/16), plus f16 scale error.
// * Q4_1 / Q5_1: range/15 (range/31) steps from the minimum: error <= half a step plus the
//   f16 errors of scale and minimum.
// * MXFP4: shared exponent floor(log2 amax) - 2; FP4 steps are at most 2 units in [4, 6]
//   and amax may reach just below 8 units, clipped to 6: error <= amax / 4 (2 units, one
//   unit being at most amax/4).
// * Q4_K / Q5_K / Q6_K / Q2_K / Q3_K: per-group scales are themselves quantized (6 or 8
//   bits) against the super-block maximum, so the bound is stated on the super-block:
//   error <= c * amax with c = 1/15 (Q4_K), 1/31 (Q5_K), 1/63 (Q6_K), 1/3 (Q2_K),
//   1/7 (Q3_K) times a slack factor of 2.5 for the scale quantization. (Measured worst
//   error / amax over 2000 random super-blocks of this kind: 0.091, 0.047, 0.018, 0.37,
//   0.26.)
// * F16 / BF16: relative rounding 2^-11 / 2^-8 (for values in the normal range).

fn bound(ty: GgmlType, block: &[f32]) -> f32 {
    let amax = block.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let (mn, mx) = block
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let range = mx - mn;
    // Error of storing v as f16: relative 2^-11, absolute 2^-25 in the subnormal range.
    let fe = |v: f32| v.abs() * 2f32.powi(-11) + 2f32.powi(-25);
    let tiny = 1e-6 * amax;
    // Scales of the k-quants are f16 multiples of 6-8 bit integers: at most 63 * 63 f16
    // subnormal steps of absolute error per element.
    let k_abs = 63.0 * 63.0 * 2f32.powi(-25);
    match ty {
        T::Q8_0 => amax / 127.0 * 0.5 + 127.0 * fe(amax / 127.0) + tiny,
        T::Q4_0 => amax / 8.0 + 8.0 * fe(amax / 8.0) + tiny,
        T::Q5_0 => amax / 16.0 + 16.0 * fe(amax / 16.0) + tiny,
        T::Q4_1 => range / 15.0 * 0.5 + 15.0 * fe(range / 15.0) + fe(mn) + tiny,
        T::Q5_1 => range / 31.0 * 0.5 + 31.0 * fe(range / 31.0) + fe(mn) + tiny,
        T::MXFP4 => amax / 4.0 + tiny,
        T::Q4_K => 2.5 * amax / 15.0 + k_abs,
        T::Q5_K => 2.5 * amax / 31.0 + k_abs,
        T::Q6_K => 2.5 * amax / 63.0 + k_abs,
        T::Q2_K => 2.5 * amax / 3.0 + k_abs,
        T::Q3_K => 2.5 * amax / 7.0 + k_abs,
        _ => unreachable!("{ty}"),
    }
}

/// Rows of realistic weights: per-32 spreads over several octaves, occasional outliers.
fn weights(n_super: usize) -> impl Strategy<Value = Vec<f32>> {
    let n = n_super * 256;
    (
        prop::collection::vec(-1.0f32..1.0, n),
        prop::collection::vec(-8i32..3, n / 32),
        prop::collection::vec(0u8..64, n),
    )
        .prop_map(|(u, exps, outlier)| {
            u.iter()
                .enumerate()
                .map(|(i, &v)| {
                    let s = 2f32.powi(exps[i / 32]);
                    if outlier[i] == 0 { v * s * 8.0 } else { v * s }
                })
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn round_trip_error_within_bound(x in weights(2)) {
        for ty in [T::Q8_0, T::Q4_0, T::Q4_1, T::Q5_0, T::Q5_1, T::MXFP4,
                   T::Q2_K, T::Q3_K, T::Q4_K, T::Q5_K, T::Q6_K] {
            let q = quantize_to_vec(ty, &x).unwrap();
            prop_assert_eq!(q.len(), ty.type_size() * x.len() / ty.block_size());
            let y = dequantize_to_vec(ty, &q).unwrap();
            let bs = ty.block_size();
            for (b, (xb, yb)) in x.chunks(bs).zip(y.chunks(bs)).enumerate() {
                let lim = bound(ty, xb);
                for (i, (&a, &r)) in xb.iter().zip(yb).enumerate() {
                    prop_assert!((a - r).abs() <= lim,
                        "{}: block {} elem {}: x {} -> {} (err {}, bound {})", ty, b, i, a, r, (a - r).abs(), lim);
                }
            }
        }
    }

    #[test]
    fn float_round_trips(x in prop::collection::vec(-1e4f32..1e4, 64)) {
        for (ty, rel) in [(T::F32, 0.0f32), (T::F16, 2f32.powi(-11)), (T::BF16, 2f32.powi(-8))] {
            let y = dequantize_to_vec(ty, &quantize_to_vec(ty, &x).unwrap()).unwrap();
            for (&a, &r) in x.iter().zip(&y) {
                // Absolute slack for f16 subnormals (spacing 2^-24).
                prop_assert!((a - r).abs() <= a.abs() * rel + 2f32.powi(-25), "{}: {} -> {}", ty, a, r);
            }
        }
    }
}
