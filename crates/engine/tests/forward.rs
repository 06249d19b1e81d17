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

    // the thread count does not change a single bit
    let pool1 = ThreadPool::new(1).unwrap();
    let mut one = Engine::new(&model, k, &pool1, cfg(64, 512)).unwrap();
    assert_eq!(one.forward(&PROMPT, LogitsWanted::All).unwrap(), all);

    // chunked prefill (ubatch 3) gives the same last logits as one batch
    let mut chunked = Engine::new(&model, k, &pool, cfg(64, 3)).unwrap();
    let last = chunked.forward(&PROMPT, LogitsWanted::Last).unwrap();
    let d = max_diff(&last, &all[(PROMPT.len() - 1) * nv..]);
    assert!(d < 1e-4, "chunked prefill differs by {d}");
    let mut chunked = Engine::new(&model, k, &pool, cfg(64, 3)).unwrap();
    let every = chunked.forward(&PROMPT, LogitsWanted::All).unwrap();
    let d = max_diff(&every, &all);
    assert!(d < 1e-4, "chunked prefill (all logits) differs by {d}");
    // truncate and replay the last two tokens: same logits as before
    chunked.truncate(PROMPT.len() - 2);
    assert_eq!(chunked.n_past(), PROMPT.len() - 2);
    let again = chunked
        .forward(&PROMPT[PROMPT.len() - 2..], LogitsWanted::All)
        .unwrap();
    let d = max_diff(&again, &all[(PROMPT.len() - 2) * nv..]);
    assert!(d < 1e-4, "replay after truncate differs by {d}");
}

/// The context size does not change a single bit: llama.cpp rounds its cache up to a multiple
/// of 256 cells, and its attention sums over the used cells padded to 256 (capped at the cache),
/// which decides the softmax's exponential and the kernels of the products; sluice follows
/// llama.cpp's cell count, not `-c` itself. (A random-weight fixture model: the demo model's
/// attention sums happen to come out the same in both orders.)
#[test]
fn logits_do_not_depend_on_the_context_size() {
    let path = testdata::fixtures_root().join("moe/qwen3moe-f32.gguf");
    assert!(
        path.is_file(),
        "moe fixtures missing: run `bash scripts/fetch_moe_fixtures.sh` ({} not found)",
        path.display()
    );
    let file = GgufFile::open(&path).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let k = Kernels::detect();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1000).collect();
    let mut reference = Engine::new(&model, k, &pool, cfg(256, 512)).unwrap();
    let want = reference.forward(&prompt, LogitsWanted::All).unwrap();
    for n_ctx in [prompt.len(), prompt.len() + 1, prompt.len() + 7, 300] {
        let mut e = Engine::new(&model, k, &pool, cfg(n_ctx, 512)).unwrap();
        let got = e.forward(&prompt, LogitsWanted::All).unwrap();
        assert!(
            got == want,
            "context {n_ctx}: max diff {}",
            max_diff(&got, &want)
        );
    }
}

#[test]
fn context_overflow_is_an_error() {
    let file = GgufFile::open(demo_path()).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    let mut eng = Engine::new(&model, Kernels::detect(), &pool, cfg(4, 512)).unwrap();
    let err = eng
        .forward(&[1, 2, 3, 4, 5], LogitsWanted::Last)
        .unwrap_err();
    assert!(matches!(
        err,
        ForwardError::ContextOverflow {
            n_past: 0,
            n_tokens: 5,
            n_ctx: 4
        }
    ));
    assert_eq!(eng.n_past(), 0);
    eng.forward(&[1, 2, 3], LogitsWanted::Last).unwrap();
    let err = eng.forward(&[4, 5], LogitsWanted::Last).unwrap_err();
    assert!(matches!(
        err,
        ForwardError::ContextOverflow { n_past: 3, .. }
    ));
    assert_eq!(eng.n_past(), 3);
    eng.forward(&[4], LogitsWanted::Last).unwrap();
    assert!(matches!(
        eng.forward(&[5], LogitsWanted::Last),
        Err(ForwardError::ContextOverflow { .. })
    ));
    // other input errors
    eng.reset();
    let nv = eng.n_vocab() as u32;
    assert!(matches!(
        eng.forward(&[nv], LogitsWanted::Last),
        Err(ForwardError::BadToken { .. })
    ));
    assert!(matches!(
        eng.forward(&[], LogitsWanted::Last),
        Err(ForwardError::NoTokens)
    ));
    assert_eq!(eng.n_past(), 0);
}

mod tiny {
    //! Tiny synthetic GGUF models with deterministic pseudo-random weights.

    use std::path::PathBuf;

    use gguf::{GgmlType, GgufWriter, Value};

    pub struct Rng(u64);
    impl Rng {
        pub fn new(seed: u64) -> Rng {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        /// Uniform in [-1, 1).
        pub fn next(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            ((self.0 >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        }
        pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n).map(|_| self.next() * scale).collect()
        }
    }

    #[derive(Clone)]
    pub struct Spec {
        pub arch: &'static str,
        pub n_embd: usize,
        pub n_layer: usize,
        pub n_head: usize,
        pub n_head_kv: usize,
        pub head_dim: usize,
        pub n_vocab: usize,
        pub n_ff: usize,
        pub n_expert: usize,
        pub n_expert_used: usize,
        pub n_ff_shexp: usize,
        /// Every expert is a copy of expert 0 (and of the dense FFN with the same seed).
        pub identical_experts: bool,
        /// Type of the FFN matrices (dense and experts).
        pub ffn_type: GgmlType,
        pub seed: u64,
    }

    pub fn spec(arch: &'static str) -> Spec {
        let moe = matches!(arch, "qwen3moe" | "qwen2moe" | "olmoe");
        Spec {
            arch,
            n_embd: 64,
            n_layer: 2,
            n_head: 4,
            n_head_kv: if arch == "olmoe" { 4 } else { 2 },
            head_dim: 16,
            n_vocab: 96,
            n_ff: 96,
            n_expert: if moe { 6 } else { 0 },
            n_expert_used: if moe { 2 } else { 0 },
            n_ff_shexp: 64,
            identical_experts: false,
            ffn_type: GgmlType::F32,
            seed: 7,
        }
    }

    fn bytes(ty: GgmlType, v: &[f32], row: usize) -> Vec<u8> {
        match ty {
            GgmlType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            // types without a quantizer: zero bytes of the right size
            _ if !quant::can_quantize(ty) => {
                vec![0u8; ty.row_bytes(v.len() as u64).unwrap() as usize]
            }
            _ => v
                .chunks(row)
                .flat_map(|r| quant::quantize_to_vec(ty, r).unwrap())
                .collect(),
        }
    }

    impl Spec {
        pub fn write(&self, dir: &std::path::Path) -> PathBuf {
            let a = self.arch;
            let k = |s: &str| format!("{a}.{s}");
            let (e, hd) = (self.n_embd, self.head_dim);
            let q = self.n_head * hd;
            let kv = self.n_head_kv * hd;
            let mut w = GgufWriter::new();
            let mut md = vec![
                ("general.architecture".to_owned(), Value::String(a.into())),
                (k("vocab_size"), Value::U32(self.n_vocab as u32)),
                (k("context_length"), Value::U32(256)),
                (k("embedding_length"), Value::U32(e as u32)),
                (k("block_count"), Value::U32(self.n_layer as u32)),
                (k("feed_forward_length"), Value::U32(self.n_ff as u32)),
                (k("attention.head_count"), Value::U32(self.n_head as u32)),
                (
                    k("attention.head_count_kv"),
                    Value::U32(self.n_head_kv as u32),
                ),
                (k("attention.key_length"), Value::U32(hd as u32)),
                (k("attention.value_length"), Value::U32(hd as u32)),
                (k("rope.dimension_count"), Value::U32(hd as u32)),
                (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
                (k("rope.freq_base"), Value::F32(10000.0)),
            ];
            if self.n_expert > 0 {
                md.push((k("expert_count"), Value::U32(self.n_expert as u32)));
                md.push((
                    k("expert_used_count"),
                    Value::U32(self.n_expert_used as u32),
                ));
                md.push((
                    k("expert_feed_forward_length"),
                    Value::U32(self.n_ff as u32),
                ));
                if a == "qwen2moe" {
                    md.push((
                        k("expert_shared_feed_forward_length"),
                        Value::U32(self.n_ff_shexp as u32),
                    ));
                }
            }
            if a == "llama" && self.n_expert > 0 {
                md.retain(|(key, _)| key != &k("expert_feed_forward_length"));
            }
            for (key, v) in md {
                w.add_metadata(key, v).unwrap();
            }
            // Separate generators so that the attention weights do not depend on the FFN kind.
            let mut ra = Rng::new(self.seed);
            let mut rf = Rng::new(self.seed + 1000);
            let mut rr = Rng::new(self.seed + 2000);
            let f32t = |w: &mut GgufWriter<'_>, name: String, dims: &[usize], v: Vec<f32>| {
                let d: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
                w.add_tensor(name, &d, GgmlType::F32, bytes(GgmlType::F32, &v, dims[0]))
                    .unwrap();
            };
            let norm = |r: &mut Rng, n: usize| -> Vec<f32> {
                (0..n).map(|_| 1.0 + 0.2 * r.next()).collect()
            };
            let sc = |n_in: usize| 1.0 / (n_in as f32).sqrt();
            f32t(
                &mut w,
                "token_embd.weight".into(),
                &[e, self.n_vocab],
                ra.vec(e * self.n_vocab, 1.0),
            );
            f32t(&mut w, "output_norm.weight".into(), &[e], norm(&mut ra, e));
            f32t(
                &mut w,
                "output.weight".into(),
                &[e, self.n_vocab],
                ra.vec(e * self.n_vocab, 2.0 * sc(e)),
            );
            let ffn_t = self.ffn_type;
            for il in 0..self.n_layer {
                let n = |s: &str| format!("blk.{il}.{s}");
                let (qd, kd) = match a {
                    "qwen2moe" | "olmoe" => (e, kv),
                    _ => (q, kv),
                };
                f32t(&mut w, n("attn_norm.weight"), &[e], norm(&mut ra, e));
                f32t(
                    &mut w,
                    n("attn_q.weight"),
                    &[e, qd],
                    ra.vec(e * qd, 2.0 * sc(e)),
                );
                f32t(
                    &mut w,
                    n("attn_k.weight"),
                    &[e, kd],
                    ra.vec(e * kd, 2.0 * sc(e)),
                );
                f32t(&mut w, n("attn_v.weight"), &[e, kd], ra.vec(e * kd, sc(e)));
                f32t(
                    &mut w,
                    n("attn_output.weight"),
                    &[qd, e],
                    ra.vec(qd * e, sc(qd)),
                );
                if a == "qwen2moe" {
                    f32t(&mut w, n("attn_q.bias"), &[qd], ra.vec(qd, 0.1));
                    f32t(&mut w, n("attn_k.bias"), &[kd], ra.vec(kd, 0.1));
                    f32t(&mut w, n("attn_v.bias"), &[kd], ra.vec(kd, 0.1));
                }
                match a {
                    "qwen3moe" | "qwen3" => {
                        f32t(&mut w, n("attn_q_norm.weight"), &[hd], norm(&mut ra, hd));
                        f32t(&mut w, n("attn_k_norm.weight"), &[hd], norm(&mut ra, hd));
                    }
                    "olmoe" => {
                        f32t(&mut w, n("attn_q_norm.weight"), &[e], norm(&mut ra, e));
                        f32t(&mut w, n("attn_k_norm.weight"), &[e], norm(&mut ra, e));
                    }
                    _ => {}
                }
                f32t(&mut w, n("ffn_norm.weight"), &[e], norm(&mut ra, e));
                let f = self.n_ff;
                let mut mat = |name: String, rows: usize, cols: usize, x: usize, r: &mut Rng| {
                    let one: Vec<f32> = r.vec(rows * cols, 2.0 * sc(cols));
                    let mut all = Vec::with_capacity(one.len() * x);
                    for i in 0..x {
                        if i == 0 || self.identical_experts {
                            all.extend_from_slice(&one);
                        } else {
                            all.extend(r.vec(rows * cols, 2.0 * sc(cols)));
                        }
                    }
                    let dims: Vec<u64> = if x > 1 || self.n_expert > 0 {
                        vec![cols as u64, rows as u64, x as u64]
                    } else {
                        vec![cols as u64, rows as u64]
                    };
                    w.add_tensor(name, &dims, ffn_t, bytes(ffn_t, &all, cols))
                        .unwrap();
                };
                if self.n_expert > 0 {
                    let x = self.n_expert;
                    mat(n("ffn_gate_exps.weight"), f, e, x, &mut rf);
                    mat(n("ffn_up_exps.weight"), f, e, x, &mut rf);
                    mat(n("ffn_down_exps.weight"), e, f, x, &mut rf);
                } else {
                    mat(n("ffn_gate.weight"), f, e, 1, &mut rf);
                    mat(n("ffn_up.weight"), f, e, 1, &mut rf);
                    mat(n("ffn_down.weight"), e, f, 1, &mut rf);
                }
                if self.n_expert > 0 {
                    f32t(
                        &mut w,
                        n("ffn_gate_inp.weight"),
                        &[e, self.n_expert],
                        rr.vec(e * self.n_expert, 4.0 * sc(e)),
                    );
                }
                if a == "qwen2moe" {
                    let s = self.n_ff_shexp;
                    f32t(
                        &mut w,
                        n("ffn_gate_inp_shexp.weight"),
                        &[e],
                        rr.vec(e, sc(e)),
                    );
                    f32t(
                        &mut w,
                        n("ffn_gate_shexp.weight"),
                        &[e, s],
                        rr.vec(e * s, 2.0 * sc(e)),
                    );
                    f32t(
                        &mut w,
                        n("ffn_up_shexp.weight"),
                        &[e, s],
                        rr.vec(e * s, 2.0 * sc(e)),
                    );
                    f32t(
                        &mut w,
                        n("ffn_down_shexp.weight"),
                        &[s, e],
                        rr.vec(s * e, 2.0 * sc(s)),
                    );
                }
            }
            let path = dir.join(format!("{a}-{}.gguf", self.seed));
            w.write_to_path(&path).unwrap();
            path
        }
    }
}

/// Logits of every position of `tokens`, in one batch and token by token; checks they agree
/// and are finite.
fn run_both(path: &std::path::Path, tokens: &[u32], kv: KvType) -> Vec<f32> {
    let file = GgufFile::open(path).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let c = EngineConfig {
        n_ctx: 32,
        kv_type: kv,
        ubatch: 16,
    };
    let mut b = Engine::new(&model, Kernels::detect(), &pool, c).unwrap();
    let all = b.forward(tokens, LogitsWanted::All).unwrap();
    assert!(all.iter().all(|v| v.is_finite()));
    let nv = b.n_vocab();
    let spread = all.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(spread > 0.1, "logits are all near zero ({spread})");
    let mut s = Engine::new(&model, Kernels::detect(), &pool, c).unwrap();
    for (i, &t) in tokens.iter().enumerate() {
        let l = s.forward(&[t], LogitsWanted::Last).unwrap();
        let d = max_diff(&l, &all[i * nv..(i + 1) * nv]);
        assert!(d < 1e-3, "position {i}: prefill vs decode differ by {d}");
    }
    all
}

const TINY_PROMPT: [u32; 7] = [3, 17, 42, 5, 91, 60, 8];

#[test]
fn identical_experts_equal_dense_ffn() {
    let dir = tempfile::tempdir().unwrap();
    for ty in [gguf::GgmlType::F32, gguf::GgmlType::Q8_0] {
        let mut dense = tiny::spec("llama");
        dense.ffn_type = ty;
        let mut moe = dense.clone();
        moe.n_expert = 4;
        moe.n_expert_used = 2;
        moe.identical_experts = true;
        let mut distinct = moe.clone();
        distinct.identical_experts = false;
        let ld = run_both(&dense.write(dir.path()), &TINY_PROMPT, KvType::F32);
        let lm = run_both(&moe.write(dir.path()), &TINY_PROMPT, KvType::F32);
        let d = max_diff(&ld, &lm);
        assert!(
            d < 1e-4,
            "{ty:?}: identical experts differ from dense by {d}"
        );
        // the oracle can fail: distinct experts give other logits
        std::fs::remove_file(dir.path().join("llama-7.gguf")).unwrap();
        let lx = run_both(&distinct.write(dir.path()), &TINY_PROMPT, KvType::F32);
        assert!(
            max_diff(&ld, &lx) > 1e-2,
            "{ty:?}: distinct experts match dense"
        );
    }
}

#[test]
fn per_arch_smoke() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen2moe", "olmoe", "qwen3moe"] {
        let s = tiny::spec(arch);
        let p = s.write(dir.path());
        for kv in [KvType::F32, KvType::F16] {
            run_both(&p, &TINY_PROMPT, kv);
        }
    }
}

#[test]
fn observer_sees_named_intermediates() {
    use std::sync::Mutex;
    let dir = tempfile::tempdir().unwrap();
    let p = tiny::spec("qwen2moe").write(dir.path());
    let file = GgufFile::open(&p).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    type Seen = Vec<(String, Option<usize>, Vec<f32>)>;
    let seen: Mutex<Seen> = Mutex::new(Vec::new());
    let mut eng = Engine::new(&model, Kernels::detect(), &pool, cfg(16, 8)).unwrap();
    eng.set_observer(Some(Box::new(
        |name: &str, il: Option<usize>, d: &[f32]| {
            seen.lock().unwrap().push((name.to_owned(), il, d.to_vec()));
        },
    )));
    let logits = eng.forward(&[1, 2, 3], LogitsWanted::Last).unwrap();
    drop(eng);
    let seen = seen.into_inner().unwrap();
    for name in [
        "attn_norm",
        "Qcur",
        "Kcur",
        "Vcur",
        "kqv_out",
        "ffn_inp",
        "ffn_moe_probs",
        "ffn_moe_topk",
        "ffn_moe_weights",
        "ffn_moe_out",
        "ffn_shexp_out",
        "l_out",
    ] {
        for il in 0..2 {
            assert!(
                seen.iter().any(|(n, l, _)| n == name && *l == Some(il)),
                "{name} layer {il} not observed"
            );
        }
    }
    let (_, _, out) = seen.iter().find(|(n, _, _)| n == "result_output").unwrap();
    assert_eq!(out, &logits);
    let (_, _, ids) = seen
        .iter()
        .find(|(n, l, _)| n == "ffn_moe_topk" && *l == Some(0))
        .unwrap();
    assert_eq!(ids.len(), 3 * 2);
    let (_, _, probs) = seen
        .iter()
        .find(|(n, l, _)| n == "ffn_moe_probs" && *l == Some(0))
        .unwrap();
    // each token's probabilities sum to one, and the chosen ones are the largest
    for t in 0..3 {
        let row = &probs[t * 6..(t + 1) * 6];
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        let best = ids[t * 2] as usize;
        assert!(row.iter().all(|&v| v <= row[best]));
    }
}

#[test]
fn unsupported_weight_type_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = tiny::spec("olmoe");
    // Q8_1 is an activation type: ggml has no product kernel with Q8_1 weights.
    s.ffn_type = gguf::GgmlType::Q8_1;
    let p = s.write(dir.path());
    let file = GgufFile::open(&p).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    let err = Engine::new(&model, Kernels::detect(), &pool, cfg(16, 8)).unwrap_err();
    match &err {
        ForwardError::UnsupportedWeight { tensor, .. } => {
            assert!(tensor.ends_with("_exps.weight"), "{tensor}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(err.to_string().contains("blk.0.ffn_"), "{err}");
}

/// A saved context put back (into the same engine after other work, or into another engine
/// of the same model) continues bit for bit as the context it was saved from, in both KV
/// storage types; positions past the saved ones do not leak into it.
#[test]
fn saved_state_restores_the_context_bit_for_bit() {
    let file = GgufFile::open(demo_path()).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let k = Kernels::detect();
    for kv_type in [KvType::F32, KvType::F16] {
        let c = EngineConfig {
            kv_type,
            ..cfg(64, 512)
        };
        let mut a = Engine::new(&model, k, &pool, c).unwrap();
        a.forward(&PROMPT[..5], LogitsWanted::Last).unwrap();
        let state = a.save_state();
        assert_eq!(state.n_past(), 5);
        assert!(state.bytes() > 0);
        let want = a.forward(&PROMPT[5..], LogitsWanted::All).unwrap();
        // Other tokens overwrite the cells, then the state comes back.
        a.reset();
        a.forward(&[9, 8, 7, 6, 5, 4, 3, 2, 1, 0], LogitsWanted::Last)
            .unwrap();
        a.restore_state(&state).unwrap();
        assert_eq!(a.n_past(), 5);
        assert_eq!(a.forward(&PROMPT[5..], LogitsWanted::All).unwrap(), want);
        // Into another engine of the same model.
        let mut b = Engine::new(&model, k, &pool, c).unwrap();
        b.restore_state(&state).unwrap();
        assert_eq!(b.forward(&PROMPT[5..], LogitsWanted::All).unwrap(), want);
        // Into an engine whose context cannot hold it: refused, nothing changed.
        let mut small = Engine::new(&model, k, &pool, cfg(4, 512)).unwrap();
        assert!(small.restore_state(&state).is_err());
        assert_eq!(small.n_past(), 0);
    }
}

/// The abort check is asked before every chunk; stopping leaves the context as it was, and the
/// engine then runs on as if the call had not been made.
#[test]
fn abort_before_a_chunk_leaves_the_context_unchanged() {
    let file = GgufFile::open(demo_path()).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let k = Kernels::detect();
    let mut fresh = Engine::new(&model, k, &pool, cfg(64, 2)).unwrap();
    fresh.forward(&PROMPT[..2], LogitsWanted::Last).unwrap();
    let want = fresh.forward(&PROMPT[2..], LogitsWanted::Last).unwrap();

    let mut e = Engine::new(&model, k, &pool, cfg(64, 2)).unwrap();
    e.forward(&PROMPT[..2], LogitsWanted::Last).unwrap();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = std::sync::Arc::clone(&asked);
    // Stop before the third chunk (two of the six tokens' chunks ran).
    e.set_abort(Some(Box::new(move || {
        seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 2
    })));
    let err = e.forward(&PROMPT[2..], LogitsWanted::Last).unwrap_err();
    assert!(matches!(err, ForwardError::Cancelled), "{err}");
    assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 3);
    assert_eq!(e.n_past(), 2);
    e.set_abort(None);
    assert_eq!(e.forward(&PROMPT[2..], LogitsWanted::Last).unwrap(), want);
}

fn qwen35moe_path() -> PathBuf {
    moe_path("qwen35moe-q8_0.gguf")
}

/// The hybrid models: qwen35moe's value heads tiled over the key heads, qwen3next's grouped,
/// lfm2moe's short convolutions (a convolution state alone) and nemotron_h_moe's Mamba-2
/// layers (a convolution state and a scan state, beside layers without a mixer or an FFN).
fn hybrid_paths() -> [PathBuf; 4] {
    [
        qwen35moe_path(),
        moe_path("qwen3next-q8_0.gguf"),
        moe_path("lfm2moe-q8_0.gguf"),
        moe_path("nemotron_h_moe-q8_0.gguf"),
    ]
}

fn moe_path(name: &str) -> PathBuf {
    let p = testdata::fixtures_root().join("moe").join(name);
    assert!(
        p.is_file(),
        "moe fixtures missing: run `bash scripts/fetch_moe_fixtures.sh` ({} not found)",
        p.display()
    );
    p
}

/// A hybrid model's linear-attention layers hold one state for the whole context: going back
/// to where the last call started (with rollback on) gives the same bits as never having gone
/// on; going anywhere else empties the context; a saved state carries the recurrent state.
#[test]
fn hybrid_context_goes_back_through_its_snapshot_or_to_empty() {
    for path in hybrid_paths() {
        context_goes_back(&path);
    }
}

fn context_goes_back(path: &std::path::Path) {
    let file = GgufFile::open(path).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    let k = Kernels::detect();
    let prompt = &PROMPT[..7];
    let mut e = Engine::new(&model, k, &pool, cfg(64, 4)).unwrap();
    assert!(e.has_recurrent_state());
    e.set_rollback(true);
    e.forward(prompt, LogitsWanted::Last).unwrap();
    let state = e.save_state();
    assert!(state.bytes() > 0);
    let want = e.forward(&[9], LogitsWanted::Last).unwrap();
    // back to the start of that call, and the same token again
    e.truncate(7);
    assert_eq!(e.n_past(), 7);
    assert_eq!(e.forward(&[9], LogitsWanted::Last).unwrap(), want);
    // not where the last call started: the context is emptied
    e.truncate(5);
    assert_eq!(e.n_past(), 0);
    e.restore_state(&state).unwrap();
    assert_eq!(e.n_past(), 7);
    assert_eq!(e.forward(&[9], LogitsWanted::Last).unwrap(), want);
    // without rollback, going back is going to empty
    e.set_rollback(false);
    e.forward(&[3], LogitsWanted::Last).unwrap();
    e.truncate(8);
    assert_eq!(e.n_past(), 0);
    // and the same tokens run again from empty give the same bits
    e.forward(prompt, LogitsWanted::Last).unwrap();
    assert_eq!(e.forward(&[9], LogitsWanted::Last).unwrap(), want);
}

/// A call stopped after some of its chunks ran: the recurrent state has moved on, so the
/// context goes back through the snapshot of the call's start (rollback on) or to empty.
#[test]
fn hybrid_abort_after_a_chunk_rolls_back_or_empties() {
    for path in hybrid_paths() {
        abort_rolls_back(&path);
    }
}

fn abort_rolls_back(path: &std::path::Path) {
    let file = GgufFile::open(path).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    let k = Kernels::detect();
    let mut fresh = Engine::new(&model, k, &pool, cfg(64, 2)).unwrap();
    fresh.forward(&PROMPT[..2], LogitsWanted::Last).unwrap();
    let want = fresh.forward(&PROMPT[2..], LogitsWanted::Last).unwrap();
    for rollback in [true, false] {
        let mut e = Engine::new(&model, k, &pool, cfg(64, 2)).unwrap();
        e.set_rollback(rollback);
        e.forward(&PROMPT[..2], LogitsWanted::Last).unwrap();
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = std::sync::Arc::clone(&asked);
        e.set_abort(Some(Box::new(move || {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 2
        })));
        let err = e.forward(&PROMPT[2..], LogitsWanted::Last).unwrap_err();
        assert!(matches!(err, ForwardError::Cancelled), "{err}");
        e.set_abort(None);
        if rollback {
            assert_eq!(e.n_past(), 2);
        } else {
            assert_eq!(e.n_past(), 0);
            e.forward(&PROMPT[..2], LogitsWanted::Last).unwrap();
        }
        assert_eq!(e.forward(&PROMPT[2..], LogitsWanted::Last).unwrap(), want);
    }
}

/// A qwen35moe file with a NextN (MTP) block after the trunk, as llama.cpp's converter can
/// write: the block is a full-attention layer with the gated q, the MoE FFN and the nextn
/// tensors. It loads (never recurrent, listed as NextN) and the trunk's logits do not change:
/// the block is not run.
#[test]
fn hybrid_nextn_block_loads_and_is_not_run() {
    use gguf::{GgmlType, GgufWriter, TensorType, Value};
    let src = GgufFile::open(qwen35moe_path()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        let v = if k == "qwen35moe.block_count" {
            Value::U32(5)
        } else {
            v.clone()
        };
        w.add_metadata(k, v).unwrap();
    }
    w.add_metadata("qwen35moe.nextn_predict_layers", Value::U32(1))
        .unwrap();
    let known = |t: &gguf::TensorInfo| match t.ty {
        TensorType::Known(ty) => ty,
        _ => panic!("{}: unknown type", t.name),
    };
    for t in src.tensors() {
        let data = src.tensor_data(t).unwrap().to_vec();
        w.add_tensor(t.name.clone(), &t.dims, known(t), data)
            .unwrap();
    }
    // the NextN block: layer 3's tensors (a full-attention layer) as blk.4, and its own
    for t in src.tensors() {
        if let Some(rest) = t.name.strip_prefix("blk.3.") {
            let data = src.tensor_data(t).unwrap().to_vec();
            w.add_tensor(format!("blk.4.{rest}"), &t.dims, known(t), data)
                .unwrap();
        }
    }
    let e = 256u64;
    let f32s = |n: u64, v: f32| -> Vec<u8> { (0..n).flat_map(|_| v.to_le_bytes()).collect() };
    w.add_tensor(
        "blk.4.nextn.eh_proj.weight",
        &[2 * e, e],
        GgmlType::F32,
        f32s(2 * e * e, 0.01),
    )
    .unwrap();
    for n in ["enorm", "hnorm", "shared_head_norm"] {
        w.add_tensor(
            format!("blk.4.nextn.{n}.weight"),
            &[e],
            GgmlType::F32,
            f32s(e, 1.0),
        )
        .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nextn.gguf");
    w.write_to_path(&path).unwrap();

    let file = GgufFile::open(&path).unwrap();
    let with = Model::from_gguf(&file).unwrap();
    let hp = &with.hparams;
    assert_eq!((hp.n_layer, hp.n_layer_nextn), (4, 1));
    assert_eq!(hp.recurrent, vec![true, true, true, false, false]);
    assert_eq!(with.tensors.nextn.len(), 1);
    assert_eq!(with.tensors.nextn[0].layer, 4);
    assert!(with.tensors.nextn[0].block.mha().is_some());
    let trunk = Model::from_gguf(&src).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    let k = Kernels::detect();
    let run = |m: &Model<'_>| {
        let mut e = Engine::new(m, k, &pool, cfg(64, 4)).unwrap();
        e.forward(&PROMPT, LogitsWanted::All).unwrap()
    };
    assert_eq!(run(&with), run(&trunk));
}

/// A decode step's logits after a prefill of `prompt`, then `group` run one call per token;
/// and the same group in one [`Engine::forward_rows`] call: every row equal bit for bit, and
/// the context after it the same (the next step's logits too, after cutting the group back).
fn rows_equal_one_token_calls(path: &std::path::Path, kv: KvType) {
    let what = format!("{} ({kv:?} KV)", path.display());
    let file = GgufFile::open(path).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let k = Kernels::detect();
    let c = EngineConfig {
        n_ctx: 64,
        kv_type: kv,
        ubatch: 16,
    };
    let nv = model.hparams.n_vocab as usize;
    let tok = |i: usize| ((i * 37 + 11) % nv.min(1000)) as u32;
    let prompt: Vec<u32> = (0..9).map(tok).collect();
    let group: Vec<u32> = (20..25).map(tok).collect();

    let mut one = Engine::new(&model, k, &pool, c).unwrap();
    one.forward(&prompt, LogitsWanted::Last).unwrap();
    let mut want = Vec::new();
    for &t in &group {
        want.extend(one.forward(&[t], LogitsWanted::Last).unwrap());
    }
    let mut rows = Engine::new(&model, k, &pool, c).unwrap();
    rows.forward(&prompt, LogitsWanted::Last).unwrap();
    let got = rows.forward_rows(&group).unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.chunks(nv).zip(want.chunks(nv)).enumerate() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(g) == bits(w),
            "{what}: row {i} differs from its one-token call by {}",
            max_diff(g, w)
        );
    }
    // the batched order is back for the next prompt: a batch after it is what it was before
    let batched = |e: &mut Engine<'_>| {
        e.truncate(prompt.len());
        e.forward(&group, LogitsWanted::All).unwrap()
    };
    let mut fresh = Engine::new(&model, k, &pool, c).unwrap();
    fresh.forward(&prompt, LogitsWanted::Last).unwrap();
    let fresh_batch = batched(&mut fresh);
    assert!(
        batched(&mut rows) == fresh_batch,
        "{what}: batch order not restored"
    );
    // cut back to two of the group's tokens and go on: as one-token calls would
    rows.truncate(prompt.len());
    rows.forward_rows(&group[..2]).unwrap();
    one.truncate(prompt.len() + 2);
    let next = rows.forward_rows(&[tok(40)]).unwrap();
    let next1 = one.forward(&[tok(40)], LogitsWanted::Last).unwrap();
    assert!(next == next1, "{what}: the step after a cut differs");
}

/// [`Engine::forward_rows`] (a speculative decode's verification) gives each row the bits of a
/// one-token call, on every MHA architecture and weight type of the fixtures and with both KV
/// types, where a batched call may differ in the last bits.
#[test]
fn rows_in_one_token_order_equal_decode_steps() {
    let dir = testdata::fixtures_root().join("moe");
    assert!(
        dir.join("qwen3moe-f32.gguf").is_file(),
        "moe fixtures missing: run `bash scripts/fetch_moe_fixtures.sh`"
    );
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.ends_with(".gguf")
                && !name.starts_with("deepseek2")
                && !name.starts_with("qwen35moe")
                && !name.starts_with("qwen3next")
                && !name.starts_with("lfm2moe")
                && !name.starts_with("nemotron_h_moe")
        })
        .collect();
    paths.sort();
    paths.push(demo_path());
    assert!(paths.len() > 20, "{paths:?}");
    for path in &paths {
        for kv in [KvType::F32, KvType::F16] {
            rows_equal_one_token_calls(path, kv);
        }
    }
}

/// Latent and linear attention are not computed row by row: refused, naming the layer.
#[test]
fn rows_in_one_token_order_are_refused_where_not_kept() {
    let dir = testdata::fixtures_root().join("moe");
    for name in [
        "deepseek2-f32.gguf",
        "qwen35moe-f32.gguf",
        "qwen3next-f32.gguf",
        "lfm2moe-f32.gguf",
        "nemotron_h_moe-f32.gguf",
    ] {
        let file = GgufFile::open(dir.join(name)).unwrap();
        let model = Model::from_gguf(&file).unwrap();
        let pool = ThreadPool::new(1).unwrap();
        let mut e = Engine::new(&model, Kernels::detect(), &pool, cfg(32, 16)).unwrap();
        e.forward(&[1, 2, 3], LogitsWanted::Last).unwrap();
        let err = e.forward_rows(&[4, 5]).unwrap_err().to_string();
        assert!(err.contains("layer 0"), "{name}: {err}");
        assert_eq!(e.n_past(), 3, "{name}: the context moved");
    }
}

/// The glm4moe fixtures (the only MHA ones with a NextN layer).
fn glm4moe_paths() -> Vec<PathBuf> {
    let dir = testdata::fixtures_root().join("moe");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("glm4moe") && name.ends_with(".gguf")
        })
        .collect();
    paths.sort();
    assert!(paths.len() >= 5, "moe fixtures missing: {paths:?}");
    paths
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A draft head keeps every row's hidden state, which makes a prompt's last layer run the
/// FFN of the rows that otherwise stop after its attention: aside, so that no logit moves.
#[test]
fn a_draft_head_leaves_every_logit_as_it_was() {
    for path in glm4moe_paths() {
        let what = path.display().to_string();
        let file = GgufFile::open(&path).unwrap();
        let model = Model::from_gguf(&file).unwrap();
        let pool = ThreadPool::new(2).unwrap();
        let k = Kernels::detect();
        let c = cfg(64, 4);
        let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 11) % 1000).collect();
        let run = |head: bool| {
            let mut e = Engine::new(&model, k, &pool, c).unwrap();
            if head {
                e.enable_mtp(&model, k).unwrap();
                assert!(e.has_mtp());
            }
            let mut out = e.forward(&prompt, LogitsWanted::Last).unwrap();
            out.extend(e.forward(&[5], LogitsWanted::Last).unwrap());
            out.extend(e.forward_rows(&[6, 7, 8]).unwrap());
            e.truncate(13);
            out.extend(e.forward(&[9, 10], LogitsWanted::All).unwrap());
            out
        };
        assert!(bits(&run(true)) == bits(&run(false)), "{what}");
    }
}

/// The head's drafts depend on the context, not on how it was fed: a draft whose first row
/// stands, one whose first row was run with another token, and a verify pass cut back all
/// leave the head where running the context plainly leaves it (its rows are computed in
/// one-token order, so this holds bit for bit).
#[test]
fn head_drafts_follow_the_context_however_it_was_fed() {
    for path in glm4moe_paths() {
        let what = path.display().to_string();
        let file = GgufFile::open(&path).unwrap();
        let model = Model::from_gguf(&file).unwrap();
        let pool = ThreadPool::new(2).unwrap();
        let k = Kernels::detect();
        // a ubatch below the prompt: the head's catch-up runs in chunks
        let c = cfg(64, 4);
        let p: Vec<u32> = (0..13).map(|i| (i * 53 + 7) % 1000).collect();
        let head = || {
            let mut e = Engine::new(&model, k, &pool, c).unwrap();
            e.enable_mtp(&model, k).unwrap();
            e.forward(&p[..9], LogitsWanted::Last).unwrap();
            e
        };
        let draft = |e: &mut Engine<'_>| {
            let d = e.mtp_draft(77, 3, 0.0).unwrap();
            d.iter().map(|&(t, p)| (t, p.to_bits())).collect::<Vec<_>>()
        };
        // plainly
        let mut a = head();
        a.forward_rows(&p[9..12]).unwrap();
        let want = draft(&mut a);
        assert_eq!(want.len(), 3, "{what}: p_min 0 drafts the most");
        // a draft after the prompt whose first row stands (the pass runs its token)
        let mut b = head();
        assert_eq!(b.mtp_draft(p[9], 2, 0.0).unwrap().len(), 2);
        b.forward_rows(&p[9..12]).unwrap();
        assert_eq!(
            draft(&mut b),
            want,
            "{what}: after a draft with the token run"
        );
        // a draft with a token the pass does not run
        let mut c2 = head();
        c2.mtp_draft(p[9] + 1, 2, 0.0).unwrap();
        c2.forward_rows(&p[9..12]).unwrap();
        assert_eq!(
            draft(&mut c2),
            want,
            "{what}: after a draft with another token"
        );
        // a longer verify pass cut back, and a step run alone
        let mut d = head();
        d.mtp_draft(p[9], 1, 0.0).unwrap();
        d.forward_rows(&[p[9], p[10], p[11], 5, 6]).unwrap();
        d.truncate(12);
        assert_eq!(draft(&mut d), want, "{what}: after a cut");
        d.forward_rows(&[77]).unwrap();
        let mut a2 = head();
        a2.forward_rows(&[p[9], p[10], p[11], 77]).unwrap();
        assert_eq!(
            draft(&mut d),
            draft(&mut a2),
            "{what}: a step after a draft"
        );
        // p_min: the first draft's probability bounds what is drafted
        let mut e = head();
        let all = e.mtp_draft(p[9], 3, 0.0).unwrap();
        let mut f = head();
        let none = f.mtp_draft(p[9], 3, all[0].1 + 1e-6).unwrap();
        assert!(none.is_empty(), "{what}: {all:?}");
    }
}

/// No NextN layer, or a model whose drafts cannot be verified row by row: refused, saying
/// why.
#[test]
fn a_draft_head_is_refused_where_it_cannot_run() {
    let dir = testdata::fixtures_root().join("moe");
    for (name, why) in [
        ("qwen3moe-f32.gguf", "no NextN"),
        ("deepseek2-f32.gguf", "latent or linear attention"),
        ("qwen35moe-f32.gguf", "latent or linear attention"),
        // bailingmoe2's NextN layer has its own output norm, which llama.cpp does not run
        ("bailingmoe2-f32.gguf", "layer_output_norm"),
        // a NextN layer, over linear-attention layers
        ("qwen3next-f32.gguf", "latent or linear attention"),
    ] {
        let file = GgufFile::open(dir.join(name)).unwrap();
        let model = Model::from_gguf(&file).unwrap();
        let pool = ThreadPool::new(1).unwrap();
        let k = Kernels::detect();
        let mut e = Engine::new(&model, k, &pool, cfg(32, 16)).unwrap();
        let err = e.enable_mtp(&model, k).unwrap_err().to_string();
        assert!(err.contains(why), "{name}: {err}");
        assert!(!e.has_mtp());
        assert!(e.mtp_draft(1, 3, 0.0).unwrap().is_empty());
    }
}

/// The logits' bits of every step of decoding [`PROMPT`] one token at a time.
fn decode_bits(e: &mut Engine) -> Vec<u32> {
    PROMPT
        .iter()
        .flat_map(|&t| bits(&e.forward(&[t], LogitsWanted::Last).unwrap()))
        .collect()
}

/// The start-up choice of the one-token multi-row kernels, made per weight type and order:
/// with each pair's kernels and row prefetch left out in turn, every decode step keeps its
/// logits' bits, and the pairs to choose for stay the same.
#[test]
fn multi_row_chosen_per_type_keeps_every_decode_bit() {
    let file = GgufFile::open(demo_path()).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    let k = Kernels::detect();
    let mut base = Engine::new(&model, k, &pool, cfg(64, 512)).unwrap();
    let pairs = base.one_token_multi_row_kernels();
    if k.isa() != quant::Isa::Scalar {
        assert!(
            !pairs.is_empty(),
            "the demo's weights have multi-row kernels"
        );
    }
    let want = decode_bits(&mut base);
    for &(w, order) in &pairs {
        let mut e = Engine::new(&model, k, &pool, cfg(64, 512)).unwrap();
        e.set_multi_row_for(w, order, false);
        e.set_one_token_row_prefetch_for(w, order, false);
        assert_eq!(e.one_token_multi_row_kernels(), pairs);
        assert!(
            decode_bits(&mut e) == want,
            "{w} {order:?}: decode bits changed"
        );
    }
}

/// The start-up choice of the row prefetch for the one-token products without multi-row
/// kernels: with each pair's prefetch left out in turn, every decode step keeps its logits'
/// bits, the pair drops out of the choice (its prefetch is off), and no pair is offered to
/// both choices.
#[test]
fn row_prefetch_chosen_per_type_keeps_every_decode_bit() {
    let file = GgufFile::open(demo_path()).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    let k = Kernels::detect();
    let mut base = Engine::new(&model, k, &pool, cfg(64, 512)).unwrap();
    let multi = base.one_token_multi_row_kernels();
    let pairs = base.one_token_row_prefetch_kernels();
    assert!(!pairs.is_empty(), "the demo has one-row weight types");
    assert!(
        pairs.iter().all(|p| !multi.contains(p)),
        "{pairs:?} {multi:?}"
    );
    let want = decode_bits(&mut base);
    for &(w, order) in &pairs {
        let mut e = Engine::new(&model, k, &pool, cfg(64, 512)).unwrap();
        e.set_one_token_row_prefetch_for(w, order, false);
        let left = e.one_token_row_prefetch_kernels();
        assert!(!left.contains(&(w, order)), "{w} {order:?}: {left:?}");
        assert_eq!(left.len(), pairs.len() - 1);
        assert_eq!(e.one_token_multi_row_kernels(), multi);
        assert!(
            decode_bits(&mut e) == want,
            "{w} {order:?}: decode bits changed"
        );
    }
}

/// An expert source over the file's own expert bytes that logs when each layer's routing
/// reaches it, beside the observer's log of each layer's attention.
struct LoggingSource<'f> {
    file: &'f GgufFile,
    take_early: bool,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl LoggingSource<'_> {
    fn stack(&self, layer: usize, proj: engine::ExpertProj) -> (&[u8], usize) {
        let name = match proj {
            engine::ExpertProj::Gate => "ffn_gate_exps",
            engine::ExpertProj::Up => "ffn_up_exps",
            engine::ExpertProj::Down => "ffn_down_exps",
        };
        let t = self
            .file
            .tensor(&format!("blk.{layer}.{name}.weight"))
            .unwrap();
        let data = self.file.tensor_data(t).unwrap();
        (data, data.len() / t.dims[2] as usize)
    }
}

impl engine::ExpertSource for LoggingSource<'_> {
    fn proj_bytes(&self, layer: usize, proj: engine::ExpertProj) -> Option<usize> {
        Some(self.stack(layer, proj).1)
    }
    fn load(&mut self, layer: usize, routed: &[usize]) -> Result<(), String> {
        self.log
            .lock()
            .unwrap()
            .push(format!("load {layer} {routed:?}"));
        Ok(())
    }
    fn load_early(&mut self, layer: usize, routed: &[usize]) -> Result<bool, String> {
        if self.take_early {
            self.log
                .lock()
                .unwrap()
                .push(format!("early {layer} {routed:?}"));
        }
        Ok(self.take_early)
    }
    fn part(&self, layer: usize, expert: usize, proj: engine::ExpertProj) -> &[u8] {
        let (data, per) = self.stack(layer, proj);
        &data[expert * per..(expert + 1) * per]
    }
    fn release(&mut self, _layer: usize) {}
}

/// SmallThinker's router reads the layer's input: the engine hands each layer's routing to
/// the source before the layer's attention (a source that takes it gets no second load), or
/// after it where the source declines; the experts routed and the logits are the same.
#[test]
fn a_routing_known_before_the_attention_reaches_the_source_first() {
    use std::sync::{Arc, Mutex};
    let p = testdata::fixtures_root()
        .join("moe")
        .join("smallthinker-q8_0.gguf");
    assert!(
        p.is_file(),
        "moe fixtures missing: run `bash scripts/fetch_moe_fixtures.sh`"
    );
    let file = GgufFile::open(&p).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    let tokens = [9u32, 100, 7, 300, 5];
    let mut resident = Engine::new(&model, Kernels::detect(), &pool, cfg(64, 8)).unwrap();
    let want = resident.forward(&tokens, LogitsWanted::All).unwrap();
    let want1 = resident.forward(&[11], LogitsWanted::Last).unwrap();
    let mut routings = Vec::new();
    for take_early in [true, false] {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut eng = Engine::new(&model, Kernels::detect(), &pool, cfg(64, 8)).unwrap();
        let src = LoggingSource {
            file: &file,
            take_early,
            log: Arc::clone(&log),
        };
        eng.set_expert_source(Some(Box::new(src))).unwrap();
        let seen = Arc::clone(&log);
        eng.set_observer(Some(Box::new(
            move |name: &str, il: Option<usize>, _: &[f32]| {
                if name == "kqv_out" {
                    seen.lock()
                        .unwrap()
                        .push(format!("attention {}", il.unwrap_or(99)));
                }
            },
        )));
        let got = eng.forward(&tokens, LogitsWanted::All).unwrap();
        assert_eq!(bits(&got), bits(&want), "take_early {take_early}");
        // the prompt, then one more token (a one-token pass)
        let got = eng.forward(&[11], LogitsWanted::Last).unwrap();
        assert_eq!(bits(&got), bits(&want1), "take_early {take_early}");
        drop(eng);
        let log = log.lock().unwrap().clone();
        let (verb, first) = if take_early {
            ("early", true)
        } else {
            ("load", false)
        };
        for pass in 0..2 {
            for il in 0..3 {
                let at = |what: &str| {
                    let hits: Vec<usize> = (log.iter().enumerate())
                        .filter(|(_, l)| l.starts_with(&format!("{what} {il}")))
                        .map(|(i, _)| i)
                        .collect();
                    assert_eq!(hits.len(), 2, "{what} {il}: {log:?}");
                    hits[pass]
                };
                assert_eq!(at(verb) < at("attention"), first, "{log:?}");
            }
        }
        // no layer is loaded twice: one routing per layer and pass
        assert_eq!(
            log.iter().filter(|l| !l.starts_with("attention")).count(),
            6
        );
        routings.push(
            log.iter()
                .filter(|l| !l.starts_with("attention"))
                .map(|l| l.split_once(' ').unwrap().1.to_owned())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(routings[0], routings[1]);
}
