//! Thread pool behaviour and threaded matvec / matmul against a single-threaded reference.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;

use half::f16;
use quant::{GgmlType, QuantError, RowKernel, SumOrder, ThreadPool, matmul_with, matvec_with};

// ---------------------------------------------------------------------------------------
// Thread pool
// ---------------------------------------------------------------------------------------

fn run_counting(pool: &ThreadPool, n_tasks: usize) -> Vec<usize> {
    let counts: Vec<AtomicUsize> = (0..n_tasks).map(|_| AtomicUsize::new(0)).collect();
    pool.run(n_tasks, |i| {
        counts[i].fetch_add(1, Ordering::Relaxed);
    });
    counts.into_iter().map(AtomicUsize::into_inner).collect()
}

#[test]
fn every_task_runs_exactly_once() {
    for n_threads in 1..=4 {
        let pool = ThreadPool::new(n_threads).unwrap();
        assert_eq!(pool.n_threads(), n_threads);
        for n_tasks in [0, 1, 2, 3, 4, 5, 7, 64, 1000] {
            let counts = run_counting(&pool, n_tasks);
            assert!(
                counts.iter().all(|&c| c == 1),
                "{n_threads} threads, {n_tasks} tasks: {counts:?}"
            );
        }
    }
}

#[test]
fn zero_threads_means_one() {
    let pool = ThreadPool::new(0).unwrap();
    assert_eq!(pool.n_threads(), 1);
    assert_eq!(run_counting(&pool, 10), vec![1; 10]);
}

#[test]
fn many_consecutive_runs() {
    for n_threads in 1..=4 {
        let pool = ThreadPool::new(n_threads).unwrap();
        for run in 0..2000usize {
            let n_tasks = 1 + run % 9;
            let sum = AtomicUsize::new(0);
            pool.run(n_tasks, |i| {
                sum.fetch_add(i + 1, Ordering::Relaxed);
            });
            assert_eq!(sum.into_inner(), n_tasks * (n_tasks + 1) / 2, "run {run}");
        }
    }
}

#[test]
fn workers_take_part() {
    // Two tasks that each wait for the other can only finish if two threads run them.
    let pool = ThreadPool::new(2).unwrap();
    for _ in 0..50 {
        let barrier = Barrier::new(2);
        let names = Mutex::new(Vec::new());
        pool.run(2, |_| {
            barrier.wait();
            names
                .lock()
                .unwrap()
                .push(thread::current().name().map(str::to_owned));
        });
        let mut names = names.into_inner().unwrap();
        names.sort();
        assert_eq!(names.len(), 2);
        assert_ne!(names[0], names[1]);
    }
}

#[test]
fn task_writes_are_visible_after_run() {
    let pool = ThreadPool::new(3).unwrap();
    for round in 0..200u64 {
        let cells: Vec<Mutex<u64>> = (0..37).map(|_| Mutex::new(0)).collect();
        pool.run(cells.len(), |i| {
            *cells[i].lock().unwrap() = round * 100 + i as u64
        });
        for (i, c) in cells.iter().enumerate() {
            assert_eq!(*c.lock().unwrap(), round * 100 + i as u64);
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        String::from("<non-string panic>")
    }
}

#[test]
fn panic_is_resumed_on_caller_and_pool_stays_usable() {
    for n_threads in 1..=4 {
        let pool = ThreadPool::new(n_threads).unwrap();
        for _ in 0..20 {
            let result = panic::catch_unwind(AssertUnwindSafe(|| {
                pool.run(100, |i| {
                    if i == 37 {
                        panic!("task 37 failed");
                    }
                });
            }));
            let payload = result.expect_err("the panic must reach the caller");
            assert_eq!(panic_message(payload.as_ref()), "task 37 failed");
            assert_eq!(run_counting(&pool, 50), vec![1; 50]);
        }
    }
}

#[test]
fn panic_on_a_worker_thread_reaches_the_caller() {
    let pool = ThreadPool::new(2).unwrap();
    let caller = thread::current().id();
    for _ in 0..20 {
        let barrier = Barrier::new(2);
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            pool.run(2, |_| {
                barrier.wait(); // both tasks are now on different threads
                if thread::current().id() != caller {
                    panic!("worker panic");
                }
            });
        }));
        let payload = result.expect_err("the worker's panic must reach the caller");
        assert_eq!(panic_message(payload.as_ref()), "worker panic");
    }
    assert_eq!(run_counting(&pool, 9), vec![1; 9]);
}

#[test]
fn nested_run_executes_inline() {
    for n_threads in 1..=4 {
        let pool = ThreadPool::new(n_threads).unwrap();
        let counts: Vec<AtomicUsize> = (0..8 * 5).map(|_| AtomicUsize::new(0)).collect();
        pool.run(8, |outer| {
            let me = thread::current().id();
            pool.run(5, |inner| {
                assert_eq!(thread::current().id(), me, "nested tasks run inline");
                counts[outer * 5 + inner].fetch_add(1, Ordering::Relaxed);
            });
        });
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }
}

#[test]
fn nested_run_of_another_pool_executes_inline() {
    let a = ThreadPool::new(2).unwrap();
    let b = ThreadPool::new(3).unwrap();
    let total = AtomicUsize::new(0);
    a.run(6, |_| {
        b.run(4, |_| {
            a.run(3, |_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
    });
    assert_eq!(total.into_inner(), 6 * 4 * 3);
}

#[test]
fn concurrent_runs_from_several_threads() {
    let pool = ThreadPool::new(3).unwrap();
    thread::scope(|s| {
        for t in 0..3usize {
            let pool = &pool;
            s.spawn(move || {
                for r in 0..300usize {
                    let n = 1 + (r + t) % 11;
                    let sum = AtomicUsize::new(0);
                    pool.run(n, |i| {
                        sum.fetch_add(i, Ordering::Relaxed);
                    });
                    assert_eq!(sum.into_inner(), n * (n - 1) / 2);
                }
            });
        }
    });
}

#[test]
fn drop_while_idle() {
    for n_threads in 1..=4 {
        drop(ThreadPool::new(n_threads).unwrap()); // never used
        let pool = ThreadPool::new(n_threads).unwrap();
        assert_eq!(run_counting(&pool, 16), vec![1; 16]);
        drop(pool); // workers may be spinning or parked
    }
}

// ---------------------------------------------------------------------------------------
// matvec / matmul with small test kernels
// ---------------------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// F32 weights × F32 activations, summed left to right.
fn f32_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len(), 4 * n);
    assert_eq!(a.len(), 4 * n);
    w.chunks_exact(4)
        .zip(a.chunks_exact(4))
        .map(|(w, a)| {
            f32::from_le_bytes(w.try_into().unwrap()) * f32::from_le_bytes(a.try_into().unwrap())
        })
        .fold(0.0, |s, p| s + p)
}

fn f32_store(x: &[f32], out: &mut [u8]) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

const F32_KERNEL: RowKernel = RowKernel {
    wtype: GgmlType::F32,
    order: SumOrder::VecDot,
    act_type: GgmlType::F32,
    dot: f32_dot,
    dot_rows: None,
    dot_tokens: None,
    dot_panel: None,
    quantize: f32_store,
    grouped: None,
    prefetch: false,
};

/// A plain Q8_0 quantizer (f16 scale `amax / 127`, round to nearest).
fn q8_0_quantize(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        ob[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        for (q, v) in ob[2..].iter_mut().zip(xb) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

fn q8_0_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert_eq!(w.len(), n / 32 * 34);
    assert_eq!(a.len(), w.len());
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(34).zip(a.chunks_exact(34)) {
        let dw = f16::from_le_bytes([wb[0], wb[1]]).to_f32();
        let da = f16::from_le_bytes([ab[0], ab[1]]).to_f32();
        let s: i32 = wb[2..]
            .iter()
            .zip(&ab[2..])
            .map(|(&p, &q)| i32::from(p as i8) * i32::from(q as i8))
            .sum();
        sum += dw * da * s as f32;
    }
    sum
}

/// Three rows at a time (an odd width, so chunks end with a remainder for `dot`).
fn q8_0_dot3(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    assert_eq!(out.len(), 3);
    let rb = w.len() / 3;
    for (o, row) in out.iter_mut().zip(w.chunks_exact(rb)) {
        *o = q8_0_dot(n, row, a);
    }
}

const Q8_0_KERNEL: RowKernel = RowKernel {
    wtype: GgmlType::Q8_0,
    order: SumOrder::VecDot,
    act_type: GgmlType::Q8_0,
    dot: q8_0_dot,
    dot_rows: Some(quant::DotRows {
        rows: 3,
        f: q8_0_dot3,
    }),
    dot_tokens: None,
    dot_panel: None,
    quantize: q8_0_quantize,
    grouped: None,
    prefetch: true,
};

/// Weight bytes for `rows × cols` random values, stored with the kernel's own quantizer
/// (the weight and activation types of the test kernels coincide).
fn weights(k: &RowKernel, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = k.wtype.row_bytes(cols as u64).unwrap() as usize;
    let mut w = vec![0u8; rows * rb];
    for row in w.chunks_exact_mut(rb) {
        (k.quantize)(&rng.vec(cols), row);
    }
    w
}

/// The single-threaded reference: quantize each activation row, one dot per output.
fn reference(k: &RowKernel, w: &[u8], rows: usize, cols: usize, x: &[f32]) -> Vec<f32> {
    let rb = k.wtype.row_bytes(cols as u64).unwrap() as usize;
    let arb = k.act_type.row_bytes(cols as u64).unwrap() as usize;
    let mut out = Vec::new();
    for xr in x.chunks_exact(cols) {
        let mut xq = vec![0u8; arb];
        (k.quantize)(xr, &mut xq);
        for r in 0..rows {
            out.push((k.dot)(cols, &w[r * rb..(r + 1) * rb], &xq));
        }
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

const SHAPES: &[(usize, usize)] = &[(1, 32), (3, 64), (17, 96), (64, 32), (100, 256), (513, 128)];

fn check_kernel_bit_identical(k: &RowKernel) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let pools: Vec<ThreadPool> = [1, 2, 3].map(|n| ThreadPool::new(n).unwrap()).into();
    let mut scratch = Vec::new();
    for &(rows, cols) in SHAPES {
        let w = weights(k, rows, cols, &mut rng);
        for n_tok in [1usize, 2, 5] {
            let x = rng.vec(n_tok * cols);
            let want = reference(k, &w, rows, cols, &x);
            for pool in &pools {
                let mut got = vec![f32::NAN; n_tok * rows];
                matmul_with(pool, k, &w, rows, cols, &x, n_tok, &mut got, &mut scratch).unwrap();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{} matmul {rows}x{cols}, {n_tok} tokens, {} threads",
                    k.wtype,
                    pool.n_threads()
                );
                if n_tok == 1 {
                    let mut got = vec![f32::NAN; rows];
                    matvec_with(pool, k, &w, rows, cols, &x, &mut got, &mut scratch).unwrap();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{} matvec {rows}x{cols}, {} threads",
                        k.wtype,
                        pool.n_threads()
                    );
                }
            }
        }
    }
}

#[test]
fn test_kernels_threaded_results_are_bit_identical() {
    check_kernel_bit_identical(&F32_KERNEL);
    check_kernel_bit_identical(&Q8_0_KERNEL);
}

#[test]
fn matvec_values_match_f64_product() {
    // The F32 test kernel is an ordinary dot product, so this checks the indexing of
    // weights, activations and outputs against an independent computation.
    let (rows, cols, n_tok) = (70, 48, 3);
    let mut rng = Rng(7);
    let wf = rng.vec(rows * cols);
    let x = rng.vec(n_tok * cols);
    let mut w = vec![0u8; rows * cols * 4];
    f32_store(&wf, &mut w);
    let pool = ThreadPool::new(2).unwrap();
    let mut out = vec![0.0; n_tok * rows];
    matmul_with(
        &pool,
        &F32_KERNEL,
        &w,
        rows,
        cols,
        &x,
        n_tok,
        &mut out,
        &mut Vec::new(),
    )
    .unwrap();
    for t in 0..n_tok {
        for r in 0..rows {
            let want: f64 = (0..cols)
                .map(|c| f64::from(wf[r * cols + c]) * f64::from(x[t * cols + c]))
                .sum();
            let got = f64::from(out[t * rows + r]);
            assert!((got - want).abs() < 1e-4, "t{t} r{r}: {got} vs {want}");
        }
    }
}

#[test]
fn empty_products_are_zero() {
    let pool = ThreadPool::new(2).unwrap();
    let mut scratch = Vec::new();
    let mut out = vec![f32::NAN; 4];
    matvec_with(&pool, &F32_KERNEL, &[], 4, 0, &[], &mut out, &mut scratch).unwrap();
    assert_eq!(out, vec![0.0; 4]);
    matvec_with(
        &pool,
        &F32_KERNEL,
        &[],
        0,
        8,
        &[0.0; 8],
        &mut [],
        &mut scratch,
    )
    .unwrap();
    matmul_with(
        &pool,
        &F32_KERNEL,
        &[0; 32],
        1,
        8,
        &[],
        0,
        &mut [],
        &mut scratch,
    )
    .unwrap();
}

#[test]
fn shape_errors_are_typed() {
    let pool = ThreadPool::new(2).unwrap();
    let k = &Q8_0_KERNEL;
    let (rows, cols) = (4, 64);
    let w = vec![0u8; rows * 68];
    let x = vec![0.0f32; cols];
    let mut out = vec![0.0f32; rows];
    let mut s = Vec::new();

    let e = matvec_with(&pool, k, &w, rows, 48, &x[..48], &mut out, &mut s).unwrap_err();
    assert_eq!(
        e,
        QuantError::NotBlockMultiple {
            ty: GgmlType::Q8_0,
            n: 48,
            block: 32
        }
    );
    let e = matvec_with(&pool, k, &w[1..], rows, cols, &x, &mut out, &mut s).unwrap_err();
    assert!(
        matches!(
            e,
            QuantError::LengthMismatch {
                what: "weight",
                expected: 272,
                got: 271,
                ..
            }
        ),
        "{e:?}"
    );
    let e = matvec_with(&pool, k, &w, rows, cols, &x[1..], &mut out, &mut s).unwrap_err();
    assert!(
        matches!(
            e,
            QuantError::LengthMismatch {
                what: "activation",
                ..
            }
        ),
        "{e:?}"
    );
    let e = matvec_with(&pool, k, &w, rows, cols, &x, &mut out[1..], &mut s).unwrap_err();
    assert!(
        matches!(e, QuantError::LengthMismatch { what: "output", .. }),
        "{e:?}"
    );
    let e = matmul_with(&pool, k, &w, rows, cols, &x, 2, &mut out, &mut s).unwrap_err();
    assert!(
        matches!(
            e,
            QuantError::LengthMismatch {
                what: "activation",
                ..
            }
        ),
        "{e:?}"
    );
    let e = matvec_with(&pool, k, &w, usize::MAX / 2, cols, &x, &mut out, &mut s).unwrap_err();
    assert!(matches!(e, QuantError::ShapeOverflow { .. }), "{e:?}");
}

#[test]
fn types_without_a_pairing_are_unsupported() {
    let pool = ThreadPool::new(1).unwrap();
    let e = quant::matvec(
        &pool,
        quant::Kernels::detect(),
        GgmlType::I8,
        &[0; 32],
        1,
        32,
        &[0.0; 32],
        &mut [0.0],
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            QuantError::Unsupported {
                ty: GgmlType::I8,
                ..
            }
        ),
        "{e:?}"
    );
}

// ---------------------------------------------------------------------------------------
// matvec / matmul with the kernel tables
// ---------------------------------------------------------------------------------------

/// Weights quantized by the reference quantizer; IQ4_NL and IQ4_XS (which it lacks) get
/// random bytes with a finite f16 scale in the block's first two bytes.
fn table_weights(t: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    if quant::can_quantize(t) {
        return quant::quantize_to_vec(t, &rng.vec(rows * cols)).unwrap();
    }
    assert!(matches!(t, GgmlType::IQ4_NL | GgmlType::IQ4_XS), "{t}");
    let mut w: Vec<u8> = (0..t.row_bytes((rows * cols) as u64).unwrap())
        .map(|_| rng.next_u64() as u8)
        .collect();
    for b in w.chunks_exact_mut(t.type_size()) {
        b[..2].copy_from_slice(&f16::from_f32(0.01 + 0.01 * rng.f32()).to_le_bytes());
    }
    w
}

/// Threaded products with the real kernel tables equal a per-row loop bit for bit.
#[test]
fn table_kernels_threaded_results_are_bit_identical() {
    use GgmlType::*;
    let types = [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS,
    ];
    let pools: Vec<ThreadPool> = [1, 2, 3].map(|n| ThreadPool::new(n).unwrap()).into();
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    let mut scratch = Vec::new();
    for table in [quant::Kernels::scalar(), quant::Kernels::detect()] {
        for t in types {
            let k = RowKernel::lookup(table, t)
                .unwrap_or_else(|e| panic!("{} table has no {t} kernel: {e}", table.isa().name()));
            let (rows, cols) = (83, 512);
            let w = table_weights(t, rows, cols, &mut rng);
            for n_tok in [1usize, 3] {
                let x = rng.vec(n_tok * cols);
                let want = reference(&k, &w, rows, cols, &x);
                for pool in &pools {
                    let mut got = vec![f32::NAN; n_tok * rows];
                    quant::matmul(
                        pool,
                        table,
                        t,
                        &w,
                        rows,
                        cols,
                        &x,
                        n_tok,
                        &mut got,
                        &mut scratch,
                    )
                    .unwrap();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{t} {n_tok} tokens {} threads",
                        pool.n_threads()
                    );
                    if n_tok == 1 {
                        quant::matvec(pool, table, t, &w, rows, cols, &x, &mut got, &mut scratch)
                            .unwrap();
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{t} matvec {} threads",
                            pool.n_threads()
                        );
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// matvec_many: a batch of products in one pool run
// ---------------------------------------------------------------------------------------

/// Every job of a batch equals the same product run alone through `matvec_with`, bit for bit,
/// for the table's real kernels of the types a MoE decode multiplies (the routed experts'
/// orders: the repacked 8-row kernels of Q4_K and MXFP4, the vec_dot ones of Q6_K and Q8_0),
/// with jobs of several shapes and types mixed in one batch, on 1-3 threads.
#[test]
fn a_batch_of_products_equals_each_product_alone() {
    use quant::{Kernels, MatvecJob, matvec_many, quantize_activation};
    let mut rng = Rng(0x51ce_0001);
    let tables: Vec<&Kernels> = vec![Kernels::scalar(), Kernels::detect()];
    let pools: Vec<ThreadPool> = [1, 2, 3].map(|n| ThreadPool::new(n).unwrap()).into();
    // (type, rows, cols) of each job; rows not a multiple of the chunk or of 8 included.
    let specs: &[(GgmlType, usize, usize)] = &[
        (GgmlType::Q4_K, 96, 512),
        (GgmlType::Q4_K, 96, 512),
        (GgmlType::Q6_K, 40, 256),
        (GgmlType::Q8_0, 19, 64),
        (GgmlType::MXFP4, 64, 128),
        (GgmlType::Q4_K, 200, 256),
        (GgmlType::F16, 33, 64),
    ];
    for table in tables {
        let kernels: Vec<RowKernel> = specs
            .iter()
            .map(|&(ty, rows, cols)| RowKernel::for_weight(table, ty, rows, cols, true).unwrap())
            .collect();
        let weights: Vec<Vec<u8>> = specs
            .iter()
            .map(|&(ty, rows, cols)| quant::quantize_to_vec(ty, &rng.vec(rows * cols)).unwrap())
            .collect();
        let xs: Vec<Vec<f32>> = specs.iter().map(|&(_, _, cols)| rng.vec(cols)).collect();
        let mut qx: Vec<Vec<u8>> = vec![Vec::new(); specs.len()];
        for (i, &(_, _, cols)) in specs.iter().enumerate() {
            quantize_activation(&kernels[i], cols, &xs[i], &mut qx[i]).unwrap();
        }
        for pool in &pools {
            let mut want: Vec<Vec<f32>> = Vec::new();
            for (i, &(_, rows, cols)) in specs.iter().enumerate() {
                let mut o = vec![f32::NAN; rows];
                matvec_with(
                    pool,
                    &kernels[i],
                    &weights[i],
                    rows,
                    cols,
                    &xs[i],
                    &mut o,
                    &mut Vec::new(),
                )
                .unwrap();
                want.push(o);
            }
            let mut got: Vec<Vec<f32>> = specs.iter().map(|s| vec![f32::NAN; s.1]).collect();
            let mut jobs: Vec<MatvecJob<'_>> = got
                .iter_mut()
                .enumerate()
                .map(|(i, out)| MatvecJob {
                    kernel: &kernels[i],
                    w: &weights[i],
                    rows: specs[i].1,
                    cols: specs[i].2,
                    xq: &qx[i],
                    out,
                })
                .collect();
            matvec_many(pool, &mut jobs).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    bits(g),
                    bits(w),
                    "job {i} ({:?}), {} threads",
                    specs[i],
                    pool.n_threads()
                );
            }
        }
    }
}

#[test]
fn a_batch_with_a_wrong_length_is_refused() {
    use quant::{Kernels, MatvecJob, matvec_many};
    let pool = ThreadPool::new(2).unwrap();
    let k = RowKernel::lookup(Kernels::scalar(), GgmlType::Q8_0).unwrap();
    let w = vec![0u8; 4 * 34 * 2];
    let xq = vec![0u8; 34 * 2];
    let mut out = vec![0f32; 3];
    let mut jobs = [MatvecJob {
        kernel: &k,
        w: &w,
        rows: 4,
        cols: 64,
        xq: &xq,
        out: &mut out,
    }];
    let err = matvec_many(&pool, &mut jobs).unwrap_err();
    assert!(
        matches!(err, QuantError::LengthMismatch { what: "output", .. }),
        "{err}"
    );
}
