//! Each op against a float64 reference computed here, SIMD against scalar, and the ggml
//! conventions (pairing, tie order, f16 rounding) on hand-checkable inputs.

use engine::ops::{self, Gating, KvCache, KvType, Rope, RopeConfig, RopeMode};
use half::f16;
use proptest::prelude::*;
use quant::ThreadPool;

/// Deterministic pseudo-random values in [-1, 1) (xorshift64*).
fn rand_vec(seed: u64, n: usize, amp: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
            (r as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
        })
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - y).abs())
        .fold(0.0, f64::max)
}

const F32_EPS: f64 = f32::EPSILON as f64;

// ---------- rms_norm ----------

#[test]
fn rms_norm_matches_f64() {
    let n = 200;
    let x = rand_vec(1, 3 * n, 3.0);
    let w = rand_vec(2, n, 1.5);
    let eps = 1e-6f32;
    let mut out = vec![0f32; 3 * n];
    ops::rms_norm(&x, &w, eps, &mut out);
    let mut inplace = x.clone();
    ops::rms_norm_inplace(&mut inplace, &w, eps);
    assert_eq!(out, inplace);
    for r in 0..3 {
        let xr = &x[r * n..(r + 1) * n];
        let ms = xr.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64;
        let s = 1.0 / (ms + f64::from(eps)).sqrt();
        let want: Vec<f64> = xr
            .iter()
            .zip(&w)
            .map(|(&v, &wi)| f64::from(v) * s * f64::from(wi))
            .collect();
        for (o, e) in out[r * n..(r + 1) * n].iter().zip(&want) {
            // four f32 roundings (square/mean, sqrt, divide, two multiplies) at most
            assert!(
                (f64::from(*o) - e).abs() <= 6.0 * F32_EPS * e.abs() + 1e-30,
                "{o} vs {e}"
            );
        }
    }
}

// ---------- exp / silu / swiglu / softmax ----------

#[test]
fn exp_ggml_error_bound_and_special_values() {
    let mut worst = 0f64;
    let mut x = -103.0f32;
    while x < 88.0 {
        let got = f64::from(ops::exp_ggml(x));
        let want = f64::from(x).exp();
        if want > f64::from(f32::MIN_POSITIVE) && want < f64::from(f32::MAX) {
            worst = worst.max((got - want).abs() / want);
        }
        x += 0.000_731;
    }
    // ggml documents about 1.5 ulp; an ulp is at most 2^-23 relative
    assert!(worst < 2.0 * F32_EPS, "max relative error {worst:e}");
    assert_eq!(ops::exp_ggml(f32::NEG_INFINITY), 0.0);
    assert_eq!(ops::exp_ggml(0.0), 1.0);
    assert_eq!(ops::exp_ggml(-200.0), 0.0);
    assert_eq!(ops::exp_ggml(100.0), f32::INFINITY);
    assert!(ops::exp_ggml(f32::NAN).is_nan());
}

#[test]
fn silu_and_swiglu_match_f64() {
    let n = 77; // 9 vector groups and a 5-element libm tail
    let g = rand_vec(3, n, 8.0);
    let u = rand_vec(4, n, 2.0);
    let mut s = vec![0f32; n];
    let mut sw = vec![0f32; n];
    ops::silu(&g, &mut s);
    ops::swiglu(&g, &u, &mut sw);
    let silu64: Vec<f64> = g
        .iter()
        .map(|&x| f64::from(x) / (1.0 + (-f64::from(x)).exp()))
        .collect();
    for (i, (&a, &e)) in s.iter().zip(&silu64).enumerate() {
        assert!(
            (f64::from(a) - e).abs() <= 4.0 * F32_EPS * e.abs() + 1e-30,
            "silu[{i}] {a} vs {e}"
        );
        let want = e * f64::from(u[i]);
        let got = f64::from(sw[i]);
        assert!(
            (got - want).abs() <= 5.0 * F32_EPS * want.abs() + 1e-30,
            "swiglu[{i}]"
        );
        assert_eq!(sw[i], s[i] * u[i], "swiglu must be silu(gate)·up in f32");
    }
}

fn softmax64(x: &[f32], scale: f32, n_vis: usize) -> Vec<f64> {
    let w: Vec<f64> = x[..n_vis].iter().map(|&v| f64::from(v * scale)).collect();
    let m = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = w.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    let mut out: Vec<f64> = e.iter().map(|v| v / s).collect();
    out.resize(x.len(), 0.0);
    out
}

#[test]
fn softmax_matches_f64_with_scale_and_mask() {
    for (n, n_vis, scale) in [
        (1, 1, 1.0),
        (8, 8, 0.125),
        (37, 37, 1.0),
        (64, 23, 0.088),
        (300, 299, 0.5),
    ] {
        let x = rand_vec(n as u64, n, 6.0);
        let mut out = vec![f32::NAN; n];
        ops::softmax(&x, scale, n_vis, &mut out);
        let want = softmax64(&x, scale, n_vis);
        let err = max_abs_diff(&out, &want);
        assert!(err <= 8.0 * F32_EPS, "n={n} n_vis={n_vis}: {err:e}");
        assert!(out[n_vis..].iter().all(|&v| v == 0.0));
        let total: f64 = out.iter().map(|&v| f64::from(v)).sum();
        assert!((total - 1.0).abs() < 1e-5);
    }
}

/// f64 softmax with a sink logit in the normaliser.
fn softmax64_sink(x: &[f32], scale: f32, n_vis: usize, sink: f32) -> Vec<f64> {
    let w: Vec<f64> = x[..n_vis].iter().map(|&v| f64::from(v * scale)).collect();
    let m = w.iter().cloned().fold(f64::from(sink), f64::max);
    let e: Vec<f64> = w.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum::<f64>() + (f64::from(sink) - m).exp();
    let mut out: Vec<f64> = e.iter().map(|v| v / s).collect();
    out.resize(x.len(), 0.0);
    out
}

#[test]
fn softmax_sink_takes_its_share_of_the_mass() {
    for (n, n_vis, scale, sink) in [
        (1, 1, 1.0, 0.0),
        (8, 8, 0.125, 3.0),
        (37, 20, 1.0, -2.0),
        (300, 299, 0.5, 40.0),
    ] {
        let x = rand_vec(n as u64 + 7, n, 6.0);
        let mut out = vec![f32::NAN; n];
        ops::softmax_sink(&x, scale, n_vis, sink, &mut out);
        let want = softmax64_sink(&x, scale, n_vis, sink);
        let err = max_abs_diff(&out, &want);
        assert!(err <= 8.0 * F32_EPS, "n={n} sink={sink}: {err:e}");
        // the sink keeps the rest of the mass: the outputs sum to 1 - p(sink)
        let total: f64 = out.iter().map(|&v| f64::from(v)).sum();
        assert!(total < 1.0 - 1e-7, "a sink must take some mass");
    }
    // masked (-inf) elements come out as exact zeros and change nothing else
    let mut x = rand_vec(3, 40, 4.0);
    x[..10].fill(f32::NEG_INFINITY);
    let mut masked = vec![0f32; 40];
    ops::softmax_sink(&x, 0.3, 40, 0.5, &mut masked);
    assert!(masked[..10].iter().all(|&v| v == 0.0));
    let want = softmax64_sink(&x[10..], 0.3, 30, 0.5);
    assert!(max_abs_diff(&masked[10..], &want) <= 8.0 * F32_EPS);
}

#[test]
fn swiglu_oai_clamps_and_matches_f64() {
    let (alpha, limit) = (1.702f32, 7.0f32);
    let gate = [-20.0f32, -1.0, 0.0, 0.5, 6.9, 7.0, 7.5, 100.0];
    let up = [-9.0f32, 8.0, 1.0, -0.5, 3.0, -7.5, 0.25, 7.0];
    let mut out = [0f32; 8];
    ops::swiglu_oai(&gate, &up, alpha, limit, &mut out);
    for i in 0..8 {
        let g = f64::from(gate[i].min(limit));
        let u = f64::from(up[i].clamp(-limit, limit));
        let want = g / (1.0 + (-f64::from(alpha) * g).exp()) * (u + 1.0);
        let err = (f64::from(out[i]) - want).abs();
        assert!(
            err <= 4.0 * F32_EPS * want.abs().max(1.0),
            "{i}: {} vs {want}",
            out[i]
        );
    }
    // above the limit the gate saturates: 7.5 and 100 give what 7 gives, for the same up
    let mut sat = [0f32; 3];
    ops::swiglu_oai(&[7.0, 7.5, 100.0], &[1.0; 3], alpha, limit, &mut sat);
    assert_eq!(sat[0], sat[1]);
    assert_eq!(sat[0], sat[2]);
}

/// ggml's `reglu` (`ggml_vec_reglu_f32`): `gate > 0 ? gate * up : 0`, so a gate that is not
/// positive gives +0 whatever `up` holds (infinite, NaN, negative), and -0 only from a positive
/// gate times a negative zero.
#[test]
fn reglu_is_ggmls_select_not_a_product_with_relu() {
    let gate = [-2.0f32, -0.0, 0.0, 1e-30, 0.5, 3.0, -1.0, f32::NAN, 2.0];
    let up = [
        5.0f32,
        f32::NAN,
        f32::INFINITY,
        4.0,
        -0.0,
        -1.5,
        f32::INFINITY,
        1.0,
        0.25,
    ];
    let mut out = [1f32; 9];
    ops::reglu(&gate, &up, &mut out);
    let want = [0.0f32, 0.0, 0.0, 4e-30, -0.0, -4.5, 0.0, 0.0, 0.5];
    for i in 0..9 {
        assert_eq!(out[i].to_bits(), want[i].to_bits(), "{i}: {}", out[i]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn simd_matches_scalar_bits(
        x in prop::collection::vec(-90.0f32..90.0, 0..70),
        seed in 0u64..1000,
        scale in 0.01f32..2.0,
        vis_frac in 0.0f64..=1.0,
    ) {
        let n = x.len();
        let up = rand_vec(seed, n, 3.0);
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        ops::silu(&x, &mut a);
        ops::silu_scalar(&x, &mut b);
        prop_assert_eq!(bits(&a), bits(&b));
        ops::swiglu(&x, &up, &mut a);
        ops::swiglu_scalar(&x, &up, &mut b);
        prop_assert_eq!(bits(&a), bits(&b));
        let n_vis = ((n as f64 * vis_frac) as usize).min(n).max(n.min(1));
        ops::softmax(&x, scale, n_vis, &mut a);
        ops::softmax_scalar(&x, scale, n_vis, &mut b);
        prop_assert_eq!(bits(&a), bits(&b));
        let sink = up.first().copied().unwrap_or(0.0) * 20.0;
        ops::softmax_sink(&x, scale, n_vis, sink, &mut a);
        ops::softmax_sink_scalar(&x, scale, n_vis, sink, &mut b);
        prop_assert_eq!(bits(&a), bits(&b));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn simd_dots_match_scalar_bits(n in 0usize..300, seed in 0u64..1000) {
        let a = rand_vec(seed, n, 3.0);
        let b = rand_vec(seed + 7, n, 1.0);
        prop_assert_eq!(ops::dot_ggml(&a, &b).to_bits(), ops::dot_ggml_scalar(&a, &b).to_bits());
        prop_assert_eq!(
            ops::dot_tinyblas(&a, &b).to_bits(),
            ops::dot_tinyblas_scalar(&a, &b).to_bits()
        );
        let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
        let mag: f64 = a.iter().zip(&b).map(|(&x, &y)| (f64::from(x) * f64::from(y)).abs()).sum();
        // f32 accumulation: error bounded by (terms per accumulator + reduction depth) ulps of Σ|xy|
        let bound = (n as f64 / 8.0 + 8.0) * F32_EPS * mag + 1e-30;
        prop_assert!((f64::from(ops::dot_ggml(&a, &b)) - exact).abs() <= bound);
        prop_assert!((f64::from(ops::dot_tinyblas(&a, &b)) - exact).abs() <= bound);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn argsort_is_a_descending_permutation(
        x in prop::collection::vec(prop_oneof![Just(0.5f32), Just(-1.0f32), -4.0f32..4.0], 0..200),
        nan_at in prop::option::of(0usize..200),
    ) {
        let mut x = x;
        if let Some(i) = nan_at && i < x.len() {
            x[i] = f32::NAN;
        }
        let idx = ops::argsort_desc(&x);
        let mut seen = idx.clone();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..x.len()).collect::<Vec<_>>());
        for w in idx.windows(2) {
            let (a, b) = (x[w[0]], x[w[1]]);
            prop_assert!(a >= b || b.is_nan(), "{} before {}", a, b);
        }
        if x.len() <= 16 && !x.iter().any(|v| v.is_nan()) {
            for w in idx.windows(2) {
                if x[w[0]] == x[w[1]] {
                    prop_assert!(w[0] < w[1], "ties keep index order in short rows");
                }
            }
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

// ---------- RoPE ----------

fn rot(x0: f64, x1: f64, t: f64) -> (f64, f64) {
    (x0 * t.cos() - x1 * t.sin(), x0 * t.sin() + x1 * t.cos())
}

#[test]
fn rope_pairing_norm_vs_neox() {
    // head_dim 6, n_dims 4, base 10000, position 1: pair 0 turns by 1 rad, pair 1 by 0.01 rad
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let (t0, t1) = (1.0f64, 0.01f64);
    let norm = Rope::new(RopeConfig::plain(4, RopeMode::Norm, 10000.0, 4096)).unwrap();
    let mut a = x;
    norm.apply(&mut a, 6, 1).unwrap();
    let (a0, a1) = rot(1.0, 2.0, t0);
    let (a2, a3) = rot(3.0, 4.0, t1);
    assert!(
        max_abs_diff(&a, &[a0, a1, a2, a3, 5.0, 6.0]) < 1e-6,
        "{a:?}"
    );
    let neox = Rope::new(RopeConfig::plain(4, RopeMode::Neox, 10000.0, 4096)).unwrap();
    let mut b = x;
    neox.apply(&mut b, 6, 1).unwrap();
    let (b0, b2) = rot(1.0, 3.0, t0);
    let (b1, b3) = rot(2.0, 4.0, t1);
    assert!(
        max_abs_diff(&b, &[b0, b1, b2, b3, 5.0, 6.0]) < 1e-6,
        "{b:?}"
    );
    // the tail beyond n_dims is untouched, bit for bit
    assert_eq!(&a[4..], &x[4..]);
    assert_eq!(&b[4..], &x[4..]);
    // position 0 is the identity
    let mut c = x;
    neox.apply(&mut c, 6, 0).unwrap();
    assert_eq!(c, x);
}

/// f64 rotation with ggml's f32 angle sequence (θ accumulated in f32 is part of the spec).
fn rope_ref(cfg: &RopeConfig, x: &[f32], head_dim: usize, pos: i64) -> Vec<f64> {
    let nd = cfg.n_dims;
    let ts = cfg.freq_base.powf(-2.0 / nd as f32);
    let mut theta = pos as f32;
    let mut angles = vec![];
    for _ in 0..nd / 2 {
        angles.push(f64::from(theta));
        theta *= ts;
    }
    let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for h in 0..x.len() / head_dim {
        let o = &mut out[h * head_dim..(h + 1) * head_dim];
        for (i, &t) in angles.iter().enumerate() {
            let (i0, i1) = match cfg.mode {
                RopeMode::Norm => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + nd / 2),
            };
            (o[i0], o[i1]) = rot(o[i0], o[i1], t);
        }
    }
    out
}

#[test]
fn rope_matches_f64_over_positions() {
    for mode in [RopeMode::Norm, RopeMode::Neox] {
        let cfg = RopeConfig::plain(64, mode, 1e6, 32768);
        let rope = Rope::new(cfg.clone()).unwrap();
        let x = rand_vec(7, 4 * 64, 2.0);
        for pos in [0i64, 1, 5, 100, 4095, 30000] {
            let mut y = x.clone();
            rope.apply(&mut y, 64, pos).unwrap();
            let want = rope_ref(&cfg, &x, 64, pos);
            let err = max_abs_diff(&y, &want);
            assert!(err < 2e-6, "{mode:?} pos {pos}: {err:e}");
        }
    }
}

#[test]
fn yarn_reduces_to_plain_rope() {
    let plain = RopeConfig::plain(32, RopeMode::Neox, 10000.0, 2048);
    let mut yarn_off = plain.clone();
    yarn_off.beta_fast = 16.0;
    yarn_off.beta_slow = 2.0;
    let mut yarn_unscaled = plain.clone();
    yarn_unscaled.ext_factor = 1.0;
    let (p, a, b) = (
        Rope::new(plain).unwrap(),
        Rope::new(yarn_off).unwrap(),
        Rope::new(yarn_unscaled).unwrap(),
    );
    let (mut cp, mut ca, mut cb) = (vec![0f32; 32], vec![0f32; 32], vec![0f32; 32]);
    for pos in [0, 3, 77, 1000, 5000] {
        p.fill_cache(pos, &mut cp);
        a.fill_cache(pos, &mut ca);
        b.fill_cache(pos, &mut cb);
        assert_eq!(cp, ca, "ext_factor 0 ignores the YaRN betas");
        // freq_scale 1: both angles agree, the mix can only differ by rounding
        for (x, y) in cp.iter().zip(&cb) {
            assert!(
                (x - y).abs() <= 2e-6 * (1.0 + pos as f32 * 1e-3),
                "pos {pos}: {x} vs {y}"
            );
        }
    }
}

#[test]
fn yarn_scaled_matches_f64_formula() {
    let mut cfg = RopeConfig::plain(64, RopeMode::Norm, 10000.0, 4096);
    cfg.freq_scale = 0.25;
    cfg.ext_factor = 1.0;
    let rope = Rope::new(cfg.clone()).unwrap();
    // f64 YaRN: correction range, linear ramp, mixed angle and magnitude
    let nd = 64f64;
    let corr = |beta: f64| {
        nd * (4096.0 / (beta * 2.0 * std::f64::consts::PI)).ln() / (2.0 * 10000f64.ln())
    };
    let (low, high) = (corr(32.0).floor().max(0.0), corr(1.0).ceil().min(nd - 1.0));
    let mscale = 1.0 + 0.1 * (1.0f64 / 0.25).ln();
    let ts = 10000f32.powf(-2.0 / 64.0);
    let pos = 300i64;
    let mut cache = vec![0f32; 64];
    rope.fill_cache(pos, &mut cache);
    let mut theta = pos as f32;
    for i in 0..32 {
        let ext = f64::from(theta);
        let interp = 0.25 * ext;
        let y = (i as f64 - low) / (high - low).max(0.001);
        let mix = 1.0 - y.clamp(0.0, 1.0);
        let t = interp * (1.0 - mix) + ext * mix;
        assert!(
            (f64::from(cache[2 * i]) - t.cos() * mscale).abs() < 2e-5,
            "cos {i}"
        );
        assert!(
            (f64::from(cache[2 * i + 1]) - t.sin() * mscale).abs() < 2e-5,
            "sin {i}"
        );
        theta *= ts;
    }
    // high-frequency pairs extrapolate (mix 1), low-frequency ones interpolate (mix 0)
    assert!(low > 0.0 && high < nd - 1.0);
}

// ---------- routing ----------

#[test]
fn route_softmax_topk_renormalized() {
    let logits = [0.5f32, 2.0, -1.0, 1.5, 0.0, 1.9, -3.0, 0.7];
    let (ids, w) = ops::route(&logits, 2, true, 0.0, Gating::Softmax);
    assert_eq!(ids, vec![1, 5]);
    let sum: f32 = w.iter().sum();
    assert!((sum - 1.0).abs() < 1e-6);
    let p = softmax64(&logits, 1.0, 8);
    let want = [p[1] / (p[1] + p[5]), p[5] / (p[1] + p[5])];
    assert!(max_abs_diff(&w, &want) < 1e-6);
    // without renormalization the weights are the probabilities; the scale multiplies
    let (_, raw) = ops::route(&logits, 2, false, 2.5, Gating::Softmax);
    assert!(max_abs_diff(&raw, &[p[1] * 2.5, p[5] * 2.5]) < 1e-6);
    // sigmoid gating
    let (ids, w) = ops::route(&logits, 3, false, 1.0, Gating::Sigmoid);
    assert_eq!(ids, vec![1, 5, 3]);
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    assert!(max_abs_diff(&w, &[sig(2.0), sig(1.9), sig(1.5)]) < 1e-6);
}

#[test]
fn route_softmax_over_the_selected_logits() {
    let logits = [0.5f32, 2.0, -1.0, 1.5, 0.0, 1.9, -3.0, 0.7];
    let (ids, w) = ops::route(&logits, 3, false, 0.0, Gating::SoftmaxSelected);
    assert_eq!(ids, vec![1, 5, 3]);
    let sel = [2.0f32, 1.9, 1.5];
    let want = softmax64(&sel, 1.0, 3);
    assert!(max_abs_diff(&w, &want) < 1e-6);
    // the same weights when the choice is replayed
    let mut fixed = vec![0f32; 3];
    ops::route_fixed_into(
        &logits,
        &ids,
        false,
        0.0,
        Gating::SoftmaxSelected,
        &mut ops::RouteScratch::default(),
        &mut fixed,
    );
    assert_eq!(bits(&fixed), bits(&w));
}

#[test]
fn route_ties_keep_index_order() {
    let logits = [1.0f32, 3.0, 2.0, 3.0, 2.0, 3.0];
    assert_eq!(ops::top_k_desc(&logits, 4), vec![1, 3, 5, 2]);
    let (ids, w) = ops::route(&logits, 2, true, 0.0, Gating::Softmax);
    assert_eq!(ids, vec![1, 3]);
    assert_eq!(w[0], w[1]);
    assert!((w[0] - 0.5).abs() < 1e-7);
}

/// Llama 4's routing ranks the raw logits and weights the chosen by their sigmoid: the same
/// choice as sigmoid gating where the sigmoids differ, the larger logit where they round to
/// the same f32 (both 1 here, where sigmoid gating keeps the lower index).
#[test]
fn route_sigmoid_weights_ranked_on_the_logits() {
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let logits = [0.5f32, 2.0, -1.0, 1.5, 0.0, 1.9, -3.0, 0.7];
    let (ids, w) = ops::route(&logits, 3, false, 0.0, Gating::SigmoidRankLogits);
    assert_eq!(ids, ops::top_k_desc(&logits, 3));
    assert!(max_abs_diff(&w, &[sig(2.0), sig(1.9), sig(1.5)]) < 1e-6);
    let (sig_ids, sig_w) = ops::route(&logits, 3, false, 0.0, Gating::Sigmoid);
    assert_eq!((&ids, bits(&w)), (&sig_ids, bits(&sig_w)));
    let saturated = [20.0f32, 30.0, 0.0, -1.0];
    let (ids, w) = ops::route(&saturated, 1, false, 0.0, Gating::SigmoidRankLogits);
    assert_eq!(ids, vec![1]);
    assert_eq!(w[0], 1.0);
    let (ids, _) = ops::route(&saturated, 1, false, 0.0, Gating::Sigmoid);
    assert_eq!(ids, vec![0]);
    // a replayed choice gets the same weights
    let mut fixed = vec![0f32; 3];
    let chosen = ops::top_k_desc(&logits, 3);
    ops::route_fixed_into(
        &logits,
        &chosen,
        false,
        0.0,
        Gating::SigmoidRankLogits,
        &mut ops::RouteScratch::default(),
        &mut fixed,
    );
    assert_eq!(bits(&fixed), bits(&sig_w));
}

/// Llama 4's attention temperature: 1 up to the position before the first step of
/// `floor_scale` (less the offset), then `ln(steps + 1) · scale + 1` (f64, rounded to f32).
#[test]
fn attention_temperature_steps_with_the_position() {
    let t = model::AttnTemp {
        floor_scale: 8192,
        scale: 0.1,
        offset: 1.0,
    };
    let want = |steps: f64| (steps.ln_1p() * 0.1f32 as f64 + 1.0) as f32;
    for (pos, steps) in [
        (0, 0.0),
        (5, 0.0),
        (8190, 0.0),
        (8191, 1.0),
        (16382, 1.0),
        (16383, 2.0),
        (100_000, 12.0),
    ] {
        assert_eq!(
            ops::attn_temp_factor(&t, pos),
            want(steps),
            "position {pos}"
        );
    }
    assert_eq!(ops::attn_temp_factor(&t, 10), 1.0);
    let mut q = vec![1.5f32, -2.0, 0.25];
    let k = ops::attn_temp_factor(&t, 8191);
    ops::scale_inplace(&mut q, k);
    assert_eq!(bits(&q), bits(&[1.5 * k, -2.0 * k, 0.25 * k]));
}

// ---------- attention ----------

/// Naive f64 attention on the given (already rounded, if needed) values: every cell visible,
/// no sinks; the probabilities rounded to f16 when `round_p` (an F16 cache's).
#[allow(clippy::too_many_arguments)]
fn attn_ref(
    q: &[f32],
    ks: &[Vec<f32>],
    vs: &[Vec<f32>],
    n_head: usize,
    n_kv: usize,
    hd: usize,
    n_vis: usize,
    scale: f32,
    round_p: bool,
) -> Vec<f64> {
    let window = Window {
        first: 0,
        sinks: None,
        round_p,
    };
    attn_ref_window(q, ks, vs, n_head, n_kv, hd, n_vis, scale, window)
}

fn round16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
}

#[test]
fn attention_decode_and_prefill_match_naive_gqa() {
    let pool = ThreadPool::new(2).unwrap();
    let (n_head, n_kv, hd, n_ctx) = (4, 2, 64, 300);
    let scale = 1.0 / (hd as f32).sqrt();
    for ty in [KvType::F32, KvType::F16] {
        let mut cache = KvCache::new(ty, 2, n_ctx, n_kv, hd).unwrap();
        let n = 270; // crosses the 256 padding boundary
        let ks: Vec<Vec<f32>> = (0..n)
            .map(|t| rand_vec(100 + t as u64, n_kv * hd, 2.0))
            .collect();
        let vs: Vec<Vec<f32>> = (0..n)
            .map(|t| rand_vec(1000 + t as u64, n_kv * hd, 1.0))
            .collect();
        for t in 0..n {
            cache.store(1, t, &ks[t], &vs[t]).unwrap();
        }
        let f16c = ty == KvType::F16;
        let (ks_r, vs_r): (Vec<Vec<f32>>, Vec<Vec<f32>>) = if f16c {
            (
                ks.iter().map(|k| round16(k)).collect(),
                vs.iter().map(|v| round16(v)).collect(),
            )
        } else {
            (ks.clone(), vs.clone())
        };
        // stored values read back with the storage rounding
        let mut kr = vec![0f32; hd];
        cache.key(1, 5, 1, &mut kr).unwrap();
        assert_eq!(kr, ks_r[5][hd..2 * hd]);
        cache.value(1, 7, 0, &mut kr).unwrap();
        assert_eq!(kr, vs_r[7][..hd]);

        // prefill of 6 tokens at positions 264..270 and 6 decodes both match the naive
        // computation (they differ in the last bits: ggml sums them in different orders)
        let p0 = 264;
        let q = rand_vec(9, 6 * n_head * hd, 2.0);
        let mut batch = vec![0f32; q.len()];
        ops::attend_batch(&pool, &q, &cache, 1, p0, 6, n_head, scale, &mut batch).unwrap();
        for i in 0..6 {
            let qi = &q[i * n_head * hd..(i + 1) * n_head * hd];
            let mut one = vec![0f32; n_head * hd];
            ops::attend(&pool, qi, &cache, 1, p0 + i + 1, n_head, scale, &mut one).unwrap();
            let q_used = if f16c { round16(qi) } else { qi.to_vec() };
            let want = attn_ref(
                &q_used,
                &ks_r,
                &vs_r,
                n_head,
                n_kv,
                hd,
                p0 + i + 1,
                scale,
                f16c,
            );
            let b = &batch[i * n_head * hd..(i + 1) * n_head * hd];
            for (what, got) in [("decode", &one[..]), ("prefill", b)] {
                let err = max_abs_diff(got, &want);
                // f32 dot of 64 terms and f32 softmax, on values of order 1; with F16 the
                // probabilities are rounded to f16, so a last-bit difference in a score can
                // move one of them by an f16 ulp (2^-11 relative). On aarch64 an F16 cache's
                // products accumulate in half precision, as in llama.cpp's ARM build (about
                // 2^-11 relative per step over the ~270 cells).
                let tol = match (f16c, cfg!(target_arch = "aarch64")) {
                    (true, true) => 1e-3,
                    (true, false) => 2e-5,
                    (false, _) => 2e-6,
                };
                assert!(err < tol, "{ty:?} {what} token {i}: {err:e}");
            }
        }
        // a short context: position 0 sees only itself, so the output is V_0 of its KV head
        let q0 = rand_vec(5, n_head * hd, 1.0);
        let mut o = vec![0f32; n_head * hd];
        ops::attend(&pool, &q0, &cache, 1, 1, n_head, scale, &mut o).unwrap();
        for h in 0..n_head {
            assert_eq!(
                o[h * hd..(h + 1) * hd],
                vs_r[0][(h / 2) * hd..(h / 2 + 1) * hd]
            );
        }
    }
}

/// What [`attn_ref_window`] adds to plain attention.
#[derive(Clone, Copy)]
struct Window<'s> {
    /// First visible cell.
    first: usize,
    /// One sink per head.
    sinks: Option<&'s [f32]>,
    /// Round the probabilities to f16.
    round_p: bool,
}

/// Naive f64 attention of one token over cells `first..n_vis` with an optional sink per head.
#[allow(clippy::too_many_arguments)]
fn attn_ref_window(
    q: &[f32],
    ks: &[Vec<f32>],
    vs: &[Vec<f32>],
    n_head: usize,
    n_kv: usize,
    hd: usize,
    n_vis: usize,
    scale: f32,
    w: Window<'_>,
) -> Vec<f64> {
    let mut out = vec![0f64; n_head * hd];
    for h in 0..n_head {
        let kvh = h / (n_head / n_kv);
        let qh = &q[h * hd..(h + 1) * hd];
        let s: Vec<f64> = (w.first..n_vis)
            .map(|t| {
                (0..hd)
                    .map(|d| f64::from(qh[d]) * f64::from(ks[t][kvh * hd + d]))
                    .sum::<f64>()
                    * f64::from(scale)
            })
            .collect();
        let sink = w.sinks.map(|sk| f64::from(sk[h]));
        let m = s
            .iter()
            .cloned()
            .fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
        let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
        let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |sv| (sv - m).exp());
        for (j, t) in (w.first..n_vis).enumerate() {
            let mut p = e[j] / z;
            if w.round_p {
                p = f64::from(f16::from_f64(p).to_f32());
            }
            for d in 0..hd {
                out[h * hd + d] += p * f64::from(vs[t][kvh * hd + d]);
            }
        }
    }
    out
}

#[test]
fn attention_with_sliding_window_and_sinks_matches_naive() {
    let pool = ThreadPool::new(2).unwrap();
    let (n_head, n_kv, hd, n_ctx) = (4, 2, 64, 64);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut cache = KvCache::new(KvType::F32, 1, n_ctx, n_kv, hd).unwrap();
    let n = 40;
    let ks: Vec<Vec<f32>> = (0..n)
        .map(|t| rand_vec(300 + t as u64, n_kv * hd, 2.0))
        .collect();
    let vs: Vec<Vec<f32>> = (0..n)
        .map(|t| rand_vec(3000 + t as u64, n_kv * hd, 1.0))
        .collect();
    for t in 0..n {
        cache.store(0, t, &ks[t], &vs[t]).unwrap();
    }
    let sinks = [0.5f32, -1.0, 3.0, 0.0];
    let window = 8;
    let p0 = 30;
    let n_tok = 5;
    let q = rand_vec(77, n_tok * n_head * hd, 2.0);
    for (win, sk) in [
        (Some(window), None),
        (None, Some(&sinks[..])),
        (Some(window), Some(&sinks[..])),
    ] {
        let extras = ops::AttnExtras {
            window: win,
            chunk: None,
            sinks: sk,
            batch_end: None,
            batch_tokens: None,
        };
        let mut batch = vec![0f32; q.len()];
        ops::attend_batch_with(
            &pool, &q, &cache, 0, p0, n_tok, n_head, scale, extras, &mut batch,
        )
        .unwrap();
        for i in 0..n_tok {
            let n_vis = p0 + i + 1;
            let first = win.map_or(0, |w| n_vis - w);
            let qi = &q[i * n_head * hd..(i + 1) * n_head * hd];
            let window = Window {
                first,
                sinks: sk,
                round_p: false,
            };
            let want = attn_ref_window(qi, &ks, &vs, n_head, n_kv, hd, n_vis, scale, window);
            let got = &batch[i * n_head * hd..(i + 1) * n_head * hd];
            let err = max_abs_diff(got, &want);
            assert!(
                err < 2e-6,
                "window {win:?} sinks {} token {i}: {err:e}",
                sk.is_some()
            );
            // one token alone (decode) gives what the batch gave for it, up to the sum order
            let mut one = vec![0f32; n_head * hd];
            ops::attend_batch_with(
                &pool,
                qi,
                &cache,
                0,
                n_vis - 1,
                1,
                n_head,
                scale,
                extras,
                &mut one,
            )
            .unwrap();
            assert!(max_abs_diff(&one, &want) < 2e-6);
        }
    }
    // a window that covers every cell is no window
    let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
    let wide = ops::AttnExtras {
        window: Some(1000),
        chunk: None,
        sinks: None,
        batch_end: None,
        batch_tokens: None,
    };
    ops::attend_batch_with(&pool, &q, &cache, 0, p0, n_tok, n_head, scale, wide, &mut a).unwrap();
    ops::attend_batch(&pool, &q, &cache, 0, p0, n_tok, n_head, scale, &mut b).unwrap();
    assert_eq!(bits(&a), bits(&b));
    // wrong sink count and an empty window are refused
    let bad = ops::AttnExtras {
        window: None,
        chunk: None,
        sinks: Some(&sinks[..3]),
        batch_end: None,
        batch_tokens: None,
    };
    assert!(
        ops::attend_batch_with(&pool, &q, &cache, 0, p0, n_tok, n_head, scale, bad, &mut a)
            .is_err()
    );
    let zero = ops::AttnExtras {
        window: Some(0),
        chunk: None,
        sinks: None,
        batch_end: None,
        batch_tokens: None,
    };
    assert!(
        ops::attend_batch_with(&pool, &q, &cache, 0, p0, n_tok, n_head, scale, zero, &mut a)
            .is_err()
    );
}

/// Chunked attention (Llama 4): a query at position `p` sees its own chunk's cells
/// `(p / c) · c ..= p` only, in a batch that crosses a chunk boundary and token by token; the
/// bits equal a sliding window that starts at the chunk, and a chunk of 0 is refused.
#[test]
fn attention_in_chunks_matches_naive() {
    let pool = ThreadPool::new(2).unwrap();
    let (n_head, n_kv, hd, n_ctx) = (4, 2, 64, 64);
    let scale = 1.0 / (hd as f32).sqrt();
    let n = 40;
    let ks: Vec<Vec<f32>> = (0..n)
        .map(|t| rand_vec(500 + t as u64, n_kv * hd, 2.0))
        .collect();
    let vs: Vec<Vec<f32>> = (0..n)
        .map(|t| rand_vec(5000 + t as u64, n_kv * hd, 1.0))
        .collect();
    {
        let ty = KvType::F32;
        let mut cache = KvCache::new(ty, 1, n_ctx, n_kv, hd).unwrap();
        for t in 0..n {
            cache.store(0, t, &ks[t], &vs[t]).unwrap();
        }
        let (ks_c, vs_c) = (&ks, &vs);
        let (chunk, p0, n_tok) = (8, 29, 6);
        let q = rand_vec(79, n_tok * n_head * hd, 2.0);
        let extras = ops::AttnExtras {
            chunk: Some(chunk),
            ..ops::AttnExtras::default()
        };
        let mut batch = vec![0f32; q.len()];
        ops::attend_batch_with(
            &pool, &q, &cache, 0, p0, n_tok, n_head, scale, extras, &mut batch,
        )
        .unwrap();
        for i in 0..n_tok {
            let pos = p0 + i;
            let first = pos / chunk * chunk;
            assert_eq!(extras.first_visible(pos + 1), first);
            let qi = &q[i * n_head * hd..(i + 1) * n_head * hd];
            let window = Window {
                first,
                sinks: None,
                round_p: false,
            };
            let want = attn_ref_window(qi, ks_c, vs_c, n_head, n_kv, hd, pos + 1, scale, window);
            let got = &batch[i * n_head * hd..(i + 1) * n_head * hd];
            let err = max_abs_diff(got, &want);
            assert!(err < 2e-6, "{ty:?} position {pos}: {err:e}");
            // one token alone: the same bits as a window reaching back to its chunk's start
            let (mut one, mut win) = (vec![0f32; n_head * hd], vec![0f32; n_head * hd]);
            ops::attend_batch_with(
                &pool, qi, &cache, 0, pos, 1, n_head, scale, extras, &mut one,
            )
            .unwrap();
            let as_window = ops::AttnExtras {
                window: Some(pos - first + 1),
                ..ops::AttnExtras::default()
            };
            ops::attend_batch_with(
                &pool, qi, &cache, 0, pos, 1, n_head, scale, as_window, &mut win,
            )
            .unwrap();
            assert_eq!(bits(&one), bits(&win), "{ty:?} position {pos}");
            assert!(max_abs_diff(&one, &want) < 2e-6);
        }
        let zero = ops::AttnExtras {
            chunk: Some(0),
            ..ops::AttnExtras::default()
        };
        assert!(
            ops::attend_batch_with(
                &pool, &q, &cache, 0, p0, n_tok, n_head, scale, zero, &mut batch
            )
            .is_err()
        );
    }
}

#[test]
fn attention_is_thread_count_independent_and_checks_bounds() {
    let (n_head, n_kv, hd) = (8, 2, 32);
    let mut cache = KvCache::new(KvType::F16, 1, 40, n_kv, hd).unwrap();
    for t in 0..40 {
        cache
            .store(
                0,
                t,
                &rand_vec(t as u64, n_kv * hd, 1.0),
                &rand_vec(99 + t as u64, n_kv * hd, 1.0),
            )
            .unwrap();
    }
    let q = rand_vec(3, 3 * n_head * hd, 1.0);
    let mut a = vec![0f32; q.len()];
    let mut b = vec![0f32; q.len()];
    ops::attend_batch(
        &ThreadPool::new(1).unwrap(),
        &q,
        &cache,
        0,
        30,
        3,
        n_head,
        0.2,
        &mut a,
    )
    .unwrap();
    ops::attend_batch(
        &ThreadPool::new(3).unwrap(),
        &q,
        &cache,
        0,
        30,
        3,
        n_head,
        0.2,
        &mut b,
    )
    .unwrap();
    assert_eq!(bits(&a), bits(&b));
    let pool = ThreadPool::new(1).unwrap();
    assert!(ops::attend_batch(&pool, &q, &cache, 0, 38, 3, n_head, 0.2, &mut a).is_err());
    assert!(ops::attend_batch(&pool, &q, &cache, 1, 0, 3, n_head, 0.2, &mut a).is_err());
    assert!(cache.store(0, 40, &[0.0; 64], &[0.0; 64]).is_err());
    assert!(cache.key(0, 0, 2, &mut [0.0; 32]).is_err());
    assert!(cache.value(0, 0, 0, &mut [0.0; 31]).is_err());
    assert!(KvCache::new(KvType::F32, 1, 8, 2, 0).is_err());
    assert!(KvCache::new(KvType::F32, 1, 8, 0, 8).is_err());
    assert!(cache.store(0, 0, &[0.0; 63], &[0.0; 64]).is_err());
    assert!(ops::attend_batch(&pool, &q, &cache, 0, 0, 3, 7, 0.2, &mut a).is_err());
}
