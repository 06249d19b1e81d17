//! Times a matvec (rows × cols weights times one activation row) done with the single-row
//! dot kernel per row against the multi-row kernel of the best kernel table, with the
//! weights hot in cache (the same matrix is multiplied over and over). Single thread.
//!
//! `cargo run --release -p quant --example rows_bench -- [TYPE ...] [--reps N] [--ms M]`
//! (types by ggml name, default Q8_0 Q4_0 IQ4_NL MXFP4 F16). Takes `--reps` alternating
//! samples (default 9) of roughly `--ms` milliseconds each (default 60) and prints the
//! median time per matvec, weight bytes per second, and the median of the per-sample
//! speedups.

use std::hint::black_box;
use std::time::Instant;

use quant::{GgmlType, Kernels, vec_dot_type};

const SHAPES: [(usize, usize); 2] = [(2048, 768), (4096, 2048)];

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn normal(&mut self) -> f32 {
        let u = ((self.next() >> 11) as f64 / (1u64 << 53) as f64).max(1e-300);
        let v = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

/// A weight row of `n` elements: the quantized form of random normals when a quantizer
/// for the type exists, else random bytes with the f16 scale (or E8M0) set to a sane value.
fn weights(ty: GgmlType, rows: usize, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut w = Vec::new();
    for _ in 0..rows {
        let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        match quant::quantize_to_vec(ty, &x) {
            Ok(b) => w.extend_from_slice(&b),
            Err(_) => {
                for _ in 0..n / ty.block_size() {
                    let start = w.len();
                    w.extend((0..ty.type_size()).map(|_| rng.next() as u8));
                    if ty == GgmlType::MXFP4 {
                        w[start] = 120 + (rng.next() % 8) as u8;
                    } else {
                        let d = half::f16::from_f32(0.01 + (rng.next() % 100) as f32 * 1e-4);
                        w[start..start + 2].copy_from_slice(&d.to_le_bytes());
                    }
                }
            }
        }
    }
    w
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut types = Vec::new();
    let mut reps = 9usize;
    let mut ms = 60f64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).expect("--reps N"),
            "--ms" => ms = args.next().and_then(|v| v.parse().ok()).expect("--ms M"),
            name => types.push(
                *GgmlType::ALL
                    .iter()
                    .find(|t| t.name().eq_ignore_ascii_case(name))
                    .unwrap_or_else(|| panic!("unknown type {name}")),
            ),
        }
    }
    if types.is_empty() {
        use GgmlType::*;
        types = vec![Q8_0, Q4_0, IQ4_NL, MXFP4, F16];
    }
    let k = Kernels::detect();
    println!("kernel table: {}", k.isa().name());
    println!(
        "{:<7} {:>11} {:>5} {:>11} {:>11} {:>9} {:>9} {:>7}",
        "type", "shape", "rows", "single µs", "multi µs", "single", "multi", "speedup"
    );
    let mut rng = Rng(0x5eed);
    for ty in types {
        let dot = k.dot(ty).expect("dot kernel");
        let Some(dr) = k.dot_rows(ty) else {
            println!("{ty:<7} no multi-row kernel");
            continue;
        };
        let act = vec_dot_type(ty).expect("activation type");
        let quantize = k.quantize(act).expect("quantizer");
        for (rows, n) in SHAPES {
            let w = weights(ty, rows, n, &mut rng);
            let rb = ty.row_bytes(n as u64).expect("row length") as usize;
            let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            let mut a = vec![0u8; act.row_bytes(n as u64).expect("row length") as usize];
            quantize(&x, &mut a);
            let mut out = vec![0f32; rows];

            let single = |out: &mut [f32]| {
                for (o, row) in out.iter_mut().zip(w.chunks_exact(rb)) {
                    *o = dot(n, black_box(row), black_box(&a));
                }
            };
            // Whole calls of the multi-row kernel, the rows left over one by one.
            let whole = rows / dr.rows * dr.rows;
            let multi = |out: &mut [f32]| {
                let (head, tail) = out.split_at_mut(whole);
                for (o, wc) in head
                    .chunks_exact_mut(dr.rows)
                    .zip(w.chunks_exact(rb * dr.rows))
                {
                    (dr.f)(n, black_box(wc), black_box(&a), o);
                }
                for (o, row) in tail.iter_mut().zip(w[whole * rb..].chunks_exact(rb)) {
                    *o = dot(n, black_box(row), black_box(&a));
                }
            };
            // Same results (also warms the caches).
            let mut check = vec![0f32; rows];
            single(&mut out);
            multi(&mut check);
            assert!(
                out.iter()
                    .zip(&check)
                    .all(|(p, q)| p.to_bits() == q.to_bits()),
                "{ty}: multi-row results differ"
            );
            // Calls per sample.
            let t = Instant::now();
            single(&mut out);
            let once = t.elapsed().as_secs_f64();
            let iters = ((ms * 1e-3 / once) as usize).max(1);
            let (mut ts, mut tm) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                let t = Instant::now();
                for _ in 0..iters {
                    single(&mut out);
                }
                ts.push(t.elapsed().as_secs_f64() / iters as f64);
                let t = Instant::now();
                for _ in 0..iters {
                    multi(&mut out);
                }
                tm.push(t.elapsed().as_secs_f64() / iters as f64);
                black_box(&out);
            }
            // Speedup: median of the ratios of adjacent samples (robust to load drifting
            // over the run on a shared machine).
            let ratio = median(ts.iter().zip(&tm).map(|(s, m)| s / m).collect());
            let (s, m) = (median(ts), median(tm));
            let bytes = w.len() as f64;
            println!(
                "{:<7} {:>11} {:>5} {:>11.1} {:>11.1} {:>6.2}GB/s {:>6.2}GB/s {:>6.2}x",
                ty.name(),
                format!("{rows}x{n}"),
                dr.rows,
                s * 1e6,
                m * 1e6,
                bytes / s * 1e-9,
                bytes / m * 1e-9,
                ratio
            );
        }
    }
}
