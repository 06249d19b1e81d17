//! k-quant / IQ4_XS / 1- to 3-bit i-quant / ternary × Q8_K dot kernels and the Q8_K activation
//! quantizer.
//!
//! Weight rows are random bytes with finite, moderate f16 scales (every bit pattern of the
//! quant and sub-block-scale fields is a valid block) or the output of the reference weight
//! quantizer; activation rows come from the Q8_K quantizer on random floats.
//!
//! Tolerances. Both kernels compute every super-block's integer sums exactly; they differ
//! only in the float steps: converting those sums to f32, multiplying by the block scales
//! and adding up the blocks (the SIMD kernels in eight lanes, a separate accumulator for
//! the minimum terms, and a final tree sum). Each rounding is at most u = 2^-24 relative
//! to the terms involved, and a row goes through at most `nb + 6` of them in sequence
//! (`nb` = number of super-blocks), so each kernel is within
//!
//!   (nb + 6) · u · M   of the exact value, where   M = Σ_i |a_i| · (|d·scale_i·q_i| + |dmin·min_i|)
//!
//! bounds every partial sum (the minimum part counted separately, as the kernels keep it
//! separate; `M` is computed from the dequantized row with `dmin` or `d` zeroed). The f64
//! reference made from the dequantized weights (f32, up to three roundings each) and
//! activations (`d·q` in f32, one rounding) is within 4 · u · M of exact. The tests allow
//! `2 · (nb + 8) · u · M` for both comparisons. Observed differences are about 50 times
//! smaller (at most ~5e-8 · M over a few thousand random rows).
//!
//! TQ1_0, TQ2_0 and the 1- to 3-bit i-quants: the scalar and the AVX2 kernels both follow
//! ggml's x86 lanes and float order, so they must agree bit for bit; the NEON kernels follow
//! ggml's ARM order (exact integer totals, one float step per block or group), so against the
//! scalar ones they are held to the tolerance. The ternary types' lanes hold the products
//! of the stored digits and the activation sums apart (the offset of -1), so their `M`
//! counts `|d|` per element besides `|w|`, as the minimum part of the other types.

mod common;

use common::activations;
use proptest::prelude::*;
use quant::{GgmlType, Isa, Kernels, QK_K, can_quantize, dequantize_row, quantize_row};

const Q8K_BYTES: usize = 292;

/// The allowed difference for a row of `n` elements with magnitude `m` (see module docs).
fn tolerance(n: usize, m: f64) -> f64 {
    let nb = (n / QK_K) as f64;
    2.0 * (nb + 8.0) * 2f64.powi(-24) * m
}

const TYPES: [GgmlType; 15] = [
    GgmlType::TQ1_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
    GgmlType::TQ2_0,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

/// The types whose AVX2 and scalar kernels sum in the same order (see module docs).
const SAME_ORDER: [GgmlType; 9] = [
    GgmlType::TQ1_0,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::TQ2_0,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
];

/// Byte offsets of the f16 super-block scale `d` and (if any) `dmin` inside a block.
fn scale_offsets(ty: GgmlType) -> (usize, Option<usize>) {
    match ty {
        GgmlType::Q2_K => (80, Some(82)),
        GgmlType::Q3_K => (108, None),
        GgmlType::Q4_K | GgmlType::Q5_K => (0, Some(2)),
        GgmlType::Q6_K => (208, None),
        GgmlType::IQ4_XS
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ1_S => (0, None),
        // (IQ1_M's d is spread over the top nibbles of its scale words: see random_weights)
        GgmlType::IQ1_M => (IQ1M_SCALES, None),
        GgmlType::TQ2_0 => (64, None),
        GgmlType::TQ1_0 => (52, None),
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

fn dequant(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, bytes, &mut out).expect("dequantize");
    out
}

/// Copy of `w` with the f16 at `off` of every block set to zero.
fn zero_f16(ty: GgmlType, w: &[u8], off: usize) -> Vec<u8> {
    let mut w = w.to_vec();
    for b in w.chunks_exact_mut(ty.type_size()) {
        b[off..off + 2].fill(0);
    }
    w
}

/// The exact dot product of the dequantized weights with the dequantized activations (in
/// f64), and the magnitude `M` of the module docs.
fn reference(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> (f64, f64) {
    let wf = dequant(ty, w, n);
    let af = dequant(GgmlType::Q8_K, a, n);
    let exact: f64 = wf
        .iter()
        .zip(&af)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let magnitude = match scale_offsets(ty) {
        (d_off, None) if matches!(ty, GgmlType::TQ1_0 | GgmlType::TQ2_0) => {
            // |w| plus |d| per element: the offset's part
            let d: Vec<f64> = w
                .chunks_exact(ty.type_size())
                .map(|b| f64::from(half::f16::from_le_bytes([b[d_off], b[d_off + 1]]).to_f32()))
                .collect();
            (0..n)
                .map(|i| f64::from(af[i]).abs() * (f64::from(wf[i]).abs() + d[i / QK_K].abs()))
                .sum()
        }
        (_, None) => wf
            .iter()
            .zip(&af)
            .map(|(&x, &y)| (f64::from(x) * f64::from(y)).abs())
            .sum(),
        (d_off, Some(dmin_off)) => {
            // Split each weight into its scale part (dmin = 0) and minimum part (d = 0).
            let scale_part = dequant(ty, &zero_f16(ty, w, dmin_off), n);
            let min_part = dequant(ty, &zero_f16(ty, w, d_off), n);
            (0..n)
                .map(|i| {
                    f64::from(af[i]).abs()
                        * (f64::from(scale_part[i]).abs() + f64::from(min_part[i]).abs())
                })
                .sum()
        }
    };
    (exact, magnitude)
}

/// A moderate finite f16: ± m · 2^e with e in -20..=1 (subnormals included), or zero.
fn f16_scale() -> impl Strategy<Value = half::f16> {
    prop_oneof![
        1 => Just(half::f16::ZERO),
        20 => (any::<bool>(), 1u16..1024, -20i32..=1).prop_map(|(neg, m, e)| {
            let v = f32::from(m) / 1024.0 * 2f32.powi(e);
            half::f16::from_f32(if neg { -v } else { v })
        }),
    ]
}

/// Number of super-blocks: 1, 2, or an odd number up to 33.
fn block_count() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(2usize),
        (1usize..=16).prop_map(|k| 2 * k + 1)
    ]
}

/// Offset of IQ1_M's four scale words, whose top nibbles hold its f16 `d`.
const IQ1M_SCALES: usize = 48;

/// A weight row of `ty`: random bytes with random f16 `d` (and `dmin`).
fn random_weights(ty: GgmlType, nb: usize) -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), nb * ty.type_size()),
        prop::collection::vec((f16_scale(), f16_scale()), nb),
    )
        .prop_map(move |(mut w, scales)| {
            let (d_off, dmin_off) = scale_offsets(ty);
            for (b, (d, dmin)) in w.chunks_exact_mut(ty.type_size()).zip(scales) {
                if ty == GgmlType::IQ1_M {
                    let h = d.to_bits();
                    for k in 0..4 {
                        let p = &mut b[IQ1M_SCALES + 2 * k + 1];
                        *p = (*p & 0x0f) | ((((h >> (4 * k)) & 0xf) as u8) << 4);
                    }
                    continue;
                }
                b[d_off..d_off + 2].copy_from_slice(&d.to_le_bytes());
                if let Some(o) = dmin_off {
                    b[o..o + 2].copy_from_slice(&dmin.to_le_bytes());
                }
            }
            w
        })
}

/// A case: weight type, n, weight row bytes, activation row bytes.
fn case(ty: GgmlType) -> impl Strategy<Value = (usize, Vec<u8>, Vec<u8>)> {
    block_count().prop_flat_map(move |nb| {
        (random_weights(ty, nb), activations(nb))
            .prop_map(move |(w, x)| (nb * QK_K, w, quantize_q8k(&x)))
    })
}

/// A case whose weights come from the reference weight quantizer (random blocks for a type
/// without one).
fn quantized_case(ty: GgmlType) -> BoxedStrategy<(usize, Vec<u8>, Vec<u8>)> {
    if !can_quantize(ty) {
        return case(ty).boxed();
    }
    block_count()
        .prop_flat_map(move |nb| {
            (activations(nb), activations(nb)).prop_map(move |(wx, x)| {
                let n = nb * QK_K;
                let mut w = vec![0u8; n / QK_K * ty.type_size()];
                quantize_row(ty, &wx, &mut w).expect("weight quantizer");
                (n, w, quantize_q8k(&x))
            })
        })
        .boxed()
}

fn check_simd_vs_scalar(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> Result<(), TestCaseError> {
    let scalar = Kernels::scalar().dot(ty).expect("scalar kernel")(n, w, a);
    let (_, m) = reference(ty, w, a, n);
    let tol = tolerance(n, m);
    // every SIMD table of this CPU (with and without its AVX-512 and BMI2 kernels)
    for k in Kernels::simd_tables() {
        let simd = k.dot(ty).expect("SIMD kernel")(n, w, a);
        let name = k.name();
        if SAME_ORDER.contains(&ty) && k.isa() != Isa::Neon {
            prop_assert_eq!(
                simd.to_bits(),
                scalar.to_bits(),
                "{} {} n={}: {} vs {}",
                ty,
                name,
                n,
                simd,
                scalar
            );
        }
        let diff = (f64::from(simd) - f64::from(scalar)).abs();
        prop_assert!(
            diff <= tol,
            "{ty} {name} n={n}: simd {simd} scalar {scalar} diff {diff:e} > {tol:e} (M = {m:e})"
        );
    }
    Ok(())
}

fn check_scalar_vs_reference(
    ty: GgmlType,
    n: usize,
    w: &[u8],
    a: &[u8],
) -> Result<(), TestCaseError> {
    let got = Kernels::scalar().dot(ty).expect("scalar kernel")(n, w, a);
    let (exact, m) = reference(ty, w, a, n);
    let diff = (f64::from(got) - exact).abs();
    let tol = tolerance(n, m);
    prop_assert!(
        diff <= tol,
        "{ty} n={n}: scalar {got} reference {exact} diff {diff:e} > {tol:e} (M = {m:e})"
    );
    Ok(())
}

#[test]
fn every_kind_has_both_kernels_and_the_quantizer() {
    for ty in TYPES {
        assert!(Kernels::scalar().dot(ty).is_some(), "{ty}");
        assert!(Kernels::detect().dot(ty).is_some(), "{ty}");
        assert_eq!(quant::vec_dot_type(ty), Some(GgmlType::Q8_K));
    }
    assert!(Kernels::scalar().quantize(GgmlType::Q8_K).is_some());
    assert!(Kernels::detect().quantize(GgmlType::Q8_K).is_some());
    if Kernels::detect().isa() == Isa::Scalar {
        eprintln!("note: no AVX2 on this CPU; SIMD-vs-scalar tests compare scalar with itself");
    }
}

macro_rules! type_tests {
    ($($name:ident: $ty:expr;)*) => {$(
        mod $name {
            use super::*;

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(64))]

                #[test]
                fn simd_matches_scalar((n, w, a) in case($ty)) {
                    check_simd_vs_scalar($ty, n, &w, &a)?;
                }

                #[test]
                fn scalar_matches_dequantized_dot((n, w, a) in case($ty)) {
                    check_scalar_vs_reference($ty, n, &w, &a)?;
                }

                #[test]
                fn quantized_weights((n, w, a) in quantized_case($ty)) {
                    check_simd_vs_scalar($ty, n, &w, &a)?;
                    check_scalar_vs_reference($ty, n, &w, &a)?;
                }
            }
        }
    )*};
}

type_tests! {
    q2_k: GgmlType::Q2_K;
    q3_k: GgmlType::Q3_K;
    q4_k: GgmlType::Q4_K;
    q5_k: GgmlType::Q5_K;
    q6_k: GgmlType::Q6_K;
    iq4_xs: GgmlType::IQ4_XS;
    tq2_0: GgmlType::TQ2_0;
    iq2_xxs: GgmlType::IQ2_XXS;
    iq2_xs: GgmlType::IQ2_XS;
    iq2_s: GgmlType::IQ2_S;
    iq3_xxs: GgmlType::IQ3_XXS;
    iq3_s: GgmlType::IQ3_S;
    iq1_s: GgmlType::IQ1_S;
    iq1_m: GgmlType::IQ1_M;
    tq1_0: GgmlType::TQ1_0;
}

#[test]
fn empty_rows_give_zero() {
    for ty in TYPES {
        for k in [Kernels::scalar(), Kernels::detect()] {
            assert_eq!(k.dot(ty).unwrap()(0, &[], &[]), 0.0, "{ty}");
        }
    }
}

#[test]
#[should_panic(expected = "weight row length")]
fn short_weight_row_is_rejected() {
    let a = quantize_q8k(&[1.0; QK_K]);
    Kernels::detect().dot(GgmlType::Q4_K).unwrap()(QK_K, &[0u8; 143], &a);
}

#[test]
#[should_panic(expected = "activation row length")]
fn short_activation_row_is_rejected() {
    Kernels::detect().dot(GgmlType::Q6_K).unwrap()(QK_K, &[0u8; 210], &[0u8; 291]);
}

#[test]
#[should_panic(expected = "not a multiple")]
fn partial_block_is_rejected() {
    Kernels::scalar().dot(GgmlType::Q2_K).unwrap()(100, &[], &[]);
}

// ---- Q8_K quantizer ----

struct Q8KBlock {
    d: f32,
    qs: Vec<i8>,
    bsums: Vec<i16>,
}

fn parse_q8k(b: &[u8]) -> Q8KBlock {
    Q8KBlock {
        d: f32::from_le_bytes(b[0..4].try_into().unwrap()),
        qs: b[4..260].iter().map(|&v| v as i8).collect(),
        bsums: b[260..292]
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn q8k_blocks_are_consistent(x in block_count().prop_flat_map(activations)) {
        // the NEON table rounds as llama.cpp's ARM build does (from the exact product)
        let reference = match Kernels::detect().isa() {
            quant::Isa::Neon => quant::kernels::quantize_row_q8_k_fused,
            _ => Kernels::scalar().quantize(GgmlType::Q8_K).unwrap(),
        };
        let detected = Kernels::detect().quantize(GgmlType::Q8_K).unwrap();
        let mut out = vec![0u8; x.len() / QK_K * Q8K_BYTES];
        let mut out2 = vec![0xAAu8; out.len()];
        reference(&x, &mut out);
        detected(&x, &mut out2);
        prop_assert_eq!(&out, &out2);

        for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact(Q8K_BYTES)) {
            let b = parse_q8k(ob);
            for (g, s) in b.bsums.iter().enumerate() {
                let sum: i32 = b.qs[16 * g..16 * g + 16].iter().map(|&q| i32::from(q)).sum();
                prop_assert_eq!(i32::from(*s), sum);
            }
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            if amax == 0.0 {
                prop_assert!(ob.iter().all(|&v| v == 0), "all-zero block must be all-zero bytes");
                continue;
            }
            // The first element of largest magnitude is `max`; d = 1 / (-127 / max).
            let max = *xb.iter().find(|v| v.abs() == amax).unwrap();
            prop_assert_eq!(b.d.to_bits(), (1.0f32 / (-127.0f32 / max)).to_bits());
            // Rounding to nearest: |x - d q| <= |d| / 2, plus the f32 roundings of
            // x · iscale and of d (each at most 127 · 2^-24 units of |d|).
            let bound = f64::from(b.d.abs()) * (0.5 + 2e-5);
            for (&v, &q) in xb.iter().zip(&b.qs) {
                prop_assert!(q != -128);
                let err = (f64::from(v) - f64::from(b.d) * f64::from(q)).abs();
                prop_assert!(err <= bound, "x {} q {} d {} err {:e}", v, q, b.d, err);
            }
        }
    }
}

/// ggml's reference quantizer (`quantize_row_q8_K_ref`, the one ggml's x86 CPU backend
/// uses) on the fixture's deterministic inputs (rounding ties, outliers, tiny and large
/// magnitudes, zero blocks); see `tests/fixtures/README.md`. For an all-zero block ggml
/// writes `d = 0` and zero quants but leaves the group sums unwritten (they do not matter:
/// every use is multiplied by `d`), so those are not compared; ours are zero.
#[test]
fn q8k_equals_ggml_reference_bytes() {
    let path = format!(
        "{}/tests/fixtures/quant_ggml.gguf",
        env!("CARGO_MANIFEST_DIR")
    );
    let f = gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let input = f.tensor_data(f.tensor("quant.input").unwrap()).unwrap();
    let x: Vec<f32> = input
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let info = f.tensor("act.q8_K").unwrap();
    assert_eq!(info.ggml_type(), Some(GgmlType::Q8_K));
    let want = f.tensor_data(info).unwrap();
    for k in [Kernels::scalar(), Kernels::detect()] {
        let mut got = vec![0xAAu8; want.len()];
        k.quantize(GgmlType::Q8_K).unwrap()(&x, &mut got);
        for (b, (g, w)) in got
            .chunks_exact(Q8K_BYTES)
            .zip(want.chunks_exact(Q8K_BYTES))
            .enumerate()
        {
            let zero_block = w[..4] == [0; 4];
            let compared = if zero_block {
                Q8K_BYTES - 32
            } else {
                Q8K_BYTES
            };
            assert_eq!(
                g[..compared],
                w[..compared],
                "{:?}: block {b} differs",
                k.isa()
            );
            if zero_block {
                assert!(g.iter().all(|&v| v == 0), "{:?}: block {b}", k.isa());
            }
        }
    }
}

#[test]
fn q8k_zero_and_negative_zero_blocks_are_all_zero_bytes() {
    let mut x = vec![0.0f32; 2 * QK_K];
    x[QK_K..].fill(-0.0);
    let out = quantize_q8k(&x);
    assert!(out.iter().all(|&v| v == 0));
}

#[test]
fn q8k_largest_magnitude_is_minus_127_and_ties_go_to_even() {
    let mut x = vec![0.0f32; QK_K];
    x[0] = 0.25;
    x[5] = -2.0;
    x[6] = 2.0; // same magnitude as x[5], later: x[5] is `max`
    x[40] = -1.0; // -1 · (-127 / -2) = -63.5: a tie, rounds to the even -64
    x[41] = 3.0 / 127.0; // 3/127 · 63.5 = 1.5 (in f32): rounds to 2
    let b = parse_q8k(&quantize_q8k(&x));
    assert_eq!(b.d, 1.0 / (-127.0f32 / -2.0));
    assert_eq!(b.qs[5], -127);
    assert_eq!(b.qs[6], 127);
    assert_eq!(b.qs[40], -64);
    assert_eq!(b.qs[0], 16); // 0.25 · 63.5 = 15.875
    let scaled = (3.0f32 / 127.0) * (-127.0f32 / -2.0);
    assert_eq!(b.qs[41] as f32, scaled.round_ties_even());
    assert_eq!(b.bsums[0], 16 - 127 + 127);
    assert_eq!(b.bsums[2], -64 + b.qs[41] as i16);
}

#[test]
fn q8k_ignores_nan_when_choosing_the_scale() {
    let mut x = vec![1.0f32; QK_K];
    x[3] = f32::NAN;
    x[9] = -4.0;
    let b = parse_q8k(&quantize_q8k(&x));
    assert_eq!(b.d, 1.0 / (-127.0f32 / -4.0));
    assert_eq!(b.qs[9], -127);
}
