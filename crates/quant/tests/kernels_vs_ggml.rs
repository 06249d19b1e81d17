//! Activation quantizers and dot kernels against what ggml's CPU backend computes.
//!
//! The fixtures (see `tests/fixtures/README.md`) hold activation rows, the bytes the CPU
//! backend's `from_float` makes of them (Q8_0, Q8_1, Q8_K, F16, BF16), weight rows of every
//! type with a dot kernel here, and the backend's `vec_dot` of each weight row with each
//! quantized activation row at several lengths. `cpu_ggml.gguf` was produced by the x86
//! backend's AVX2/FMA/F16C build ("haswell" variant), `cpu_ggml_aarch64.gguf` by its ARM
//! build for NEON + dotprod + FP16 (a Cortex-A76), run under qemu.
//!
//! * Quantizers: the scalar table reproduces the x86 bytes, the AVX2 table (when this CPU
//!   has it) the x86 bytes, the NEON table (when this CPU has it) the ARM bytes, exactly.
//! * Dot kernels, AVX2 / NEON table: the kernels follow ggml's order of operations on that
//!   architecture, so the result must be the same f32, bit for bit.
//! * Dot kernels, scalar table: within the tolerance of both fixtures (its additions run in
//!   another order).
//!
//! Tolerance (the bounds of `kernels_legacy.rs` and `kernels_kquants.rs`, taken for two
//! implementations). Both sides compute exact integer or exact-product block sums and
//! differ only in f32 rounding of scale products and running sums. With `M` the sum over
//! the row of |activation| · (|scale part of the weight| + |minimum part|) (the two parts
//! of Q4_1 / Q5_1 / Q2_K / Q4_K / Q5_K weights counted separately, plus |m·s| per block for
//! Q4_1 / Q5_1 whose minimum meets the Q8_1 block sum `s`; for the ternary types, whose x86
//! lanes take the offset of -1 off another grouping of the elements than their digits', the
//! digit `q` and the offset counted apart: `(|q·d| + |d|)` for the weight `(q - 1)·d`) and
//! `C` the longest chain of f32
//! roundings, each side is within `C · ε/2 · M` of the exact value. We allow:
//!   32-element blocks:  `2 · (n/32 + 3 + 4) · ε · M`
//!   float types:        `2 · (n/32 + 5 + n%32 + 4) · ε · M`
//!   256-element blocks: `(n/256 + 8) · ε · M`
//! plus 1e-30 absolute, with ε = `f32::EPSILON`.

use gguf::{GgufFile, TensorInfo};
use quant::{GgmlType, Isa, Kernels, dequantize_row, vec_dot_type};

use GgmlType as T;

const EPS: f64 = f32::EPSILON as f64;

/// Activation types the CPU backend quantizes activations to.
const ACTS: [GgmlType; 5] = [T::Q8_0, T::Q8_1, T::Q8_K, T::F16, T::BF16];

/// Weight types with a dot kernel, all of which both fixtures cover.
const WEIGHTS: [GgmlType; 25] = [
    T::F32,
    T::F16,
    T::BF16,
    T::Q8_0,
    T::Q4_0,
    T::Q4_1,
    T::Q5_0,
    T::Q5_1,
    T::IQ4_NL,
    T::MXFP4,
    T::Q2_K,
    T::Q3_K,
    T::Q4_K,
    T::Q5_K,
    T::Q6_K,
    T::IQ4_XS,
    T::TQ1_0,
    T::TQ2_0,
    T::IQ2_XXS,
    T::IQ2_XS,
    T::IQ2_S,
    T::IQ3_XXS,
    T::IQ3_S,
    T::IQ1_S,
    T::IQ1_M,
];

/// The x86 fixture (AVX2 build of ggml's CPU backend).
const X86: &str = "cpu_ggml.gguf";
/// The aarch64 fixture (NEON + dotprod + FP16 build).
const ARM: &str = "cpu_ggml_aarch64.gguf";

fn open(name: &str) -> GgufFile {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A kernel table and the fixture it is checked against.
struct Case {
    fixture: &'static str,
    k: &'static Kernels,
    /// Dot products must be bit-identical (else: within the tolerance).
    exact: bool,
    /// The activation quantizers must reproduce the fixture's bytes.
    quantizers: bool,
}

fn cases() -> Vec<Case> {
    let scalar = |fixture, quantizers| Case {
        fixture,
        k: Kernels::scalar(),
        exact: false,
        quantizers,
    };
    let best = |fixture| Case {
        fixture,
        k: Kernels::detect(),
        exact: true,
        quantizers: true,
    };
    match Kernels::detect().isa() {
        Isa::Scalar => vec![scalar(X86, true)],
        // the AVX2 table, and where the CPU has AVX-512 or BMI2 the tables without their
        // builds (as on CPUs without them)
        Isa::Avx2 => std::iter::once(scalar(X86, true))
            .chain(Kernels::simd_tables().into_iter().map(|k| Case {
                fixture: X86,
                k,
                exact: true,
                quantizers: true,
            }))
            .collect(),
        // (the scalar table against the ARM data: its own test below)
        Isa::Neon => vec![scalar(X86, true), best(ARM)],
    }
}

/// A tensor's info, data and row length (ne0), checking its type.
fn tensor<'a>(f: &'a GgufFile, name: &str, ty: GgmlType) -> (&'a TensorInfo, &'a [u8], usize) {
    let info = f
        .tensor(name)
        .unwrap_or_else(|| panic!("fixture has no {name}"));
    assert_eq!(info.ggml_type(), Some(ty), "{name}");
    let data = f.tensor_data(info).unwrap();
    (info, data, info.dims[0] as usize)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn quantize(k: &Kernels, ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let q = k.quantize(ty).expect("quantizer registered");
    let mut out = vec![0xAAu8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    q(x, &mut out);
    out
}

// ---------------------------------------------------------------------------------------
// Activation quantizers.

/// Quantize each row of `<input>` (cut to the row length of `<prefix>.<t>`) and compare
/// with `<prefix>.<t>` byte for byte.
fn check_quantizer(f: &GgufFile, input: &str, prefix: &str, ty: GgmlType, k: &Kernels) {
    let (_, xb, x_len) = tensor(f, input, T::F32);
    let x = f32s(xb);
    let name = format!("{prefix}.{}", ty.name());
    let (info, want, len) = tensor(f, &name, ty);
    let rows = x.len() / x_len;
    assert_eq!(info.n_elements() as usize, len * rows, "{name}");
    let row_bytes = want.len() / rows;
    let ts = ty.type_size();
    for r in 0..rows {
        let xr = &x[r * x_len..r * x_len + len];
        let got = quantize(k, ty, xr);
        let want = &want[r * row_bytes..(r + 1) * row_bytes];
        if got != want {
            let bad: Vec<usize> = (0..want.len() / ts)
                .filter(|&b| got[b * ts..(b + 1) * ts] != want[b * ts..(b + 1) * ts])
                .collect();
            let b = bad[0];
            let bs = ty.block_size();
            panic!(
                "{name} row {r} ({}): {} of {} blocks differ; first is block {b}\n got  {:02x?}\n want {:02x?}\n input {:?}",
                k.name(),
                bad.len(),
                want.len() / ts,
                &got[b * ts..(b + 1) * ts],
                &want[b * ts..(b + 1) * ts],
                &xr[b * bs..(b + 1) * bs],
            );
        }
    }
}

#[test]
fn activation_quantizers_match_ggml_bytes() {
    for case in cases().iter().filter(|c| c.quantizers) {
        let f = open(case.fixture);
        for ty in ACTS {
            check_quantizer(&f, "act.input", "act", ty, case.k);
            check_quantizer(&f, "edge.input", "edge", ty, case.k);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Dot kernels.

/// Byte offsets of the f16 scale `d` and minimum scale `dmin` for types with a minimum.
fn min_offsets(ty: GgmlType) -> Option<(usize, usize)> {
    match ty {
        T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => Some((0, 2)),
        T::Q2_K => Some((80, 82)),
        _ => None,
    }
}

/// Byte offset of the f16 scale `d` of the ternary types (weights `(q - 1)·d`, `q` a digit).
fn ternary_scale(ty: GgmlType) -> Option<usize> {
    match ty {
        T::TQ1_0 => Some(52),
        T::TQ2_0 => Some(64),
        _ => None,
    }
}

fn dequant(ty: GgmlType, b: &[u8], n: usize) -> Vec<f64> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, b, &mut out).unwrap();
    out.into_iter().map(f64::from).collect()
}

/// Copy of `w` with the f16 at `off` of every block set to zero.
fn zero_f16(ty: GgmlType, w: &[u8], off: usize) -> Vec<u8> {
    let mut w = w.to_vec();
    for b in w.chunks_exact_mut(ty.type_size()) {
        b[off..off + 2].fill(0);
    }
    w
}

/// `M` of the module docs for `n` elements of weight row `w` and activation row `a`.
fn magnitude(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f64 {
    let act = vec_dot_type(ty).unwrap();
    let av = dequant(act, a, n);
    let wm: Vec<f64> = match min_offsets(ty) {
        None if let Some(off) = ternary_scale(ty) => {
            let blocks = w.chunks_exact(ty.type_size());
            let d = blocks.map(|b| f64::from(half::f16::from_le_bytes([b[off], b[off + 1]])));
            let d: Vec<f64> = d.flat_map(|d| [d; 256]).collect();
            let wv = dequant(ty, w, n);
            wv.iter()
                .zip(&d)
                .map(|(w, d)| (w + d).abs() + d.abs())
                .collect()
        }
        None => dequant(ty, w, n).iter().map(|v| v.abs()).collect(),
        Some((d, m)) => {
            let scale_part = dequant(ty, &zero_f16(ty, w, m), n);
            let min_part = dequant(ty, &zero_f16(ty, w, d), n);
            scale_part
                .iter()
                .zip(&min_part)
                .map(|(s, m)| s.abs() + m.abs())
                .collect()
        }
    };
    let mut s: f64 = wm.iter().zip(&av).map(|(w, a)| w * a.abs()).sum();
    if act == T::Q8_1 {
        let f16 = |b: &[u8], at: usize| f64::from(half::f16::from_le_bytes([b[at], b[at + 1]]));
        for (wb, ab) in w.chunks_exact(ty.type_size()).zip(a.chunks_exact(36)) {
            s += (f16(wb, 2) * f16(ab, 2)).abs();
        }
    }
    s
}

/// The allowed difference; `eps` is the machine epsilon of the reference's accumulators.
fn tolerance(ty: GgmlType, n: usize, m: f64, eps: f64) -> f64 {
    let factor = match ty.block_size() {
        1 => 2.0 * ((n / 32 + 5 + n % 32) as f64 + 4.0),
        32 => 2.0 * ((n / 32 + 3) as f64 + 4.0),
        _ => (n / 256) as f64 + 8.0,
    };
    factor * eps * m + 1e-30
}

/// ggml's ARM build with FP16 arithmetic multiplies and accumulates F16 rows in f16 lanes
/// (`vfmaq_f16`): its F16 dot products carry f16 rounding, machine epsilon 2^-10.
fn reference_eps(fixture: &str, ty: GgmlType) -> f64 {
    if fixture == ARM && ty == T::F16 {
        2f64.powi(-10)
    } else {
        EPS
    }
}

/// Distance between two finite f32 in units in the last place.
fn ulps(a: f32, b: f32) -> u64 {
    let key = |x: f32| {
        let bits = x.to_bits() as i64;
        if bits & 0x8000_0000 != 0 {
            -(bits & 0x7fff_ffff)
        } else {
            bits
        }
    };
    key(a).abs_diff(key(b))
}

/// Largest difference seen for one weight type and kernel table.
#[derive(Default)]
struct Worst {
    cases: usize,
    differing: usize,
    ulps: u64,
    /// |ours - ggml| / tolerance
    of_tolerance: f64,
}

#[test]
fn dot_kernels_match_ggml() {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for case in cases() {
        check_dots(&case, &mut report, &mut failures);
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn check_dots(case: &Case, report: &mut Vec<String>, failures: &mut Vec<String>) {
    let f = open(case.fixture);
    let (_, input, input_len) = tensor(&f, "act.input", T::F32);
    let k = case.k;
    for ty in WEIGHTS {
        let act = vec_dot_type(ty).unwrap();
        let (_, wb, w_len) = tensor(&f, &format!("w.{}", ty.name()), ty);
        let (a_info, ab, a_len) = if act == T::F32 {
            tensor(&f, "act.input", T::F32)
        } else {
            tensor(&f, &format!("act.{}", act.name()), act)
        };
        let a_rows = a_info.dims[1] as usize;
        assert_eq!(input.len() / 4 / input_len, a_rows);
        let w_rows = wb.len() / ty.row_bytes(w_len as u64).unwrap() as usize;
        let (d_info, db, _) = tensor(&f, &format!("dot.{}", ty.name()), T::F32);
        assert_eq!(d_info.dims[..2], [a_rows as u64, w_rows as u64]);
        let want = f32s(db);
        let lengths: Vec<usize> = match f
            .metadata()
            .get_array(&format!("dot.{}.lengths", ty.name()))
        {
            Some(gguf::ArrayValue::U32(v)) => v.iter().map(|&n| n as usize).collect(),
            other => panic!("dot.{}.lengths: {other:?}", ty.name()),
        };
        assert_eq!(want.len(), lengths.len() * w_rows * a_rows);

        let mut worst = Worst::default();
        let mut want = want.into_iter();
        for &n in &lengths {
            assert!(n <= w_len && n <= a_len);
            let wr = ty.row_bytes(n as u64).unwrap() as usize;
            let ar = act.row_bytes(n as u64).unwrap() as usize;
            for wi in 0..w_rows {
                let w_stride = wb.len() / w_rows;
                let w = &wb[wi * w_stride..wi * w_stride + wr];
                for ai in 0..a_rows {
                    let a_stride = ab.len() / a_rows;
                    let a = &ab[ai * a_stride..ai * a_stride + ar];
                    let expect = want.next().unwrap();
                    let tol = tolerance(
                        ty,
                        n,
                        magnitude(ty, n, w, a),
                        reference_eps(case.fixture, ty),
                    );
                    let got = k.dot(ty).expect("dot kernel registered")(n, w, a);
                    let diff = (f64::from(got) - f64::from(expect)).abs();
                    worst.cases += 1;
                    if got.to_bits() != expect.to_bits() {
                        worst.differing += 1;
                        worst.ulps = worst.ulps.max(ulps(got, expect));
                        worst.of_tolerance = worst.of_tolerance.max(diff / tol);
                    }
                    let what = format!(
                        "{ty} {} vs {} n={n} weight row {wi} activation row {ai}: ours {got:e} ggml {expect:e}",
                        k.name(),
                        case.fixture
                    );
                    if case.exact {
                        if got.to_bits() != expect.to_bits() {
                            failures.push(format!("{what}: not bit-identical"));
                        }
                    } else if diff > tol {
                        failures.push(format!("{what}: beyond tolerance {tol:e}"));
                    }
                }
            }
        }
        report.push(format!(
            "{:>7} {:>6} vs {}: {:>3} of {:>3} differ, max {:>4} ulps, {:.3} of tolerance",
            ty.name(),
            k.name(),
            case.fixture,
            worst.differing,
            worst.cases,
            worst.ulps,
            worst.of_tolerance
        ));
    }
}

#[test]
fn fixtures_cover_every_dot_kernel() {
    for name in [X86, ARM] {
        let f = open(name);
        for ty in GgmlType::ALL {
            let has_kernel = Kernels::scalar().dot(*ty).is_some();
            let in_fixture = f.tensor(&format!("dot.{}", ty.name())).is_some();
            assert_eq!(
                has_kernel, in_fixture,
                "{ty}: kernel registered {has_kernel}, {name} reference {in_fixture}"
            );
            assert_eq!(WEIGHTS.contains(ty), has_kernel, "{ty}");
        }
    }
}

/// The scalar table's dot products against the ARM reference too, on every machine (the
/// NEON table's exact check runs only on aarch64, under qemu in CI).
#[test]
fn scalar_dots_within_tolerance_of_the_arm_reference() {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let case = Case {
        fixture: ARM,
        k: Kernels::scalar(),
        exact: false,
        quantizers: false,
    };
    check_dots(&case, &mut report, &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// llama.cpp's ARM build quantizes Q8_K activations rounding the exact product `iscale · x`
/// (GCC fuses it): on the near-halves of `tie.x` its bytes (`tie.q8_K`) are those of
/// [`quant::kernels::quantize_row_q8_k_fused`] on every target, and not those of the x86
/// rounding (the scalar table's), which the data tells apart.
#[test]
fn arm_q8_k_quantizer_matches_ggml_aarch64() {
    let f = open(ARM);
    let (_, xb, cols) = tensor(&f, "tie.x", T::F32);
    let x = f32s(xb);
    let (_, want, _) = tensor(&f, "tie.q8_K", T::Q8_K);
    let rb = T::Q8_K.row_bytes(cols as u64).unwrap() as usize;
    let mut parted = 0;
    for (r, (row, want)) in x.chunks_exact(cols).zip(want.chunks_exact(rb)).enumerate() {
        let mut got = vec![0u8; rb];
        quant::kernels::quantize_row_q8_k_fused(row, &mut got);
        assert!(
            got == want,
            "row {r}: the fused Q8_K bytes differ from llama.cpp aarch64's"
        );
        parted += usize::from(quantize(Kernels::scalar(), T::Q8_K, row) != want);
    }
    assert!(
        parted > 0,
        "the near-halves did not tell the two roundings apart"
    );
    let k = Kernels::detect();
    if k.isa() == Isa::Neon {
        for (row, want) in x.chunks_exact(cols).zip(want.chunks_exact(rb)) {
            assert!(
                quantize(k, T::Q8_K, row) == want,
                "the NEON table's Q8_K quantizer"
            );
        }
    }
}

/// llama.cpp's ARM Q8_0 quantizer (NEON `quantize_row_q8_0`), for finite input: `d = amax /
/// 127` and the quants `x · (1 / d)` rounded to nearest even. (The x86 one, and the scalar
/// table's, multiply by `127 / amax`, which differs in the last bit now and then.)
fn arm_quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 34);
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(half::f16::from_f32(d).to_le_bytes());
        out.extend(b.iter().map(|v| (v * id).round_ties_even() as i8 as u8));
    }
    out
}

/// llama.cpp's ARM build multiplies a plain Q4_0 / Q8_0 weight the repack declines (`tb.<t>.w`:
/// 6 rows of 1024, in the default buffer) by 2 and 5 activation rows (`rp.x`) in
/// `tinyBLAS_Q0_ARM` (`tb.<t>.y<n>`). The scalar reference of that order
/// ([`quant::kernels::arm_q0_reference`]) gives its bits on every target, the activation rows
/// quantized as llama.cpp's ARM build does ([`arm_quantize_q8_0`]).
#[test]
fn arm_q0_reference_matches_ggml_aarch64_tinyblas() {
    let f = open(ARM);
    let (_, xb, cols) = tensor(&f, "rp.x", T::F32);
    let x = f32s(xb);
    let mut failures = Vec::new();
    for ty in [T::Q4_0, T::Q8_0] {
        let (info, w, len) = tensor(&f, &format!("tb.{}.w", ty.name()), ty);
        assert_eq!(len, cols);
        let rows = info.dims[1] as usize;
        let rb = w.len() / rows;
        let dot = quant::kernels::arm_q0_reference(ty).unwrap();
        for n_tok in [2usize, 5] {
            let (_, yb, _) = tensor(&f, &format!("tb.{}.y{n_tok}", ty.name()), T::F32);
            let want = f32s(yb);
            for t in 0..n_tok {
                let a = arm_quantize_q8_0(&x[t * cols..(t + 1) * cols]);
                for r in 0..rows {
                    let g = dot(cols, &w[r * rb..(r + 1) * rb], &a);
                    let e = want[t * rows + r];
                    if g.to_bits() != e.to_bits() {
                        failures.push(format!(
                            "{ty} {n_tok} tokens: token {t} row {r}: ours {g:e} ggml {e:e}"
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The product of the `rows` weight rows `w` with the first `n_tok` rows of `x` as the engine
/// forms it (one token: `matvec_with` with the kernels of `kernel.order.single_row()`; more:
/// `matmul_with`), compared with llama.cpp's `want` bit for bit; each differing output is a
/// line in `failures`.
#[cfg(target_arch = "aarch64")]
#[allow(clippy::too_many_arguments)]
fn check_product(
    label: &str,
    kernel: &quant::RowKernel,
    w: &[u8],
    (rows, cols): (usize, usize),
    x: &[f32],
    n_tok: usize,
    want: &[f32],
    failures: &mut Vec<String>,
) {
    use quant::{RowKernel, ThreadPool, matmul_with, matvec_with};
    let pool = ThreadPool::new(1).unwrap();
    let mut out = vec![0f32; rows * n_tok];
    let mut scratch = Vec::new();
    let xs = &x[..cols * n_tok];
    if n_tok == 1 {
        let k = Kernels::detect();
        let one = RowKernel::lookup_in(k, kernel.wtype, kernel.order.single_row()).unwrap();
        matvec_with(&pool, &one, w, rows, cols, xs, &mut out, &mut scratch).unwrap();
    } else {
        matmul_with(
            &pool,
            kernel,
            w,
            rows,
            cols,
            xs,
            n_tok,
            &mut out,
            &mut scratch,
        )
        .unwrap();
    }
    for (i, (g, e)) in out.iter().zip(want).enumerate() {
        if g.to_bits() != e.to_bits() {
            failures.push(format!(
                "{label}: token {} row {}: ours {g:e} ggml {e:e}",
                i / rows,
                i % rows
            ));
        }
    }
}

/// On aarch64: the NEON table multiplies those weights (`tb.<t>.w`) by 1, 2 and 5 activation
/// rows with the kernels [`Kernels::order_for`] picks (vec_dot for one row, tinyBLAS from two)
/// and gives llama.cpp's ARM products (`tb.<t>.y<n>`) bit for bit.
#[cfg(target_arch = "aarch64")]
#[test]
fn plain_q0_products_match_ggml_aarch64() {
    let k = Kernels::detect();
    assert_eq!(k.isa(), Isa::Neon, "the CI emulates a Cortex-A76");
    let f = open(ARM);
    let (_, xb, cols) = tensor(&f, "rp.x", T::F32);
    let x = f32s(xb);
    let mut failures = Vec::new();
    for ty in [T::Q4_0, T::Q8_0] {
        let (info, w, _) = tensor(&f, &format!("tb.{}.w", ty.name()), ty);
        let rows = info.dims[1] as usize;
        assert_eq!(
            k.order_for(ty, rows, cols, false),
            quant::SumOrder::TinyBlas
        );
        let kernel = quant::RowKernel::for_weight(k, ty, rows, cols, false).unwrap();
        for n_tok in [1usize, 2, 5] {
            let (_, yb, _) = tensor(&f, &format!("tb.{}.y{n_tok}", ty.name()), T::F32);
            let label = format!("{ty} {n_tok} tokens");
            let want = f32s(yb);
            check_product(
                &label,
                &kernel,
                w,
                (rows, cols),
                &x,
                n_tok,
                &want,
                &mut failures,
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// On aarch64: the NEON table's products of the weights llama.cpp's ARM build repacks
/// (`rp.<t>.w`: Q4_0, Q8_0, IQ4_NL and MXFP4 4x4, Q4_K, Q5_K and Q6_K 8x4, 8 rows of 1024)
/// with 1, 4 and 5 activation rows (`rp.x`) equal that build's matrix products
/// (`rp.<t>.y<n>`, computed through its CPU_REPACK buffer: gemv for one row, gemm for four,
/// gemm and gemv for five) bit for bit, through the kernels [`Kernels::order_for`] picks for
/// such a weight; so do the k-quants' gemm products of the Q8_K near-halves (`tie.<t>.y4`).
#[cfg(target_arch = "aarch64")]
#[test]
fn repacked_products_match_ggml_aarch64() {
    let k = Kernels::detect();
    assert_eq!(k.isa(), Isa::Neon, "the CI emulates a Cortex-A76");
    let f = open(ARM);
    let (_, xb, cols) = tensor(&f, "rp.x", T::F32);
    let x = f32s(xb);
    let (_, tb, _) = tensor(&f, "tie.x", T::F32);
    let tie = f32s(tb);
    let mut failures = Vec::new();
    for ty in [
        T::Q4_0,
        T::Q8_0,
        T::Q4_K,
        T::Q5_K,
        T::Q6_K,
        T::IQ4_NL,
        T::MXFP4,
    ] {
        let (info, w, len) = tensor(&f, &format!("rp.{}.w", ty.name()), ty);
        assert_eq!(len, cols);
        let rows = info.dims[1] as usize;
        assert_eq!(
            k.order_for(ty, rows, cols, false),
            quant::SumOrder::Repacked,
            "{ty}"
        );
        let kernel = quant::RowKernel::for_weight(k, ty, rows, cols, false).unwrap();
        if ty.block_size() == 256 {
            let (_, yb, _) = tensor(&f, &format!("tie.{}.y4", ty.name()), T::F32);
            let label = format!("{ty} near-halves");
            let want = f32s(yb);
            check_product(
                &label,
                &kernel,
                w,
                (rows, cols),
                &tie,
                4,
                &want,
                &mut failures,
            );
        }
        for n_tok in [1usize, 4, 5] {
            let (_, yb, _) = tensor(&f, &format!("rp.{}.y{n_tok}", ty.name()), T::F32);
            let label = format!("{ty} {n_tok} tokens");
            let want = f32s(yb);
            check_product(
                &label,
                &kernel,
                w,
                (rows, cols),
                &x,
                n_tok,
                &want,
                &mut failures,
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The IQ panel product (x86 fixture): 16 weight rows of each panel type times 7, 8 and 9
/// activation rows, through `matmul_with` with the kernels llama.cpp's choice gives (the
/// panel order from 8 rows, `vec_dot` below), bit for bit; and the panel's results are not
/// `vec_dot`'s (so the fixture tells the two orders apart).
#[test]
fn iq_panel_products_match_ggml() {
    let f = open(X86);
    let (_, xb, cols) = tensor(&f, "iqp.x", T::F32);
    let x = f32s(xb);
    let pool = quant::ThreadPool::new(1).unwrap();
    let mut tables = vec![Kernels::scalar()];
    if Kernels::detect().isa() == Isa::Avx2 {
        tables.push(Kernels::detect());
    }
    let mut apart = 0;
    for ty in [
        T::IQ1_S,
        T::IQ1_M,
        T::IQ2_XXS,
        T::IQ2_XS,
        T::IQ2_S,
        T::IQ3_XXS,
        T::IQ3_S,
        T::IQ4_XS,
    ] {
        let (info, w, wcols) = tensor(&f, &format!("iqp.{}.w", ty.name()), ty);
        assert_eq!(wcols, cols);
        let rows = info.dims[1] as usize;
        for k in &tables {
            let order = k.order_for(ty, rows, cols, false);
            assert_eq!(order, quant::SumOrder::IqPanel, "{ty}");
            for n_tok in [7, 8, 9] {
                let (_, yb, _) = tensor(&f, &format!("iqp.{}.y{n_tok}", ty.name()), T::F32);
                let want = f32s(yb);
                let o = if n_tok >= k.min_tokens(order, ty) {
                    order
                } else {
                    order.single_row()
                };
                let kernel = quant::RowKernel::lookup_in(k, ty, o).unwrap();
                let mut out = vec![0f32; rows * n_tok];
                let mut scratch = Vec::new();
                quant::matmul_with(
                    &pool,
                    &kernel,
                    w,
                    rows,
                    cols,
                    &x[..n_tok * cols],
                    n_tok,
                    &mut out,
                    &mut scratch,
                )
                .unwrap();
                // (the scalar IQ4_XS vec_dot sums in its own order: `dot_kernels_match_ggml`
                // holds it to a tolerance)
                let exact = n_tok >= 8 || k.isa() == Isa::Avx2 || ty != T::IQ4_XS;
                for (i, (g, e)) in out.iter().zip(&want).enumerate().filter(|_| exact) {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{ty} {n_tok} rows, output {i} ({:?}): {g} vs {e}",
                        k.isa()
                    );
                }
                if n_tok >= 8 {
                    let plain = quant::RowKernel::lookup(k, ty).unwrap();
                    quant::matmul_with(
                        &pool,
                        &plain,
                        w,
                        rows,
                        cols,
                        &x[..n_tok * cols],
                        n_tok,
                        &mut out,
                        &mut scratch,
                    )
                    .unwrap();
                    apart += out
                        .iter()
                        .zip(&want)
                        .filter(|(g, e)| g.to_bits() != e.to_bits())
                        .count();
                }
            }
        }
    }
    assert!(
        apart > 0,
        "vec_dot gives the panel's bits everywhere: the fixture does not test the order"
    );
}
