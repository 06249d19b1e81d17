//! Multi-row dot kernels of the 32-element block types and F16.
//!
//! The contract of a multi-row kernel is that each output equals the single-row kernel of
//! the same table on that row, bit for bit. Inputs are random valid rows built like those
//! of `kernels_legacy.rs` (random quant bytes, finite moderate block scales), activations
//! either quantized from random values or, for the block types, raw random Q8_0 blocks
//! whose quants cover the whole i8 range including -128 (which only a NaN input gives, and
//! which the kernels must handle like the single-row kernel does).

mod common;

use common::Rng;
use proptest::prelude::*;
use quant::{GgmlType, Isa, Kernels, vec_dot_type};

/// Weight types that get a multi-row kernel in the SIMD tables (AVX2 and NEON).
const TYPES: [GgmlType; 5] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::MXFP4,
    GgmlType::F16,
];

/// A random valid weight row of `n` elements.
fn weight_row(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    if ty == GgmlType::F16 {
        for _ in 0..n {
            let h = half::f16::from_f32(rng.normal()).to_bits();
            out.extend_from_slice(&h.to_le_bytes());
        }
        return out;
    }
    for _ in 0..n / 32 {
        let start = out.len();
        out.extend((0..ty.type_size()).map(|_| rng.byte()));
        let b = &mut out[start..];
        match ty {
            GgmlType::MXFP4 => b[0] = 100 + rng.below(51) as u8,
            _ => b[..2].copy_from_slice(&rng.f16_scale()),
        }
    }
    out
}

/// An activation row of `n` elements for weight type `ty`: quantized from random values
/// with varying block magnitudes, or (`raw`, block types only) random Q8_0 blocks.
fn activation_row(ty: GgmlType, n: usize, raw: bool, rng: &mut Rng) -> Vec<u8> {
    let act = vec_dot_type(ty).unwrap();
    if raw && act == GgmlType::Q8_0 {
        let mut out = Vec::new();
        for _ in 0..n / 32 {
            out.extend_from_slice(&rng.f16_scale());
            out.extend((0..32).map(|_| rng.byte()));
        }
        return out;
    }
    let mut x = Vec::with_capacity(n);
    while x.len() < n {
        let scale = 10f32.powf(rng.unit() as f32 * 5.0 - 3.0);
        let len = (n - x.len()).min(32);
        if rng.below(6) == 0 {
            x.extend((0..len).map(|_| 0.0));
        } else {
            x.extend((0..len).map(|_| rng.normal() * scale));
        }
    }
    let q = Kernels::scalar().quantize(act).unwrap();
    let mut out = vec![0u8; act.row_bytes(n as u64).unwrap() as usize];
    q(&x, &mut out);
    out
}

/// Every (type, multi-row kernel) of the best table.
fn registered() -> Vec<(GgmlType, quant::DotRows)> {
    let k = Kernels::detect();
    TYPES
        .iter()
        .filter_map(|&ty| k.dot_rows(ty).map(|r| (ty, r)))
        .collect()
}

/// Runs the multi-row kernel of `ty` on `rows` random rows of `n` elements (a whole number
/// of kernel calls) and compares every output with the single-row kernel.
fn check(ty: GgmlType, n: usize, raw: bool, seed: u64) -> Result<(), TestCaseError> {
    let k = Kernels::detect();
    let Some(dr) = k.dot_rows(ty) else {
        return Ok(());
    };
    let dot = k.dot(ty).unwrap();
    let mut rng = Rng(seed);
    let calls = 1 + rng.below(3) as usize;
    let rows = calls * dr.rows;
    let row_bytes = ty.row_bytes(n as u64).unwrap() as usize;
    let w: Vec<u8> = (0..rows)
        .flat_map(|_| weight_row(ty, n, &mut rng))
        .collect();
    let a = activation_row(ty, n, raw, &mut rng);
    let mut out = vec![f32::NAN; rows];
    for (wc, oc) in w
        .chunks_exact(dr.rows * row_bytes)
        .zip(out.chunks_exact_mut(dr.rows))
    {
        (dr.f)(n, wc, &a, oc);
    }
    for (r, got) in out.iter().enumerate() {
        let want = dot(n, &w[r * row_bytes..(r + 1) * row_bytes], &a);
        prop_assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "{} n={} row {} of {} (raw activations: {}): rows kernel {} single-row {}",
            ty,
            n,
            r,
            rows,
            raw,
            got,
            want
        );
    }
    Ok(())
}

/// Row lengths: 1 block, small odd and even block counts, 2048; F16 also gets ragged
/// lengths (not a multiple of 32).
fn lengths() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(32usize),
        (1usize..=9).prop_map(|b| 32 * (2 * b + 1)),
        (1usize..=8).prop_map(|b| 64 * b),
        Just(2048usize),
    ]
}

#[test]
fn simd_table_has_a_rows_kernel_for_each_type() {
    for ty in TYPES {
        assert!(
            Kernels::scalar().dot_rows(ty).is_none(),
            "{ty}: the scalar table has no multi-row kernels"
        );
    }
    let k = Kernels::detect();
    if k.isa() == Isa::Scalar {
        eprintln!("no SIMD table on this CPU: nothing to check");
        return;
    }
    let isa = k.isa().name();
    for ty in TYPES {
        let dr = k
            .dot_rows(ty)
            .unwrap_or_else(|| panic!("{isa} table has no multi-row {ty} kernel"));
        assert!(
            (2..=8).contains(&dr.rows),
            "{ty}: {} rows per call",
            dr.rows
        );
    }
    let names: Vec<String> = registered()
        .iter()
        .map(|(ty, dr)| format!("{ty}×{}", dr.rows))
        .collect();
    eprintln!("{isa} multi-row kernels: {}", names.join(" "));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn rows_match_single_row_bit_for_bit(n in lengths(), seed in any::<u64>()) {
        for ty in TYPES {
            check(ty, n, false, seed)?;
        }
    }

    #[test]
    fn rows_match_single_row_with_raw_activations(n in lengths(), seed in any::<u64>()) {
        for ty in TYPES {
            if ty != GgmlType::F16 {
                check(ty, n, true, seed)?;
            }
        }
    }

    #[test]
    fn f16_rows_match_with_ragged_tails(blocks in 0usize..=6, tail in 1usize..32, seed in any::<u64>()) {
        check(GgmlType::F16, 32 * blocks + tail, false, seed)?;
    }
}

/// A -128 activation quant times a negative weight: the single-row sign trick gives the
/// product negated, so a kernel that computed the true product would differ. One row of
/// each 4-bit type whose every weight is negative, against activations that are all -128
/// except one 1 (so that lane sums are not all equal).
#[test]
fn minus_128_activations_match_single_row() {
    let k = Kernels::detect();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::IQ4_NL,
        GgmlType::MXFP4,
        GgmlType::Q8_0,
    ] {
        let Some(dr) = k.dot_rows(ty) else { continue };
        let n = 96;
        let block: Vec<u8> = match ty {
            // nibble 3 → 3 - 8 = -5
            GgmlType::Q4_0 => [&0x3c00u16.to_le_bytes()[..], &[0x33; 16]].concat(),
            // index 2 → -83
            GgmlType::IQ4_NL => [&0x3c00u16.to_le_bytes()[..], &[0x22; 16]].concat(),
            // index 10 → doubled level -2
            GgmlType::MXFP4 => [&[127u8][..], &[0xaa; 16]].concat(),
            _ => [&0x3c00u16.to_le_bytes()[..], &[0xf0; 32]].concat(),
        };
        let row: Vec<u8> = block.repeat(n / 32);
        let w = row.repeat(dr.rows);
        let mut a = Vec::new();
        for b in 0..n / 32 {
            a.extend_from_slice(&0x3c00u16.to_le_bytes());
            let mut q = [0x80u8; 32];
            q[b] = 1;
            a.extend_from_slice(&q);
        }
        let want = k.dot(ty).unwrap()(n, &row, &a);
        let mut out = vec![0f32; dr.rows];
        (dr.f)(n, &w, &a, &mut out);
        for got in out {
            assert_eq!(got.to_bits(), want.to_bits(), "{ty}: {got} vs {want}");
        }
    }
}

#[test]
fn rows_kernels_reject_wrong_shapes() {
    for (ty, dr) in registered() {
        let n = 64;
        let row_bytes = ty.row_bytes(n as u64).unwrap() as usize;
        let act = vec_dot_type(ty).unwrap();
        let a = vec![0u8; act.row_bytes(n as u64).unwrap() as usize];
        // One row too many (weights and outputs), then a short activation row.
        let w = vec![0u8; row_bytes * (dr.rows + 1)];
        let bad: [(&[u8], &[u8], usize); 2] = [
            (&w, &a, dr.rows + 1),
            (&w[..row_bytes * dr.rows], &a[..a.len() - 2], dr.rows),
        ];
        for (w, a, rows) in bad {
            let r = std::panic::catch_unwind(|| {
                let mut out = vec![0f32; rows];
                (dr.f)(n, w, a, &mut out);
            });
            let msg = r.expect_err("shape violation accepted");
            let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(msg.contains("contract"), "{ty}: {msg}");
        }
    }
}
