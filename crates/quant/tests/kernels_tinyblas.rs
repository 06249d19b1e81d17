//! Dot kernels of the tinyBLAS summation order ([`SumOrder::TinyBlas`]) for F32, F16 and BF16.
//!
//! * The scalar kernels follow the documented order: one 8-lane accumulator updated by a
//!   fused multiply-add per element (lane `i % 8`), then the lanes added as
//!   `((l4 + l0) + (l6 + l2)) + ((l5 + l1) + (l7 + l3))`; checked against an independent
//!   emulation written here.
//! * The best table's kernels (AVX2 on x86-64) give the same bits as the scalar ones, for
//!   every row length (also those that are not a multiple of 8) and for special values. The
//!   NEON table sums F32 and F16 as llama.cpp's ARM build does (4 f32 lanes; 8 f16 lanes):
//!   F32 is checked against an emulation of that order, F16 against the exact sum.
//! * Each output of a multi-row kernel equals the single-row kernel on that row, bit for bit.
//! * [`SumOrder::for_weight`] picks the order for plain float weights with the sizes
//!   llama.cpp's `llamafile_sgemm` accepts, and the vec_dot order otherwise.
//! * The ARM order of Q4_0 and Q8_0 weights (`tinyBLAS_Q0_ARM`, [`arm_q0_reference`]): the
//!   scalar reference equals an independent emulation written here, and the exact dot product
//!   where nothing rounds; on aarch64 the NEON table's kernels equal it bit for bit. (That it
//!   is llama.cpp's ARM order is checked on that build's outputs in `kernels_vs_ggml.rs`.)

mod common;

use common::Rng;
use proptest::prelude::*;
use quant::kernels::arm_q0_reference;
use quant::{GgmlType, Kernels, RowKernel, SumOrder};

const TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];

/// One random value: mostly normal with a random magnitude, sometimes zero (either sign),
/// and with `special` a small chance of an infinity, a NaN or a subnormal.
fn value(rng: &mut Rng, special: bool) -> f32 {
    if special && rng.below(40) == 0 {
        return match rng.below(5) {
            0 => f32::INFINITY,
            1 => f32::NEG_INFINITY,
            2 => f32::NAN,
            3 => f32::from_bits(1 + rng.below(1 << 20) as u32),
            _ => -0.0,
        };
    }
    if rng.below(10) == 0 {
        return if rng.below(2) == 0 { 0.0 } else { -0.0 };
    }
    rng.normal() * 10f32.powf(rng.unit() as f32 * 6.0 - 3.0)
}

/// `n` elements of type `ty` (rounded from random values) and the same values as f32.
fn row(ty: GgmlType, n: usize, rng: &mut Rng, special: bool) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut vals = Vec::new();
    for _ in 0..n {
        let v = value(rng, special);
        match ty {
            GgmlType::F32 => {
                bytes.extend_from_slice(&v.to_le_bytes());
                vals.push(v);
            }
            GgmlType::F16 => {
                let h = half::f16::from_f32(v);
                bytes.extend_from_slice(&h.to_bits().to_le_bytes());
                vals.push(h.to_f32());
            }
            _ => {
                let h = half::bf16::from_f32(v);
                bytes.extend_from_slice(&h.to_bits().to_le_bytes());
                vals.push(h.to_f32());
            }
        }
    }
    (bytes, vals)
}

/// The tinyBLAS order, written independently of the library: lanes over groups of 8.
fn emulate(w: &[f32], a: &[f32]) -> f32 {
    let mut lane = [0f32; 8];
    for (wg, ag) in w.chunks(8).zip(a.chunks(8)) {
        for l in 0..wg.len() {
            lane[l] = wg[l].mul_add(ag[l], lane[l]);
        }
    }
    let lo = [lane[0], lane[1], lane[2], lane[3]];
    let hi = [lane[4], lane[5], lane[6], lane[7]];
    let t: Vec<f32> = hi.iter().zip(&lo).map(|(h, l)| h + l).collect();
    (t[0] + t[2]) + (t[1] + t[3])
}

/// llama.cpp's ARM tinyBLAS order for F32, written independently of the library: 4 lanes,
/// a last partial group's missing lanes multiplied as zeros, then `(l0 + l1) + (l2 + l3)`.
fn emulate_arm_f32(w: &[f32], a: &[f32]) -> f32 {
    let mut lane = [0f32; 4];
    for (wg, ag) in w.chunks(4).zip(a.chunks(4)) {
        for (l, acc) in lane.iter_mut().enumerate() {
            let (x, y) = (wg.get(l).copied(), ag.get(l).copied());
            *acc = x.unwrap_or(0.0).mul_add(y.unwrap_or(0.0), *acc);
        }
    }
    (lane[0] + lane[1]) + (lane[2] + lane[3])
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn tiny(k: &Kernels, ty: GgmlType) -> quant::DotFn {
    k.dot_in(SumOrder::TinyBlas, ty)
        .unwrap_or_else(|| panic!("no tinyBLAS kernel for {ty}"))
}

/// `nb` random Q8_0 or Q4_0 blocks: random quant bytes, scales from `scale`.
fn q0_blocks(
    ty: GgmlType,
    nb: usize,
    rng: &mut Rng,
    scale: &mut dyn FnMut(&mut Rng) -> [u8; 2],
) -> Vec<u8> {
    let bs = ty.type_size();
    let mut b: Vec<u8> = (0..nb * bs).map(|_| rng.byte()).collect();
    for blk in b.chunks_exact_mut(bs) {
        blk[..2].copy_from_slice(&scale(rng));
    }
    b
}

/// The quants of one Q8_0 / Q4_0 block, elements 0..32.
fn q0_quants(ty: GgmlType, blk: &[u8]) -> Vec<i32> {
    match ty {
        GgmlType::Q8_0 => blk[2..34].iter().map(|&q| i32::from(q as i8)).collect(),
        _ => (0..32)
            .map(|j| {
                let b = blk[2 + j % 16];
                i32::from(if j < 16 { b & 15 } else { b >> 4 }) - 8
            })
            .collect(),
    }
}

fn f16_of(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// `tinyBLAS_Q0_ARM` written independently of the library, from its source: lane `t` sums
/// `vdotq_s32` lane `t` of the low and the high 16 quants, converts, multiplies by the
/// product of the scales and adds; then `vaddvq_f32`.
fn emulate_arm_q0(ty: GgmlType, w: &[u8], a: &[u8]) -> f32 {
    let mut lane = [0f32; 4];
    for (x, y) in w.chunks_exact(ty.type_size()).zip(a.chunks_exact(34)) {
        let (qx, qy) = (q0_quants(ty, x), q0_quants(GgmlType::Q8_0, y));
        let d = f16_of(x) * f16_of(y);
        for (t, l) in lane.iter_mut().enumerate() {
            let lo: i32 = (4 * t..4 * t + 4).map(|j| qx[j] * qy[j]).sum();
            let hi: i32 = (16 + 4 * t..16 + 4 * t + 4).map(|j| qx[j] * qy[j]).sum();
            let p = (lo + hi) as f32 * d;
            *l += p;
        }
    }
    (lane[0] + lane[1]) + (lane[2] + lane[3])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn arm_q0_reference_follows_the_documented_order(seed in any::<u64>(), nb in 1usize..40, q8 in any::<bool>()) {
        let ty = if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_0 };
        let mut rng = Rng(seed);
        let w = q0_blocks(ty, nb, &mut rng, &mut Rng::f16_scale);
        let a = q0_blocks(GgmlType::Q8_0, nb, &mut rng, &mut Rng::f16_scale);
        let got = arm_q0_reference(ty).unwrap()(32 * nb, &w, &a);
        let want = emulate_arm_q0(ty, &w, &a);
        prop_assert!(same(got, want), "{ty} {nb} blocks: {got:e} vs {want:e}");
    }

    /// With scales 1 or 2 and at most 4 blocks nothing rounds (every partial sum is an
    /// integer below 2^24): the result is the exact dot product of the dequantized rows (the
    /// quants are read right).
    #[test]
    fn arm_q0_reference_is_exact_where_nothing_rounds(seed in any::<u64>(), nb in 1usize..5, q8 in any::<bool>()) {
        let ty = if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_0 };
        let mut rng = Rng(seed);
        let mut pow2 = |r: &mut Rng| half::f16::from_f32(f32::powi(2.0, r.below(2) as i32)).to_le_bytes();
        let w = q0_blocks(ty, nb, &mut rng, &mut pow2);
        let a = q0_blocks(GgmlType::Q8_0, nb, &mut rng, &mut pow2);
        let exact: f64 = w.chunks_exact(ty.type_size()).zip(a.chunks_exact(34)).map(|(x, y)| {
            let s: i32 = q0_quants(ty, x).iter().zip(q0_quants(GgmlType::Q8_0, y)).map(|(p, q)| p * q).sum();
            f64::from(s) * f64::from(f16_of(x)) * f64::from(f16_of(y))
        }).sum();
        let got = arm_q0_reference(ty).unwrap()(32 * nb, &w, &a);
        prop_assert_eq!(f64::from(got), exact, "{} {} blocks", ty, nb);
    }

    /// On aarch64 the NEON table's Q4_0 / Q8_0 tinyBLAS kernels give the reference's bits.
    #[test]
    fn neon_arm_q0_equals_reference(seed in any::<u64>(), nb in 1usize..80, q8 in any::<bool>()) {
        let k = Kernels::detect();
        if k.isa() != quant::Isa::Neon {
            return Ok(());
        }
        let ty = if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_0 };
        let mut rng = Rng(seed);
        let w = q0_blocks(ty, nb, &mut rng, &mut Rng::f16_scale);
        let a = q0_blocks(GgmlType::Q8_0, nb, &mut rng, &mut Rng::f16_scale);
        let got = tiny(k, ty)(32 * nb, &w, &a);
        let want = arm_q0_reference(ty).unwrap()(32 * nb, &w, &a);
        prop_assert!(same(got, want), "{ty} {nb} blocks: {got:e} vs {want:e}");
    }

    #[test]
    fn scalar_follows_the_documented_order(seed in any::<u64>(), n in 1usize..300, t in 0usize..3) {
        let ty = TYPES[t];
        let mut rng = Rng(seed);
        let (wb, wv) = row(ty, n, &mut rng, false);
        let (ab, av) = row(ty, n, &mut rng, false);
        let got = tiny(Kernels::scalar(), ty)(n, &wb, &ab);
        let want = emulate(&wv, &av);
        prop_assert!(same(got, want), "{ty} n={n}: {got:e} vs {want:e}");
    }

    #[test]
    fn best_table_equals_scalar(seed in any::<u64>(), n in 1usize..700, t in 0usize..3, special in any::<bool>()) {
        let ty = TYPES[t];
        let mut rng = Rng(seed);
        let (wb, _) = row(ty, n, &mut rng, special);
        let (ab, _) = row(ty, n, &mut rng, special);
        let k = Kernels::detect();
        let got = tiny(k, ty)(n, &wb, &ab);
        if k.isa() == quant::Isa::Neon && ty != GgmlType::BF16 {
            // llama.cpp's ARM order (F32 here; F16, in half precision, below)
            if ty == GgmlType::F32 {
                let f = |b: &[u8]| -> Vec<f32> {
                    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
                };
                let want = emulate_arm_f32(&f(&wb), &f(&ab));
                prop_assert!(same(got, want), "{ty} n={n}: {got:e} vs ARM order {want:e}");
            }
            return Ok(());
        }
        let want = tiny(Kernels::scalar(), ty)(n, &wb, &ab);
        prop_assert!(same(got, want), "{ty} n={n}: {got:e} vs scalar {want:e}");
    }

    /// The NEON F16 kernel accumulates in half precision (as llama.cpp's ARM tinyBLAS does;
    /// bit-exact against it in the engine's attention fixture): within f16 rounding of the
    /// exact sum, on values small enough not to overflow f16.
    #[test]
    fn neon_f16_is_within_half_precision_rounding(seed in any::<u64>(), n in 1usize..700) {
        let k = Kernels::detect();
        if k.isa() != quant::Isa::Neon {
            return Ok(());
        }
        let mut rng = Rng(seed);
        let mut half_row = || -> (Vec<u8>, Vec<f64>) {
            let v: Vec<half::f16> = (0..n).map(|_| half::f16::from_f32(rng.normal().clamp(-2.0, 2.0))).collect();
            (v.iter().flat_map(|h| h.to_le_bytes()).collect(), v.iter().map(|h| f64::from(h.to_f32())).collect())
        };
        let (wb, wv) = half_row();
        let (ab, av) = half_row();
        let got = f64::from(tiny(k, GgmlType::F16)(n, &wb, &ab));
        let exact: f64 = wv.iter().zip(&av).map(|(x, y)| x * y).sum();
        let mag: f64 = wv.iter().zip(&av).map(|(x, y)| (x * y).abs()).sum();
        let tol = (n as f64 / 8.0 + 4.0) * mag * f64::powi(2.0, -10);
        prop_assert!((got - exact).abs() <= tol, "n={n}: {got} vs exact {exact} (tolerance {tol})");
    }

    #[test]
    fn multi_row_equals_single_row(seed in any::<u64>(), n in 1usize..600, t in 0usize..3, special in any::<bool>()) {
        let ty = TYPES[t];
        let k = Kernels::detect();
        let Some(rows) = k.dot_rows_in(SumOrder::TinyBlas, ty) else {
            return Ok(());
        };
        let mut rng = Rng(seed);
        let mut w = Vec::new();
        for _ in 0..rows.rows {
            w.extend(row(ty, n, &mut rng, special).0);
        }
        let (a, _) = row(ty, n, &mut rng, special);
        let mut out = vec![0f32; rows.rows];
        (rows.f)(n, &w, &a, &mut out);
        let one = tiny(k, ty);
        let rb = w.len() / rows.rows;
        for (r, &o) in out.iter().enumerate() {
            let want = one(n, &w[r * rb..(r + 1) * rb], &a);
            prop_assert!(same(o, want), "{ty} n={n} row {r}: {o:e} vs {want:e}");
        }
    }
}

#[test]
fn for_weight_picks_tinyblas_for_plain_float_weights_llamafile_accepts() {
    for ty in TYPES {
        assert_eq!(
            SumOrder::for_weight(ty, 256, 256, false),
            SumOrder::TinyBlas
        );
        assert_eq!(
            SumOrder::for_weight(ty, 1024, 2048, false),
            SumOrder::TinyBlas
        );
        assert_eq!(SumOrder::for_weight(ty, 4, 8, false), SumOrder::TinyBlas);
        // expert stacks go through MUL_MAT_ID, which never uses tinyBLAS
        assert_eq!(SumOrder::for_weight(ty, 256, 256, true), SumOrder::VecDot);
        // llamafile_sgemm declines a row count that is not a multiple of 4 ...
        assert_eq!(SumOrder::for_weight(ty, 1027, 256, false), SumOrder::VecDot);
        assert_eq!(SumOrder::for_weight(ty, 1, 256, false), SumOrder::VecDot);
        // ... and a row length that is not a multiple of 8
        assert_eq!(SumOrder::for_weight(ty, 256, 260, false), SumOrder::VecDot);
        let tables = [Kernels::scalar(), Kernels::detect()];
        for k in tables {
            let rk = RowKernel::for_weight(k, ty, 256, 256, false).unwrap();
            let rk_expert = RowKernel::for_weight(k, ty, 256, 256, true).unwrap();
            assert_eq!(rk_expert.order, SumOrder::VecDot);
            if k.isa() == quant::Isa::Neon {
                // llama.cpp's ARM build: tinyBLAS for F32 from 4 tokens, F16 from 8, never BF16
                let (order, min) = match ty {
                    GgmlType::F32 => (SumOrder::TinyBlas, 4),
                    GgmlType::F16 => (SumOrder::TinyBlas, 8),
                    _ => (SumOrder::VecDot, 2),
                };
                assert_eq!(rk.order, order, "{ty}");
                assert_eq!(k.min_tokens(rk.order, ty), min, "{ty}");
                assert_eq!(k.order_for(ty, 256, 258, false), SumOrder::VecDot);
            } else {
                assert_eq!(rk.order, SumOrder::TinyBlas);
                assert_eq!(rk.act_type, ty);
                assert_eq!(k.min_tokens(rk.order, ty), 2);
            }
        }
    }
}

/// Which order a Q4_0 / Q8_0 weight takes: on ARM the repack's 4x4 order for row counts
/// divisible by 4, tinyBLAS_Q0_ARM for the other plain weights (and for any unrepacked one),
/// `vec_dot` for the other expert stacks; on x86 (scalar, AVX2) never tinyBLAS.
#[test]
fn q0_weights_take_arm_tinyblas_where_the_repack_declines_them() {
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
        for k in [Kernels::scalar(), Kernels::detect()] {
            let neon = k.isa() == quant::Isa::Neon;
            let plain_odd = k.order_for(ty, 1030, 256, false);
            let expert_odd = k.order_for(ty, 1030, 256, true);
            let heads = k.order_unrepacked(ty, 512, 256);
            if neon {
                assert_eq!(plain_odd, SumOrder::TinyBlas, "{ty}");
                assert_eq!(heads, SumOrder::TinyBlas, "{ty}");
                assert_eq!(k.order_for(ty, 512, 256, false), SumOrder::Repacked);
                assert_eq!(k.min_tokens(SumOrder::TinyBlas, ty), 2);
                let rk = RowKernel::for_weight(k, ty, 1030, 256, false).unwrap();
                assert_eq!(
                    (rk.order, rk.act_type),
                    (SumOrder::TinyBlas, GgmlType::Q8_0)
                );
            } else {
                assert_eq!(plain_odd, SumOrder::VecDot, "{ty}");
                assert_eq!(heads, SumOrder::VecDot, "{ty}");
            }
            assert_eq!(expert_odd, SumOrder::VecDot, "{ty}");
        }
    }
}

#[test]
fn the_order_differs_from_vec_dot() {
    // Same inputs, two orders: the results differ in the last bits for most rows (the
    // reason the order is followed per weight), never by more than rounding.
    let mut rng = Rng(7);
    let mut differ = 0;
    for _ in 0..100 {
        let (wb, wv) = row(GgmlType::F32, 256, &mut rng, false);
        let (ab, av) = row(GgmlType::F32, 256, &mut rng, false);
        let k = Kernels::detect();
        let v = k.dot(GgmlType::F32).unwrap()(256, &wb, &ab);
        let t = tiny(k, GgmlType::F32)(256, &wb, &ab);
        let exact: f64 = wv
            .iter()
            .zip(&av)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum();
        let mag: f64 = wv
            .iter()
            .zip(&av)
            .map(|(&x, &y)| (f64::from(x) * f64::from(y)).abs())
            .sum();
        assert!(
            (f64::from(t) - exact).abs() <= mag * 1e-5,
            "{t} vs exact {exact}"
        );
        differ += usize::from(v.to_bits() != t.to_bits());
    }
    assert!(differ > 10, "only {differ} of 100 rows differ");
}
