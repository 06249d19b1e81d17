//! Every kernel of every SIMD table of this CPU (`Kernels::simd_tables`: with and without its
//! AVX-512 VNNI, wide and BMI2 builds) against one reference kernel, bit for bit, for the
//! k-quant paths of a mixture-of-experts decode: Q4_K in the repacked order (plain and
//! grouped) and Q4_K, Q5_K, Q6_K and Q8_0 in the `vec_dot` order, through the single-row,
//! multi-row and multi-token kernels.
//!
//! The reference: for the repacked order the scalar table (whose repacked kernels follow
//! llama.cpp's order exactly); for the `vec_dot` order the narrowest SIMD table
//! (`Kernels::narrow`, AVX2 only), whose kernels `kernels_vs_ggml.rs` holds to the bits of
//! ggml's x86 build (the scalar table sums those types in ggml's generic order, which differs).
//!
//! Matrices of several row counts and lengths are walked the way a matrix-vector product walks
//! them: whole groups of the multi-row (or multi-token) kernel, the rest row by row. Weights
//! are random bytes with finite f16 scales, plus the extreme block (every quant and scale at
//! its largest magnitude) against activations that quantize to their most negative quant,
//! where a 16-bit sum would saturate first.

mod common;

use common::Rng;
use proptest::prelude::*;
use quant::{DotFn, GgmlType, Isa, Kernels, QK_K, QuantizeFn, SumOrder, vec_dot_type};

/// Byte offsets of the f16 scales inside a block.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q8_0 => &[0],
        _ => unreachable!("not a type of this test: {ty}"),
    }
}

/// `rows` rows of `n` elements: random bytes with finite f16 scales; with `extreme`, every
/// other byte 0xff (largest quants and scales; Q6_K's scales -128, Q8_0's quants -128)
/// instead of random.
fn weights(ty: GgmlType, rows: usize, n: usize, extreme: bool, rng: &mut Rng) -> Vec<u8> {
    let fill = if ty == GgmlType::Q8_0 { 0x80 } else { 0xff };
    let mut w: Vec<u8> = (0..rows * ty.row_bytes(n as u64).unwrap() as usize)
        .map(|_| if extreme { fill } else { rng.byte() })
        .collect();
    for b in w.chunks_exact_mut(ty.type_size()) {
        if extreme && ty == GgmlType::Q6_K {
            // the signed scales at their largest magnitude, -128
            b[192..208].fill(0x80);
        }
        for &off in scale_offsets(ty) {
            b[off..off + 2].copy_from_slice(&rng.f16_scale());
        }
    }
    w
}

/// `tokens` activation rows of `n` elements through `quantize` (to `act`); with `extreme`,
/// every element negative and of equal magnitude, so that every quant is the most negative.
fn activations(
    (act, quantize): (GgmlType, QuantizeFn),
    tokens: usize,
    n: usize,
    extreme: bool,
    rng: &mut Rng,
) -> Vec<u8> {
    let arb = act.row_bytes(n as u64).unwrap() as usize;
    let mut a = vec![0u8; tokens * arb];
    for out in a.chunks_exact_mut(arb) {
        let x: Vec<f32> = (0..n)
            .map(|i| {
                if extreme {
                    -1.5
                } else {
                    rng.normal() * 10f32.powi((i / 32 % 7) as i32 - 3)
                }
            })
            .collect();
        quantize(&x, out);
    }
    a
}

/// The kernels of one path of one table.
struct Path {
    label: String,
    dot: DotFn,
    quantize: QuantizeFn,
    /// (rows, tokens, kernel) of the multi-row (tokens 1) and multi-token kernels.
    multi: Vec<(usize, usize, quant::kernels::DotTokensFn)>,
}

/// Every table's kernels of `ty` in `order` (and its grouped kernels, with `grouped`).
fn paths(ty: GgmlType, order: SumOrder, grouped: bool) -> Vec<Path> {
    let act = vec_dot_type(ty).expect("activation type");
    let mut out = Vec::new();
    for k in Kernels::simd_tables() {
        let name = k.name();
        if grouped {
            let Some(g) = k.grouped_in(order, ty) else {
                continue;
            };
            let mut multi = Vec::new();
            if let Some(r) = g.dot_rows {
                multi.push((r.rows, 1, r.f));
            }
            if let Some(t) = g.dot_tokens {
                multi.push((t.rows, t.tokens, t.f));
            }
            out.push(Path {
                label: format!("{ty} {order:?} grouped ({name})"),
                dot: g.dot,
                quantize: g.quantize,
                multi,
            });
        } else {
            let (Some(dot), Some(quantize)) = (k.dot_in(order, ty), k.quantize_in(order, act))
            else {
                continue;
            };
            let mut multi = Vec::new();
            if let Some(r) = k.dot_rows_in(order, ty) {
                multi.push((r.rows, 1, r.f));
            }
            if let Some(t) = k.dot_tokens_in(order, ty) {
                multi.push((t.rows, t.tokens, t.f));
            }
            out.push(Path {
                label: format!("{ty} {order:?} ({name})"),
                dot,
                quantize,
                multi,
            });
        }
    }
    out
}

/// The reference kernel of `ty` in `order` (see the module docs).
fn reference(ty: GgmlType, order: SumOrder, grouped: bool) -> DotFn {
    match (order, grouped) {
        (SumOrder::VecDot, _) => Kernels::narrow().dot(ty).expect("AVX2 kernel"),
        (_, true) => {
            Kernels::scalar()
                .grouped_in(order, ty)
                .expect("scalar grouped kernels")
                .dot
        }
        (_, false) => Kernels::scalar().dot_in(order, ty).expect("scalar kernel"),
    }
}

/// `rows` × `nb` blocks of `ty` against `tokens` activation rows through every table's kernels
/// of the path, each output against the reference.
fn check(
    ty: GgmlType,
    order: SumOrder,
    grouped: bool,
    (rows, tokens, nb): (usize, usize, usize),
    extreme: bool,
    seed: u64,
) {
    let reference = reference(ty, order, grouped);
    let n = nb * QK_K;
    let rb = ty.row_bytes(n as u64).unwrap() as usize;
    let act = vec_dot_type(ty).expect("activation type");
    let arb = act.row_bytes(n as u64).unwrap() as usize;
    for p in paths(ty, order, grouped) {
        let mut rng = Rng(seed);
        let w = weights(ty, rows, n, extreme, &mut rng);
        let a = activations((act, p.quantize), tokens, n, extreme, &mut rng);
        let want: Vec<f32> = a
            .chunks_exact(arb)
            .flat_map(|a| w.chunks_exact(rb).map(move |w| reference(n, w, a)))
            .collect();
        // the single-row kernel on every output
        for (t, a_row) in a.chunks_exact(arb).enumerate() {
            for (r, w_row) in w.chunks_exact(rb).enumerate() {
                let got = (p.dot)(n, w_row, a_row);
                assert_eq!(
                    got.to_bits(),
                    want[t * rows + r].to_bits(),
                    "{} n={n} dot row {r} token {t}: {got} vs {}",
                    p.label,
                    want[t * rows + r]
                );
            }
        }
        // each multi-row or multi-token kernel on its whole tiles of the matrix
        for &(kr, kt, f) in &p.multi {
            for t0 in (0..tokens - tokens % kt).step_by(kt) {
                let a_tile = &a[t0 * arb..(t0 + kt) * arb];
                for r0 in (0..rows - rows % kr).step_by(kr) {
                    let mut out = vec![f32::NAN; kr * kt];
                    f(n, &w[r0 * rb..(r0 + kr) * rb], a_tile, &mut out);
                    for t in 0..kt {
                        for r in 0..kr {
                            let (got, want) = (out[t * kr + r], want[(t0 + t) * rows + r0 + r]);
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{} n={n} tile {kr}x{kt} row {} token {}: {got} vs {want}",
                                p.label,
                                r0 + r,
                                t0 + t
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The paths under test: (type, order, grouped).
const PATHS: [(GgmlType, SumOrder, bool); 6] = [
    (GgmlType::Q4_K, SumOrder::Repacked, false),
    (GgmlType::Q4_K, SumOrder::Repacked, true),
    (GgmlType::Q4_K, SumOrder::VecDot, false),
    (GgmlType::Q5_K, SumOrder::VecDot, false),
    (GgmlType::Q6_K, SumOrder::VecDot, false),
    (GgmlType::Q8_0, SumOrder::VecDot, false),
];

fn avx2() -> bool {
    Kernels::detect().isa() == Isa::Avx2
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_table_gives_the_reference_bits(
        path in 0..PATHS.len(),
        rows in prop_oneof![Just(8usize), Just(16), 1usize..=27],
        tokens in prop_oneof![Just(1usize), 1usize..=9],
        nb in 1usize..=6,
        seed in any::<u64>(),
    ) {
        // (the reference of the vec_dot order is the AVX2 table: x86 only)
        if avx2() {
            let (ty, order, grouped) = PATHS[path];
            check(ty, order, grouped, (rows, tokens, nb), false, seed);
        }
    }
}

#[test]
fn extreme_blocks_give_the_reference_bits() {
    if !avx2() {
        return;
    }
    for (ty, order, grouped) in PATHS {
        for (rows, tokens, nb) in [(8, 1, 1), (16, 4, 3), (24, 9, 2)] {
            check(ty, order, grouped, (rows, tokens, nb), true, 7);
        }
    }
}

#[test]
fn the_detected_table_has_the_vnni_kernels_where_the_cpu_has_vnni() {
    let k = Kernels::detect();
    if !k.vnni() {
        return;
    }
    // the VNNI builds replace the kernels of the table without them
    let plain = Kernels::without_vnni();
    let r = SumOrder::Repacked;
    let rows = |k: &Kernels, o, ty| k.dot_rows_in(o, ty).map(|d| d.f as usize);
    for (o, ty) in [
        (r, GgmlType::Q4_K),
        (SumOrder::VecDot, GgmlType::Q6_K),
        (SumOrder::VecDot, GgmlType::Q8_0),
    ] {
        assert_ne!(rows(k, o, ty), rows(plain, o, ty), "{ty} {o:?}");
    }
    for ty in [GgmlType::Q5_K, GgmlType::Q6_K] {
        assert_ne!(
            k.dot(ty).map(|f| f as usize),
            plain.dot(ty).map(|f| f as usize),
            "{ty}"
        );
    }
}

#[test]
fn the_avx_vnni_table_has_the_vex_builds_where_the_cpu_has_avx_vnni() {
    let k = Kernels::with_avx_vnni();
    if !k.avx_vnni() {
        return;
    }
    // a table of its own among the tested ones, with neither the AVX-512 VNNI nor the wide
    // builds, whose kernels differ from the plain AVX2 table's where the VEX builds exist
    assert!(!k.vnni() && !k.wide(), "{}", k.name());
    assert!(
        Kernels::simd_tables().iter().any(|t| t.name() == k.name()),
        "{}",
        k.name()
    );
    let plain = Kernels::without_wide();
    assert_ne!(k.name(), plain.name());
    // (the VEX builds measured faster than AVX2's: repacked Q4_K and Q8_0's rows)
    let rows = |k: &Kernels, o, ty| k.dot_rows_in(o, ty).map(|d| d.f as usize);
    for (o, ty) in [
        (SumOrder::Repacked, GgmlType::Q4_K),
        (SumOrder::VecDot, GgmlType::Q8_0),
    ] {
        assert_ne!(rows(k, o, ty), rows(plain, o, ty), "{ty} {o:?}");
    }
    let tiles = |k: &Kernels| {
        k.dot_tokens_in(SumOrder::Repacked, GgmlType::Q4_K)
            .map(|d| d.f as usize)
    };
    assert_ne!(tiles(k), tiles(plain));
}
