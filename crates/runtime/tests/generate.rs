//! Generation through the library, on the generated MoE test models
//! (`scripts/fetch_moe_fixtures.sh`): streamed experts give the resident run's tokens, a sink
//! sees the events in their documented order, a cancel stops the generation and says so.

mod common;

use std::sync::{Arc, Mutex};

use runtime::cancel::Control;
use runtime::generate::{Outcome, Turn};
use runtime::open::{Loaded, RunConfig};
use runtime::sink::{Collect, Prefilled, Sink};
use runtime::stream::{CacheMb, CachePolicy, DenseWeights, ReadBackend, StreamConfig, StreamMode};
use runtime::telemetry::TokenRow;
use runtime::{Notices, Result};

use common::{config, moe};

/// The tokens and text of one generation of `n` tokens from `prompt`.
fn generate(cfg: &RunConfig, prompt: &str, n: usize) -> (Outcome, Collect) {
    let loaded = Loaded::open(cfg, &Notices::silent()).expect("open");
    let ids = loaded.tokenizer.encode(prompt, true, false);
    let (mut rt, _) = loaded.runtime(cfg).expect("runtime");
    let mut text = Collect::default();
    let o = rt
        .generate(
            &Turn {
                ids: &ids,
                n_max: n,
                prompt: None,
                turn: 0,
            },
            &mut text,
        )
        .expect("generate");
    rt.finish().expect("finish");
    (o, text)
}

#[test]
fn streamed_experts_generate_the_resident_tokens() {
    for model in [
        "qwen3moe-q4_k_m.gguf",
        "mixtral-q8_0.gguf",
        "gptoss-mxfp4.gguf",
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
            ("serial, forecast cache", streamed(&|_| {})),
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

/// Cancels the request in flight at its second piece of text.
struct CancelAtSecondDelta {
    control: Arc<Control>,
    deltas: usize,
}

impl Sink for CancelAtSecondDelta {
    fn delta(&mut self, _d: &chat::SplitDelta) -> Result<()> {
        self.deltas += 1;
        if self.deltas == 2 {
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
    let mut sink = CancelAtSecondDelta {
        control: Arc::clone(&control),
        deltas: 0,
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
    // One prefill and single-token passes sum in different orders: close, not equal.
    let (a, b) = (whole.score.perplexity(), step.score.perplexity());
    assert!((a - b).abs() < 1e-3 * a, "{a} vs {b}");
    assert!(a > 1.0);
    // Too short to score: refused, not failed.
    let e = runtime::score::score_text(&mut rt, "", false).unwrap_err();
    assert!(e.is_rejected(), "{e}");
}

fn loaded_len(rt: &runtime::generate::Runtime<'_>, text: &str) -> usize {
    rt.tokenizer.encode(text, true, false).len()
}
