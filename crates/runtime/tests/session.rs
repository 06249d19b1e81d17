//! Sessions through the library, on the generated MoE test models: a continued chat re-uses
//! its context and answers as a fresh prefill of the same conversation would, a cancelled turn
//! is rolled back, a refused request changes nothing, a restored decision prefix scores as a
//! whole prefill does and leaves the conversation's context as it was.

mod common;

use std::sync::Arc;

use runtime::cancel::Control;
use runtime::decide::PrefixCacheMode;
use runtime::events::Prefilled;
use runtime::generate::{Runtime, Turn};
use runtime::open::{Loaded, RunConfig};
use runtime::session::{ChatRequest, DecideRequest, Session, SessionConfig};
use runtime::sink::{Collect, Sink};
use runtime::{Notices, Result};

use common::{config, moe};

fn chat_config() -> RunConfig {
    chat_config_of("qwen3moe-q4_k_m.gguf")
}

fn chat_config_of(model: &str) -> RunConfig {
    let mut cfg = config(moe(model));
    cfg.chatml = true;
    cfg
}

/// The models the context-reuse tests run on: one with a KV cache of keys and values, one
/// with multi-head latent attention, whose cache holds keys only (deepseek2, DeepSeek V3.1's
/// template), and two hybrids whose linear-attention layers hold a recurrent state instead of
/// KV cells (qwen35moe, qwen3next with its value heads grouped by key head, and lfm2moe's
/// short convolutions, and nemotron_h_moe's Mamba-2 layers: going back goes through the state
/// kept at the last call's start).
const CONTEXT_MODELS: [&str; 6] = [
    "qwen3moe-q4_k_m.gguf",
    "deepseek2-q8_0.gguf",
    "qwen35moe-q8_0.gguf",
    "qwen3next-q8_0.gguf",
    "lfm2moe-q8_0.gguf",
    "nemotron_h_moe-q8_0.gguf",
];

fn session() -> Session {
    Session::new(SessionConfig {
        n_predict: 4,
        decide: true,
        ..SessionConfig::default()
    })
}

fn say(prompt: &str, clear_kv: bool) -> ChatRequest {
    ChatRequest {
        prompt: prompt.into(),
        clear_kv,
        ..ChatRequest::default()
    }
}

/// Remembers what the prefill ran.
#[derive(Default)]
struct Prefill(Option<(usize, usize)>, Collect);

impl Sink for Prefill {
    fn prefilled(&mut self, p: &Prefilled) -> Result<()> {
        self.0 = Some((p.n_prompt, p.n_new));
        Ok(())
    }

    fn delta(&mut self, d: &chat::SplitDelta) -> Result<()> {
        self.1.delta(d)
    }
}

/// The tokens a fresh runtime generates from `ids`.
fn fresh(cfg: &RunConfig, ids: &[u32], n: usize) -> Vec<u32> {
    let loaded = Loaded::open(cfg, &Notices::silent()).expect("open");
    let (mut rt, _) = loaded.runtime(cfg).expect("runtime");
    let turn = Turn {
        ids,
        n_max: n,
        prompt: None,
        turn: 0,
    };
    rt.generate(&turn, &mut Collect::default())
        .expect("generate")
        .tokens
}

fn with_runtime(cfg: &RunConfig, f: impl FnOnce(&mut Runtime<'_>)) {
    let loaded = Loaded::open(cfg, &Notices::silent()).expect("open");
    let (mut rt, _) = loaded.runtime(cfg).expect("runtime");
    f(&mut rt);
}

#[test]
fn a_continued_chat_reuses_its_context_and_answers_as_a_fresh_prefill() {
    for model in CONTEXT_MODELS {
        // lfm2moe's tiny model answers with three newline tokens, which the next turn's
        // rendering tokenizes as one, and Nemotron-3's template renders a past turn's
        // reasoning as `<think></think>` where the generation prompt opened `<think>\n`: their
        // history is held up to the answer
        let exact = !["deepseek2", "lfm2moe", "nemotron_h_moe"]
            .iter()
            .any(|p| model.starts_with(p));
        continued_chat(&chat_config_of(model), exact);
    }
}

fn continued_chat(cfg: &RunConfig, exact_history: bool) {
    let cfg = cfg.clone();
    with_runtime(&cfg, |rt| {
        let mut s = session();
        let a = s.accept_chat(rt, &say("Hello", true)).expect("accept");
        let first_prompt = a.prompt_tokens().len();
        s.chat(rt, a, &mut Collect::default()).expect("turn 1");
        assert_eq!(s.conversation().len(), 2);
        assert_eq!(s.conversation()[0], ("user", "Hello".to_string()));
        let held = s.context_tokens().to_vec();
        assert_eq!(held.len(), rt.engine.n_past());

        let a = s.accept_chat(rt, &say("More", false)).expect("accept");
        let ids = a.prompt_tokens().to_vec();
        if exact_history {
            assert_eq!(ids[..held.len() - 1], held[..held.len() - 1]);
        } else {
            // DeepSeek's template renders a past turn as `<think></think>` and its answer, where
            // the generation prompt opened `<think>`: the turn's prompt is still held
            assert_eq!(ids[..first_prompt - 1], held[..first_prompt - 1]);
        }
        let mut sink = Prefill::default();
        let o = s.chat(rt, a, &mut sink).expect("turn 2");
        // Only what the context did not hold was run.
        let (n_prompt, n_new) = sink.0.expect("prefilled");
        assert_eq!(n_prompt, ids.len());
        let reused = ids.len() - n_new;
        assert!(reused <= held.len(), "{reused} of {}", held.len());
        // (a recurrent state goes back only to where the last call started: a history held up
        // to the answer is run again whole)
        if exact_history || !rt.engine.has_recurrent_state() {
            assert!(reused > 0, "{reused} of {}", held.len());
        }
        assert_eq!(s.conversation().len(), 4);
        assert_eq!(s.context_tokens().len(), rt.engine.n_past());
        assert_eq!(s.turns(), 2);
        // The same conversation prefilled whole from an empty context answers the same.
        assert_eq!(fresh(&cfg, &ids, 4), o.tokens);
    });
}

/// Cancels at the first piece of text.
struct CancelAtOnce(Arc<Control>);

impl Sink for CancelAtOnce {
    fn delta(&mut self, _d: &chat::SplitDelta) -> Result<()> {
        self.0.cancel(2);
        Ok(())
    }
}

#[test]
fn a_cancelled_turn_is_rolled_back_and_a_retry_answers_as_without_it() {
    for model in CONTEXT_MODELS {
        cancelled_turn(&chat_config_of(model));
    }
}

fn cancelled_turn(cfg: &RunConfig) {
    let cfg = cfg.clone();
    let mut want = Vec::new();
    with_runtime(&cfg, |rt| {
        let mut s = session();
        for (p, clear) in [("Hello", true), ("More", false)] {
            let a = s.accept_chat(rt, &say(p, clear)).expect("accept");
            want.push(s.chat(rt, a, &mut Collect::default()).expect("turn").tokens);
        }
    });
    with_runtime(&cfg, |rt| {
        let control = Arc::new(Control::new(None, Notices::silent()));
        rt.install_control(Arc::clone(&control));
        let mut s = session();
        control.start(1);
        let a = s.accept_chat(rt, &say("Hello", true)).expect("accept");
        s.chat(rt, a, &mut Collect::default()).expect("turn 1");
        control.done();
        let conv = s.conversation().to_vec();
        let held = s.context_tokens().to_vec();

        control.start(2);
        let a = s.accept_chat(rt, &say("More", false)).expect("accept");
        let o = s
            .chat(rt, a, &mut CancelAtOnce(Arc::clone(&control)))
            .expect("cancelled turn");
        control.done();
        assert!(o.cancelled);
        // The conversation is as before the turn; the context holds no more than it did.
        assert_eq!(s.conversation(), conv.as_slice());
        assert!(held.starts_with(s.context_tokens()));
        assert_eq!(s.context_tokens().len(), rt.engine.n_past());

        control.start(3);
        let a = s.accept_chat(rt, &say("More", false)).expect("accept");
        let o = s.chat(rt, a, &mut Collect::default()).expect("retry");
        control.done();
        assert!(!o.cancelled);
        assert_eq!(o.tokens, want[1]);
    });
}

#[test]
fn a_refused_request_changes_nothing() {
    let mut cfg = chat_config();
    cfg.ctx = Some(64);
    with_runtime(&cfg, |rt| {
        let mut s = session();
        let a = s.accept_chat(rt, &say("Hello", true)).expect("accept");
        s.chat(rt, a, &mut Collect::default()).expect("turn 1");
        let (conv, held, n_past) = (
            s.conversation().to_vec(),
            s.context_tokens().to_vec(),
            rt.engine.n_past(),
        );
        let long = "word ".repeat(100);
        let Err(e) = s.accept_chat(rt, &say(&long, false)) else {
            panic!("a prompt past the context was accepted");
        };
        assert!(e.is_rejected(), "{e}");
        assert!(e.to_string().contains("context"), "{e}");
        let mut too_many = say("Hi", false);
        too_many.n_predict = Some(1000);
        let Err(e) = s.accept_chat(rt, &too_many) else {
            panic!("n_predict past the context was accepted");
        };
        assert!(e.is_rejected(), "{e}");
        let Err(e) = s.accept_decide(
            rt,
            &DecideRequest {
                prefix: "Pick: ".into(),
                suffix: "A or B?".into(),
                choices: vec!["A".into(), "A".into()],
                reuse_prefix: true,
            },
        ) else {
            panic!("choices sharing their first token were accepted");
        };
        assert!(e.is_rejected(), "{e}");
        assert_eq!(s.conversation(), conv.as_slice());
        assert_eq!(s.context_tokens(), held.as_slice());
        assert_eq!(rt.engine.n_past(), n_past);
        // Without decisions switched on, a decision is refused.
        let off = Session::new(SessionConfig::default());
        let Err(e) = off.accept_decide(rt, &DecideRequest::default()) else {
            panic!("a decision was accepted by a session without them");
        };
        assert!(e.is_rejected(), "{e}");
    });
}

#[test]
fn a_restored_decision_prefix_scores_as_a_whole_prefill_and_leaves_the_chat_alone() {
    for model in CONTEXT_MODELS {
        restored_prefix(&chat_config_of(model));
    }
}

fn restored_prefix(cfg: &RunConfig) {
    let cfg = cfg.clone();
    with_runtime(&cfg, |rt| {
        let mut s = Session::new(SessionConfig {
            n_predict: 3,
            decide: true,
            prefix_cache: PrefixCacheMode::On,
            ..SessionConfig::default()
        });
        let a = s.accept_chat(rt, &say("Hello", true)).expect("accept");
        s.chat(rt, a, &mut Collect::default()).expect("turn");
        let n_past = rt.engine.n_past();
        let ask = |suffix: &str, reuse_prefix: bool| DecideRequest {
            prefix: "Pick one of the two letters, please: ".into(),
            suffix: suffix.into(),
            choices: vec!["A".into(), "B".into()],
            reuse_prefix,
        };
        let mut run = |req: &DecideRequest| {
            let a = s.accept_decide(rt, req).expect("accept");
            s.decide(rt, a).expect("decide")
        };
        let first = run(&ask("A or B?", true));
        assert_eq!(first.n_reused, 0);
        assert!(first.prefix_state_bytes > 0);
        let other = run(&ask("B or A?", true));
        assert!(other.n_reused > 0, "the kept prefix was not restored");
        let whole = run(&ask("B or A?", false));
        assert_eq!(whole.n_reused, 0);
        assert_eq!(other.choice_logp, whole.choice_logp);
        assert_eq!(other.best(), whole.best());
        assert_eq!(whole.choice_logp.len(), 2);
        // The conversation's context is as it was.
        assert_eq!(rt.engine.n_past(), n_past);
        assert_eq!(s.context_tokens().len(), n_past);
        assert!(
            whole
                .line(7)
                .starts_with("BMOE_DECIDE {\"id\":7,\"cancelled\":false,")
        );
    });
}

#[test]
fn a_whole_conversation_sent_again_renders_as_the_turns_did_and_reuses_the_context() {
    let cfg = chat_config();
    with_runtime(&cfg, |rt| {
        // Turn by turn.
        let mut by_turn = session();
        let a = by_turn
            .accept_chat(rt, &say("Hello", true))
            .expect("accept");
        let first = by_turn
            .chat(rt, a, &mut Collect::default())
            .expect("turn 1");
        let a = by_turn
            .accept_chat(rt, &say("More", false))
            .expect("accept");
        let turn_ids = a.prompt_tokens().to_vec();

        // The same conversation as an API sends it, whole, on a fresh session.
        rt.engine.reset();
        let mut whole = session();
        let msgs = [("user", "Hello".to_owned())];
        let a = whole
            .accept_messages(rt, &msgs, None, None, true)
            .expect("accept");
        let o = whole.chat(rt, a, &mut Collect::default()).expect("first");
        assert_eq!(o.tokens, first.tokens);
        let msgs = [
            ("user", "Hello".to_owned()),
            ("assistant", o.answer.clone()),
            ("user", "More".to_owned()),
        ];
        let a = whole
            .accept_messages(rt, &msgs, None, None, true)
            .expect("accept");
        assert_eq!(a.prompt_tokens(), &turn_ids[..]);
        let mut sink = Prefill::default();
        whole.chat(rt, a, &mut sink).expect("second");
        let (n_prompt, n_new) = sink.0.expect("prefilled");
        assert!(n_new < n_prompt, "{n_new} of {n_prompt} tokens run again");

        // A leading system message takes the place of the session's; a raw text has no
        // template.
        let sys = [
            ("system", "Be brief.".to_owned()),
            ("user", "Hi".to_owned()),
        ];
        let given = whole
            .accept_messages(rt, &sys, None, None, true)
            .expect("accept");
        let configured = Session::new(SessionConfig {
            system: Some("Be brief.".into()),
            ..SessionConfig::default()
        });
        let own = configured
            .accept_messages(rt, &sys[1..], None, None, true)
            .expect("accept");
        assert_eq!(given.prompt_tokens(), own.prompt_tokens());
        let other = Session::new(SessionConfig {
            system: Some("Answer at length.".into()),
            ..SessionConfig::default()
        });
        let replaced = other
            .accept_messages(rt, &sys, None, None, true)
            .expect("accept");
        assert_eq!(replaced.prompt_tokens(), given.prompt_tokens());
        let raw = whole.accept_text(rt, "Hi", Some(2), true).expect("accept");
        assert_eq!(
            raw.prompt_tokens(),
            &rt.tokenizer.encode("Hi", true, false)[..]
        );
        let o = whole.chat(rt, raw, &mut Collect::default()).expect("raw");
        assert_eq!(o.tokens.len(), 2);
        assert!(whole.conversation().is_empty());
        // Without re-use the prompt runs whole again.
        let again = whole.accept_text(rt, "Hi", Some(2), false).expect("accept");
        let mut sink = Prefill::default();
        let o2 = whole.chat(rt, again, &mut sink).expect("again");
        let (n_prompt, n_new) = sink.0.expect("prefilled");
        assert_eq!(n_new, n_prompt);
        assert_eq!(o2.tokens, o.tokens);
    });
}

/// Asks to stop after `n` pieces of text.
struct StopAfter(usize, Collect);

impl Sink for StopAfter {
    fn delta(&mut self, d: &chat::SplitDelta) -> Result<()> {
        self.0 = self.0.saturating_sub(1);
        self.1.delta(d)
    }

    fn stop(&self) -> bool {
        self.0 == 0
    }
}

#[test]
fn a_sink_that_stops_ends_the_generation_there_and_says_why() {
    use runtime::events::End;
    let cfg = config(moe("qwen3moe-q4_k_m.gguf"));
    with_runtime(&cfg, |rt| {
        let ids = rt.tokenizer.encode("The experts", true, false);
        let turn = Turn {
            ids: &ids,
            n_max: 8,
            prompt: None,
            turn: 0,
        };
        rt.ignore_eos = true;
        let whole = rt.generate(&turn, &mut Collect::default()).expect("whole");
        assert_eq!(whole.end, End::Length);
        assert_eq!(whole.summary.tokens, 8);
        rt.engine.reset();
        let mut sink = StopAfter(3, Collect::default());
        let o = rt.generate(&turn, &mut sink).expect("stopped");
        assert_eq!(o.end, End::Stop);
        // It stopped at the third piece of text: the tokens drawn up to there, the last not
        // run into the context, the same tokens as the whole run's.
        let n = o.tokens.len();
        assert!((2..7).contains(&n), "{n}");
        assert_eq!(o.summary.tokens, n + 1);
        assert_eq!(o.tokens, whole.tokens[..n]);
        assert_eq!(rt.engine.n_past(), ids.len() + n);
    });
}
