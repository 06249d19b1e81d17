//! Generation: the [`Runtime`] that holds everything a generation needs once it is set up, and
//! its loop — prefill the prompt after what the context already holds, then sample, decode and
//! run one token at a time (with `--ngram`, a drawn token and its draft per pass, each row with
//! a one-token pass's bits, so that the tokens are the same), reporting to a [`Sink`] and
//! stopping at an end-of-generation token, the token limit, a full context or a cancel.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chat::{ChatFormat, ReasoningSyntax};
use engine::{Engine, LogitsWanted};
use sampler::{Sampler, SamplerMark};
use text::{StreamDecoder, Tokenizer};

use crate::cancel::Control;
use crate::error::{Context, Result};
use crate::events::{End, Outcome, Prefilled, Summary, TokenRow};
use crate::notice::Notices;
use crate::probes::{DenseProbe, Usage};
use crate::sink::Sink;
use crate::source::{StreamCounters, StreamSnapshot};
use crate::spec::{self, SpecCounts};
use crate::traces::{ComputeTrace, IoTrace};
use telemetry::Phase;

/// The recorders a run may have (each optional): they see every forward pass of every
/// generation.
#[derive(Default)]
pub struct Recorders {
    /// Samples how much of the dense weights is resident, for the per-token figures; with it
    /// the runtime takes a [`TokenRow`] per token (for a sink's `token`), without it none.
    pub probe: Option<DenseProbe>,
    /// The `route_trace v1` file.
    pub route_trace: Option<crate::routes::RouteTraceFile>,
    /// colibri's `ROUTE_TRACE` stream.
    pub route_stream: Option<crate::routes::RouteStream>,
    /// The expert-use history, saved after each generation.
    pub history: Option<crate::history::History>,
    /// The `io_trace v1` file (the expert source writes to it too).
    pub io_trace: Option<Arc<Mutex<IoTrace>>>,
    /// The `compute_trace v1` file (the engine's observer writes to it too).
    pub compute_trace: Option<Arc<Mutex<ComputeTrace>>>,
    /// What the engine ranked ahead of the router, scored (`--predict-log`, `--route-ahead`).
    pub predict: Option<crate::predict::PredictLog>,
    /// The live routing picture ([`crate::open::RunConfig::route_heat`]).
    pub heat: Option<Arc<crate::routes::RouteHeat>>,
}

/// Everything a generation needs, set up once: the engine over the loaded model, the
/// tokenizer and chat format, the sampler, the expert source's counters and the recorders. A
/// one-shot run makes one [`generate`](Runtime::generate) call; a session one per turn.
pub struct Runtime<'a> {
    pub engine: Engine<'a>,
    pub tokenizer: &'a Tokenizer,
    /// The model's chat format (when prompts are rendered with the template).
    pub format: Option<&'a ChatFormat>,
    pub arch: String,
    pub n_ctx: usize,
    pub n_threads: usize,
    /// Seconds the load took.
    pub load_s: f64,
    pub streaming: bool,
    pub cache_bytes: u64,
    pub overlap: bool,
    pub counters: Arc<StreamCounters>,
    pub sampler: Sampler,
    /// As llama.cpp's `--ignore-eos`: end-of-generation tokens are never drawn.
    pub ignore_eos: bool,
    /// The `mode:` line (and the route replay's note).
    pub mode: String,
    /// Cancels work in flight (a session installs it).
    pub control: Option<Arc<Control>>,
    /// Where the runtime's notices go.
    pub notices: Notices,
    pub recorders: Recorders,
    /// Installed after the (first) prefill: decode steps replay a recorded routing.
    pub replay: Option<engine::RouteReplay>,
    /// `--route-ahead`'s depth (0: off).
    pub route_ahead: usize,
    /// The `moe-prefetch:` line's tag for the reads ahead this run makes.
    pub prefetch_tag: &'static str,
    /// Speculative decoding (`--ngram`, `--mtp`).
    pub spec: Option<spec::Spec>,
}

/// One generation: the whole prompt's tokens (those already in the context, the engine's
/// `n_past` first ones, are not run again), how many tokens at most, the rendered chat prompt
/// (for the reasoning split) and the session turn.
pub struct Turn<'c> {
    pub ids: &'c [u32],
    pub n_max: usize,
    pub prompt: Option<&'c chat::Prompt>,
    pub turn: u32,
}

/// What a turn's prefill left: the last logits (empty when cancelled), what it ran and cost,
/// and the counters where the decode starts.
struct PrefillDone {
    logits: Vec<f32>,
    cancelled: bool,
    n_new: usize,
    secs: f64,
    delta: StreamSnapshot,
    usage: Usage,
    at_decode: StreamSnapshot,
    usage_at_decode: Usage,
}

/// A decode pass's wall time, and the time since the previous pass ended.
#[derive(Clone, Copy)]
struct Pass {
    wall: Duration,
    gap: Duration,
}

/// Which generated token a row is for: `n` of at most `of`, in session turn `turn`.
#[derive(Clone, Copy)]
struct Step {
    n: usize,
    of: usize,
    turn: u32,
}

/// The text of a generation as it is decoded: split into answer and reasoning (with a chat
/// prompt of a reasoning model), accumulated for the outcome, handed to the sink.
struct Text {
    splitter: Option<chat::ReasoningSplitter>,
    answer: String,
    reasoning: String,
}

impl Text {
    fn push(&mut self, delta: &str, sink: &mut dyn Sink) -> Result<()> {
        let d = match &mut self.splitter {
            None => chat::SplitDelta {
                text: delta.to_owned(),
                ..Default::default()
            },
            Some(s) => s.push(delta),
        };
        self.emit(&d, sink)
    }

    fn finish(&mut self, sink: &mut dyn Sink) -> Result<()> {
        if let Some(s) = &mut self.splitter {
            let d = s.finish();
            self.emit(&d, sink)?;
        }
        Ok(())
    }

    fn emit(&mut self, d: &chat::SplitDelta, sink: &mut dyn Sink) -> Result<()> {
        if d.reset || !d.text.is_empty() || !d.reasoning.is_empty() {
            d.apply(&mut self.answer, &mut self.reasoning);
            sink.delta(d)?;
        }
        Ok(())
    }
}

impl Runtime<'_> {
    /// The cumulative hit rate, or -1 without a cache.
    fn hit_pct(&self, snap: &StreamSnapshot) -> f64 {
        if self.streaming && self.cache_bytes > 0 {
            snap.hit_pct()
        } else {
            -1.0
        }
    }

    fn stamp(&self, turn: u32, phase: Phase, step: usize) {
        if let Some(p) = &self.recorders.predict {
            p.set_decode(phase == Phase::Decode);
        }
        if let Some(t) = &self.recorders.io_trace {
            t.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .stamp(turn, phase, step);
        }
    }

    fn ct(&self, f: &mut dyn FnMut(&mut ComputeTrace)) {
        if let Some(t) = &self.recorders.compute_trace {
            f(&mut t.lock().unwrap_or_else(PoisonError::into_inner));
        }
    }

    /// Lets `control` cancel this runtime's work: the engine checks it between prefill chunks,
    /// the generation loop between tokens.
    pub fn install_control(&mut self, control: Arc<Control>) {
        let check = Arc::clone(&control);
        self.engine.set_abort(Some(Box::new(move || check.check())));
        self.control = Some(control);
    }

    /// The expert cache's budget in MiB (0 without one).
    pub fn budget_mib(&self) -> f64 {
        self.cache_bytes as f64 / (1u64 << 20) as f64
    }

    /// Prefill `ids` after the context (with the session's cancel check and test hold), the
    /// last token's logits. The route and I/O traces see it as the prefill of `turn`.
    pub fn prefill(&mut self, ids: &[u32], turn: u32) -> Result<Vec<f32>, engine::ForwardError> {
        if let Some(t) = &self.recorders.route_trace {
            t.start_turn(turn);
        }
        self.stamp(turn, Phase::Prefill, self.engine.n_past());
        let pos = self.engine.n_past();
        self.ct(&mut |c| c.begin(turn, Phase::Prefill, pos));
        if let Some(c) = &self.control {
            c.begin_prefill();
        }
        let r = self.engine.forward(ids, LogitsWanted::Last);
        if let Some(c) = &self.control {
            c.end_prefill();
        }
        self.ct(&mut |c| c.end());
        r
    }

    /// Prefill the prompt's tokens after the context and generate up to `t.n_max` tokens,
    /// reporting to `sink`. A cancel stops between prefill chunks or tokens (the outcome
    /// says so; the context then holds what was run).
    pub fn generate(&mut self, t: &Turn<'_>, sink: &mut dyn Sink) -> Result<Outcome> {
        let ahead_at = self.recorders.predict.as_ref().map(|p| p.figures());
        let p = self.prefill_turn(t, sink)?;
        let cache_aware_at = self.engine.cache_aware_counts();
        let mut cancelled = p.cancelled;
        let mut logits = p.logits;
        let mut last_end = Instant::now();
        self.begin_decode()?;
        let (mut decoder, mut text) = self.text_for(t);
        let tokenizer = self.tokenizer;
        let eog = &tokenizer.vocab().eog;
        let n_ctx = self.n_ctx;
        let steps = t.n_max.min(n_ctx.saturating_sub(t.ids.len()));
        let mut n_gen = 0usize;
        let mut fed = Vec::new();
        let mut decode = Duration::ZERO;
        let mut loop_overhead = Duration::ZERO;
        // The last token's row, reported once its text is known.
        let mut held: Option<TokenRow> = None;
        let mut end = End::Length;
        // Speculation: what drafts are looked up in (the prompt and every token drawn); the
        // tokens drawn ahead from a verify pass's rows, each with where the sampler was after
        // it, the first `in_ctx` of them run into the context by that pass.
        let mut sp = SpecCounts {
            source: self.spec.map(|s| s.source()).unwrap_or_default(),
            ..SpecCounts::default()
        };
        let mut corpus: Vec<u32> = if let Some(spec::Spec::Ngram(_)) = self.spec {
            t.ids.to_vec()
        } else {
            Vec::new()
        };
        let ctx0 = self.engine.n_past();
        let mut queue: VecDeque<(u32, SamplerMark)> = VecDeque::new();
        let mut in_ctx = 0usize;
        while !cancelled && n_gen < t.n_max {
            let (id, mark) = match queue.pop_front() {
                Some((id, mark)) => (id, Some(mark)),
                None => {
                    if self.engine.n_past() >= n_ctx {
                        self.notices.info(format!(
                            "\nsluice: the context ({n_ctx} tokens) is full; generation stopped"
                        ));
                        end = End::Context;
                        break;
                    }
                    self.mask_eog(&mut logits);
                    (self.sampler.sample(&logits), None)
                }
            };
            let ran = in_ctx > 0;
            in_ctx = in_ctx.saturating_sub(1);
            // The previous token's row goes out now, so that the text the decoder holds back
            // at the end can still join the last one.
            if let Some(row) = held.take() {
                sink.token(&row)?;
            }
            if eog.contains(&id) {
                end = End::Eog;
                break;
            }
            text.push(&decoder.push(tokenizer, id), sink)?;
            n_gen += 1;
            if sink.stop() {
                end = End::Stop;
                // the draws taken ahead after this one are not used
                if let Some(m) = &mark
                    && !queue.is_empty()
                {
                    self.sampler.rewind(m);
                }
                break;
            }
            if let Some(spec::Spec::Ngram(_)) = self.spec {
                corpus.push(id);
            }
            if let Some(c) = &self.control {
                c.hold_decode(n_gen);
            }
            if ran {
                // a drafted token the model drew itself: the verify pass ran it. A cancel
                // stops here as it stops before a pass: the token keeps its row, and leaves
                // the context with the final cut below.
                let stop = self.control.as_ref().is_some_and(|c| c.cancelled());
                if stop {
                    cancelled = true;
                } else {
                    fed.push(id);
                    sp.accepted += 1;
                }
                if self.recorders.probe.is_some() {
                    let step = Step {
                        n: n_gen,
                        of: steps,
                        turn: t.turn,
                    };
                    held = Some(self.confirmed_row(step));
                }
                continue;
            }
            let t_draft = Instant::now();
            let drafts: Vec<u32> = match self.spec {
                Some(sp) => {
                    let room = (sp.draft())
                        .min(t.n_max - n_gen)
                        .min(n_ctx - self.engine.n_past() - 1);
                    match sp {
                        spec::Spec::Ngram(ng) => {
                            spec::ngram_draft(&corpus, ng.min_match, room).to_vec()
                        }
                        spec::Spec::Mtp(m) => (self.engine.mtp_draft(id, room, m.p_min)?)
                            .into_iter()
                            .map(|(d, _)| d)
                            .collect(),
                    }
                }
                None => Vec::new(),
            };
            let mut draft_s = t_draft.elapsed().as_secs_f64();
            // (The per-token figures are taken only when something reports them.)
            let before = self
                .recorders
                .probe
                .is_some()
                .then(|| (self.counters.snapshot(), Usage::now()));
            let (ran, pass) = self.decode_pass(id, &drafts, t.turn, last_end);
            last_end = Instant::now();
            let mut batch = 1;
            // A cancel stops before the token's forward pass: the token was drawn and its
            // text delivered, so it still gets its row (with no pass: zero time and reads).
            match ran {
                Ok(rows) => {
                    fed.push(id);
                    decode += pass.wall;
                    loop_overhead += pass.gap;
                    sp.decodes += 1;
                    if drafts.is_empty() {
                        logits = rows;
                    } else {
                        sp.drafted += drafts.len() as u64;
                        sp.drafted_steps += 1;
                        let budget =
                            (t.n_max - n_gen).min(n_ctx - self.engine.n_past() + drafts.len());
                        let (k, next) = self.draw_ahead(rows, &drafts, budget, &mut queue);
                        logits = next;
                        in_ctx = k;
                        batch += k;
                        // the drafts the model did not draw leave the context
                        let t_cut = Instant::now();
                        let keep = self.engine.n_past() - (drafts.len() - k);
                        self.engine.truncate(keep);
                        draft_s += t_cut.elapsed().as_secs_f64();
                    }
                }
                Err(engine::ForwardError::Cancelled) => {
                    cancelled = true;
                    batch = 0;
                }
                Err(e) => return Err(e.into()),
            }
            sp.draft_s += draft_s;
            if let Some(before) = before {
                let step = Step {
                    n: n_gen,
                    of: steps,
                    turn: t.turn,
                };
                let mut row = self.token_row(step, pass, cancelled, before);
                row.mtp_batch = batch;
                row.mtp_draft_ms = draft_s * 1e3;
                held = Some(row);
            }
        }
        // The context holds what was run of the generation: tokens a verify pass ran that
        // were never delivered (after a stop) leave it.
        if self.engine.n_past() > ctx0 + fed.len() {
            self.engine.truncate(ctx0 + fed.len());
        }
        text.push(&decoder.finish(), sink)?;
        text.finish(sink)?;
        if let Some(row) = held.take() {
            sink.token(&row)?;
        }
        // The tail after the last decode belongs to the loop's overhead too.
        loop_overhead += last_end.elapsed();
        let decode_usage = Usage::now().since(&p.usage_at_decode);
        let d = self.counters.snapshot().since(&p.at_decode);
        let cache_aware = self.engine.cache_aware_counts().since(&cache_aware_at);
        let summary = Summary {
            tokens: n_gen,
            decode_s: decode.as_secs_f64(),
            load_s: self.load_s,
            n_prompt: p.n_new,
            prefill_s: p.secs,
            decode: d,
            overlap: self.overlap,
            usage: decode_usage,
            cache_hit_pct: self.hit_pct(&self.counters.snapshot()),
            cache_budget_mib: self.budget_mib(),
            // (a dropped routing is never handed to the source, which counts what it loads)
            experts_routed: d.routed + cache_aware.dropped,
            cache_aware,
            loop_overhead_s: loop_overhead.as_secs_f64(),
            prefill: p.delta,
            prefill_usage: p.usage,
            ahead: match (&self.recorders.predict, &ahead_at) {
                (Some(log), Some(at)) => log.figures().since(at),
                _ => Default::default(),
            },
            spec: self.spec.is_some().then_some(sp),
        };
        let outcome = Outcome {
            summary,
            decode,
            decode_usage,
            d,
            answer: text.answer,
            reasoning: text.reasoning,
            cancelled,
            tokens: fed,
            end: if cancelled { End::Cancelled } else { end },
        };
        sink.finished(&outcome)?;
        Ok(outcome)
    }

    /// The turn's prefill: the prompt's tokens after those the context holds, with what it
    /// cost; said in a notice and to the sink unless it was cancelled.
    fn prefill_turn(&mut self, t: &Turn<'_>, sink: &mut dyn Sink) -> Result<PrefillDone> {
        let reuse = self.engine.n_past();
        let new = &t.ids[reuse.min(t.ids.len())..];
        let usage0 = Usage::now();
        let snap0 = self.counters.snapshot();
        let t0 = Instant::now();
        let prefilled = self.prefill(new, t.turn);
        let secs = t0.elapsed().as_secs_f64();
        let at_decode = self.counters.snapshot();
        let usage_at_decode = Usage::now();
        let (logits, cancelled) = match prefilled {
            Ok(l) => (l, false),
            Err(engine::ForwardError::Cancelled) => (Vec::new(), true),
            Err(e) => return Err(e.into()),
        };
        if !cancelled {
            self.notices.info(format!(
                "sluice: prompt {} tokens ({} new), prefill {secs:.3} s ({:.2} tok/s)",
                t.ids.len(),
                new.len(),
                if secs > 0.0 {
                    new.len() as f64 / secs
                } else {
                    0.0
                }
            ));
            sink.prefilled(&Prefilled {
                n_prompt: t.ids.len(),
                n_new: new.len(),
                secs,
            })?;
        }
        Ok(PrefillDone {
            logits,
            cancelled,
            n_new: new.len(),
            secs,
            delta: at_decode.since(&snap0),
            usage: usage_at_decode.since(&usage0),
            at_decode,
            usage_at_decode,
        })
    }

    /// From here on the passes are decode steps: the route trace says so, and a route
    /// replay (installed after the first prefill) takes over the routing.
    fn begin_decode(&mut self) -> Result<()> {
        if let Some(tr) = &self.recorders.route_trace {
            tr.start_decode();
        }
        if let Some(r) = self.replay.take() {
            let what = self.mode.clone();
            self.engine
                .set_route_replay(Some(r))
                .with_context(|| format!("--route-replay ({what})"))?;
        }
        Ok(())
    }

    /// The decoder of the generated tokens and the text they make, split into answer and
    /// reasoning for a chat prompt of a reasoning model.
    fn text_for(&self, t: &Turn<'_>) -> (StreamDecoder, Text) {
        let (special, splitter) = match (self.format, t.prompt) {
            (Some(format), Some(prompt)) => (
                // Reasoning tags (and harmony's headers) are special tokens in many
                // vocabularies; the splitter needs their text.
                !matches!(format.reasoning_syntax(), ReasoningSyntax::None),
                Some(format.splitter(prompt)),
            ),
            _ => (false, None),
        };
        let text = Text {
            splitter,
            answer: String::new(),
            reasoning: String::new(),
        };
        (StreamDecoder::continuation(special), text)
    }

    /// One decode step's forward pass of token `id` (and of the `drafts` after it, verified
    /// in one pass with each row's one-token bits), stamped in the traces: its logits, one row
    /// per token run (or why there are none), and its timing.
    fn decode_pass(
        &mut self,
        id: u32,
        drafts: &[u32],
        turn: u32,
        last_end: Instant,
    ) -> (Result<Vec<f32>, engine::ForwardError>, Pass) {
        let pos = self.engine.n_past();
        self.stamp(turn, Phase::Decode, pos);
        self.ct(&mut |c| c.begin(turn, Phase::Decode, pos));
        let t1 = Instant::now();
        let gap = t1 - last_end;
        let ran = if drafts.is_empty() {
            self.engine.forward(&[id], LogitsWanted::Last)
        } else {
            let mut group = Vec::with_capacity(1 + drafts.len());
            group.push(id);
            group.extend_from_slice(drafts);
            self.engine.forward_rows(&group)
        };
        let wall = t1.elapsed();
        self.ct(&mut |c| c.end());
        (ran, Pass { wall, gap })
    }

    /// As llama.cpp's `--ignore-eos`: end-of-generation tokens are never drawn.
    fn mask_eog(&self, logits: &mut [f32]) {
        if self.ignore_eos {
            for &id in &self.tokenizer.vocab().eog {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Draw the tokens a verify pass's `rows` give, in order, while each is the draft that
    /// pass ran after it (at most `budget` draws): into `queue`, each with where the sampler
    /// was after it. Returns how many drafts were drawn (the pass ran them into the context)
    /// and the logits after the last of them (the rows cut down to that one, no copy).
    fn draw_ahead(
        &mut self,
        mut rows: Vec<f32>,
        drafts: &[u32],
        budget: usize,
        queue: &mut VecDeque<(u32, SamplerMark)>,
    ) -> (usize, Vec<f32>) {
        let nv = rows.len() / (1 + drafts.len());
        let mut k = 0;
        for i in 0..budget.min(drafts.len() + 1) {
            let row = &mut rows[i * nv..(i + 1) * nv];
            self.mask_eog(row);
            let x = self.sampler.sample(row);
            queue.push_back((x, self.sampler.mark()));
            if drafts.get(i) != Some(&x) || self.tokenizer.vocab().eog.contains(&x) {
                break;
            }
            k += 1;
        }
        rows.drain(..k * nv);
        rows.truncate(nv);
        (k, rows)
    }

    /// The row of generated token `step` that an earlier pass ran as a draft: as a token
    /// without a pass of its own, zero time and reads (its cost is on that pass's row), and
    /// `mtp_batch` 0.
    fn confirmed_row(&mut self, step: Step) -> TokenRow {
        let none = Pass {
            wall: Duration::ZERO,
            gap: Duration::ZERO,
        };
        let mut row = self.token_row(step, none, true, Default::default());
        row.mtp_batch = 0;
        row
    }

    /// A generated token's figures (zero time and reads when `cancelled`: no pass ran for it).
    fn token_row(
        &mut self,
        step: Step,
        pass: Pass,
        cancelled: bool,
        (snap0, usage0): (StreamSnapshot, Usage),
    ) -> TokenRow {
        let snap = self.counters.snapshot();
        let (wall_s, d, usage) = if cancelled {
            (0.0, Default::default(), Usage::default())
        } else {
            (
                pass.wall.as_secs_f64(),
                snap.since(&snap0),
                Usage::now().since(&usage0),
            )
        };
        let mut row = TokenRow::new(
            step.n,
            step.of,
            wall_s,
            &d,
            self.overlap,
            &usage,
            self.hit_pct(&snap),
            pass.gap.as_secs_f64(),
        );
        if let Some(probe) = &mut self.recorders.probe {
            row.dense_resident_frac = probe.sample();
        }
        row.cache_budget_mib = self.budget_mib();
        row.turn = step.turn;
        row
    }

    /// Add the routing so far to the usage history file (after each generation).
    pub fn save_history(&self) {
        if let Some(h) = &self.recorders.history {
            h.save();
        }
    }

    /// Flush the traces; reports the first write error.
    pub fn finish(&mut self) -> Result<()> {
        if let Some(t) = self.recorders.route_trace.take() {
            t.finish()?;
        }
        if let Some(s) = &self.recorders.route_stream {
            s.finish()?;
        }
        if let Some(t) = &self.recorders.io_trace {
            t.lock().unwrap_or_else(PoisonError::into_inner).finish()?;
        }
        if let Some(t) = &self.recorders.compute_trace {
            t.lock().unwrap_or_else(PoisonError::into_inner).finish()?;
        }
        Ok(())
    }
}

/// The bytes of every tensor of `file` not in `experts` (routed experts and NextN layers; what the dense probe
/// samples).
pub fn dense_slices<'f>(
    file: &'f gguf::GgufFile,
    experts: &std::collections::HashSet<String>,
) -> Vec<&'f [u8]> {
    file.tensors()
        .iter()
        .filter(|t| !experts.contains(&t.name))
        .filter_map(|t| file.tensor_data(t).ok())
        .collect()
}
