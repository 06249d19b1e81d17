//! Multi-row k-quant kernels against the single-row kernel, one thread.
//!
//! For each weight type with a multi-row kernel in the detected table and each matrix
//! shape (rows × columns), computes the matrix times one Q8_K activation row twice: with
//! the single-row `dot` on every row, and with `dot_rows` on groups of rows (the rows left
//! over go through `dot`). Both must give the same bits. The matrices stay in cache across
//! repetitions (the core's L2 for the first two shapes, the shared L3 for the third). Each
//! measurement is repeated with the two variants alternating; the speedup of the medians
//! is reported, and that of the fastest runs (less sensitive to other work on the
//! machine).
//!
//! Run: `cargo run --release -p quant --example rows_bench_k [-- [--runs N] [--ms M] [--big]
//! [TYPE...]]` (`--big` adds a 151936 × 2048 matrix, read from memory on every pass).

use std::hint::black_box;
use std::time::{Duration, Instant};

use quant::{GgmlType, Kernels, QK_K};

const SHAPES: [(usize, usize); 3] = [(2048, 768), (768, 2048), (4096, 2048)];
/// With `--big`: a matrix far larger than the caches (an output layer).
const BIG: (usize, usize) = (151936, 2048);
const TYPES: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];
const Q8K_BYTES: usize = 292;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Offsets of the f16 `d` and (if any) `dmin` inside a block.
fn scale_offsets(ty: GgmlType) -> (usize, Option<usize>) {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => (0, Some(2)),
        GgmlType::Q6_K => (208, None),
        _ => unreachable!("not a type of this benchmark"),
    }
}

/// Random blocks with realistic scales (d ≈ 2e-3, dmin ≈ 1.5e-2).
fn weights(ty: GgmlType, rows: usize, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut w: Vec<u8> = (0..rows * n / QK_K * ty.type_size())
        .map(|_| rng.next() as u8)
        .collect();
    let (d_off, dmin_off) = scale_offsets(ty);
    for b in w.chunks_exact_mut(ty.type_size()) {
        let d = half::f16::from_f32(2e-3 * (1.0 + 0.1 * rng.unit()));
        b[d_off..d_off + 2].copy_from_slice(&d.to_le_bytes());
        if let Some(o) = dmin_off {
            let m = half::f16::from_f32(1.5e-2 * (1.0 + 0.1 * rng.unit()));
            b[o..o + 2].copy_from_slice(&m.to_le_bytes());
        }
    }
    w
}

fn per_row(f: quant::DotFn, n: usize, rb: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(w.chunks_exact(rb)) {
        *o = f(n, row, a);
    }
}

fn multi_row(
    f: quant::DotFn,
    g: quant::DotRows,
    n: usize,
    rb: usize,
    w: &[u8],
    a: &[u8],
    out: &mut [f32],
) {
    let split = out.len() / g.rows * g.rows;
    let (groups, rest) = out.split_at_mut(split);
    let (wg, wr) = w.split_at(groups.len() * rb);
    for (o, rows) in groups
        .chunks_exact_mut(g.rows)
        .zip(wg.chunks_exact(g.rows * rb))
    {
        (g.f)(n, rows, a, o);
    }
    per_row(f, n, rb, wr, a, rest);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn reps_for(ms: f64, mut f: impl FnMut()) -> usize {
    let t = Instant::now();
    let mut k = 0;
    while t.elapsed() < Duration::from_secs_f64(ms / 1e3 / 4.0) {
        f();
        k += 1;
    }
    (k * 4).max(1)
}

fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    t.elapsed().as_secs_f64() / reps as f64
}

fn main() {
    let mut runs = 9usize;
    let mut ms = 40.0f64;
    let mut only: Vec<String> = Vec::new();
    let mut big = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).unwrap_or(runs),
            "--ms" => ms = args.next().and_then(|v| v.parse().ok()).unwrap_or(ms),
            "--big" => big = true,
            t => only.push(t.to_ascii_uppercase()),
        }
    }

    let k = Kernels::detect();
    let quantize = k.quantize(GgmlType::Q8_K).expect("Q8_K quantizer");
    println!(
        "isa {}, {runs} runs of ~{ms} ms per variant, medians",
        k.isa().name()
    );
    println!(
        "{:<6} {:>11} {:>5} {:>12} {:>12} {:>8} {:>9}",
        "type", "rows x cols", "R", "per-row us", "multi us", "speedup", "(best)"
    );
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for ty in TYPES {
        if !only.is_empty() && !only.iter().any(|t| t.eq_ignore_ascii_case(&ty.to_string())) {
            continue;
        }
        let (Some(dot), Some(rows_k)) = (k.dot(ty), k.dot_rows(ty)) else {
            println!(
                "{ty:<6} no multi-row kernel in the {} table",
                k.isa().name()
            );
            continue;
        };
        let shapes = SHAPES.iter().chain(big.then_some(&BIG));
        for &(rows, n) in shapes {
            let rb = n / QK_K * ty.type_size();
            let w = weights(ty, rows, n, &mut rng);
            let x: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
            let mut a = vec![0u8; n / QK_K * Q8K_BYTES];
            quantize(&x, &mut a);
            let mut o1 = vec![0f32; rows];
            let mut o2 = vec![0f32; rows];
            per_row(dot, n, rb, &w, &a, &mut o1);
            multi_row(dot, rows_k, n, rb, &w, &a, &mut o2);
            assert!(
                o1.iter().zip(&o2).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{ty} {rows}x{n}: multi-row results differ from the single-row kernel"
            );

            let mut single = || per_row(dot, n, rb, black_box(&w), black_box(&a), &mut o1);
            let reps = reps_for(ms, &mut single);
            let mut t1 = Vec::new();
            let mut t2 = Vec::new();
            for _ in 0..runs {
                t1.push(time(reps, || {
                    per_row(dot, n, rb, black_box(&w), black_box(&a), &mut o1)
                }));
                t2.push(time(reps, || {
                    multi_row(dot, rows_k, n, rb, black_box(&w), black_box(&a), &mut o2)
                }));
            }
            black_box((&o1, &o2));
            let (b1, b2) = (best(&t1), best(&t2));
            let (m1, m2) = (median(t1), median(t2));
            println!(
                "{:<6} {:>11} {:>5} {:>12.1} {:>12.1} {:>8.3} {:>9.3}",
                ty.to_string(),
                format!("{rows}x{n}"),
                rows_k.rows,
                m1 * 1e6,
                m2 * 1e6,
                m1 / m2,
                b1 / b2
            );
        }
    }
}
