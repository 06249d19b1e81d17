//! The kernels of llama.cpp's IQ panel order ([`SumOrder::IqPanel`]: IQ1_S, IQ1_M, IQ2_XXS,
//! IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S and IQ4_XS in batches of 8 rows or more).
//!
//! Every super-block's integer total is exact and the float chain is fixed (one FMA per
//! super-block), so the scalar kernel, the AVX2 kernel and the panel kernel (8 rows decoded
//! once for any number of tokens) must agree bit for bit. Against the f64 dot of the dequantized row: per
//! super-block the total's conversion, the scale product and the FMA round once each, so
//! the kernel is within `(nb + 4) · u · M` (u = 2^-24, `M = Σ |w_i · a_i|`); the reference
//! within `4 · u · M`; the test allows `2 · (nb + 8) · u · M`. (ggml's own results are
//! compared in `kernels_vs_ggml.rs`.)

mod common;

use common::{Rng, activations};
use proptest::prelude::*;
use quant::{GgmlType, Kernels, QK_K, SumOrder, dequantize_row};

const Q8K_BYTES: usize = 292;

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

/// `rows` random rows of `nb` blocks: random bytes with a finite, moderate f16 scale (IQ1_M
/// keeps it in the top nibbles of its four scale words).
fn random_rows(ty: GgmlType, nb: usize, rows: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    let bs = ty.type_size();
    let mut w: Vec<u8> = (0..rows * nb * bs).map(|_| r.byte()).collect();
    for b in w.chunks_exact_mut(bs) {
        let d = u16::from_le_bytes(r.f16_scale());
        if ty == GgmlType::IQ1_M {
            for i in 0..4 {
                let o = 48 + 2 * i;
                let v =
                    (u16::from_le_bytes([b[o], b[o + 1]]) & 0x0fff) | (((d >> (4 * i)) & 15) << 12);
                b[o..o + 2].copy_from_slice(&v.to_le_bytes());
            }
        } else {
            b[0..2].copy_from_slice(&d.to_le_bytes());
        }
    }
    w
}

fn quantize_q8k(x: &[f32]) -> Vec<u8> {
    let q = Kernels::scalar()
        .quantize(GgmlType::Q8_K)
        .expect("Q8_K quantizer");
    let mut out = vec![0u8; x.len() / QK_K * Q8K_BYTES];
    q(x, &mut out);
    out
}

/// The f64 dot of the dequantized weight and activation rows, and `M`.
fn reference(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> (f64, f64) {
    let mut wf = vec![0f32; n];
    dequantize_row(ty, w, &mut wf).expect("dequantize weights");
    let mut af = vec![0f32; n];
    dequantize_row(GgmlType::Q8_K, a, &mut af).expect("dequantize activations");
    let exact = wf
        .iter()
        .zip(&af)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let m = wf
        .iter()
        .zip(&af)
        .map(|(&x, &y)| (f64::from(x) * f64::from(y)).abs())
        .sum();
    (exact, m)
}

fn dot(k: &Kernels, ty: GgmlType) -> quant::DotFn {
    k.dot_in(SumOrder::IqPanel, ty).expect("panel dot kernel")
}

/// `rows` weight rows × `tokens` activation rows: every kernel of both tables, bit for bit,
/// and the scalar kernel against the f64 reference.
fn check(
    ty: GgmlType,
    nb: usize,
    seed: u64,
    x: &[f32],
    tokens: usize,
) -> Result<(), TestCaseError> {
    let n = nb * QK_K;
    let rows = 8;
    let w = random_rows(ty, nb, rows, seed);
    let a: Vec<u8> = x
        .chunks_exact(n)
        .take(tokens)
        .flat_map(quantize_q8k)
        .collect();
    let (wrb, arb) = (nb * ty.type_size(), nb * Q8K_BYTES);
    let (scalar, simd) = (Kernels::scalar(), Kernels::detect());
    let mut want = vec![0f32; rows * tokens];
    for t in 0..tokens {
        let at = &a[t * arb..(t + 1) * arb];
        for r in 0..rows {
            let wr = &w[r * wrb..(r + 1) * wrb];
            let s = dot(scalar, ty)(n, wr, at);
            let v = dot(simd, ty)(n, wr, at);
            prop_assert_eq!(
                s.to_bits(),
                v.to_bits(),
                "{} row {} token {}: {} vs {}",
                ty,
                r,
                t,
                s,
                v
            );
            let (exact, m) = reference(ty, wr, at, n);
            let tol = 2.0 * (nb as f64 + 8.0) * 2f64.powi(-24) * m;
            prop_assert!(
                (f64::from(s) - exact).abs() <= tol,
                "{ty}: {s} vs {exact} (M {m:e})"
            );
            want[t * rows + r] = s;
        }
    }
    for k in [scalar, simd] {
        let panel = k.dot_panel_in(SumOrder::IqPanel, ty).expect("panel kernel");
        prop_assert_eq!(panel.rows, 8);
        let mut out = vec![0f32; rows * tokens];
        (panel.f)(n, &w, &a, &mut out);
        for (i, (g, e)) in out.iter().zip(&want).enumerate() {
            prop_assert_eq!(g.to_bits(), e.to_bits(), "{} panel output {}", ty, i);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn every_panel_kernel_gives_the_same_bits(
        nb in 1usize..4,
        seed in any::<u64>(),
        x in activations(3 * 5),
        tokens in 1usize..6,
    ) {
        for ty in TYPES {
            check(ty, nb, seed, &x, tokens)?;
        }
    }
}

/// The tables pick the panel order where llama.cpp's x86 build does, and never on ARM.
#[test]
fn the_panel_order_is_for_batches_of_eight_of_whole_panels() {
    let k = Kernels::scalar();
    for ty in TYPES {
        for expert in [false, true] {
            assert_eq!(k.order_for(ty, 64, 512, expert), SumOrder::IqPanel, "{ty}");
            assert_eq!(k.order_for(ty, 60, 512, expert), SumOrder::VecDot, "{ty}");
        }
        assert_eq!(k.min_tokens(SumOrder::IqPanel, ty), 8);
        assert_eq!(SumOrder::IqPanel.single_row(), SumOrder::VecDot);
    }
    for ty in [GgmlType::Q4_K, GgmlType::TQ1_0, GgmlType::Q6_K] {
        assert_ne!(k.order_for(ty, 64, 512, false), SumOrder::IqPanel, "{ty}");
    }
    if Kernels::detect().isa() == quant::Isa::Neon {
        for ty in TYPES {
            assert_eq!(
                Kernels::detect().order_for(ty, 64, 512, false),
                SumOrder::VecDot
            );
        }
    }
}
