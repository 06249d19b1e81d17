//! Multi-token kernels (`Kernels::dot_tokens_in`) against the single-row kernel of the same
//! order, and `matmul_with` (which tiles a product with them) against one `dot` per output.
//!
//! The contract is bit-exactness per output: `out[t * R + r]` has the bits of `dot` on weight
//! row `r` and activation row `t`, so no tolerance is involved. Weight rows are random bytes
//! with finite f16 block scales (every bit pattern of the other fields is a valid block), or
//! rows from the reference weight quantizer; activation rows come from the table's own
//! activation quantizer on random floats of mixed magnitudes.

mod common;

use common::Rng;
use proptest::prelude::*;
use quant::kernels::{DotTokens, DotTokensFn};
use quant::{
    DotFn, DotRows, GgmlType, Isa, Kernels, QuantizeFn, RowKernel, SumOrder, ThreadPool,
    matmul_with, quantize_row, vec_dot_type,
};

/// Weight types and orders that may have a multi-token kernel.
const CASES: [(GgmlType, SumOrder); 19] = [
    (GgmlType::Q8_0, SumOrder::VecDot),
    (GgmlType::Q4_K, SumOrder::VecDot),
    (GgmlType::Q5_K, SumOrder::VecDot),
    (GgmlType::Q6_K, SumOrder::VecDot),
    (GgmlType::F32, SumOrder::TinyBlas),
    (GgmlType::F16, SumOrder::TinyBlas),
    (GgmlType::BF16, SumOrder::TinyBlas),
    (GgmlType::Q4_0, SumOrder::Repacked),
    (GgmlType::Q8_0, SumOrder::Repacked),
    (GgmlType::IQ4_NL, SumOrder::Repacked),
    (GgmlType::MXFP4, SumOrder::Repacked),
    (GgmlType::Q4_K, SumOrder::Repacked),
    (GgmlType::Q5_K, SumOrder::Repacked),
    (GgmlType::Q6_K, SumOrder::Repacked),
    (GgmlType::Q2_K, SumOrder::VecDot),
    (GgmlType::Q3_K, SumOrder::VecDot),
    (GgmlType::IQ4_XS, SumOrder::VecDot),
    (GgmlType::IQ4_NL, SumOrder::VecDot),
    (GgmlType::MXFP4, SumOrder::VecDot),
];

/// Byte offsets of the f16 scales inside a block of `ty` (empty for the float types).
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        _ => &[],
    }
}

/// `rows` random weight rows of `n` elements: random bytes with finite f16 scales; float
/// types get finite random values.
fn random_weights(ty: GgmlType, rows: usize, n: usize, rng: &mut Rng) -> Vec<u8> {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            let x: Vec<f32> = (0..rows * n).map(|_| rng.normal()).collect();
            let mut w = vec![0u8; rows * ty.row_bytes(n as u64).unwrap() as usize];
            quantize_row(ty, &x, &mut w).expect("float conversion");
            w
        }
        _ => {
            let mut w: Vec<u8> = (0..rows * ty.row_bytes(n as u64).unwrap() as usize)
                .map(|_| rng.byte())
                .collect();
            for b in w.chunks_exact_mut(ty.type_size()) {
                for &off in scale_offsets(ty) {
                    b[off..off + 2].copy_from_slice(&rng.f16_scale());
                }
                if ty == GgmlType::MXFP4 {
                    // a finite E8M0 scale, 2^-27 ..= 2^27
                    b[0] = 100 + rng.below(55) as u8;
                }
            }
            w
        }
    }
}

/// `rows` rows from the reference weight quantizer.
fn quantized_weights(ty: GgmlType, rows: usize, n: usize, rng: &mut Rng) -> Vec<u8> {
    let x = floats(rows * n, rng);
    let rb = ty.row_bytes(n as u64).unwrap() as usize;
    let mut w = vec![0u8; rows * rb];
    for (x, out) in x.chunks_exact(n).zip(w.chunks_exact_mut(rb)) {
        quantize_row(ty, x, out).expect("weight quantizer");
    }
    w
}

/// Random floats: a normal sample times 10^e per 32 elements (e in -3..=3), some runs zero.
fn floats(len: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x: Vec<f32> = (0..len).map(|_| rng.normal()).collect();
    for run in x.chunks_mut(32) {
        match rng.below(10) {
            0 => run.fill(0.0),
            k => {
                let s = 10f32.powi(k as i32 % 7 - 3);
                run.iter_mut().for_each(|v| *v *= s);
            }
        }
    }
    x
}

/// `tokens` activation rows of `n` elements quantized with `quantize` to `ty`'s activation
/// type.
fn activations(
    ty: GgmlType,
    quantize: QuantizeFn,
    tokens: usize,
    n: usize,
    rng: &mut Rng,
) -> Vec<u8> {
    let act = vec_dot_type(ty).expect("activation type");
    let arb = act.row_bytes(n as u64).unwrap() as usize;
    let x = floats(tokens * n, rng);
    let mut a = vec![0u8; tokens * arb];
    for (x, out) in x.chunks_exact(n).zip(a.chunks_exact_mut(arb)) {
        quantize(x, out);
    }
    a
}

/// Row length for block count `nb`: whole blocks of `ty`; float types: `nb` groups of 8
/// elements and `tail` more (the tinyBLAS-order kernels accept any length).
fn row_len(ty: GgmlType, nb: usize, tail: usize) -> usize {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 8 * nb + tail,
        _ => ty.block_size() * nb,
    }
}

fn tile_kernel(ty: GgmlType, order: SumOrder) -> Option<DotTokens> {
    Kernels::detect().dot_tokens_in(order, ty)
}

/// The kernels of one order of `ty` under test: the single-row kernel and the quantizer of
/// its activations, with the multi-row and multi-token kernels that must give its bits.
struct Under {
    label: String,
    dot: DotFn,
    quantize: QuantizeFn,
    dot_rows: Option<DotRows>,
    dot_tokens: Option<DotTokens>,
}

/// The detected table's kernels of `ty` in `order` and, where that order multiplies whole
/// groups of activation rows in another order, those grouped kernels.
fn kernels_under(ty: GgmlType, order: SumOrder) -> Vec<Under> {
    let mut out = Vec::new();
    let act = vec_dot_type(ty).expect("activation type");
    for k in tables() {
        let name = k.name();
        if let (Some(dot), Some(quantize)) = (k.dot_in(order, ty), k.quantize_in(order, act)) {
            out.push(Under {
                label: format!("{ty} {order:?} ({name})"),
                dot,
                quantize,
                dot_rows: k.dot_rows_in(order, ty),
                dot_tokens: k.dot_tokens_in(order, ty),
            });
        }
        if let Some(g) = k.grouped_in(order, ty) {
            out.push(Under {
                label: format!("{ty} {order:?} grouped ({name})"),
                dot: g.dot,
                quantize: g.quantize,
                dot_rows: g.dot_rows,
                dot_tokens: g.dot_tokens,
            });
        }
    }
    out
}

/// The detected table and, on a CPU where it has wide builds or BMI2 kernels, the tables
/// without them too.
fn tables() -> Vec<&'static Kernels> {
    Kernels::simd_tables()
}

/// One call of a tile of `rows` × `tokens` (`f`) against `dot` on every (row, token).
#[allow(clippy::too_many_arguments)]
fn check_tile_fn(
    ty: GgmlType,
    u: &Under,
    (rows, tokens): (usize, usize),
    f: DotTokensFn,
    (nb, tail): (usize, usize),
    quantized: bool,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let n = row_len(ty, nb, tail);
    let w = if quantized && quant::can_quantize(ty) {
        quantized_weights(ty, rows, n, &mut rng)
    } else {
        random_weights(ty, rows, n, &mut rng)
    };
    let a = activations(ty, u.quantize, tokens, n, &mut rng);
    let mut out = vec![f32::NAN; rows * tokens];
    f(n, &w, &a, &mut out);
    let rb = w.len() / rows;
    let arb = a.len() / tokens;
    for (t, a_row) in a.chunks_exact(arb).enumerate() {
        for (r, w_row) in w.chunks_exact(rb).enumerate() {
            let (got, want) = (out[t * rows + r], (u.dot)(n, w_row, a_row));
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{} n={n} tile {rows}x{tokens} row {r} token {t}: tile {got}, dot {want}",
                u.label
            );
        }
    }
}

/// The multi-token and multi-row kernels of `ty` in `order` (and of its grouped kernels)
/// against their single-row kernel.
fn check_tile(
    ty: GgmlType,
    order: SumOrder,
    (nb, tail): (usize, usize),
    quantized: bool,
    seed: u64,
) {
    for u in kernels_under(ty, order) {
        if let Some(k) = u.dot_tokens {
            check_tile_fn(ty, &u, (k.rows, k.tokens), k.f, (nb, tail), quantized, seed);
        }
        if let Some(k) = u.dot_rows {
            check_tile_fn(ty, &u, (k.rows, 1), k.f, (nb, tail), quantized, seed);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn tiles_equal_single_row_bits(
        case in 0..CASES.len(),
        nb in prop_oneof![1usize..=3, 4usize..=9],
        tail in prop_oneof![Just(0usize), 1usize..8],
        quantized in prop::bool::weighted(0.3),
        seed in any::<u64>(),
    ) {
        let (ty, order) = CASES[case];
        check_tile(ty, order, (nb, tail), quantized, seed);
    }
}

/// `matmul_with` with the detected kernels against one `dot` per output, for shapes that
/// leave rows and tokens outside whole tiles, on one and two threads.
fn check_matmul(
    ty: GgmlType,
    order: SumOrder,
    (rows, n_tok): (usize, usize),
    (nb, tail): (usize, usize),
    seed: u64,
) {
    let kernels = Kernels::detect();
    let kernel = RowKernel::lookup_in(kernels, ty, order).expect("kernels");
    let mut rng = Rng(seed);
    let cols = row_len(ty, nb, tail);
    let w = random_weights(ty, rows, cols, &mut rng);
    let x = floats(n_tok * cols, &mut rng);
    let rb = w.len() / rows;
    let act = kernel.act_type;
    let arb = act.row_bytes(cols as u64).unwrap() as usize;
    // the first n_tok - n_tok % group activation rows in the grouped order, if any
    let n_grouped = kernel.grouped.map_or(0, |g| n_tok - n_tok % g.group);
    let mut want = vec![0f32; n_tok * rows];
    let mut aq = vec![0u8; arb];
    for (t, xr) in x.chunks_exact(cols).enumerate() {
        let (quantize, dot) = match kernel.grouped {
            Some(g) if t < n_grouped => (g.quantize, g.dot),
            _ => (kernel.quantize, kernel.dot),
        };
        quantize(xr, &mut aq);
        for (r, w_row) in w.chunks_exact(rb).enumerate() {
            want[t * rows + r] = dot(cols, w_row, &aq);
        }
    }
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads).unwrap();
        let mut out = vec![f32::NAN; n_tok * rows];
        let mut scratch = Vec::new();
        matmul_with(
            &pool,
            &kernel,
            &w,
            rows,
            cols,
            &x,
            n_tok,
            &mut out,
            &mut scratch,
        )
        .unwrap();
        for (i, (g, w)) in out.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{ty} {order:?} rows={rows} n_tok={n_tok} threads={threads}: row {} token {}",
                i % rows,
                i / rows
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn matmul_equals_one_dot_per_output(
        case in 0..CASES.len(),
        rows in prop_oneof![1usize..=20, 60usize..=140],
        n_tok in 1usize..=11,
        nb in 1usize..=3,
        tail in prop_oneof![Just(0usize), 1usize..8],
        seed in any::<u64>(),
    ) {
        let (ty, order) = CASES[case];
        check_matmul(ty, order, (rows, n_tok), (nb, tail), seed);
    }
}

#[test]
fn simd_tables_have_multi_token_kernels() {
    for (ty, order) in CASES {
        assert!(
            Kernels::scalar().dot_tokens_in(order, ty).is_none(),
            "{ty}: the scalar table has no multi-token kernels"
        );
    }
    if Kernels::detect().isa() == Isa::Neon {
        // the NEON table: F32 and F16 in its tinyBLAS order, Q8_0, the k-quants and IQ4_XS in their vec_dot
        // order, and every type llama.cpp's ARM build repacks in its repacked order (with
        // multi-row kernels there too, also for the grouped rows of Q8_0 and Q6_K)
        let mut cases = vec![
            (GgmlType::F32, SumOrder::TinyBlas),
            (GgmlType::F16, SumOrder::TinyBlas),
        ];
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::IQ4_XS,
        ] {
            cases.push((ty, SumOrder::VecDot));
        }
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::IQ4_NL,
            GgmlType::MXFP4,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            cases.push((ty, SumOrder::Repacked));
            for u in kernels_under(ty, SumOrder::Repacked) {
                assert!(u.dot_rows.is_some(), "{}: no multi-row kernel", u.label);
                assert!(u.dot_tokens.is_some(), "{}: no multi-token kernel", u.label);
            }
        }
        for (ty, order) in cases {
            let k = tile_kernel(ty, order).unwrap_or_else(|| {
                panic!("{ty} {order:?}: no multi-token kernel in the NEON table")
            });
            assert!(
                k.rows > 0 && k.tokens > 1,
                "{ty}: tile {}x{}",
                k.rows,
                k.tokens
            );
        }
        return;
    }
    if Kernels::detect().isa() != Isa::Avx2 {
        eprintln!("note: no AVX2 on this CPU; the multi-token kernels are not tested");
        return;
    }
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::IQ4_XS,
        GgmlType::IQ4_NL,
        GgmlType::MXFP4,
    ] {
        let k = tile_kernel(ty, SumOrder::VecDot)
            .unwrap_or_else(|| panic!("{ty}: no multi-token kernel in the AVX2 table"));
        assert!(
            k.rows > 0 && k.tokens > 1,
            "{ty}: tile {}x{}",
            k.rows,
            k.tokens
        );
    }
}

/// Every tile on a few fixed seeds and sizes, so each registered kernel is exercised on
/// every run whatever proptest draws.
#[test]
fn every_registered_tile_on_fixed_cases() {
    for (ty, order) in CASES {
        for nb in [1, 2, 5] {
            for quantized in [false, true] {
                check_tile(ty, order, (nb, nb % 3), quantized, 0x5eed ^ nb as u64);
            }
        }
        check_matmul(ty, order, (37, 7), (2, 0), 0xfeed);
        check_matmul(ty, order, (13, 9), (3, 5), 0xbeef);
    }
}
