//! sluice side of the executed-instruction comparison of `scripts/arm_insn_counts.sh`: the
//! dot kernels and activation quantizers of the best kernel table ([`Kernels::detect`], the
//! NEON table on an aarch64 core with dotprod and FP16), run under
//! `qemu-aarch64 -cpu cortex-a76` with every executed instruction logged.
//! `scripts/arm_insn_probe.c` is the same probe for llama.cpp's kernels and writes the inputs
//! both read (`arm_insn_probe gen DIR`).
//!
//! `cargo run --release -p quant --example arm_insn_probe -- DIR`
//!
//! Prints the kernel table, then one line per measured item (`dot <type>` or
//! `quant <act type>`, the same items in the same order as the C probe) and brackets each
//! measurement with `getppid()` calls, which qemu's strace log shows between the executed
//! instructions: after one first marker, every item is
//! preparation and warm-up call, marker, the operation once, marker, three times, marker.
//! An operation is a matvec for a dot kernel (the single-row dot of the item's weight type for
//! each of `ROWS` rows of `ACT_N` elements against one activation row) and one quantizer call
//! on a row of `ACT_N` values. Then `mm <type> <tokens>` items: the whole product of the
//! `ROWS` × `ACT_N` weight with 1 or `MM_TOK` activation rows as the engine runs it
//! (`RowKernel::for_weight`, `matvec_with` / `matmul_with` on a one-thread pool: activation
//! quantization, the kernels of the order the table prescribes, the pool's dispatch). The
//! example runs (and means nothing) on any target; only the log of an aarch64 run is read.

use std::hint::black_box;
use std::path::Path;

use quant::{GgmlType, Kernels, RowKernel, ThreadPool, matmul_with, matvec_with, vec_dot_type};

/// Elements per row (must match `ACT_N` of scripts/arm_insn_probe.c).
const ACT_N: usize = 4096;
/// Weight rows per matvec (must match `ROWS` of scripts/arm_insn_probe.c).
const ROWS: usize = 64;

const W_TYPES: [GgmlType; 25] = {
    use GgmlType::*;
    [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, F16,
        F32, BF16, TQ1_0, TQ2_0, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M,
    ]
};
/// Activation rows of the batched products (must match `MM_TOK` of scripts/arm_insn_probe.c).
const MM_TOK: usize = 4;
const MM_TYPES: [GgmlType; 7] = {
    use GgmlType::*;
    [Q4_0, Q8_0, IQ4_NL, MXFP4, Q4_K, Q5_K, Q6_K]
};
const A_TYPES: [GgmlType; 5] = {
    use GgmlType::*;
    [Q8_0, Q8_1, Q8_K, F16, BF16]
};

/// A system call the strace log shows, made nowhere else in the measured run.
fn marker() {
    #[cfg(unix)]
    black_box(std::os::unix::process::parent_id());
}

fn row_bytes(ty: GgmlType) -> usize {
    ty.row_bytes(ACT_N as u64)
        .expect("ACT_N is a whole number of blocks") as usize
}

fn read(dir: &Path, name: &str, len: usize) -> Result<Vec<u8>, String> {
    let p = dir.join(name);
    let b = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    if b.len() != len {
        return Err(format!(
            "{}: {} bytes, expected {len}",
            p.display(),
            b.len()
        ));
    }
    Ok(b)
}

fn floats(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn run(dir: &Path) -> Result<(), String> {
    let k = Kernels::detect();
    println!("kernel table: {}", k.isa().name());
    let x = floats(&read(dir, "act.f32", ACT_N * 4)?);
    let mut out = [0f32; ROWS];
    let mut sink = 0f32;
    marker();
    for ty in W_TYPES {
        let dot = k.dot(ty).ok_or_else(|| format!("no dot kernel for {ty}"))?;
        let at = vec_dot_type(ty).ok_or_else(|| format!("no activation type for {ty}"))?;
        let quantize = k
            .quantize(at)
            .ok_or_else(|| format!("no quantizer for {at}"))?;
        let mut a = vec![0u8; row_bytes(at)];
        quantize(&x, &mut a);
        let rb = row_bytes(ty);
        let w = read(dir, &format!("w.{}", ty.name()), rb * ROWS)?;
        println!("dot {}", ty.name());
        let matvec = |out: &mut [f32; ROWS]| {
            for (o, row) in out.iter_mut().zip(w.chunks_exact(rb)) {
                *o = dot(ACT_N, black_box(row), black_box(&a));
            }
            black_box(&*out);
        };
        matvec(&mut out); // warm-up, as on the C side
        marker();
        matvec(&mut out);
        marker();
        for _ in 0..3 {
            matvec(&mut out);
        }
        marker();
        sink += out[0];
    }
    for at in A_TYPES {
        let quantize = k
            .quantize(at)
            .ok_or_else(|| format!("no quantizer for {at}"))?;
        let mut a = vec![0u8; row_bytes(at)];
        println!("quant {}", at.name());
        let q = |a: &mut [u8]| {
            quantize(black_box(&x), a);
            black_box(&*a);
        };
        q(&mut a);
        marker();
        q(&mut a);
        marker();
        for _ in 0..3 {
            q(&mut a);
        }
        marker();
        sink += f32::from(a[0]);
    }
    // the batched products: the first activation row, then those of act4.f32
    let mut xs = x.clone();
    xs.extend(floats(&read(dir, "act4.f32", ACT_N * 4 * MM_TOK)?));
    xs.truncate(ACT_N * MM_TOK);
    let pool = ThreadPool::new(1).map_err(|e| format!("thread pool: {e}"))?;
    let mut y = vec![0f32; ROWS * MM_TOK];
    let mut scratch = Vec::new();
    for ty in MM_TYPES {
        let kernel = RowKernel::for_weight(k, ty, ROWS, ACT_N, false).map_err(|e| e.to_string())?;
        let rb = row_bytes(ty);
        let w = read(dir, &format!("w.{}", ty.name()), rb * ROWS)?;
        for nt in [1, MM_TOK] {
            println!("mm {} {nt}", ty.name());
            let (x, y) = (&xs[..ACT_N * nt], &mut y[..ROWS * nt]);
            let mut product = || {
                let r = if nt == 1 {
                    matvec_with(
                        &pool,
                        &kernel,
                        black_box(&w),
                        ROWS,
                        ACT_N,
                        x,
                        y,
                        &mut scratch,
                    )
                } else {
                    matmul_with(
                        &pool,
                        &kernel,
                        black_box(&w),
                        ROWS,
                        ACT_N,
                        x,
                        nt,
                        y,
                        &mut scratch,
                    )
                };
                r.map_err(|e| e.to_string())
            };
            product()?; // warm-up, as on the C side
            marker();
            product()?;
            marker();
            for _ in 0..3 {
                product()?;
            }
            marker();
            for &v in y.iter() {
                sink += v;
            }
        }
    }
    // the C probe's checksum: equal bits for equal inputs and results
    println!("checksum {:08x}", sink.to_bits());
    Ok(())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: arm_insn_probe DIR (the inputs of `scripts/arm_insn_probe gen DIR`)");
        std::process::exit(2);
    };
    if let Err(e) = run(Path::new(&dir)) {
        eprintln!("arm_insn_probe: {e}");
        std::process::exit(1);
    }
}
