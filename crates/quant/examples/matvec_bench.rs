//! Matrix × vector throughput of the quant crate's threaded matvec (a benchmark, not a test).
//!
//! ```text
//! cargo run --release -p quant --example matvec_bench -- \
//!     --types q4_K,q6_K,q8_0,mxfp4,f16 --shapes 2048x768,768x2048 --threads 1,2
//! ```
//!
//! For every type × shape (rows x cols) × thread count it fills a weight matrix with random
//! valid blocks, times `matvec` (activation quantization included) until both `--min-time`
//! seconds and `--min-iters` iterations have passed, and prints one tab-separated line:
//! `engine isa mode type rows cols threads iters median_us GB/s`, where GB/s is weight bytes
//! (`rows * row_bytes`) per second at the median time. bench/llamacpp/mul_mat_bench.c prints
//! the same columns for llama.cpp.
//!
//! `--modes hot,cold`: hot runs reuse one weight matrix, which stays in cache if it fits (like
//! llama.cpp's test-backend-ops); cold runs rotate over copies totalling `--cold-mib` MiB
//! (default 1024, above the last-level cache), one per iteration, so the weights come from
//! DRAM as in real decoding, where each matrix is used once per token. Mode column `plain` or
//! `plain-cold`. `--prefetch on,off` measures with and without the software prefetch of
//! upcoming weight rows (the isa column gets `-nopf` without it). `--multi-row on,off`
//! measures with and without the table's multi-row kernels (`RowKernel::dot_rows`; the isa
//! column gets `-1row` without them, the single-row kernel then computes every row).
//!
//! `--order vecdot|repacked|tinyblas|iqpanel` takes the kernels of that summation order
//! (`quant::SumOrder`; default vecdot; a type without kernels of the order keeps vec_dot's), and
//! the isa column gets `-repacked`, `-tinyblas` or `-iqpanel`.
//!
//! `--tokens N` (default 1) times `matmul_with` on N activation rows instead (prompt
//! processing; the mode column gets `-tN`); `--tiles on,off` measures it with and without the
//! multi-token kernels (`RowKernel::dot_tokens`, `dot_panel` and the grouped rows' ones; the
//! isa column gets `-notiles` without them); `--expert` multiplies as an expert stack is (no
//! grouped rows: with `--order repacked` every row in the gemv order, as llama.cpp's
//! `MUL_MAT_ID` does).
//!
//! `--scalar` uses the portable kernels instead of the best ones for this CPU. `--iters N`
//! runs exactly N timed iterations (for instruction counting under callgrind).
//! `--pool-overhead` instead times an empty `ThreadPool::run` (one no-op task per thread),
//! back to back and with a pause between runs long enough for the workers to park, and a run
//! of 16 tasks of 4 µs each.

use std::process::ExitCode;
use std::time::Instant;

use quant::synth::{Rng, random_weights};
use quant::{GgmlType, Kernels, RowKernel, SumOrder, ThreadPool, matmul_with, matvec_with};

struct Args {
    types: Vec<GgmlType>,
    shapes: Vec<(usize, usize)>,
    threads: Vec<usize>,
    min_time: f64,
    min_iters: usize,
    exact_iters: Option<usize>,
    /// Cold runs rotate over copies of the weights totalling at least this many bytes.
    cold_bytes: usize,
    /// Hot (false) and/or cold (true) runs.
    modes: Vec<bool>,
    /// Software prefetch settings to measure.
    prefetch: Vec<bool>,
    /// With (true) and/or without (false) the multi-row kernels.
    multi_row: Vec<bool>,
    scalar: bool,
    pool_overhead: bool,
    order: SumOrder,
    /// Activation rows per product (1: `matvec_with`, more: `matmul_with`).
    tokens: usize,
    /// With (true) and/or without (false) the multi-token kernels.
    tiles: Vec<bool>,
    /// Multiply as an expert stack (no grouped rows).
    expert: bool,
}

const DEFAULT_SHAPES: &str = "2048x768,768x2048,2048x4096,4096x2048,151936x2048";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        types: Vec::new(),
        shapes: Vec::new(),
        threads: vec![1, 2],
        min_time: 0.5,
        min_iters: 10,
        exact_iters: None,
        cold_bytes: 1 << 30,
        modes: vec![false],
        prefetch: vec![true],
        multi_row: vec![true],
        scalar: false,
        pool_overhead: false,
        order: SumOrder::VecDot,
        tokens: 1,
        tiles: vec![true],
        expert: false,
    };
    let mut types = "q4_K,q6_K,q8_0,mxfp4,f16".to_owned();
    let mut shapes = DEFAULT_SHAPES.to_owned();
    let mut it = std::env::args().skip(1);
    while let Some(opt) = it.next() {
        if opt == "--scalar" {
            a.scalar = true;
            continue;
        }
        if opt == "--pool-overhead" {
            a.pool_overhead = true;
            continue;
        }
        if opt == "--expert" {
            a.expert = true;
            continue;
        }
        let v = it.next().ok_or(format!("missing value after {opt}"))?;
        let num = |v: &str| v.parse::<f64>().map_err(|e| format!("{opt} {v}: {e}"));
        match opt.as_str() {
            "--types" => types = v,
            "--shapes" => shapes = v,
            "--threads" => {
                a.threads = v
                    .split(',')
                    .map(|t| t.parse().map_err(|e| format!("--threads {t}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--min-time" => a.min_time = num(&v)?,
            "--min-iters" => a.min_iters = num(&v)? as usize,
            "--iters" => a.exact_iters = Some(num(&v)? as usize),
            "--cold-mib" => a.cold_bytes = (num(&v)? as usize) << 20,
            "--modes" => {
                a.modes = v
                    .split(',')
                    .map(|m| match m {
                        "hot" => Ok(false),
                        "cold" => Ok(true),
                        _ => Err(format!("--modes {m}: expected hot or cold")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--prefetch" => a.prefetch = on_off(&opt, &v)?,
            "--multi-row" => a.multi_row = on_off(&opt, &v)?,
            "--tiles" => a.tiles = on_off(&opt, &v)?,
            "--tokens" => {
                a.tokens = v
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n > 0)
                    .ok_or(format!("--tokens {v}: expected a positive count"))?
            }
            "--order" => {
                a.order = match v.as_str() {
                    "vecdot" => SumOrder::VecDot,
                    "repacked" => SumOrder::Repacked,
                    "tinyblas" => SumOrder::TinyBlas,
                    "iqpanel" => SumOrder::IqPanel,
                    _ => {
                        return Err(format!(
                            "--order {v}: expected vecdot, repacked, tinyblas or iqpanel"
                        ));
                    }
                }
            }
            _ => return Err(format!("unknown option {opt}")),
        }
    }
    for name in types.split(',') {
        let t = GgmlType::ALL
            .iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
            .ok_or(format!("unknown type {name}"))?;
        a.types.push(*t);
    }
    for s in shapes.split(',') {
        let (r, c) = s
            .split_once('x')
            .ok_or(format!("shape {s} is not ROWSxCOLS"))?;
        let p = |v: &str| v.parse::<usize>().map_err(|e| format!("shape {s}: {e}"));
        a.shapes.push((p(r)?, p(c)?));
    }
    Ok(a)
}

/// A comma-separated list of `on` / `off`.
fn on_off(opt: &str, v: &str) -> Result<Vec<bool>, String> {
    v.split(',')
        .map(|m| match m {
            "on" => Ok(true),
            "off" => Ok(false),
            _ => Err(format!("{opt} {m}: expected on or off")),
        })
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Median latency of an empty run: hot (back to back) and cold (workers parked).
fn pool_overhead(a: &Args) -> Result<(), String> {
    for &n in &a.threads {
        let pool = ThreadPool::new(n).map_err(|e| e.to_string())?;
        let noop = |_: usize| std::hint::black_box(());
        for (label, pause_us, iters) in [("hot", 0u64, 20_000), ("parked", 2_000, 300)] {
            let mut times = Vec::with_capacity(iters);
            for _ in 0..iters {
                if pause_us > 0 {
                    std::thread::sleep(std::time::Duration::from_micros(pause_us));
                }
                let t0 = Instant::now();
                pool.run(n, noop);
                times.push(t0.elapsed().as_secs_f64());
            }
            println!(
                "pool\t{n} threads\t{label}\tmedian {:.2} us",
                median(&mut times) * 1e6
            );
        }
        // 16 tasks of 4 us of spinning each: 64 us of work per run.
        let busy = |_: usize| {
            let t0 = Instant::now();
            while t0.elapsed().as_nanos() < 4000 {
                std::hint::spin_loop();
            }
        };
        let mut times = Vec::with_capacity(5000);
        for _ in 0..5000 {
            let t0 = Instant::now();
            pool.run(16, busy);
            times.push(t0.elapsed().as_secs_f64());
        }
        println!(
            "pool\t{n} threads\t16 x 4 us\tmedian {:.2} us",
            median(&mut times) * 1e6
        );
    }
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    if a.pool_overhead {
        return pool_overhead(a);
    }
    let kernels = if a.scalar {
        Kernels::scalar()
    } else {
        Kernels::detect()
    };
    let pools = a
        .threads
        .iter()
        .map(|&n| ThreadPool::new(n).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    let mut scratch = Vec::new();
    for &t in &a.types {
        let mut base = RowKernel::lookup_in(kernels, t, a.order).map_err(|e| e.to_string())?;
        if a.expert {
            base.grouped = None;
        }
        let order = match base.order {
            SumOrder::VecDot => "",
            SumOrder::Repacked => "-repacked",
            SumOrder::TinyBlas => "-tinyblas",
            SumOrder::IqPanel => "-iqpanel",
        };
        for &(rows, cols) in &a.shapes {
            let w0 = random_weights(t, rows, cols, &mut rng)
                .ok_or(format!("cannot fill {t} weights of {cols} columns"))?;
            let w_bytes = w0.len();
            let n_tok = a.tokens;
            let x: Vec<f32> = (0..cols * n_tok).map(|_| rng.f32()).collect();
            let mut out = vec![0.0f32; rows * n_tok];
            let mut copies = vec![w0];
            for &cold in &a.modes {
                // Cold: enough copies to total `cold_bytes`, a different one each iteration.
                let n_copies = if cold {
                    a.cold_bytes.div_ceil(w_bytes.max(1)).max(2)
                } else {
                    1
                };
                copies.truncate(n_copies);
                while copies.len() < n_copies {
                    copies.push(copies[0].clone());
                }
                let settings = a.multi_row.iter().flat_map(|&m| {
                    a.prefetch
                        .iter()
                        .flat_map(move |&p| a.tiles.iter().map(move |&tl| (m, p, tl)))
                });
                for (multi, prefetch, tiles) in settings {
                    let kernel = RowKernel {
                        prefetch,
                        dot_rows: if multi { base.dot_rows } else { None },
                        dot_tokens: if tiles { base.dot_tokens } else { None },
                        dot_panel: if tiles { base.dot_panel } else { None },
                        grouped: base.grouped.map(|g| quant::kernels::GroupedDot {
                            dot_tokens: if tiles { g.dot_tokens } else { None },
                            ..g
                        }),
                        ..base
                    };
                    for pool in &pools {
                        let mut next_copy = 0usize;
                        let mut once = || {
                            let w = &copies[next_copy];
                            next_copy = (next_copy + 1) % copies.len();
                            let r = if n_tok == 1 {
                                matvec_with(
                                    pool,
                                    &kernel,
                                    w,
                                    rows,
                                    cols,
                                    &x,
                                    &mut out,
                                    &mut scratch,
                                )
                            } else {
                                matmul_with(
                                    pool,
                                    &kernel,
                                    w,
                                    rows,
                                    cols,
                                    &x,
                                    n_tok,
                                    &mut out,
                                    &mut scratch,
                                )
                            };
                            r.map_err(|e| format!("{t} {rows}x{cols}: {e}"))
                        };
                        let Some((iters, med)) = time(a, &mut once)? else {
                            continue;
                        };
                        println!(
                            "sluice\t{}{order}{}{}{}\t{}{}\t{}\t{rows}\t{cols}\t{}\t{iters}\t{:.2}\t{:.2}",
                            kernels.name(),
                            if multi { "" } else { "-1row" },
                            if prefetch { "" } else { "-nopf" },
                            if tiles { "" } else { "-notiles" },
                            if cold { "plain-cold" } else { "plain" },
                            if n_tok > 1 {
                                format!("-t{n_tok}")
                            } else {
                                String::new()
                            },
                            t.name(),
                            pool.n_threads(),
                            med * 1e6,
                            w_bytes as f64 / med * 1e-9
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// Time `once` (after 3 warm-up calls unless `--iters`): iterations and median seconds.
fn time(
    a: &Args,
    once: &mut dyn FnMut() -> Result<(), String>,
) -> Result<Option<(usize, f64)>, String> {
    if a.exact_iters.is_none() {
        for _ in 0..3 {
            once()?;
        }
    }
    let mut times = Vec::new();
    let start = Instant::now();
    loop {
        let done = match a.exact_iters {
            Some(n) => times.len() >= n,
            None => {
                (start.elapsed().as_secs_f64() >= a.min_time && times.len() >= a.min_iters)
                    || times.len() >= 100_000
            }
        };
        if done {
            break;
        }
        let t0 = Instant::now();
        once()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    if times.is_empty() {
        return Ok(None);
    }
    Ok(Some((times.len(), median(&mut times))))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("matvec_bench: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("matvec_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
