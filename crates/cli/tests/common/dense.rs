//! Tiny dense `llama` / `qwen2` models with random weights, written with the gguf writer, and
//! their logits through sluice's forward pass: the inputs of the upcycle and moefy tests.

use std::path::Path;

use engine::ops::KvType;
use engine::{Engine, EngineConfig, LogitsWanted};
use gguf::{GgmlType, GgufFile, GgufWriter, Value};
use model::Model;
use quant::{Kernels, ThreadPool};

pub const N_EMBD: usize = 64;
pub const N_HEAD: usize = 4;
pub const N_HEAD_KV: usize = 2;
pub const N_FF: usize = 96;
pub const N_VOCAB: usize = 300;
pub const N_LAYER: usize = 2;

/// Deterministic values in ±scale (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 >> 12;
                self.0 ^= self.0 << 25;
                self.0 ^= self.0 >> 27;
                let u = (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32;
                (u / (1u64 << 23) as f32 - 1.0) * scale
            })
            .collect()
    }
}

pub fn tensor(w: &mut GgufWriter<'static>, name: &str, dims: &[usize], ty: GgmlType, v: &[f32]) {
    let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    let data = match ty {
        GgmlType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        _ => quant::quantize_to_vec(ty, v).expect("quantize"),
    };
    w.add_tensor(name, &dims, ty, data).expect("add tensor");
}

/// A dense `llama` or `qwen2` model with random weights; FFN matrices of type `ffn_ty`.
pub fn write_dense(arch: &str, ffn_ty: GgmlType, path: &Path) {
    let mut r = Rng(0x5EED ^ arch.len() as u64);
    let mut w = GgufWriter::new();
    let md = |w: &mut GgufWriter, k: &str, v: Value| w.add_metadata(k, v).expect("metadata");
    md(&mut w, "general.architecture", Value::String(arch.into()));
    md(
        &mut w,
        "general.name",
        Value::String(format!("tiny dense {arch}")),
    );
    let u = |v: usize| Value::U32(v as u32);
    md(&mut w, &format!("{arch}.block_count"), u(N_LAYER));
    md(&mut w, &format!("{arch}.context_length"), u(256));
    md(&mut w, &format!("{arch}.embedding_length"), u(N_EMBD));
    md(&mut w, &format!("{arch}.feed_forward_length"), u(N_FF));
    md(&mut w, &format!("{arch}.attention.head_count"), u(N_HEAD));
    md(
        &mut w,
        &format!("{arch}.attention.head_count_kv"),
        u(N_HEAD_KV),
    );
    md(
        &mut w,
        &format!("{arch}.rope.dimension_count"),
        u(N_EMBD / N_HEAD),
    );
    md(
        &mut w,
        &format!("{arch}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-6),
    );
    md(&mut w, &format!("{arch}.vocab_size"), u(N_VOCAB));
    let kv = N_HEAD_KV * (N_EMBD / N_HEAD);
    let sc = |n: usize| 1.0 / (n as f32).sqrt();
    let norm = |r: &mut Rng, n: usize| r.vec(n, 0.1).iter().map(|x| 1.0 + x).collect::<Vec<_>>();
    tensor(
        &mut w,
        "token_embd.weight",
        &[N_EMBD, N_VOCAB],
        GgmlType::F32,
        &r.vec(N_EMBD * N_VOCAB, 1.0),
    );
    tensor(
        &mut w,
        "output_norm.weight",
        &[N_EMBD],
        GgmlType::F32,
        &norm(&mut r, N_EMBD),
    );
    tensor(
        &mut w,
        "output.weight",
        &[N_EMBD, N_VOCAB],
        GgmlType::F32,
        &r.vec(N_EMBD * N_VOCAB, 4.0 * sc(N_EMBD)),
    );
    for il in 0..N_LAYER {
        let n = |s: &str| format!("blk.{il}.{s}");
        let f32t = GgmlType::F32;
        tensor(
            &mut w,
            &n("attn_norm.weight"),
            &[N_EMBD],
            f32t,
            &norm(&mut r, N_EMBD),
        );
        tensor(
            &mut w,
            &n("attn_q.weight"),
            &[N_EMBD, N_EMBD],
            f32t,
            &r.vec(N_EMBD * N_EMBD, 2.0 * sc(N_EMBD)),
        );
        tensor(
            &mut w,
            &n("attn_k.weight"),
            &[N_EMBD, kv],
            f32t,
            &r.vec(N_EMBD * kv, 2.0 * sc(N_EMBD)),
        );
        tensor(
            &mut w,
            &n("attn_v.weight"),
            &[N_EMBD, kv],
            f32t,
            &r.vec(N_EMBD * kv, sc(N_EMBD)),
        );
        tensor(
            &mut w,
            &n("attn_output.weight"),
            &[N_EMBD, N_EMBD],
            f32t,
            &r.vec(N_EMBD * N_EMBD, sc(N_EMBD)),
        );
        if arch == "qwen2" {
            tensor(
                &mut w,
                &n("attn_q.bias"),
                &[N_EMBD],
                f32t,
                &r.vec(N_EMBD, 0.1),
            );
            tensor(&mut w, &n("attn_k.bias"), &[kv], f32t, &r.vec(kv, 0.1));
            tensor(&mut w, &n("attn_v.bias"), &[kv], f32t, &r.vec(kv, 0.1));
        }
        tensor(
            &mut w,
            &n("ffn_norm.weight"),
            &[N_EMBD],
            f32t,
            &norm(&mut r, N_EMBD),
        );
        tensor(
            &mut w,
            &n("ffn_gate.weight"),
            &[N_EMBD, N_FF],
            ffn_ty,
            &r.vec(N_EMBD * N_FF, 2.0 * sc(N_EMBD)),
        );
        tensor(
            &mut w,
            &n("ffn_up.weight"),
            &[N_EMBD, N_FF],
            ffn_ty,
            &r.vec(N_EMBD * N_FF, 2.0 * sc(N_EMBD)),
        );
        tensor(
            &mut w,
            &n("ffn_down.weight"),
            &[N_FF, N_EMBD],
            ffn_ty,
            &r.vec(N_FF * N_EMBD, 2.0 * sc(N_FF)),
        );
    }
    w.write_to_path(path).expect("write dense model");
}

/// Logits of every position of a fixed prompt.
pub fn logits(path: &Path) -> (Vec<f32>, model::HParams) {
    let file = GgufFile::open(path).expect("open");
    let model = Model::from_gguf(&file).expect("model");
    let pool = ThreadPool::new(1).expect("pool");
    let cfg = EngineConfig {
        n_ctx: 32,
        kv_type: KvType::F32,
        ubatch: 16,
    };
    let mut e = Engine::new(&model, Kernels::detect(), &pool, cfg).expect("engine");
    let out = e
        .forward(&[1, 7, 42, 199, 3, 250, 64, 11], LogitsWanted::All)
        .expect("forward");
    (out, model.hparams.clone())
}

/// The largest absolute difference; every value must be finite (a NaN would compare as no
/// difference at all).
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    assert!(
        a.iter().chain(b).all(|v| v.is_finite()),
        "non-finite logits"
    );
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
