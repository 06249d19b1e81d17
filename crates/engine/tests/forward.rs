//! Whole-model forward pass: the demo model, context limits, and oracles on tiny synthetic
//! models (identical experts against a dense FFN; per-arch smoke tests).

use std::path::PathBuf;

use engine::ops::KvType;
use engine::{Engine, EngineConfig, ForwardError, LogitsWanted};
use gguf::GgufFile;
use model::Model;
use quant::{Kernels, ThreadPool};

fn demo_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../cli/assets/demo-qwen3moe.gguf")
}

fn cfg(n_ctx: usize, ubatch: usize) -> EngineConfig {
    EngineConfig {
        n_ctx,
        kv_type: KvType::F32,
        ubatch,
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

const PROMPT: [u32; 8] = [1, 2, 3, 100, 200, 150, 40, 250];

#[test]
fn demo_prefill_matches_decode() {
    let file = GgufFile::open(demo_path()).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let k = Kernels::detect();
    let mut batch = Engine::new(&model, k, &pool, cfg(64, 512)).unwrap();
    let all = batch.forward(&PROMPT, LogitsWanted::All).unwrap();
    let nv = batch.n_vocab();
    assert_eq!(all.len(), PROMPT.len() * nv);
    assert!(all.iter().all(|v| v.is_finite()));
    assert_eq!(batch.n_past(), PROMPT.len());

    let mut single = Engine::new(&model, k, &pool, cfg(64, 512)).unwrap();
    for (i, &t) in PROMPT.iter().enumerate() {
        let l = single.forward(&[t], LogitsWanted::Last).unwrap();
        let d = max_diff(&l, &all[i * nv..(i + 1) * nv]);
        assert!(d < 1e-4, "position {i}: prefill vs decode differ by {d}");
    }
    // continue decoding after a prefill
    let next = batch.forward(&[7], LogitsWanted::Last).unwrap();
    let next1 = single.forward(&[7], LogitsWanted::Last).unwrap();
    assert!(max_diff(&next, &next1) < 1e-4);

    // chunked prefill (ubatch 3) gives the same last logits as one batch
    let mut chunked = Engine::new(&model, k, &pool, cfg(64, 3)).unwrap();
    let last = chunked.forward(&PROMPT, LogitsWanted::Last).unwrap();
    let d = max_diff(&last, &all[(PROMPT.len() - 1) * nv..]);
    assert!(d < 1e-4, "chunked prefill differs by {d}");
}
