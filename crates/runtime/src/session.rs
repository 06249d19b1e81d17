//! Sessions: a conversation held across requests on one loaded model. A chat turn continues
//! the conversation (or starts a new one), re-using the tokens the context already holds where
//! the new rendering starts with them; a cancelled turn is rolled back (the conversation
//! without it, the context as it was re-used). A decision reads which of a list of choices the
//! model would answer, from one prefill, keeping the state after its prefix for the next
//! decision, and leaves the conversation's context as it found it.
//!
//! Each request is taken in two steps: `accept_*` checks it against the model and the context
//! without touching either (a refusal is an [`Error::Rejected`]), then [`Session::chat`] or
//! [`Session::decide`] runs it. A front end answers "accepted" between the two.

use crate::error::refused;
use crate::refusal::{Refusal, Setting, problem};
use std::time::Instant;

use chat::Data;
use telemetry::bmoe_session::{self, Line};

use crate::decide::{self, Kept, Plan, PrefixCacheMode};
use crate::error::{Error, Result, chain};
use crate::events::Outcome;
use crate::generate::{Runtime, Turn};
use crate::probes::Usage;
use crate::prompt::{chat_ids, render_prompt};
use crate::sink::Sink;
use crate::source::StreamSnapshot;

/// How a session answers requests that leave a setting out.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// A system message put before every conversation (with a chat template).
    pub system: Option<String>,
    /// Whether a reasoning model reasons when the request does not say.
    pub think: bool,
    /// Tokens generated at most when the request does not say (negative: until the end or
    /// the context is full).
    pub n_predict: i64,
    /// Whether decisions are answered.
    pub decide: bool,
    /// Whether a decision's prefix state is kept for the next.
    pub prefix_cache: PrefixCacheMode,
}

impl Default for SessionConfig {
    fn default() -> SessionConfig {
        SessionConfig {
            system: None,
            think: true,
            n_predict: 128,
            decide: false,
            prefix_cache: PrefixCacheMode::Auto,
        }
    }
}

/// A chat turn: the user's message, and what it overrides.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatRequest {
    pub prompt: String,
    pub n_predict: Option<i64>,
    pub think: Option<bool>,
    /// Start a new conversation (the expert cache stays warm); otherwise continue this one.
    pub clear_kv: bool,
}

/// A decision: which of `choices` the model answers first to `prefix` + `suffix`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecideRequest {
    pub prefix: String,
    pub suffix: String,
    pub choices: Vec<String>,
    /// Restore the kept state when the prefix starts with the kept one.
    pub reuse_prefix: bool,
}

/// A chat turn that was accepted, ready to run.
pub struct AcceptedChat {
    conv: Vec<(&'static str, String)>,
    ids: Vec<u32>,
    prompt: Option<chat::Prompt>,
    n_max: usize,
    clear_kv: bool,
    /// A raw text prompt: the conversation is left empty.
    raw: bool,
}

impl AcceptedChat {
    /// The rendered conversation's tokens (the whole prompt of the turn).
    pub fn prompt_tokens(&self) -> &[u32] {
        &self.ids
    }
}

/// A decision that was accepted, ready to run.
pub struct AcceptedDecision {
    firsts: Vec<u32>,
    full: Vec<u32>,
    split: usize,
    reuse_prefix: bool,
}

/// What a decision found, and what it cost.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Stopped by a cancel: no choice was read.
    pub cancelled: bool,
    /// The log-probability of each choice's first token (empty when cancelled).
    pub choice_logp: Vec<f64>,
    /// The prompt's tokens; how many came from the kept state.
    pub n_tokens: usize,
    pub n_reused: usize,
    pub restore_s: f64,
    pub store_s: f64,
    pub prefill_s: f64,
    /// The process's resource use and the expert source's counters over the prefill.
    pub usage: Usage,
    pub counters: StreamSnapshot,
    /// The kept prefix state's size in bytes (0 when none is kept).
    pub prefix_state_bytes: usize,
}

impl Decision {
    /// The chosen choice's index, or `None` when cancelled.
    pub fn best(&self) -> Option<usize> {
        (!self.cancelled).then(|| decide::best(&self.choice_logp))
    }

    /// The `BMOE_DECIDE` line of request `id`.
    pub fn line(&self, id: i64) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let secs = |ns: u64| ns as f64 / 1e9;
        let p = &self.counters;
        Line::Decide(bmoe_session::Decide {
            id,
            cancelled: self.cancelled,
            best: self.best().map_or(-1, |b| b as i64),
            choice_logp: self.choice_logp.clone(),
            n_tokens: self.n_tokens as u64,
            n_reused: self.n_reused as u64,
            n_prefilled: (self.n_tokens - self.n_reused) as u64,
            restore_s: self.restore_s,
            store_s: self.store_s,
            prefill_s: self.prefill_s,
            prefill_cpu_s: secs(self.usage.cpu_ns),
            prefill_read_mib: mib(p.read_bytes),
            prefill_io_s: secs(p.io_ns),
            prefill_stall_s: secs(p.stall_ns),
            prefill_mgmt_s: secs(p.mgmt_ns),
            prefill_dev_tokens: 0,
            prefill_dev_read_mib: 0.0,
            prefill_dev_stall_s: 0.0,
            prefill_dev_routed: 0,
            prefill_dev_demand: 0,
            prefix_state_mib: mib(self.prefix_state_bytes as u64),
        })
        .to_string()
    }
}

/// A conversation and the context's bookkeeping, across requests on one [`Runtime`].
pub struct Session {
    config: SessionConfig,
    /// The chat so far: (role, content).
    conv: Vec<(&'static str, String)>,
    /// The tokens in the engine's context, in order.
    kv_tokens: Vec<u32>,
    /// The state kept after the last decision's prefix.
    kept: Option<Kept>,
    turn: u32,
}

impl Session {
    pub fn new(config: SessionConfig) -> Session {
        Session {
            config,
            conv: Vec::new(),
            kv_tokens: Vec::new(),
            kept: None,
            turn: 0,
        }
    }

    /// The conversation so far: (role, content), the system message left out.
    pub fn conversation(&self) -> &[(&'static str, String)] {
        &self.conv
    }

    /// The tokens the engine's context holds for the conversation.
    pub fn context_tokens(&self) -> &[u32] {
        &self.kv_tokens
    }

    /// Turns run so far (chat turns, cancelled ones included).
    pub fn turns(&self) -> u32 {
        self.turn
    }

    /// The conversation as the model sees it: rendered with the chat template (opening the
    /// assistant's turn), or without one the texts one after the other.
    fn render(
        &self,
        rt: &Runtime<'_>,
        conv: &[(&str, String)],
        think: bool,
    ) -> Result<(Vec<u32>, Option<chat::Prompt>)> {
        self.render_with(rt, self.config.system.as_deref(), conv, think)
    }

    /// As [`render`](Session::render), with `system` as the system message.
    fn render_with(
        &self,
        rt: &Runtime<'_>,
        system: Option<&str>,
        conv: &[(&str, String)],
        think: bool,
    ) -> Result<(Vec<u32>, Option<chat::Prompt>)> {
        let Some(format) = rt.format else {
            let text: String = conv.iter().map(|(_, c)| c.as_str()).collect();
            return Ok((rt.tokenizer.encode(&text, true, false), None));
        };
        let message = |role: &str, content: &str| {
            Data::object([
                ("role", Data::string(role)),
                ("content", Data::string(content)),
            ])
        };
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(message("system", s));
        }
        for (role, content) in conv {
            messages.push(message(role, content));
        }
        let prompt = render_prompt(format, &Data::array(messages), None, think)
            .map_err(|e| Error::request(chain(&e)))?;
        Ok((chat_ids(format, rt.tokenizer, &prompt.text), Some(prompt)))
    }

    /// Checks a chat turn: its rendering, and that it leaves room in the context.
    pub fn accept_chat(&self, rt: &Runtime<'_>, req: &ChatRequest) -> Result<AcceptedChat> {
        let think = req.think.unwrap_or(self.config.think);
        let mut conv = if req.clear_kv {
            Vec::new()
        } else {
            self.conv.clone()
        };
        conv.push(("user", req.prompt.clone()));
        let (ids, prompt) = self.render(rt, &conv, think)?;
        self.accepted(rt, conv, ids, prompt, req.n_predict, req.clear_kv)
    }

    /// Checks a whole conversation sent at once (an API request carries every message; the
    /// context re-uses what it holds of it): `messages` as (role, content), rendered with the
    /// template up to the assistant's next turn. A leading system message replaces the
    /// session's; without one the session's is put first.
    ///
    /// `reuse` false starts from an empty context instead (the expert cache stays warm): a
    /// prefill split differently may differ in the last bits (llama.cpp's batched products sum
    /// in another order than its one-token ones), so only a whole prefill answers exactly as a
    /// fresh run of the same prompt.
    pub fn accept_messages(
        &self,
        rt: &Runtime<'_>,
        messages: &[(&'static str, String)],
        n_predict: Option<i64>,
        think: Option<bool>,
        reuse: bool,
    ) -> Result<AcceptedChat> {
        let think = think.unwrap_or(self.config.think);
        let (system, conv) = match messages.split_first() {
            Some(((role, content), rest)) if *role == "system" => (Some(content), rest),
            _ => (self.config.system.as_ref(), messages),
        };
        let conv = conv.to_vec();
        let (ids, prompt) = self.render_with(rt, system.map(String::as_str), &conv, think)?;
        self.accepted(rt, conv, ids, prompt, n_predict, !reuse)
    }

    /// Checks a raw text prompt (no template; BOS as the model's metadata says): a plain
    /// completion, which leaves the conversation empty.
    /// `reuse` as for [`accept_messages`](Session::accept_messages).
    pub fn accept_text(
        &self,
        rt: &Runtime<'_>,
        text: &str,
        n_predict: Option<i64>,
        reuse: bool,
    ) -> Result<AcceptedChat> {
        let ids = rt.tokenizer.encode(text, true, false);
        if ids.is_empty() {
            return Err(Error::Rejected(Refusal::EmptyPrompt));
        }
        let mut a = self.accepted(rt, Vec::new(), ids, None, n_predict, !reuse)?;
        a.raw = true;
        Ok(a)
    }

    /// A turn of `ids` that leaves room to generate in the context.
    fn accepted(
        &self,
        rt: &Runtime<'_>,
        conv: Vec<(&'static str, String)>,
        ids: Vec<u32>,
        prompt: Option<chat::Prompt>,
        n_predict: Option<i64>,
        clear_kv: bool,
    ) -> Result<AcceptedChat> {
        let n_ctx = rt.n_ctx;
        let n_predict = n_predict.unwrap_or(self.config.n_predict);
        if ids.len() >= n_ctx {
            return Err(Error::Rejected(Refusal::ContextFull {
                tokens: ids.len(),
                n_ctx,
                problem: problem!(
                    format!(
                        "the prompt is {} tokens and the context holds {n_ctx} (",
                        ids.len()
                    ),
                    Setting::Context,
                    "): no room to generate",
                ),
            }));
        }
        if n_predict >= 0 && ids.len() as u128 + n_predict as u128 > n_ctx as u128 {
            return Err(Error::Rejected(Refusal::ContextFull {
                tokens: ids.len(),
                n_ctx,
                problem: problem!(
                    format!(
                        "the prompt ({} tokens) plus n_predict ({n_predict}) exceeds the context \
                         of {n_ctx} tokens (",
                        ids.len()
                    ),
                    Setting::Context,
                    ")",
                ),
            }));
        }
        Ok(AcceptedChat {
            conv,
            ids,
            prompt,
            n_max: usize::try_from(n_predict).unwrap_or(usize::MAX),
            clear_kv,
            raw: false,
        })
    }

    /// Runs an accepted chat turn, reporting to `sink`. A new conversation drops the old one
    /// and the context; any turn drops the decisions' kept state. The context keeps the
    /// tokens the new rendering starts with (at least one is run); a cancelled turn is rolled
    /// back to them, and the conversation is left without it.
    pub fn chat(
        &mut self,
        rt: &mut Runtime<'_>,
        a: AcceptedChat,
        sink: &mut dyn Sink,
    ) -> Result<Outcome> {
        if a.clear_kv {
            rt.engine.reset();
            self.kv_tokens.clear();
            self.conv.clear();
        }
        self.kept = None;
        let mut reuse = decide::common_prefix(&self.kv_tokens, &a.ids);
        if reuse == a.ids.len() {
            reuse -= 1;
        }
        // a model with linear-attention layers may go back further than asked (to an empty
        // context), and then prefills the whole prompt
        rt.engine.set_rollback(true);
        rt.engine.truncate(reuse);
        self.kv_tokens.truncate(reuse.min(rt.engine.n_past()));
        let o = rt.generate(
            &Turn {
                ids: &a.ids,
                n_max: a.n_max,
                prompt: a.prompt.as_ref(),
                turn: self.turn,
            },
            sink,
        )?;
        self.turn += 1;
        if o.cancelled {
            rt.engine.truncate(reuse);
        } else {
            let mut conv = a.conv;
            self.kv_tokens = a.ids;
            self.kv_tokens.extend_from_slice(&o.tokens);
            if !a.raw {
                conv.push(("assistant", o.answer.clone()));
            }
            self.conv = conv;
        }
        self.kv_tokens.truncate(rt.engine.n_past());
        rt.save_history();
        Ok(o)
    }

    /// Checks a decision: decisions are on, the choices can be told apart by their first
    /// token, the prompt (rendered with reasoning off) fits the context.
    pub fn accept_decide(&self, rt: &Runtime<'_>, req: &DecideRequest) -> Result<AcceptedDecision> {
        if !self.config.decide {
            return Err(refused!(Setting::Decide;
                "decide requests need a session started with ",
                Setting::Decide,
            ));
        }
        let firsts = decide::first_tokens(rt.tokenizer, &req.choices).map_err(Error::request)?;
        let whole = format!("{}{}", req.prefix, req.suffix);
        let (full, _) = self.render(rt, &[("user", whole)], false)?;
        let (alone, _) = self.render(rt, &[("user", req.prefix.clone())], false)?;
        let n_ctx = rt.n_ctx;
        if full.len() > n_ctx {
            return Err(Error::Rejected(Refusal::ContextFull {
                tokens: full.len(),
                n_ctx,
                problem: problem!(
                    format!(
                        "the decision's prompt is {} tokens, longer than the context of {n_ctx} (",
                        full.len()
                    ),
                    Setting::Context,
                    ")",
                ),
            }));
        }
        let split = decide::split_at(&full, &alone);
        Ok(AcceptedDecision {
            firsts,
            full,
            split,
            reuse_prefix: req.reuse_prefix,
        })
    }

    /// Runs an accepted decision. The conversation's context is put back afterwards: a
    /// decision leaves no trace in it.
    pub fn decide(&mut self, rt: &mut Runtime<'_>, a: AcceptedDecision) -> Result<Decision> {
        let saved = (rt.engine.n_past() > 0).then(|| rt.engine.save_state());
        let full = &a.full;
        let plan = decide::plan(
            self.config.prefix_cache.keeps(),
            a.reuse_prefix,
            self.kept.as_ref().map(|k| k.tokens.as_slice()),
            full,
            a.split,
        );
        let usage0 = Usage::now();
        let snap0 = rt.counters.snapshot();
        let mut restore_s = 0.0;
        let mut store_s = 0.0;
        let mut prefill_s = 0.0;
        let mut n_reused = 0;
        let ran = (|| -> Result<Vec<f32>, engine::ForwardError> {
            rt.engine.reset();
            let mut from = 0;
            let mut keep_at = None;
            match plan {
                Plan::Whole => {}
                Plan::Fresh { split } => keep_at = Some(split),
                Plan::Restore { from: kept, split } => {
                    let t = Instant::now();
                    if let Some(k) = &self.kept {
                        rt.engine.restore_state(&k.state)?;
                    }
                    restore_s = t.elapsed().as_secs_f64();
                    from = kept;
                    n_reused = kept;
                    if split > kept {
                        keep_at = Some(split);
                    }
                }
            }
            if let Some(split) = keep_at {
                let t = Instant::now();
                rt.prefill(&full[from..split], self.turn)?;
                prefill_s += t.elapsed().as_secs_f64();
                let t = Instant::now();
                self.kept = Some(Kept {
                    tokens: full[..split].to_vec(),
                    state: rt.engine.save_state(),
                });
                store_s = t.elapsed().as_secs_f64();
                from = split;
            }
            let t = Instant::now();
            let logits = rt.prefill(&full[from..], self.turn)?;
            prefill_s += t.elapsed().as_secs_f64();
            Ok(logits)
        })();
        let usage = Usage::now().since(&usage0);
        let counters = rt.counters.snapshot().since(&snap0);
        match &saved {
            Some(s) => rt.engine.restore_state(s)?,
            None => rt.engine.reset(),
        }
        let (cancelled, choice_logp) = match ran {
            Ok(logits) => (false, decide::log_softmax_at(&logits, &a.firsts)),
            Err(engine::ForwardError::Cancelled) => (true, Vec::new()),
            Err(e) => return Err(e.into()),
        };
        Ok(Decision {
            cancelled,
            choice_logp,
            n_tokens: full.len(),
            n_reused,
            restore_s,
            store_s,
            prefill_s,
            usage,
            counters,
            prefix_state_bytes: self.kept.as_ref().map_or(0, |k| k.state.bytes()),
        })
    }
}
