//! Generation through the library, on the generated MoE test models
//! (`scripts/fetch_moe_fixtures.sh`): streamed experts give the resident run's tokens, a sink
//! sees the events in their documented order, a cancel stops the generation and says so.

mod common;

use std::sync::{Arc, Mutex};

use runtime::cancel::Control;
use runtime::events::{Outcome, Prefilled, TokenRow};
use runtime::generate::Turn;
use runtime::open::{Loaded, RunConfig};
use runtime::settings::stream::{
    CacheMb, CachePolicy, DenseWeights, ReadBackend, StreamConfig, StreamMode,
};
use runtime::sink::{Collect, Sink};
use runtime::{Notices, Result, Setting};

use common::{config, moe};

/// The tokens and text of one generation of `n` tokens from `prompt`.
fn generate(cfg: &RunConfig, prompt: &str, n: usize) -> (Outcome, Collect) {
    let mut text = Collect::default();
    let o = generate_into(cfg, prompt, n, &mut text);
    (o, text)
}

/// One generation of `n` tokens from `prompt`, reported to `sink`.
fn generate_into(cfg: &RunConfig, prompt: &str, n: usize, sink: &mut dyn Sink) -> Outcome {
    generate_streamed(cfg, prompt, n, sink).0
}

/// [`generate_into`], with the expert source's counters over the whole run (prompt included).
fn generate_streamed(
    cfg: &RunConfig,
    prompt: &str,
    n: usize,
    sink: &mut dyn Sink,
) -> (Outcome, runtime::source::StreamSnapshot) {
    let loaded = Loaded::open(cfg, &Notices::silent()).expect("open");
    let ids = loaded.tokenizer.encode(prompt, true, false);
    let (mut rt, _) = loaded.runtime(cfg).expect("runtime");
    let o = rt
        .generate(
            &Turn {
                ids: &ids,
                n_max: n,
                prompt: None,
                turn: 0,
            },
            sink,
        )
        .expect("generate");
    let counted = rt.counters.snapshot();
    rt.finish().expect("finish");
    (o, counted)
}

#[test]
fn streamed_experts_generate_the_resident_tokens() {
    for model in [
        "qwen3moe-q4_k_m.gguf",
        "mixtral-q8_0.gguf",
        "gptoss-mxfp4.gguf",
        "glm4moe-q8_0.gguf",
        "deepseek2-q8_0.gguf",
        "gemma4-f32.gguf",
        "qwen35moe-f32.gguf",
        "qwen3vlmoe-q8_0.gguf",
        "granitemoe-f32.gguf",
        "minimax-q4_k_m.gguf",
        "smallthinker-q4_k_m.gguf",
        "bailingmoe2-q8_0.gguf",
        "qwen3next-q8_0.gguf",
        "llama4-q8_0.gguf",
        "lfm2moe-q8_0.gguf",
        "nemotron_h_moe-q4_k_m.gguf",
    ] {
        let mut resident = config(moe(model));
        resident.stream.moe_stream = StreamMode::Off;
        let (want, want_text) = generate(&resident, "The experts", 12);
        assert!(!want.tokens.is_empty(), "{model}: nothing generated");
        assert_eq!(want.answer, want_text.answer, "{model}: sink and outcome");

        let streamed = |f: &dyn Fn(&mut StreamConfig)| {
            let mut cfg = config(moe(model));
            cfg.stream.moe_stream = StreamMode::On;
            cfg.stream.cache_mb = Some(CacheMb::Mib(2));
            cfg.stream.force_cache = true;
            f(&mut cfg.stream);
            cfg
        };
        let cases = [
            (
                "serial, no cache",
                streamed(&|s| s.cache_mb = Some(CacheMb::Mib(0))),
            ),
            ("serial, default (adaptive) cache", streamed(&|_| {})),
            (
                "serial, forecast cache",
                streamed(&|s| s.cache_policy = CachePolicy::Forecast),
            ),
            ("overlap", streamed(&|s| s.overlap = true)),
            (
                "overlap, lru cache",
                streamed(&|s| {
                    s.overlap = true;
                    s.cache_policy = CachePolicy::Lru;
                }),
            ),
            (
                "one lane, page cache, mapped dense",
                streamed(&|s| {
                    s.io_threads = 1;
                    s.no_odirect = true;
                    s.dense_weights = Some(DenseWeights::Mmap);
                }),
            ),
            ("prefetch 1", streamed(&|s| s.prefetch = 1)),
            (
                "prefetch 2, overlap, lru",
                streamed(&|s| {
                    s.prefetch = 2;
                    s.overlap = true;
                    s.cache_policy = CachePolicy::Lru;
                }),
            ),
            ("predict-prefetch", streamed(&|s| s.predict_prefetch = true)),
            (
                "predict-prefetch, spec max 8, overlap",
                streamed(&|s| {
                    s.predict_prefetch = true;
                    s.predict_spec_max = Some(8);
                    s.overlap = true;
                }),
            ),
            (
                "predict-prefetch, retention only",
                streamed(&|s| {
                    s.predict_prefetch = true;
                    s.predict_spec_max = Some(0);
                }),
            ),
            (
                "every expert read, auto backend",
                streamed(&|s| {
                    s.load_all = true;
                    s.cache_mb = Some(CacheMb::Mib(0));
                    s.force_cache = false;
                    s.overlap = true;
                    s.io_backend = ReadBackend::Auto;
                }),
            ),
        ];
        for (what, cfg) in cases {
            let (got, text) = generate(&cfg, "The experts", 12);
            assert_eq!(got.tokens, want.tokens, "{model} {what}: tokens");
            assert_eq!(text.answer, want_text.answer, "{model} {what}: text");
            assert!(got.d.read_bytes > 0, "{model} {what}: no expert was read");
            assert_eq!(
                want.d.read_bytes, 0,
                "{model}: the resident run read experts"
            );
        }
    }
}

#[test]
fn the_predict_log_changes_nothing_and_its_control_reads_100_percent() {
    for model in [
        "qwen3moe-q4_k_m.gguf",
        "mixtral-q8_0.gguf",
        "gptoss-mxfp4.gguf",
        "qwen2moe-q8_0.gguf",
    ] {
        let mut resident = config(moe(model));
        resident.stream.moe_stream = StreamMode::Off;
        let (want, _) = generate(&resident, "The experts", 10);
        assert_eq!(
            want.summary.ahead.totals().routings,
            0,
            "{model}: scored unasked"
        );
        for streamed in [false, true] {
            let mut cfg = config(moe(model));
            cfg.predict_log = true;
            if streamed {
                cfg.stream.moe_stream = StreamMode::On;
                cfg.stream.cache_mb = Some(CacheMb::Mib(1));
                cfg.stream.force_cache = true;
                cfg.stream.predict_prefetch = true;
                cfg.stream.overlap = true;
            } else {
                cfg.stream.moe_stream = StreamMode::Off;
            }
            let (got, _) = generate(&cfg, "The experts", 10);
            assert_eq!(
                got.tokens, want.tokens,
                "{model} streamed={streamed}: tokens"
            );
            let f = &got.summary.ahead;
            let t = f.totals();
            let n_moe = f.layers.len() as u64;
            assert!(n_moe >= 1, "{model}: no layer scored");
            // one routing per MoE layer per decode pass (not the prefill's last rows)
            assert_eq!(t.routings, n_moe * got.tokens.len() as u64, "{model}");
            assert_eq!(t.control.rows, t.routings, "{model}");
            assert_eq!(t.control.slot_pct(), Some(100.0), "{model}: control");
            // the stale gate cannot rank the first MoE layer; every other routing it ranks
            let first = *f.layers.keys().next().expect("a layer");
            assert_eq!(f.layers[&first].stale.rows, 0, "{model}");
            assert_eq!(f.unranked, got.tokens.len() as u64, "{model}");
            assert_eq!(t.stale.rows, t.routings - f.unranked, "{model}");
            // the previous token is scored from each layer's second pass on
            assert_eq!(t.prev.rows, t.routings - n_moe, "{model}");
            let stale = t.stale.slot_pct().unwrap_or(0.0);
            assert!(stale > 0.0 && stale <= 100.0, "{model}: stale gate {stale}");
        }
    }
}

#[test]
fn route_ahead_zero_is_the_baseline_and_a_fired_one_commits_and_reports_agreement() {
    let model = "qwen3moe-q4_k_m.gguf";
    let mut base = config(moe(model));
    base.stream.moe_stream = StreamMode::Off;
    let (want, _) = generate(&base, "The experts", 12);
    let mut inert = base.clone();
    inert.route_ahead = 0;
    let (got, _) = generate(&inert, "The experts", 12);
    assert_eq!(got.tokens, want.tokens);
    assert_eq!(got.summary.ahead.committed, 0);

    let mut fired = base.clone();
    fired.route_ahead = 1;
    let (res, _) = generate(&fired, "The experts", 12);
    let f = &res.summary.ahead;
    let n = res.tokens.len() as u64;
    // two MoE layers: the second is committed on every decode pass, the first passes through
    assert_eq!((f.committed, f.passed), (n, n));
    let agree = f.agree_pct();
    assert!(agree > 0.0 && agree < 100.0, "agreement {agree}");
    // deterministic, and streamed (its committed experts read early) == resident
    let (again, _) = generate(&fired, "The experts", 12);
    assert_eq!(again.tokens, res.tokens);
    let mut streamed = fired.clone();
    streamed.stream.moe_stream = StreamMode::On;
    streamed.stream.cache_mb = Some(CacheMb::Mib(2));
    streamed.stream.force_cache = true;
    streamed.stream.overlap = true;
    let (s, _) = generate(&streamed, "The experts", 12);
    assert_eq!(s.tokens, res.tokens, "route-ahead streamed vs resident");
    assert!(s.d.prefetches > 0, "committed experts were not read early");
    assert_eq!(
        s.d.prefetch_hits, s.d.prefetches,
        "a committed read went unused"
    );
}

#[test]
fn n_expert_used_at_the_model_count_is_the_baseline_and_fewer_route_fewer() {
    let model = "qwen3moe-q4_k_m.gguf";
    let mut base = config(moe(model));
    base.stream.moe_stream = StreamMode::Off;
    let (want, _) = generate(&base, "The experts", 12);
    let model_k = Loaded::open(&base, &Notices::silent())
        .expect("open")
        .model_n_expert_used;
    assert!(model_k > 1, "the fixture routes {model_k} experts");

    // K = the model's own count: the baseline, bit for bit
    let mut inert = base.clone();
    inert.n_expert_used = Some(model_k);
    let (got, _) = generate(&inert, "The experts", 12);
    assert_eq!(got.tokens, want.tokens);

    // K = 1: reported everywhere as the effective count, deterministic, streamed == resident,
    // one expert read per token and MoE layer where the model reads K
    let mut fired = base.clone();
    fired.n_expert_used = Some(1);
    let loaded = Loaded::open(&fired, &Notices::silent()).expect("open");
    assert_eq!(loaded.hparams.n_expert_used.max(), 1);
    assert_eq!(loaded.model_n_expert_used, model_k);
    let (_, preamble) = loaded.runtime(&fired).expect("runtime");
    assert_eq!(preamble.n_expert_used, 1);
    let (one, _) = generate(&fired, "The experts", 12);
    let (again, _) = generate(&fired, "The experts", 12);
    assert_eq!(again.tokens, one.tokens);

    let stream = |cfg: &RunConfig| {
        let mut s = cfg.clone();
        s.stream.moe_stream = StreamMode::On;
        s.stream.cache_mb = Some(CacheMb::Mib(2));
        s.stream.force_cache = true;
        s
    };
    let (s_one, _) = generate(&stream(&fired), "The experts", 12);
    assert_eq!(s_one.tokens, one.tokens, "K = 1 streamed vs resident");
    let (s_base, _) = generate(&stream(&base), "The experts", 12);
    assert_eq!(s_base.tokens, want.tokens);
    assert_eq!(s_one.tokens.len(), s_base.tokens.len());
    assert!(s_one.d.routed > 0);
    assert_eq!(
        s_one.d.routed * u64::from(model_k),
        s_base.d.routed,
        "experts routed per decode step"
    );
    let cycle = |cfg: &RunConfig| {
        let l = Loaded::open(&stream(cfg), &Notices::silent()).expect("open");
        l.layout
            .as_ref()
            .expect("a streamed layout")
            .token_cycle_bytes()
    };
    assert_eq!(cycle(&fired) * u64::from(model_k), cycle(&base));

    // outside 1..=n_expert: refused, naming the flag
    for k in [0, loaded.hparams.n_expert + 1] {
        let mut bad = base.clone();
        bad.n_expert_used = Some(k);
        let err = Loaded::open(&bad, &Notices::silent())
            .err()
            .expect("refused");
        assert_eq!(refused_setting(&err).setting, Setting::NExpertUsed, "{err}");
    }
}

/// Every event a sink receives, in order.
#[derive(Default)]
struct Record(Vec<String>);

impl Sink for Record {
    fn prefilled(&mut self, p: &Prefilled) -> Result<()> {
        self.0.push(format!("prefilled {} {}", p.n_prompt, p.n_new));
        Ok(())
    }

    fn delta(&mut self, d: &chat::SplitDelta) -> Result<()> {
        self.0.push(format!("delta {}", d.text));
        Ok(())
    }

    fn token(&mut self, row: &TokenRow) -> Result<()> {
        self.0.push(format!("token {}", row.step));
        Ok(())
    }

    fn finished(&mut self, o: &Outcome) -> Result<()> {
        self.0.push(format!("finished {}", o.summary.tokens));
        Ok(())
    }
}

#[test]
fn a_sink_hears_the_prompt_then_each_token_after_its_text_then_the_end() {
    let mut cfg = config(moe("qwen3moe-q4_k_m.gguf"));
    cfg.token_figures = true;
    cfg.sampling.temp = 0.0;
    let loaded = Loaded::open(&cfg, &Notices::silent()).expect("open");
    let ids = loaded.tokenizer.encode("The experts", true, false);
    let (mut rt, _) = loaded.runtime(&cfg).expect("runtime");
    let mut rec = Record::default();
    let turn = Turn {
        ids: &ids,
        n_max: 6,
        prompt: None,
        turn: 0,
    };
    let o = rt.generate(&turn, &mut rec).expect("generate");
    let ev = rec.0;
    assert_eq!(
        ev.first(),
        Some(&format!("prefilled {} {}", ids.len(), ids.len()))
    );
    assert_eq!(ev.last(), Some(&format!("finished {}", o.summary.tokens)));
    // One row per generated token, numbered from 1, each after some text of its own.
    let steps: Vec<&String> = ev.iter().filter(|e| e.starts_with("token ")).collect();
    assert_eq!(steps.len(), o.summary.tokens);
    let mut step = 0;
    let mut text_since = false;
    for e in &ev[1..ev.len() - 1] {
        if let Some(s) = e.strip_prefix("token ") {
            step += 1;
            assert_eq!(s, step.to_string());
            assert!(text_since, "token {s} came before any of its text: {ev:?}");
            text_since = false;
        } else {
            assert!(e.starts_with("delta "), "{e}");
            text_since = true;
        }
    }
    // Without per-token figures no row is taken.
    let mut plain = config(moe("qwen3moe-q4_k_m.gguf"));
    plain.token_figures = false;
    let loaded = Loaded::open(&plain, &Notices::silent()).expect("open");
    let (mut rt, _) = loaded.runtime(&plain).expect("runtime");
    let mut rec = Collect::default();
    rt.generate(&turn, &mut rec).expect("generate");
    assert_eq!(rec.rows, 0);
}

/// Cancels the request in flight at its `at`-th piece of text.
struct CancelAt {
    control: Arc<Control>,
    deltas: usize,
    at: usize,
}

impl Sink for CancelAt {
    fn delta(&mut self, _d: &chat::SplitDelta) -> Result<()> {
        self.deltas += 1;
        if self.deltas == self.at {
            self.control.cancel(1);
        }
        Ok(())
    }
}

#[test]
fn a_cancel_stops_the_generation_before_the_next_pass_and_says_so() {
    let cfg = config(moe("olmoe-q8_0.gguf"));
    let notes = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&notes);
    let notices = Notices::new(move |n| sink.lock().unwrap().push(n.text.clone()));
    let loaded = Loaded::open(&cfg, &notices).expect("open");
    let ids = loaded.tokenizer.encode("The experts", true, false);
    let (mut rt, _) = loaded.runtime(&cfg).expect("runtime");
    let control = Arc::new(Control::new(None, notices.clone()));
    rt.install_control(Arc::clone(&control));
    control.start(1);
    let mut sink = CancelAt {
        control: Arc::clone(&control),
        deltas: 0,
        at: 2,
    };
    let turn = Turn {
        ids: &ids,
        n_max: 20,
        prompt: None,
        turn: 0,
    };
    let o = rt.generate(&turn, &mut sink).expect("generate");
    control.done();
    assert!(o.cancelled);
    // The token whose text cancelled was drawn but never run: the context holds the prompt
    // and the one token run before it.
    assert_eq!(o.summary.tokens, 2);
    assert_eq!(o.tokens.len(), 1);
    assert_eq!(rt.engine.n_past(), ids.len() + 1);
    // The notices said what was loaded and prefilled (the library printed nothing itself).
    {
        let notes = notes.lock().unwrap();
        assert!(
            notes.iter().any(|n| n.starts_with("sluice: prompt ")),
            "{notes:?}"
        );
    }
    // A later request is not cancelled by the earlier cancel (a new chat: the context
    // emptied, as a session's `clear_kv` does).
    rt.engine.reset();
    control.start(2);
    let o = rt
        .generate(&turn, &mut Collect::default())
        .expect("generate");
    assert!(!o.cancelled);
}

#[test]
fn a_text_is_scored_alike_in_one_prefill_and_one_token_at_a_time() {
    let cfg = config(moe("qwen3moe-q4_k_m.gguf"));
    let loaded = Loaded::open(&cfg, &Notices::silent()).expect("open");
    let (mut rt, _) = loaded.runtime(&cfg).expect("runtime");
    let text = "The experts of a mixture are chosen per token by a router.";
    let whole = runtime::score::score_text(&mut rt, text, false).expect("prefill");
    let step = runtime::score::score_text(&mut rt, text, true).expect("stepped");
    let n = loaded_len(&rt, text) - 1;
    assert_eq!((whole.score.n, step.score.n), (n, n));
    assert_eq!((whole.predicted.len(), step.predicted.len()), (n, n));
    let hits = |p: &[u32]| {
        let ids = rt.tokenizer.encode(text, true, false);
        p.iter().zip(&ids[1..]).filter(|(a, b)| a == b).count()
    };
    assert_eq!(hits(&whole.predicted), whole.score.hits);
    assert_eq!(hits(&step.predicted), step.score.hits);
    // One prefill and single-token passes sum in different orders: close, not equal. (On
    // aarch64 the F16 cache's attention products accumulate in half precision, as in
    // llama.cpp's ARM build, which widens the gap.)
    let (a, b) = (whole.score.perplexity(), step.score.perplexity());
    let rel = if cfg!(target_arch = "aarch64") {
        2e-2
    } else {
        1e-3
    };
    assert!((a - b).abs() < rel * a, "{a} vs {b}");
    assert!(a > 1.0);
    // Too short to score: refused, not failed.
    let e = runtime::score::score_text(&mut rt, "", false).unwrap_err();
    assert!(e.is_rejected(), "{e}");
}

fn loaded_len(rt: &runtime::generate::Runtime<'_>, text: &str) -> usize {
    rt.tokenizer.encode(text, true, false).len()
}

/// Streamed generation of `n` tokens under `cfg`, with what the cache-aware policies did.
fn generate_counted(cfg: &RunConfig, n: usize) -> (Vec<u32>, engine::CacheAwareCounts) {
    let loaded = Loaded::open(cfg, &Notices::silent()).expect("open");
    let ids = loaded.tokenizer.encode("The experts", true, false);
    let (mut rt, _) = loaded.runtime(cfg).expect("runtime");
    let mut text = Collect::default();
    let turn = Turn {
        ids: &ids,
        n_max: n,
        prompt: None,
        turn: 0,
    };
    let o = rt.generate(&turn, &mut text).expect("generate");
    let counts = rt.engine.cache_aware_counts();
    rt.finish().expect("finish");
    (o.tokens, counts)
}

#[test]
fn cache_aware_routing_is_inert_at_a_zero_margin_and_fires_at_full_strength() {
    let mut base = config(moe("qwen3moe-q4_k_m.gguf"));
    base.stream.moe_stream = StreamMode::On;
    // a cache that holds a fraction of the experts: misses on every token
    base.stream.cache_mb = Some(CacheMb::Mib(2));
    base.stream.force_cache = true;
    let (want, none) = generate_counted(&base, 12);
    assert_eq!(none, engine::CacheAwareCounts::default());

    // thresholds below any weight the router gives: the baseline, bit for bit, with the
    // routings examined and nothing changed
    let mut inert = base.clone();
    inert.cache_aware.drop_frac = 1e-6;
    inert.cache_aware.substitute = 1e-9;
    let (got, c) = generate_counted(&inert, 12);
    assert_eq!(got, want);
    assert!(c.drop_examined > 0 && c.reranked > 0, "{c:?}");
    assert_eq!((c.dropped, c.substituted), (0, 0), "{c:?}");

    // full strength: each policy fires, and the run completes
    let mut drop = base.clone();
    drop.cache_aware.drop_frac = 1.0;
    let (got, c) = generate_counted(&drop, 12);
    assert_eq!(got.len(), want.len());
    assert!(c.dropped > 0 && c.dropped < c.drop_examined, "{c:?}");
    assert_eq!(c.reranked, 0);
    let mut sub = base.clone();
    sub.cache_aware.substitute = 1.0;
    let (got, c) = generate_counted(&sub, 12);
    assert_eq!(got.len(), want.len());
    assert!(c.substituted > 0 && c.substituted <= c.reranked, "{c:?}");

    // without streamed experts there is no cache to consult: refused, naming the flags
    let mut resident = drop.clone();
    resident.stream.moe_stream = StreamMode::Off;
    resident.stream.cache_mb = None;
    resident.stream.force_cache = false;
    let loaded = Loaded::open(&resident, &Notices::silent()).expect("open");
    let err = loaded.runtime(&resident).err().expect("refused");
    assert!(
        refused_setting(&err)
            .problem
            .settings()
            .any(|s| s == Setting::DropColdExperts),
        "{err}"
    );
}

/// Collects the generated text, each token row's `mtp_batch` and wall time, and stops (as a
/// stop sequence would) after the `stop_at`-th piece of text.
#[derive(Default)]
struct Rows {
    answer: String,
    deltas: usize,
    stop_at: Option<usize>,
    rows: Vec<(usize, usize, f64)>,
}

impl Sink for Rows {
    fn delta(&mut self, d: &chat::SplitDelta) -> Result<()> {
        self.answer.push_str(&d.text);
        self.deltas += 1;
        Ok(())
    }

    fn token(&mut self, row: &TokenRow) -> Result<()> {
        self.rows.push((row.step, row.mtp_batch, row.wall_ms));
        Ok(())
    }

    fn stop(&self) -> bool {
        self.stop_at.is_some_and(|n| self.deltas >= n)
    }
}

/// A repetitive prompt, so that the n-gram source finds matches.
const LOOP_PROMPT: &str = "The experts the experts the experts the experts the experts";

/// Two turns of a session: the first (`n1` tokens, stopped after `stop_at` pieces of text if
/// given), then a second that adds `LOOP_PROMPT` after what the first left in the context.
/// Returns both outcomes, the context length after the first, and the first's rows.
fn two_turns(
    cfg: &RunConfig,
    n1: usize,
    stop_at: Option<usize>,
) -> (Outcome, usize, Outcome, Rows) {
    let loaded = Loaded::open(cfg, &Notices::silent()).expect("open");
    let ids = loaded.tokenizer.encode(LOOP_PROMPT, true, false);
    let (mut rt, _) = loaded.runtime(cfg).expect("runtime");
    let mut rows = Rows {
        stop_at,
        ..Rows::default()
    };
    let turn = Turn {
        ids: &ids,
        n_max: n1,
        prompt: None,
        turn: 0,
    };
    let first = rt.generate(&turn, &mut rows).expect("generate");
    let after = rt.engine.n_past();
    let mut ids2 = ids.clone();
    ids2.extend(&first.tokens);
    ids2.extend(loaded.tokenizer.encode(LOOP_PROMPT, false, false));
    let turn2 = Turn {
        ids: &ids2,
        n_max: 24,
        prompt: None,
        turn: 1,
    };
    let second = rt.generate(&turn2, &mut Rows::default()).expect("generate");
    rt.finish().expect("finish");
    (first, after, second, rows)
}

/// The aarch64 build runs under qemu in CI, where the two speculation tests took most of its
/// `generate` step (over 800 s): there they run on two models each, one per NEON kernel family
/// that matters (the x86 build runs all of them, and the kernels have their own ARM tests).
const UNDER_EMULATION: bool = cfg!(target_arch = "aarch64");

/// `--ngram` gives the unspeculated tokens, greedy and sampled, resident and streamed, on
/// every MHA architecture of the fixtures (two on aarch64, [`UNDER_EMULATION`]): each verified row has a one-token pass's bits, a
/// draw ahead of a stop is given back to the sampler, and the context after a turn holds what
/// was delivered. The rows carry each verify pass's group on its first row.
#[test]
fn ngram_speculation_generates_the_unspeculated_tokens() {
    let models: &[&str] = if UNDER_EMULATION {
        &["qwen3moe-q4_k_m.gguf", "gptoss-mxfp4.gguf"]
    } else {
        &[
            "qwen3moe-q4_k_m.gguf",
            "mixtral-q8_0.gguf",
            "gptoss-mxfp4.gguf",
            "glm4moe-q4_0.gguf",
            "gemma4-f32.gguf",
            "granitemoe-q8_0.gguf",
        ]
    };
    let (drafted, accepted) = speculation_gives_the_unspeculated_tokens(
        models,
        runtime::spec::Spec::Ngram(runtime::spec::Ngram {
            draft: 4,
            min_match: 1,
        }),
    );
    assert!(
        drafted > 0 && accepted > 0,
        "{drafted} drafted, {accepted} kept"
    );
}

/// `--mtp` (the NextN head drafting) gives the unspeculated tokens as `--ngram` does, on the
/// glm4moe fixtures (the MHA models with a NextN layer) in each weight type (two on aarch64). Their head has
/// random weights: its drafts are drafted and verified, and (nearly) never kept.
#[test]
fn mtp_speculation_generates_the_unspeculated_tokens() {
    let models: &[&str] = if UNDER_EMULATION {
        &["glm4moe-q8_0.gguf", "glm4moe-q4_k_m.gguf"]
    } else {
        &[
            "glm4moe-f32.gguf",
            "glm4moe-bf16.gguf",
            "glm4moe-q8_0.gguf",
            "glm4moe-q4_k_m.gguf",
            "glm4moe-q4_1.gguf",
        ]
    };
    let (drafted, _) = speculation_gives_the_unspeculated_tokens(
        models,
        runtime::spec::Spec::Mtp(runtime::spec::Mtp {
            draft: 3,
            p_min: 0.0,
        }),
    );
    assert!(drafted > 0, "nothing drafted");
}

/// The checks of the speculated generations of `models` with `sp` against the plain ones
/// (see [`ngram_speculation_generates_the_unspeculated_tokens`]); what was drafted and kept.
fn speculation_gives_the_unspeculated_tokens(
    models: &[&str],
    sp: runtime::spec::Spec,
) -> (u64, u64) {
    let mut drafted = 0;
    let mut accepted = 0;
    for &model in models {
        for (temp, streamed) in [(0.0, false), (0.0, true), (0.3, false)] {
            let mut base = config(moe(model));
            base.token_figures = true;
            base.sampling.temp = temp;
            base.sampling.seed = 7;
            if streamed {
                base.stream.moe_stream = StreamMode::On;
                base.stream.cache_mb = Some(CacheMb::Mib(2));
                base.stream.force_cache = true;
            } else {
                base.stream.moe_stream = StreamMode::Off;
            }
            let mut spec = base.clone();
            spec.spec = Some(sp);
            let what = format!("{model} temp {temp} streamed {streamed}");
            // (sampled: stops at many places, so that some fall inside a verified group,
            // with draws taken ahead of the stop)
            let mut cases = vec![(40, None), (40, Some(9)), (5, None)];
            if temp > 0.0 {
                cases.extend((2..=16).map(|k| (40, Some(k))));
            }
            for (n1, stop_at) in cases {
                let (w1, w_after, w2, _) = two_turns(&base, n1, stop_at);
                let (g1, g_after, g2, rows) = two_turns(&spec, n1, stop_at);
                let what = format!("{what}, {n1} tokens, stop {stop_at:?}");
                assert_eq!(g1.tokens, w1.tokens, "{what}: first turn");
                assert_eq!(g1.answer, w1.answer, "{what}: first turn's text");
                assert_eq!(g1.end, w1.end, "{what}: first turn's end");
                assert_eq!(g_after, w_after, "{what}: context after the first turn");
                assert_eq!(g2.tokens, w2.tokens, "{what}: second turn");
                let c = g1.summary.spec.expect("speculation counted");
                assert!(w1.summary.spec.is_none());
                assert_eq!(c.source, sp.source(), "{what}");
                drafted += c.drafted;
                accepted += c.accepted;
                // every token run into the context has a row (a stop's is not run); a pass's
                // group is on its first row
                let n_rows = g1.tokens.len();
                let steps: Vec<usize> = rows.rows.iter().map(|r| r.0).collect();
                assert_eq!(steps, (1..=n_rows).collect::<Vec<_>>(), "{what}");
                let passes = rows.rows.iter().filter(|r| r.1 > 0).count() as u64;
                assert_eq!(passes, c.decodes, "{what}: {:?}", rows.rows);
                assert!(
                    rows.rows.iter().all(|r| r.1 > 0 || r.2 == 0.0),
                    "{what}: a confirmed token's row carries a cost: {:?}",
                    rows.rows
                );
                if stop_at.is_none() {
                    let batched: usize = rows.rows.iter().map(|r| r.1).sum();
                    assert_eq!(batched, g1.summary.tokens, "{what}: {:?}", rows.rows);
                    assert_eq!(
                        c.decodes + c.accepted,
                        g1.summary.tokens as u64,
                        "{what}: {c:?}"
                    );
                }
            }
        }
    }
    (drafted, accepted)
}

/// A context that fills up stops the speculated generation where it stops the plain one.
#[test]
fn ngram_speculation_stops_at_a_full_context_as_decoding_does() {
    let mut base = config(moe("qwen3moe-q4_k_m.gguf"));
    base.stream.moe_stream = StreamMode::Off;
    let n_prompt = {
        let loaded = Loaded::open(&base, &Notices::silent()).expect("open");
        loaded.tokenizer.encode(LOOP_PROMPT, true, false).len()
    };
    base.ctx = Some(n_prompt + 13);
    let mut spec = base.clone();
    spec.spec = Some(runtime::spec::Spec::Ngram(runtime::spec::Ngram {
        draft: 8,
        min_match: 1,
    }));
    let (want, _) = generate(&base, LOOP_PROMPT, 64);
    let (got, _) = generate(&spec, LOOP_PROMPT, 64);
    assert_eq!(want.end, runtime::events::End::Context);
    assert_eq!(got.end, want.end);
    assert_eq!(got.tokens, want.tokens);
}

/// Where a one-token pass cannot be matched row by row, `--ngram` is refused at load.
#[test]
fn ngram_speculation_is_refused_where_rows_are_not_exact() {
    for model in [
        "deepseek2-q8_0.gguf",
        "qwen35moe-f32.gguf",
        "qwen3next-f32.gguf",
        "lfm2moe-f32.gguf",
        "nemotron_h_moe-f32.gguf",
    ] {
        let mut cfg = config(moe(model));
        cfg.spec = Some(runtime::spec::Spec::Ngram(Default::default()));
        let loaded = Loaded::open(&cfg, &Notices::silent()).expect("open");
        let err = loaded.runtime(&cfg).err().expect("refused");
        assert_eq!(refused_setting(&err).setting, Setting::Ngram, "{err}");
        assert!(err.to_string().contains("layer 0"), "{err}");
    }
    let mut cfg = config(moe("qwen3moe-q4_k_m.gguf"));
    cfg.stream.moe_stream = StreamMode::On;
    cfg.stream.cache_mb = Some(CacheMb::Mib(2));
    cfg.stream.force_cache = true;
    cfg.cache_aware.substitute = 0.5;
    cfg.spec = Some(runtime::spec::Spec::Ngram(Default::default()));
    let loaded = Loaded::open(&cfg, &Notices::silent()).expect("open");
    let err = loaded.runtime(&cfg).err().expect("refused").to_string();
    assert!(err.contains("cache-aware"), "{err}");
}

/// A cancel stops a speculated generation where it stops the plain one, also on a token a
/// verify pass already ran (a kept draft): the same tokens delivered and run, the same context.
#[test]
fn a_cancel_stops_a_speculated_generation_as_the_plain_one() {
    let run = |spec: bool, at: usize| {
        let mut cfg = config(moe("mixtral-q8_0.gguf"));
        if spec {
            cfg.spec = Some(runtime::spec::Spec::Ngram(runtime::spec::Ngram {
                draft: 4,
                min_match: 1,
            }));
        }
        let loaded = Loaded::open(&cfg, &Notices::silent()).expect("open");
        let ids = loaded.tokenizer.encode(LOOP_PROMPT, true, false);
        let (mut rt, _) = loaded.runtime(&cfg).expect("runtime");
        let control = Arc::new(Control::new(None, Notices::silent()));
        rt.install_control(Arc::clone(&control));
        control.start(1);
        let mut sink = CancelAt {
            control: Arc::clone(&control),
            deltas: 0,
            at,
        };
        let turn = Turn {
            ids: &ids,
            n_max: 30,
            prompt: None,
            turn: 0,
        };
        let o = rt.generate(&turn, &mut sink).expect("generate");
        control.done();
        (o.cancelled, o.summary.tokens, o.tokens, rt.engine.n_past())
    };
    // which steps of the whole speculated generation are kept drafts (rows with mtp_batch 0)
    let mut cfg = config(moe("mixtral-q8_0.gguf"));
    cfg.token_figures = true;
    cfg.spec = Some(runtime::spec::Spec::Ngram(runtime::spec::Ngram {
        draft: 4,
        min_match: 1,
    }));
    let mut rows = Rows::default();
    generate_into(&cfg, LOOP_PROMPT, 30, &mut rows);
    let kept: Vec<usize> = rows.rows.iter().filter(|r| r.1 == 0).map(|r| r.0).collect();
    let mut kept_then_cancelled = false;
    for at in 2..=20 {
        let (c, n, fed, past) = run(false, at);
        let (sc, sn, sfed, spast) = run(true, at);
        assert!(c && sc, "at {at}");
        assert_eq!((sn, &sfed, spast), (n, &fed, past), "at {at}");
        // the cancelled token (step sn) is one a verify pass had run
        kept_then_cancelled |= kept.contains(&sn);
    }
    assert!(
        kept_then_cancelled,
        "no cancel fell on a kept draft: {kept:?}"
    );
}

/// With `--prompt-ahead`, a prompt batch that routes most of a layer's experts has the next MoE
/// layer's read ahead: the tokens stay the resident run's, the reads ahead are counted apart
/// from the decode's readers ahead (none here) and used by the next layer, and a cache with
/// room for only some of them reads only those. Without the flag, or with a short prompt,
/// nothing is read ahead.
#[test]
fn a_long_prompt_reads_the_next_layers_experts_ahead_and_changes_no_token() {
    let model = "qwen3moe-q4_k_m.gguf";
    let long = "A mixture of experts routes each token to a few of its experts, and a long \
                prompt routes nearly every expert of every layer, so the next layer's experts \
                can be read while this one computes.";
    let mut resident = config(moe(model));
    resident.stream.moe_stream = StreamMode::Off;
    let (want_long, _) = generate(&resident, long, 6);
    let (want_short, _) = generate(&resident, "The", 6);
    // (prompt, cache MiB, prompt ahead on, whether it reads ahead)
    let cases = [
        (long, 8, true, true),
        (long, 8, false, false),
        ("The", 8, true, false),
        // a layer's 16 experts take about 2 MiB of slots: beside the batch's own, 3 MiB
        // holds some of the next layer's
        (long, 3, true, true),
    ];
    for (prompt, mib, on, reads) in cases {
        let want = if prompt == long {
            &want_long
        } else {
            &want_short
        };
        let mut cfg = config(moe(model));
        cfg.stream.moe_stream = StreamMode::On;
        cfg.stream.cache_mb = Some(CacheMb::Mib(mib));
        cfg.stream.force_cache = true;
        cfg.stream.prompt_ahead = on;
        let (got, all) = generate_streamed(&cfg, prompt, 6, &mut Collect::default());
        let what = format!(
            "{:?} cache {mib} MiB on={on}",
            &prompt[..prompt.len().min(12)]
        );
        assert_eq!(got.tokens, want.tokens, "{what}: tokens");
        assert_eq!(all.prefetches, 0, "{what}: counted as a decode read ahead");
        if !reads {
            assert_eq!(all.prompt_ahead, 0, "{what}: read ahead");
            continue;
        }
        // one layer's experts at most (the fixture has two MoE layers of 16), and used
        let (n, hits) = (all.prompt_ahead, all.prompt_ahead_hits);
        assert!(n > 0 && n <= 16, "{what}: {n} read ahead");
        assert!(hits > 0 && hits <= n, "{what}: {hits} of {n} used");
        assert!(all.prompt_ahead_bytes > 0 && all.read_bytes >= all.prompt_ahead_bytes);
        if mib == 3 {
            assert!(all.prompt_ahead < 16, "{what}: past the budget");
        }
    }
}

/// The setting `e` refuses (it must be a setting's refusal, whose text names no flag).
fn refused_setting(e: &runtime::Error) -> &runtime::ConfigError {
    match e.refusal() {
        Some(runtime::Refusal::Setting(c)) => {
            assert!(!c.to_string().contains("--"), "{c}");
            c
        }
        other => panic!("not a setting's refusal: {other:?} ({e})"),
    }
}
