//! Multi-row k-quant kernels (`Kernels::dot_rows`) against the single-row kernel.
//!
//! The contract of a multi-row kernel is that result `r` has exactly the bits of `dot` on
//! row `r`, so no tolerance is involved. Weight rows are random bytes with finite f16
//! scales (every bit pattern of the quant and sub-block-scale fields is a valid block),
//! mostly moderate, sometimes anywhere in the finite f16 range (overflow to infinity and
//! invalid operations must give the same bits too), or the output of the reference weight
//! quantizer; activation rows come from the Q8_K quantizer on random floats.

mod common;

use common::activations;
use proptest::prelude::*;
use quant::{DotRows, GgmlType, Isa, Kernels, QK_K, quantize_row};

const Q8K_BYTES: usize = 292;

/// The types whose SIMD tables (AVX2 and NEON) have a multi-row kernel.
const TYPES: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// Byte offsets of the f16 super-block scale `d` and (if any) `dmin` inside a block.
fn scale_offsets(ty: GgmlType) -> (usize, Option<usize>) {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => (0, Some(2)),
        GgmlType::Q6_K => (208, None),
        _ => unreachable!("not a type of this test"),
    }
}

fn quantize_q8k(x: &[f32]) -> Vec<u8> {
    let q = Kernels::scalar()
        .quantize(GgmlType::Q8_K)
        .expect("Q8_K quantizer registered");
    let mut out = vec![0u8; x.len() / QK_K * Q8K_BYTES];
    q(x, &mut out);
    out
}

/// A finite f16: mostly ± m · 2^e with e in -20..=1 (subnormals included), sometimes zero or
/// any finite value (up to ±65504).
fn f16_scale() -> impl Strategy<Value = half::f16> {
    prop_oneof![
        1 => Just(half::f16::ZERO),
        2 => any::<u16>()
            .prop_map(half::f16::from_bits)
            .prop_filter("finite", |h| h.is_finite()),
        20 => (any::<bool>(), 1u16..1024, -20i32..=1).prop_map(|(neg, m, e)| {
            let v = f32::from(m) / 1024.0 * 2f32.powi(e);
            half::f16::from_f32(if neg { -v } else { v })
        }),
    ]
}

/// Number of super-blocks: 1, 3 and 8 (n = 256, 768, 2048) or an odd count up to 15.
fn block_count() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(3usize),
        Just(8usize),
        (2usize..=7).prop_map(|k| 2 * k + 1)
    ]
}

/// `rows` weight rows of `ty`: random bytes with random f16 `d` (and `dmin`).
fn random_weights(ty: GgmlType, rows: usize, nb: usize) -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), rows * nb * ty.type_size()),
        prop::collection::vec((f16_scale(), f16_scale()), rows * nb),
    )
        .prop_map(move |(mut w, scales)| {
            let (d_off, dmin_off) = scale_offsets(ty);
            for (b, (d, dmin)) in w.chunks_exact_mut(ty.type_size()).zip(scales) {
                b[d_off..d_off + 2].copy_from_slice(&d.to_le_bytes());
                if let Some(o) = dmin_off {
                    b[o..o + 2].copy_from_slice(&dmin.to_le_bytes());
                }
            }
            w
        })
}

/// `rows` weight rows from the reference quantizer.
fn quantized_weights(ty: GgmlType, rows: usize, nb: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(activations(nb), rows).prop_map(move |xs| {
        let row_bytes = nb * ty.type_size();
        let mut w = vec![0u8; rows * row_bytes];
        for (x, out) in xs.iter().zip(w.chunks_exact_mut(row_bytes)) {
            quantize_row(ty, x, out).expect("weight quantizer");
        }
        w
    })
}

/// A case: n, `rows` weight rows, one activation row.
fn case(
    ty: GgmlType,
    rows: usize,
    quantized: bool,
) -> impl Strategy<Value = (usize, Vec<u8>, Vec<u8>)> {
    block_count().prop_flat_map(move |nb| {
        let w = if quantized {
            quantized_weights(ty, rows, nb).boxed()
        } else {
            random_weights(ty, rows, nb).boxed()
        };
        (w, activations(nb)).prop_map(move |(w, x)| (nb * QK_K, w, quantize_q8k(&x)))
    })
}

/// The multi-row kernel of `ty` in the detected table (None in the scalar table).
fn rows_kernel(ty: GgmlType) -> Option<DotRows> {
    Kernels::detect().dot_rows(ty)
}

fn check_rows(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> Result<(), TestCaseError> {
    let k = rows_kernel(ty).expect("kernel present when a case is generated");
    let dot = Kernels::detect().dot(ty).expect("single-row kernel");
    let mut out = vec![f32::NAN; k.rows];
    (k.f)(n, w, a, &mut out);
    let row_bytes = n / QK_K * ty.type_size();
    for (r, (row, got)) in w.chunks_exact(row_bytes).zip(&out).enumerate() {
        let want = dot(n, row, a);
        prop_assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "{} n={} row {}: dot_rows {} dot {}",
            ty,
            n,
            r,
            got,
            want
        );
    }
    Ok(())
}

/// Rows per call of `ty`'s kernel, or 0 when there is none (the strategies then make
/// empty weights and the checks are skipped).
fn rows_of(ty: GgmlType) -> usize {
    rows_kernel(ty).map_or(0, |k| k.rows)
}

macro_rules! type_tests {
    ($($name:ident: $ty:expr;)*) => {$(
        mod $name {
            use super::*;

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(96))]

                #[test]
                fn rows_equal_single_row_bits((n, w, a) in case($ty, rows_of($ty), false)) {
                    if rows_kernel($ty).is_some() {
                        check_rows($ty, n, &w, &a)?;
                    }
                }
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(32))]

                #[test]
                fn quantized_rows_equal_single_row_bits(
                    (n, w, a) in case($ty, rows_of($ty), true)
                ) {
                    if rows_kernel($ty).is_some() {
                        check_rows($ty, n, &w, &a)?;
                    }
                }
            }
        }
    )*};
}

type_tests! {
    q4_k: GgmlType::Q4_K;
    q5_k: GgmlType::Q5_K;
    q6_k: GgmlType::Q6_K;
}

#[test]
fn simd_table_has_multi_row_kernels() {
    for ty in TYPES {
        assert!(
            Kernels::scalar().dot_rows(ty).is_none(),
            "{ty}: the scalar table has no multi-row kernels"
        );
    }
    let isa = Kernels::detect().isa();
    if isa == Isa::Scalar {
        eprintln!("note: no SIMD table on this CPU; the multi-row kernels are not tested");
        return;
    }
    for ty in TYPES {
        let k = Kernels::detect()
            .dot_rows(ty)
            .unwrap_or_else(|| panic!("{ty}: no multi-row kernel in the {} table", isa.name()));
        assert!(
            [2, 4, 8].contains(&k.rows),
            "{ty}: {} rows per call",
            k.rows
        );
    }
}

#[test]
fn zero_length_rows_give_zero() {
    for ty in TYPES {
        if let Some(k) = rows_kernel(ty) {
            let mut out = vec![f32::NAN; k.rows];
            (k.f)(0, &[], &[], &mut out);
            assert!(out.iter().all(|v| v.to_bits() == 0), "{ty}: {out:?}");
        }
    }
}

#[test]
fn wrong_lengths_are_rejected() {
    for ty in TYPES {
        let Some(k) = rows_kernel(ty) else { continue };
        let a = quantize_q8k(&[0.5; QK_K]);
        let w = vec![0u8; k.rows * ty.type_size()];
        // (what, n, weight bytes, activation bytes, results)
        let calls = [
            (
                "one row too few",
                QK_K,
                w.len() - ty.type_size(),
                a.len(),
                k.rows,
            ),
            ("one result too few", QK_K, w.len(), a.len(), k.rows - 1),
            ("short activation row", QK_K, w.len(), a.len() - 1, k.rows),
            ("partial block", QK_K - 32, w.len(), a.len(), k.rows),
        ];
        for (what, n, wl, al, rows) in calls {
            let call = || (k.f)(n, &w[..wl], &a[..al], &mut vec![0.0; rows]);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call));
            assert!(r.is_err(), "{ty}: {what} was accepted");
        }
    }
}
