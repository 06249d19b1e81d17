//! The kernels of `SumOrder::Repacked` (llama.cpp's interleaved Q4_0 / IQ4_NL / MXFP4 / Q4_K
//! kernels) and the grouped Q4_K kernels of its batched path.
//!
//! * The AVX2 table's single-row and 8-row kernels give the scalar kernels' bits, on random
//!   blocks (random quant bytes, finite scales) and random activation bytes (every i8 quant,
//!   -128 included).
//! * Where no float step rounds (power-of-two scales, short rows), every kernel returns the
//!   exact dot product of the dequantized rows: the integer parts (nibble order, scale and min
//!   unpacking) are right.
//! * The matrix product uses the grouped kernels and quantizer for the first `n - n % 4`
//!   activation rows of a plain Q4_K matrix, and the single-row order for the rest, for
//!   single rows and for expert stacks.
//!
//! That these orders are llama.cpp's is checked end to end by the engine's parity test. (These
//! are the x86 orders: on aarch64 the NEON table's repacked kernels follow llama.cpp's ARM
//! build, `kernels_vs_ggml.rs`, and the tests here check the scalar table's.)

mod common;

use common::Rng;
use proptest::prelude::*;
use quant::kernels::{GroupedDot, grouped_kernels, quantize_row_q8_k_grouped};
use quant::{
    DotFn, GgmlType, Isa, Kernels, QK_K, RowKernel, SumOrder, ThreadPool, dequantize_row,
    matmul_with, matvec_with,
};

const TYPES: [GgmlType; 4] = [
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::MXFP4,
    GgmlType::Q4_K,
];

fn act_type(w: GgmlType) -> GgmlType {
    if w == GgmlType::Q4_K {
        GgmlType::Q8_K
    } else {
        GgmlType::Q8_0
    }
}

fn row_bytes(ty: GgmlType, n: usize) -> usize {
    ty.row_bytes(n as u64).unwrap() as usize
}

/// `rows` random weight rows of `n` elements: random bytes, with finite f16 block scales
/// (and mins), MXFP4 exponents around 2^0 with some extremes.
fn weights(ty: GgmlType, rows: usize, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut w: Vec<u8> = (0..rows * row_bytes(ty, n)).map(|_| rng.byte()).collect();
    let bs = ty.type_size();
    for b in w.chunks_exact_mut(bs) {
        match ty {
            GgmlType::Q4_0 | GgmlType::IQ4_NL => b[..2].copy_from_slice(&rng.f16_scale()),
            GgmlType::MXFP4 => {
                b[0] = match rng.below(8) {
                    0 => [0u8, 1, 2, 254][rng.below(4) as usize],
                    _ => 117 + rng.below(20) as u8,
                }
            }
            GgmlType::Q4_K => {
                b[..2].copy_from_slice(&rng.f16_scale());
                b[2..4].copy_from_slice(&rng.f16_scale());
            }
            _ => unreachable!(),
        }
    }
    w
}

/// One random activation row of `n` elements of type `act` (Q8_0 or Q8_K) as raw bytes,
/// quants from `quant` (by default every i8 value); Q8_K group sums are consistent with the
/// quants.
fn activation_bytes(
    act: GgmlType,
    n: usize,
    rng: &mut Rng,
    quant: Option<fn(&mut Rng) -> u8>,
) -> Vec<u8> {
    let mut a: Vec<u8> = (0..row_bytes(act, n)).map(|_| rng.byte()).collect();
    for b in a.chunks_exact_mut(act.type_size()) {
        let qs = if act == GgmlType::Q8_0 {
            b[..2].copy_from_slice(&rng.f16_scale());
            2
        } else {
            let d = f32::from(half::f16::from_le_bytes(rng.f16_scale()));
            b[..4].copy_from_slice(&d.to_le_bytes());
            4
        };
        if let Some(f) = quant {
            for q in &mut b[qs..qs + 32] {
                *q = f(rng);
            }
            if act == GgmlType::Q8_K {
                for q in &mut b[qs + 32..qs + QK_K] {
                    *q = f(rng);
                }
            }
        }
        if act == GgmlType::Q8_K {
            for g in 0..16 {
                let s: i16 = b[4 + 16 * g..4 + 16 * g + 16]
                    .iter()
                    .map(|&q| i16::from(q as i8))
                    .sum();
                b[260 + 2 * g..262 + 2 * g].copy_from_slice(&s.to_le_bytes());
            }
        }
    }
    a
}

/// The best table whose `SumOrder::Repacked` is llama.cpp's x86 order: this CPU's, except on
/// aarch64, whose NEON table follows llama.cpp's ARM repacked kernels instead (checked against
/// that build in `kernels_vs_ggml.rs`); there the scalar table's x86-order kernels are checked.
fn best() -> &'static Kernels {
    match Kernels::detect().isa() {
        Isa::Neon => Kernels::scalar(),
        _ => Kernels::detect(),
    }
}

fn dot_in(k: &Kernels, ty: GgmlType) -> DotFn {
    k.dot_in(SumOrder::Repacked, ty)
        .expect("every table has the Repacked kernels")
}

fn grouped(k: &Kernels) -> GroupedDot {
    k.grouped_in(SumOrder::Repacked, GgmlType::Q4_K)
        .expect("Q4_K has grouped kernels")
}

/// The best table's single-row and multi-row kernels of (`dot`, `dot_rows`) against the scalar
/// `reference`, bit for bit, on 8 rows.
fn check_rows(
    reference: DotFn,
    dot: DotFn,
    dot_rows: Option<quant::DotRows>,
    n: usize,
    w: &[u8],
    a: &[u8],
) -> Result<(), TestCaseError> {
    let rb = w.len() / 8;
    let want: Vec<u32> = w
        .chunks_exact(rb)
        .map(|r| reference(n, r, a).to_bits())
        .collect();
    let single: Vec<u32> = w.chunks_exact(rb).map(|r| dot(n, r, a).to_bits()).collect();
    prop_assert_eq!(&single, &want);
    if let Some(dr) = dot_rows {
        prop_assert_eq!(dr.rows, 8);
        let mut out = [0f32; 8];
        (dr.f)(n, w, a, &mut out);
        let multi: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
        prop_assert_eq!(&multi, &want);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn best_table_gives_the_scalar_bits(ti in 0usize..4, blocks in 1usize..=9, seed in any::<u64>()) {
        let ty = TYPES[ti];
        let n = blocks * ty.block_size();
        let mut rng = Rng(seed);
        let w = weights(ty, 8, n, &mut rng);
        let a = activation_bytes(act_type(ty), n, &mut rng, None);
        let (s, best) = (Kernels::scalar(), best());
        let dot_rows = best.dot_rows_in(SumOrder::Repacked, ty);
        if best.isa() == Isa::Avx2 {
            prop_assert!(dot_rows.is_some());
        }
        check_rows(dot_in(s, ty), dot_in(best, ty), dot_rows, n, &w, &a)?;
        if ty == GgmlType::Q4_K {
            let (gs, gb) = (grouped(s), grouped(best));
            prop_assert_eq!(gs.group, 4);
            check_rows(gs.dot, gb.dot, gb.dot_rows, n, &w, &a)?;
        }
    }
}

/// llama.cpp's ARM 4x4 gemv and gemm of IQ4_NL and MXFP4, written independently of the
/// library from its source: per block the exact sum of table values times activation quants,
/// then `acc + (d_a · d_w) · Σ`, each step rounded (no fused multiply-add).
fn emulate_arm_lut_4x4(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (table, off) = match ty {
        GgmlType::IQ4_NL => (quant::tables::KVALUES_IQ4NL, 2),
        _ => (quant::tables::KVALUES_MXFP4, 1),
    };
    let mut acc = 0f32;
    for (x, y) in w
        .chunks_exact(ty.type_size())
        .zip(a.chunks_exact(34))
        .take(n / 32)
    {
        let sum: i32 = (0..32)
            .map(|j| {
                let b = x[off + j % 16];
                let q = if j < 16 { b & 15 } else { b >> 4 };
                i32::from(table[q as usize]) * i32::from(y[2 + j] as i8)
            })
            .sum();
        let d_a = half::f16::from_le_bytes([y[0], y[1]]).to_f32();
        let d_w = match ty {
            GgmlType::IQ4_NL => half::f16::from_le_bytes([x[0], x[1]]).to_f32(),
            _ => quant::tables::e8m0_to_f32_half(x[0]),
        };
        let p = d_a * d_w * sum as f32;
        acc += p;
    }
    acc
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// On aarch64 the NEON table's repacked IQ4_NL and MXFP4 kernels (llama.cpp's ARM 4x4
    /// order, also checked against that build's outputs in `kernels_vs_ggml.rs`) equal the
    /// emulation above bit for bit.
    #[test]
    fn neon_lut_4x4_follows_the_arm_order(mx in any::<bool>(), blocks in 1usize..=40, seed in any::<u64>()) {
        let k = Kernels::detect();
        if k.isa() != Isa::Neon {
            return Ok(());
        }
        let ty = if mx { GgmlType::MXFP4 } else { GgmlType::IQ4_NL };
        let n = blocks * 32;
        let mut rng = Rng(seed);
        let w = weights(ty, 1, n, &mut rng);
        let a = activation_bytes(GgmlType::Q8_0, n, &mut rng, None);
        let got = dot_in(k, ty)(n, &w, &a);
        let want = emulate_arm_lut_4x4(ty, n, &w, &a);
        prop_assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{ty} n={n}: {got:e} vs {want:e}");
    }
}

/// Power-of-two scales and few blocks: every product and partial sum is exact in f32, so each
/// kernel must return the exact dot product of the dequantized rows.
#[test]
fn exact_where_nothing_rounds() {
    let mut rng = Rng(7);
    for table in [Kernels::scalar(), best()] {
        for ty in TYPES {
            let act = act_type(ty);
            for blocks in [1usize, 2, 3] {
                let n = blocks * ty.block_size();
                let mut w = weights(ty, 8, n, &mut rng);
                for b in w.chunks_exact_mut(ty.type_size()) {
                    match ty {
                        GgmlType::MXFP4 => b[0] = 124 + rng.below(4) as u8,
                        GgmlType::Q4_K => {
                            let e = 0x2400 + 0x400 * rng.below(4) as u16; // 2^-6 .. 2^-3
                            b[..2].copy_from_slice(&e.to_le_bytes());
                            b[2..4].copy_from_slice(&(e + 0x400).to_le_bytes());
                        }
                        _ => b[..2].copy_from_slice(
                            &(0x2c00u16 + 0x400 * rng.below(4) as u16).to_le_bytes(),
                        ),
                    }
                }
                // Quants -4..=3 keep every integer block total far below 2^24.
                let mut a =
                    activation_bytes(act, n, &mut rng, Some(|r| (r.below(8) as i8 - 4) as u8));
                for b in a.chunks_exact_mut(act.type_size()) {
                    if act == GgmlType::Q8_0 {
                        b[..2].copy_from_slice(&0x2000u16.to_le_bytes()); // 2^-7
                    } else {
                        b[..4].copy_from_slice(&(1.0f32 / 128.0).to_le_bytes());
                    }
                }
                let mut xa = vec![0f32; n];
                dequantize_row(act, &a, &mut xa).unwrap();
                let rb = row_bytes(ty, n);
                let mut kernels = vec![dot_in(table, ty)];
                if ty == GgmlType::Q4_K {
                    kernels.push(grouped(table).dot);
                }
                for (r, row) in w.chunks_exact(rb).enumerate() {
                    let mut xw = vec![0f32; n];
                    dequantize_row(ty, row, &mut xw).unwrap();
                    let exact: f64 = xw
                        .iter()
                        .zip(&xa)
                        .map(|(&p, &q)| f64::from(p) * f64::from(q))
                        .sum();
                    for k in &kernels {
                        let got = k(n, row, &a);
                        assert_eq!(
                            f64::from(got),
                            exact,
                            "{ty} ({:?} table), {blocks} blocks, row {r}",
                            table.isa()
                        );
                    }
                }
            }
        }
    }
}

fn random_floats(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|_| rng.normal()).collect()
}

/// Of a batched Q4_K product over `n_tok` rows, rows below `n_tok - n_tok % 4` are quantized
/// and multiplied in the grouped order, the others in the single-row order; expert stacks
/// and single rows always use the single-row order.
#[test]
fn products_use_the_grouped_order_for_whole_groups_of_four() {
    let (rows, cols) = (24, 2 * QK_K);
    let mut rng = Rng(11);
    let w = weights(GgmlType::Q4_K, rows, cols, &mut rng);
    let pool = ThreadPool::new(2).unwrap();
    let rb = row_bytes(GgmlType::Q4_K, cols);
    let ab = row_bytes(GgmlType::Q8_K, cols);
    for table in [Kernels::scalar(), best()] {
        let g = grouped(table);
        let plain_dot = dot_in(table, GgmlType::Q4_K);
        let plain_q = table.quantize(GgmlType::Q8_K).unwrap();
        for expert in [false, true] {
            let k = RowKernel::for_weight(table, GgmlType::Q4_K, rows, cols, expert).unwrap();
            assert_eq!(k.order, SumOrder::Repacked);
            assert_eq!(k.grouped.is_some(), !expert);
            for n_tok in [1usize, 2, 4, 6, 9] {
                let x = random_floats(n_tok * cols, &mut rng);
                let mut out = vec![0f32; n_tok * rows];
                let mut scratch = Vec::new();
                if n_tok == 1 {
                    matvec_with(&pool, &k, &w, rows, cols, &x, &mut out, &mut scratch).unwrap();
                } else {
                    matmul_with(&pool, &k, &w, rows, cols, &x, n_tok, &mut out, &mut scratch)
                        .unwrap();
                }
                let n_grouped = if expert { 0 } else { n_tok - n_tok % 4 };
                let mut differs = false;
                for t in 0..n_tok {
                    let xr = &x[t * cols..(t + 1) * cols];
                    let mut q = vec![0u8; ab];
                    let mut qp = vec![0u8; ab];
                    plain_q(xr, &mut qp);
                    let want: Vec<u32> = if t < n_grouped {
                        (g.quantize)(xr, &mut q);
                        w.chunks_exact(rb)
                            .map(|r| (g.dot)(cols, r, &q).to_bits())
                            .collect()
                    } else {
                        w.chunks_exact(rb)
                            .map(|r| plain_dot(cols, r, &qp).to_bits())
                            .collect()
                    };
                    let other: Vec<u32> = w
                        .chunks_exact(rb)
                        .map(|r| plain_dot(cols, r, &qp).to_bits())
                        .collect();
                    differs |= want != other;
                    let got: Vec<u32> = out[t * rows..(t + 1) * rows]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    assert_eq!(
                        got,
                        want,
                        "expert {expert}, {n_tok} rows, row {t} ({:?})",
                        table.isa()
                    );
                }
                // The two orders do differ on some rows (else this test would prove little).
                if n_grouped > 0 {
                    assert!(differs, "grouped and single-row orders agree everywhere");
                }
            }
        }
    }
}

/// The grouped Q8_K quantizer equals the plain one except when a block's largest magnitude
/// occurs with both signs and the negative one comes first: then it scales by the positive
/// one (the quants and the scale change sign).
#[test]
fn grouped_quantizer_prefers_the_positive_maximum() {
    let mut rng = Rng(3);
    let plain = Kernels::scalar().quantize(GgmlType::Q8_K).unwrap();
    let ab = row_bytes(GgmlType::Q8_K, 2 * QK_K);
    let (mut p, mut g) = (vec![0u8; ab], vec![0u8; ab]);
    for _ in 0..50 {
        let x = random_floats(2 * QK_K, &mut rng);
        plain(&x, &mut p);
        quantize_row_q8_k_grouped(&x, &mut g);
        assert_eq!(p, g);
    }
    let mut x = random_floats(QK_K, &mut rng);
    let m = x.iter().fold(0f32, |m, v| m.max(v.abs())) * 2.0;
    x[10] = -m;
    x[200] = m;
    let ab = row_bytes(GgmlType::Q8_K, QK_K);
    let (mut p, mut g) = (vec![0u8; ab], vec![0u8; ab]);
    plain(&x, &mut p);
    quantize_row_q8_k_grouped(&x, &mut g);
    let d = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    assert_eq!(d(&g), -d(&p));
    assert!(d(&g) < 0.0);
    for j in 0..QK_K {
        assert_eq!(g[4 + j] as i8, -(p[4 + j] as i8), "quant {j}");
    }
    assert_eq!(g[4 + 200] as i8, -127);
    // Without the tie both agree again.
    x[10] = -m / 2.0;
    plain(&x, &mut p);
    quantize_row_q8_k_grouped(&x, &mut g);
    assert_eq!(p, g);
}

#[test]
fn repacked_types_with_row_counts_divisible_by_8() {
    for ty in TYPES {
        for expert in [false, true] {
            assert_eq!(
                SumOrder::for_weight(ty, 64, 256, expert),
                SumOrder::Repacked
            );
            assert_eq!(SumOrder::for_weight(ty, 60, 256, expert), SumOrder::VecDot);
        }
    }
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        assert_eq!(SumOrder::for_weight(ty, 64, 256, false), SumOrder::VecDot);
    }
    // Only the Repacked Q4_K has grouped kernels.
    for isa in [Isa::Scalar, best().isa()] {
        assert!(grouped_kernels(isa, SumOrder::Repacked, GgmlType::Q4_K).is_some());
        assert!(grouped_kernels(isa, SumOrder::VecDot, GgmlType::Q4_K).is_none());
        assert!(grouped_kernels(isa, SumOrder::Repacked, GgmlType::Q4_0).is_none());
    }
}

/// Extreme inputs, where the integer sums are largest and the scales at their limits: every
/// weight quant at its largest magnitude (and at the other end of the table), every 6-bit
/// Q4_K scale and min at 63, activation quants all -128 or all 127 (or alternating), f16
/// scales at the f16 maximum and at the smallest subnormal, E8M0 exponents 0, 1, 254, 255.
/// The best table's single-row, 8-row and grouped kernels give the scalar bits.
#[test]
fn extreme_values_give_the_scalar_bits() {
    let (s, best) = (Kernels::scalar(), best());
    let mut rng = Rng(5);
    for ty in TYPES {
        let act = act_type(ty);
        for blocks in [1usize, 2, 5] {
            let n = blocks * ty.block_size();
            for qbyte in [0x00u8, 0xff, 0x77, 0x88, 0x0f, 0xf0] {
                for scale in [0x7bffu16, 0x0001, 0x3c00, 0xfbff] {
                    let mut w = weights(ty, 8, n, &mut rng);
                    for b in w.chunks_exact_mut(ty.type_size()) {
                        match ty {
                            GgmlType::MXFP4 => {
                                b[0] = [0u8, 1, 254, 255][rng.below(4) as usize];
                                b[1..].fill(qbyte);
                            }
                            GgmlType::Q4_K => {
                                b[..2].copy_from_slice(&scale.to_le_bytes());
                                b[2..4].copy_from_slice(&scale.to_le_bytes());
                                b[4..16].fill(0xff);
                                b[16..].fill(qbyte);
                            }
                            _ => {
                                b[..2].copy_from_slice(&scale.to_le_bytes());
                                b[2..].fill(qbyte);
                            }
                        }
                    }
                    let quants: [fn(&mut Rng) -> u8; 3] =
                        [|_| 0x80, |_| 0x7f, |r| [0x80u8, 0x7f][r.below(2) as usize]];
                    for quant in quants {
                        let mut a = activation_bytes(act, n, &mut rng, Some(quant));
                        for b in a.chunks_exact_mut(act.type_size()) {
                            if act == GgmlType::Q8_0 {
                                b[..2].copy_from_slice(&0x3c00u16.to_le_bytes());
                            } else {
                                b[..4].copy_from_slice(&1.0f32.to_le_bytes());
                            }
                        }
                        check_rows(
                            dot_in(s, ty),
                            dot_in(best, ty),
                            best.dot_rows_in(SumOrder::Repacked, ty),
                            n,
                            &w,
                            &a,
                        )
                        .unwrap();
                        if ty == GgmlType::Q4_K {
                            let (gs, gb) = (grouped(s), grouped(best));
                            check_rows(gs.dot, gb.dot, gb.dot_rows, n, &w, &a).unwrap();
                        }
                    }
                }
            }
        }
    }
}

/// Whole matrices through the matrix × vector product (chunks of rows over two threads, the
/// 8-row kernels one group after another, longer rows than the property test): every output
/// element has the scalar kernel's bits.
#[test]
fn matrix_products_give_the_scalar_bits() {
    let pool = ThreadPool::new(2).unwrap();
    let (s, best) = (Kernels::scalar(), best());
    let mut rng = Rng(13);
    for ty in TYPES {
        for (rows, blocks) in [(64usize, 3usize), (136, 16), (8, 40)] {
            let n = blocks * ty.block_size();
            let w = weights(ty, rows, n, &mut rng);
            let x = random_floats(n, &mut rng);
            let k = RowKernel::for_weight(best, ty, rows, n, false).unwrap();
            assert_eq!(k.order, SumOrder::Repacked);
            let mut out = vec![0f32; rows];
            let mut scratch = Vec::new();
            matvec_with(&pool, &k, &w, rows, n, &x, &mut out, &mut scratch).unwrap();
            let mut q = vec![0u8; row_bytes(act_type(ty), n)];
            (k.quantize)(&x, &mut q);
            let reference = dot_in(s, ty);
            let rb = row_bytes(ty, n);
            for (r, (row, got)) in w.chunks_exact(rb).zip(&out).enumerate() {
                assert_eq!(
                    got.to_bits(),
                    reference(n, row, &q).to_bits(),
                    "{ty}, {rows} x {n}, row {r}"
                );
            }
        }
    }
}
