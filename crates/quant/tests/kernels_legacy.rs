//! Dot kernels for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 and the
//! activation quantizers Q8_0, Q8_1, F16, BF16, F32.
//!
//! Tolerances. Every kernel computes exact integer (or exact f32-product) block sums; what
//! differs between implementations is f32 rounding of the scale products and of the
//! running sums. Let `S` = Σ |weight value| · |activation value| over the row (for
//! Q4_1 / Q5_1 the weight value's `|d·q|` and `|m|` counted separately, plus Σ|m·s|) and
//! `C` the longest chain of f32 roundings any term goes through in either implementation:
//! `n/32 + 3` for the block types (a scale product, the per-block accumulation, the lane
//! reduction), `n/32 + 5 + n % 32` for the float types (lane chains, the reduction, an
//! f32 tail). The standard summation bound gives |error| ≤ C · ε/2 · S per
//! implementation, ε = f32::EPSILON; we allow `2 · (C + 4) · ε · S` (twice the sum of two
//! such bounds) plus 1e-30 absolute. Against the f64 dot of the dequantized rows, Q4_1 /
//! Q5_1 additionally differ by Σ_b |m_b| · |s_b − d_b·Σ_j q_bj|: the Q8_1 block sum `s` is
//! stored as f16 and computed from the unrounded scale, while the dequantized activations
//! are `d·q`.

mod common;

use common::Rng;
use proptest::prelude::*;
use quant::dequant::dequantize_row;
use quant::tables::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half};
use quant::{GgmlType, Isa, Kernels, vec_dot_type};

const EPS: f64 = f32::EPSILON as f64;

/// Weight types whose kernels live in this family.
const WEIGHTS: [GgmlType; 10] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::MXFP4,
];

fn f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

fn f16_val(b: [u8; 2]) -> f64 {
    f64::from(half::f16::from_bits(u16::from_le_bytes(b)).to_f32())
}

// ---------------------------------------------------------------------------------------
// Inputs.

/// A random valid weight row of `n` elements.
fn weight_row(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 => {
            for _ in 0..n {
                out.extend_from_slice(&rng.normal().to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for _ in 0..n {
                out.extend_from_slice(&f16_bits(rng.normal()).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for _ in 0..n {
                out.extend_from_slice(&((rng.normal().to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        _ => {
            let bytes = ty.type_size();
            for _ in 0..n / 32 {
                let start = out.len();
                out.extend((0..bytes).map(|_| rng.byte()));
                let b = &mut out[start..];
                match ty {
                    GgmlType::MXFP4 => b[0] = 100 + rng.below(51) as u8,
                    GgmlType::Q4_1 | GgmlType::Q5_1 => {
                        b[..2].copy_from_slice(&rng.f16_scale());
                        b[2..4].copy_from_slice(&rng.f16_scale());
                    }
                    _ => b[..2].copy_from_slice(&rng.f16_scale()),
                }
            }
        }
    }
    out
}

/// Random activations: blocks of normals with a random magnitude, all-zero blocks,
/// blocks built to hit exact .5 ties, sparse blocks. Magnitudes stay below ~2000 so that a
/// Q8_1 block sum `d·Σq` (up to 32·amax) fits in f16.
fn activations(n: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x = Vec::with_capacity(n);
    while x.len() < n {
        let len = (n - x.len()).min(32);
        let scale = 10f32.powf(rng.unit() as f32 * 5.0 - 3.0);
        match rng.below(5) {
            0 => x.extend((0..len).map(|_| 0.0)),
            1 => {
                // amax = 127·2^e makes the multiplier exactly 2^-e, so (m + 0.5)·2^e is a tie.
                let p = 2f32.powi(rng.below(14) as i32 - 10);
                let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
                x.push(sign * 127.0 * p);
                x.extend((1..len).map(|_| (rng.below(254) as f32 - 127.0 + 0.5) * p));
            }
            2 => x.extend((0..len).map(|_| {
                if rng.below(4) == 0 {
                    rng.normal() * scale
                } else {
                    0.0
                }
            })),
            _ => x.extend((0..len).map(|_| rng.normal() * scale)),
        }
    }
    x
}

/// Arbitrary f32 bit patterns mixed with NaN, infinities, signed zeros and subnormals.
fn wild_values(n: usize, rng: &mut Rng) -> Vec<f32> {
    let tiny = rng.below(4) == 0;
    (0..n)
        .map(|_| match rng.below(12) {
            0 => f32::NAN,
            1 => f32::from_bits(0x7f80_0001 + rng.below(0x7f_fffe) as u32), // signalling NaN
            2 => f32::INFINITY,
            3 => f32::NEG_INFINITY,
            4 => -0.0,
            5 => f32::from_bits(rng.below(0x80_0000) as u32), // subnormal
            _ if tiny => f32::from_bits(rng.below(0x0300_0000) as u32),
            _ => f32::from_bits(rng.next() as u32),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// References.

fn quantize(k: &Kernels, ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let q = k.quantize(ty).expect("quantizer registered");
    let mut out = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    q(x, &mut out);
    out
}

/// The activation row as real numbers (Q8_0 / Q8_1: d·q; floats: their value).
fn act_values(ty: GgmlType, b: &[u8]) -> Vec<f64> {
    match ty {
        GgmlType::F32 => b
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        GgmlType::F16 => b.chunks_exact(2).map(|c| f16_val([c[0], c[1]])).collect(),
        GgmlType::BF16 => b
            .chunks_exact(2)
            .map(|c| {
                f64::from(f32::from_bits(
                    u32::from(u16::from_le_bytes([c[0], c[1]])) << 16,
                ))
            })
            .collect(),
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            let (bytes, qs) = if ty == GgmlType::Q8_0 {
                (34, 2)
            } else {
                (36, 4)
            };
            b.chunks_exact(bytes)
                .flat_map(|blk| {
                    let d = f16_val([blk[0], blk[1]]);
                    blk[qs..].iter().map(move |&q| d * f64::from(q as i8))
                })
                .collect()
        }
        other => panic!("not an activation type: {other}"),
    }
}

/// Per element: |scale·quant| plus |min| (Q4_1 / Q5_1), i.e. the magnitudes the kernels
/// add up; for the other types simply |weight|.
fn weight_magnitudes(ty: GgmlType, b: &[u8]) -> Vec<f64> {
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            let mut w = vec![0f32; b.len() / ty.type_size()];
            dequantize_row(ty, b, &mut w).unwrap();
            out.extend(w.iter().map(|v| f64::from(*v).abs()));
        }
        _ => {
            for blk in b.chunks_exact(ty.type_size()) {
                let (d, m, q): (f64, f64, [f64; 32]) = match ty {
                    GgmlType::Q8_0 => (
                        f16_val([blk[0], blk[1]]),
                        0.0,
                        std::array::from_fn(|j| f64::from(blk[2 + j] as i8)),
                    ),
                    GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::IQ4_NL => {
                        let off = if ty == GgmlType::Q4_1 { 4 } else { 2 };
                        let m = if ty == GgmlType::Q4_1 {
                            f16_val([blk[2], blk[3]])
                        } else {
                            0.0
                        };
                        let nib = |j: usize| {
                            let v = blk[off + j % 16];
                            usize::from(if j < 16 { v & 15 } else { v >> 4 })
                        };
                        let q = std::array::from_fn(|j| match ty {
                            GgmlType::Q4_0 => nib(j) as f64 - 8.0,
                            GgmlType::Q4_1 => nib(j) as f64,
                            _ => f64::from(KVALUES_IQ4NL[nib(j)]),
                        });
                        (f16_val([blk[0], blk[1]]), m, q)
                    }
                    GgmlType::Q5_0 | GgmlType::Q5_1 => {
                        let one = ty == GgmlType::Q5_1;
                        let (qh_at, qs) = if one { (4, 8) } else { (2, 6) };
                        let qh = u32::from_le_bytes(blk[qh_at..qh_at + 4].try_into().unwrap());
                        let m = if one { f16_val([blk[2], blk[3]]) } else { 0.0 };
                        let q = std::array::from_fn(|j| {
                            let v = blk[qs + j % 16];
                            let lo = u32::from(if j < 16 { v & 15 } else { v >> 4 });
                            let q = lo | (((qh >> j) & 1) << 4);
                            q as f64 - if one { 0.0 } else { 16.0 }
                        });
                        (f16_val([blk[0], blk[1]]), m, q)
                    }
                    GgmlType::MXFP4 => {
                        let q = std::array::from_fn(|j| {
                            let v = blk[1 + j % 16];
                            f64::from(
                                KVALUES_MXFP4[usize::from(if j < 16 { v & 15 } else { v >> 4 })],
                            )
                        });
                        (f64::from(e8m0_to_f32_half(blk[0])), 0.0, q)
                    }
                    other => panic!("unexpected weight type {other}"),
                };
                out.extend(q.iter().map(|q| (d * q).abs() + m.abs()));
            }
        }
    }
    out
}

struct Case {
    ty: GgmlType,
    n: usize,
    w: Vec<u8>,
    a: Vec<u8>,
}

impl Case {
    fn new(ty: GgmlType, n: usize, seed: u64) -> Case {
        let mut rng = Rng(seed);
        let w = weight_row(ty, n, &mut rng);
        let x = activations(n, &mut rng);
        let a = quantize(Kernels::scalar(), vec_dot_type(ty).unwrap(), &x);
        Case { ty, n, w, a }
    }

    /// `S` of the module docs.
    fn magnitude(&self) -> f64 {
        let act = vec_dot_type(self.ty).unwrap();
        let av = act_values(act, &self.a);
        let wm = weight_magnitudes(self.ty, &self.w);
        let mut s: f64 = wm.iter().zip(&av).map(|(w, a)| w * a.abs()).sum();
        for (m, sb) in self.mins() {
            s += (m * sb).abs();
        }
        s
    }

    /// (m, s) per block for Q4_1 / Q5_1, empty otherwise.
    fn mins(&self) -> Vec<(f64, f64)> {
        if !matches!(self.ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
            return Vec::new();
        }
        let wb = self.w.chunks_exact(self.ty.type_size());
        let ab = self.a.chunks_exact(36);
        wb.zip(ab)
            .map(|(w, a)| (f16_val([w[2], w[3]]), f16_val([a[2], a[3]])))
            .collect()
    }

    /// Σ_b |m_b| · |s_b − Σ_j d_b q_bj| (the Q8_1 stored-sum discrepancy).
    fn min_sum_error(&self) -> f64 {
        let av = act_values(GgmlType::Q8_1, &self.a);
        self.mins()
            .iter()
            .zip(av.chunks_exact(32))
            .map(|(&(m, s), a)| m.abs() * (s - a.iter().sum::<f64>()).abs())
            .sum()
    }

    fn reference(&self) -> f64 {
        let mut w = vec![0f32; self.n];
        dequantize_row(self.ty, &self.w, &mut w).unwrap();
        let av = act_values(vec_dot_type(self.ty).unwrap(), &self.a);
        w.iter().zip(&av).map(|(w, a)| f64::from(*w) * a).sum()
    }

    fn tolerance(&self) -> f64 {
        let chain = if self.ty.block_size() == 1 {
            self.n / 32 + 5 + self.n % 32
        } else {
            self.n / 32 + 3
        };
        2.0 * (chain as f64 + 4.0) * EPS * self.magnitude() + 1e-30
    }

    /// The tolerance for table `k` (against the scalar table or the f64 reference). The NEON
    /// F16 kernel accumulates in f16 lanes as ggml's ARM build does: machine epsilon 2^-10
    /// instead of 2^-23 for the same chain, plus f16's absolute spacing below its smallest
    /// normal (2^-24) for every product that lands there.
    fn tolerance_for(&self, k: &Kernels) -> f64 {
        if k.isa() == Isa::Neon && self.ty == GgmlType::F16 {
            let chain = self.n / 32 + 5 + self.n % 32;
            let f16_eps = 2f64.powi(-10);
            2.0 * (chain as f64 + 4.0) * f16_eps * self.magnitude()
                + self.n as f64 * 2f64.powi(-24)
                + self.tolerance()
        } else {
            self.tolerance()
        }
    }

    fn dot(&self, k: &Kernels) -> f32 {
        let f = k.dot(self.ty).expect("dot kernel registered");
        f(self.n, &self.w, &self.a)
    }
}

fn element_counts() -> impl Strategy<Value = (usize, bool)> {
    // (blocks, whether float types also get a ragged tail)
    (1usize..=33, any::<bool>())
}

fn len_for(ty: GgmlType, blocks: usize, ragged: bool, seed: u64) -> usize {
    let block = if ty.block_size() == 1 {
        32
    } else {
        ty.block_size()
    };
    let tail = if ty.block_size() == 1 && ragged {
        (seed % 31) as usize + 1
    } else {
        0
    };
    blocks * block + tail
}

// ---------------------------------------------------------------------------------------
// Dot kernels.

#[test]
fn every_kernel_and_quantizer_is_registered() {
    for k in [Kernels::scalar(), Kernels::detect()] {
        for ty in WEIGHTS {
            assert!(k.dot(ty).is_some(), "{} has no {ty} dot", k.isa().name());
            let act = vec_dot_type(ty).unwrap();
            assert!(
                k.quantize(act).is_some(),
                "{} has no {act} quantizer",
                k.isa().name()
            );
        }
    }
    eprintln!(
        "best kernel table on this machine: {}",
        Kernels::detect().isa().name()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn simd_dot_matches_scalar((blocks, ragged) in element_counts(), seed in any::<u64>()) {
        for ty in WEIGHTS {
            let case = Case::new(ty, len_for(ty, blocks, ragged, seed), seed);
            let s = case.dot(Kernels::scalar());
            let v = case.dot(Kernels::detect());
            let tol = case.tolerance_for(Kernels::detect());
            prop_assert!(
                (f64::from(s) - f64::from(v)).abs() <= tol,
                "{ty} n={}: scalar {s} simd {v} tol {tol}", case.n
            );
        }
    }

    #[test]
    fn scalar_dot_matches_dequantized_f64((blocks, ragged) in element_counts(), seed in any::<u64>()) {
        for ty in WEIGHTS {
            let case = Case::new(ty, len_for(ty, blocks, ragged, seed), seed);
            let want = case.reference();
            for k in [Kernels::scalar(), Kernels::detect()] {
                let got = f64::from(case.dot(k));
                let tol = case.tolerance_for(k) + case.min_sum_error();
                prop_assert!(
                    (got - want).abs() <= tol,
                    "{ty} n={} {}: got {got} want {want} tol {tol}", case.n, k.isa().name()
                );
            }
        }
    }
}

/// One block of each type whose weights are all the same value, against 32 activations of
/// 127 (quantized: scale 1, quants 127; the Q8_1 sum 4064 is exact in f16). Expected:
/// 32 · w · 127, worked out per type in the comments.
#[test]
fn hand_checked_single_blocks() {
    let half = 0x3800u16.to_le_bytes(); // f16 0.5
    let one = 0x3c00u16.to_le_bytes(); // f16 1.0
    let cases: Vec<(GgmlType, Vec<u8>, f32)> = vec![
        // d = 0.5, q = 2 → w = 1
        (GgmlType::Q8_0, [&half[..], &[2u8; 32]].concat(), 4064.0),
        // d = 0.5, nibbles 9 → q - 8 = 1 → w = 0.5
        (GgmlType::Q4_0, [&half[..], &[0x99u8; 16]].concat(), 2032.0),
        // d = 0.5, m = 1, nibbles 1 → w = 1.5
        (
            GgmlType::Q4_1,
            [&half[..], &one, &[0x11u8; 16]].concat(),
            6096.0,
        ),
        // d = 0.5, nibbles 1 with the fifth bit set → 17 - 16 = 1 → w = 0.5
        (
            GgmlType::Q5_0,
            [&half[..], &[0xff; 4], &[0x11u8; 16]].concat(),
            2032.0,
        ),
        // d = 0.5, m = 0, nibbles 0 with the fifth bit set → 16 → w = 8
        (
            GgmlType::Q5_1,
            [&half[..], &[0, 0], &[0xff; 4], &[0u8; 16]].concat(),
            32512.0,
        ),
        // d = 0.5, index 8 → level 1 → w = 0.5
        (
            GgmlType::IQ4_NL,
            [&half[..], &[0x88u8; 16]].concat(),
            2032.0,
        ),
        // e = 127 → 2^-1, index 2 → doubled level 2 → w = 1
        (
            GgmlType::MXFP4,
            [&[127u8][..], &[0x22u8; 16]].concat(),
            4064.0,
        ),
        (GgmlType::F16, half.repeat(32), 2032.0),
        (GgmlType::BF16, 0x3f00u16.to_le_bytes().repeat(32), 2032.0),
        (GgmlType::F32, 0.5f32.to_le_bytes().repeat(32), 2032.0),
    ];
    for (ty, w, want) in cases {
        let a = quantize(Kernels::scalar(), vec_dot_type(ty).unwrap(), &[127.0; 32]);
        for k in [Kernels::scalar(), Kernels::detect()] {
            assert_eq!(
                k.dot(ty).unwrap()(32, &w, &a),
                want,
                "{ty} {}",
                k.isa().name()
            );
        }
    }
}

#[test]
fn all_zero_activations_give_zero() {
    for ty in WEIGHTS {
        let n = 96;
        let mut rng = Rng(7);
        let w = weight_row(ty, n, &mut rng);
        let a = quantize(Kernels::scalar(), vec_dot_type(ty).unwrap(), &[0.0; 96]);
        for k in [Kernels::scalar(), Kernels::detect()] {
            assert_eq!(
                k.dot(ty).unwrap()(n, &w, &a),
                0.0,
                "{ty} {}",
                k.isa().name()
            );
        }
    }
}

#[test]
#[should_panic(expected = "contract")]
fn dot_rejects_short_activation_row() {
    let w = vec![0u8; 2 * 34];
    let a = vec![0u8; 34];
    Kernels::detect().dot(GgmlType::Q8_0).unwrap()(64, &w, &a);
}

#[test]
#[should_panic(expected = "contract")]
fn dot_rejects_partial_block() {
    let w = vec![0u8; 18];
    let a = vec![0u8; 34];
    Kernels::scalar().dot(GgmlType::Q4_0).unwrap()(31, &w, &a);
}

#[test]
#[should_panic(expected = "contract")]
fn float_dot_rejects_length_mismatch() {
    Kernels::detect().dot(GgmlType::F16).unwrap()(3, &[0u8; 6], &[0u8; 4]);
}

// ---------------------------------------------------------------------------------------
// Activation quantizers.

const ACTS: [GgmlType; 5] = [
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// ggml's ARM Q8_0 / Q8_1 quantizer (the NEON table's) against the portable one on finite
/// inputs: the same f16 scale (both `amax / 127`), quants at most one apart (ARM multiplies by
/// `1 / d`, x86 by `127 / amax`, so a value near a rounding tie may round the other way), and
/// the Q8_1 sum is the scale times the ARM quants' own sum. (The exact ARM bytes are checked
/// against llama.cpp's aarch64 build in `kernels_vs_ggml.rs`.)
fn check_arm_q8(ty: GgmlType, scalar: &[u8], arm: &[u8], x: &[f32]) -> Result<(), TestCaseError> {
    let bytes = ty.type_size();
    let qs = bytes - 32;
    for (b, (s, v)) in scalar
        .chunks_exact(bytes)
        .zip(arm.chunks_exact(bytes))
        .enumerate()
    {
        prop_assert_eq!(&s[..2], &v[..2], "{} block {} scale of {:?}", ty, b, x);
        for (j, (&p, &q)) in s[qs..].iter().zip(&v[qs..]).enumerate() {
            let d = (i32::from(p as i8) - i32::from(q as i8)).abs();
            prop_assert!(
                d <= 1,
                "{} block {} quant {}: {} vs {}",
                ty,
                b,
                j,
                p as i8,
                q as i8
            );
        }
        if ty == GgmlType::Q8_1 {
            let sum: i32 = v[qs..].iter().map(|&q| i32::from(q as i8)).sum();
            // the stored sum is f16(d · Σq) with d the unrounded f32 scale `amax / 127`
            let amax = x[32 * b..32 * b + 32]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            let want = half::f16::from_f32(amax / 127.0 * sum as f32).to_le_bytes();
            prop_assert_eq!(&v[2..4], &want[..], "{} block {} sum", ty, b);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn simd_quantizers_match_scalar_bytes(blocks in 0usize..=12, tail in 0usize..32, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        for x in [activations(32 * blocks + tail, &mut rng), wild_values(32 * blocks + tail, &mut rng)] {
            for ty in ACTS {
                let x = if ty.block_size() == 32 { &x[..32 * blocks] } else { &x[..] };
                let s = quantize(Kernels::scalar(), ty, x);
                let v = quantize(Kernels::detect(), ty, x);
                if Kernels::detect().isa() == Isa::Neon && ty.block_size() == 32 {
                    if x.iter().all(|v| v.is_finite()) {
                        check_arm_q8(ty, &s, &v, x)?;
                    }
                } else {
                    prop_assert_eq!(s, v, "{} of {:?}", ty, x);
                }
            }
        }
    }

    #[test]
    fn q8_blocks_bound_the_rounding_error(blocks in 1usize..=8, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let x = activations(32 * blocks, &mut rng);
        for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
            let (bytes, qs) = if ty == GgmlType::Q8_0 { (34, 2) } else { (36, 4) };
            for k in [Kernels::scalar(), Kernels::detect()] {
                let out = quantize(k, ty, &x);
                for (xb, blk) in x.chunks_exact(32).zip(out.chunks_exact(bytes)) {
                    let amax = xb.iter().fold(0f64, |m, v| m.max(f64::from(*v).abs()));
                    let d_exact = amax / 127.0;
                    let d = f16_val([blk[0], blk[1]]);
                    // The stored scale is the f16 nearest to amax / 127.
                    prop_assert!((d - d_exact).abs() <= d_exact * 2f64.powi(-11) + 2f64.powi(-25));
                    let q: Vec<i32> = blk[qs..].iter().map(|&b| i32::from(b as i8)).collect();
                    for (&v, &q) in xb.iter().zip(&q) {
                        prop_assert!(q.abs() <= 127);
                        if amax > 0.0 {
                            // q is x / (amax/127) rounded to nearest: within half a step
                            // (plus the f32 rounding of the multiplier and product).
                            let t = f64::from(v) * 127.0 / amax;
                            prop_assert!((t - f64::from(q)).abs() <= 0.5 + 1e-4, "x {v} q {q} amax {amax}");
                        } else {
                            prop_assert_eq!(q, 0);
                        }
                    }
                    if amax > 0.0 {
                        // The element of largest magnitude maps to ±127.
                        prop_assert!(q.iter().any(|q| q.abs() == 127));
                    }
                    if ty == GgmlType::Q8_1 {
                        let sum: i32 = q.iter().sum();
                        let want = d_exact * f64::from(sum);
                        let s = f16_val([blk[2], blk[3]]);
                        prop_assert!(
                            (s - want).abs() <= want.abs() * (2f64.powi(-11) + 1e-6) + 2f64.powi(-25),
                            "s {s} want {want} sum {sum} d {d_exact}"
                        );
                    }
                }
            }
        }
    }
}

/// Inputs with max |x| = 127 (scale 1, multiplier exactly 1) and 254 (multiplier exactly
/// 1/2), so every quant is x or x/2 rounded by hand, ties to even: 0.5 → 0, 1.5 → 2,
/// 2.5 → 2 (C `roundf` would give 1, 2, 3).
#[test]
fn q8_hand_checked_blocks() {
    let mut x = [0f32; 64];
    x[..10].copy_from_slice(&[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.4, -3.6, 100.49]);
    x[32..39].copy_from_slice(&[-254.0, 3.0, 5.0, -3.0, -5.0, 1.0, 0.99]);
    let mut q0 = [0i8; 32];
    q0[..10].copy_from_slice(&[127, 0, 2, 2, 0, -2, -2, 3, -4, 100]);
    let mut q1 = [0i8; 32];
    q1[..7].copy_from_slice(&[-127, 2, 2, -2, -2, 0, 0]);
    let one = 0x3c00u16.to_le_bytes(); // f16 1.0
    let two = 0x4000u16.to_le_bytes(); // f16 2.0
    for k in [Kernels::scalar(), Kernels::detect()] {
        let out = quantize(k, GgmlType::Q8_0, &x);
        assert_eq!(out[..2], one);
        assert_eq!(out[2..34], q0.map(|v| v as u8));
        assert_eq!(out[34..36], two);
        assert_eq!(out[36..68], q1.map(|v| v as u8));

        let out = quantize(k, GgmlType::Q8_1, &x);
        assert_eq!(out[..2], one);
        // s = d · Σq = 1 · 226 and 2 · (−127) = −254, both exact in f16.
        assert_eq!(out[2..4], f16_bits(226.0).to_le_bytes());
        assert_eq!(out[4..36], q0.map(|v| v as u8));
        assert_eq!(out[36..38], two);
        assert_eq!(out[38..40], f16_bits(-254.0).to_le_bytes());
        assert_eq!(out[40..72], q1.map(|v| v as u8));
    }
}

/// Half and bfloat16 rounding, checked by hand: 1 + 2^-11 is the tie between 1 and the
/// next f16 (1 + 2^-10) and rounds to even (1.0 = 0x3c00); 1 + 3·2^-11 rounds up to
/// 1 + 2^-9 (0x3c02); 65520 overflows to infinity (0x7c00). For bf16, 1 + 2^-8 is a tie
/// → 0x3f80, 1 + 3·2^-8 → 0x3f82, and a NaN keeps its top bits with the quiet bit set.
#[test]
fn f16_bf16_hand_checked() {
    let x = [
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        65520.0,
        -0.0,
    ];
    let want: [u16; 4] = [0x3c00, 0x3c02, 0x7c00, 0x8000];
    let y = [
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        f32::from_bits(0x7f80_0001),
        -2.0,
    ];
    let want_bf: [u16; 4] = [0x3f80, 0x3f82, 0x7fc0, 0xc000];
    for k in [Kernels::scalar(), Kernels::detect()] {
        let h = quantize(k, GgmlType::F16, &x);
        let got: Vec<u16> = h
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, want);
        let b = quantize(k, GgmlType::BF16, &y);
        let got: Vec<u16> = b
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, want_bf);
        let f = quantize(k, GgmlType::F32, &x);
        assert_eq!(
            f,
            x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()
        );
    }
}

/// NaN handling, worked out by hand from ggml's x86 code. The block maximum is reduced
/// with x86 `max` (second operand unless the first is greater), lane-wise over the four
/// 8-element vectors, then halves, then pairs: a NaN at element 5 is dropped (amax = 1,
/// d = f16(1/127) = 0x2008, quant -128 only at element 5); a NaN at element 27 survives
/// every step, so the multiplier is NaN, every quant is x86's "integer indefinite"
/// (i32::MIN) saturated to -128 and the f16 scale is NaN, written as ggml's canonical
/// 0x7e00. Q8_1 sums: 31·127 + i32::MIN scaled by 1/127 overflows f16 to -inf (0xfc00);
/// 32 × i32::MIN wraps to 0 and NaN·0 is NaN (0x7e00). F16 rows: the first `n - n % 4`
/// elements go through F16C, which keeps the top payload bits (0x7fc02000 → 0x7e01); the
/// rest through the portable conversion (→ 0x7e00).
#[test]
fn nan_inputs_hand_checked() {
    let nan = f32::from_bits(0x7fc0_2000);
    let mut x = [1.0f32; 64];
    x[5] = nan;
    x[32 + 27] = nan;
    let mut qa = [127u8; 32];
    qa[5] = 0x80;
    // (x86 semantics: the NEON table follows ARM's conversions, not checked here)
    let tables = [Kernels::scalar(), Kernels::detect()];
    for k in tables.into_iter().filter(|k| k.isa() != Isa::Neon) {
        let q0 = quantize(k, GgmlType::Q8_0, &x);
        assert_eq!(q0[..2], 0x2008u16.to_le_bytes());
        assert_eq!(q0[2..34], qa);
        assert_eq!(q0[34..36], 0x7e00u16.to_le_bytes());
        assert!(q0[36..].iter().all(|&b| b == 0x80));
        let q1 = quantize(k, GgmlType::Q8_1, &x);
        assert_eq!(q1[..4], [0x08, 0x20, 0x00, 0xfc]);
        assert_eq!(q1[4..36], qa);
        assert_eq!(q1[36..40], [0x00, 0x7e, 0x00, 0x7e]);
        assert!(q1[40..].iter().all(|&b| b == 0x80));

        let h = quantize(k, GgmlType::F16, &[nan, 1.0, 1.0, 1.0, nan, -nan]);
        let got: Vec<u16> = h
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, [0x7e01, 0x3c00, 0x3c00, 0x3c00, 0x7e00, 0xfe00]);
    }
}

#[test]
#[should_panic(expected = "contract")]
fn quantizer_rejects_wrong_output_length() {
    let mut out = vec![0u8; 33];
    Kernels::detect().quantize(GgmlType::Q8_0).unwrap()(&[0.0; 32], &mut out);
}
