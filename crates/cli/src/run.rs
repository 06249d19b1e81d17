//! `sluice run`: generate text from a prompt, streaming it to standard output, then the
//! end-of-run summary (`=== answer ===`, `=== perf ===`, `generation:`, `mode:`).
//!
//! Standard output carries only the answer and the summary; diagnostics (the seed, the prompt
//! size and prefill time, the reasoning of a reasoning model) go to standard error.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chat::{ChatFormat, ReasoningSyntax};
use engine::ops::KvType;
use engine::{Engine, EngineConfig, LogitsWanted};
use gguf::GgufFile;
use quant::ThreadPool;
use runtime::Choice as _;
use sampler::{RANDOM_SEED, Sampler, SamplerParams};
use text::{StreamDecoder, Tokenizer};

use runtime::load::{build_engine, load_model, thread_count};

use crate::telemetry::{CsvSink, DenseProbe, MemPicture, Preamble, Summary, TokenRow, Usage};

/// Context size when `-c` is not given (capped at the model's training context).
pub const DEFAULT_CTX: usize = 4096;

pub struct Options {
    pub model: PathBuf,
    /// The prompt of a one-shot run.
    pub prompt: Option<String>,
    /// With --chatml: a whole conversation (JSON messages) instead of one user prompt.
    pub messages: Option<PathBuf>,
    /// Serve requests from standard input (`--session`).
    pub session: bool,
    /// Answer `decide` requests in a session.
    pub decide: bool,
    /// `--decide-prefix-cache`.
    pub prefix_cache: crate::decide::PrefixCacheMode,
    /// Score this text's perplexity instead of generating.
    pub ppl: Option<PathBuf>,
    /// With --ppl: one token per decode.
    pub ppl_step: bool,
    /// A session's test hook: wait for a cancel at this point.
    pub test_hold: Option<crate::session::Hold>,
    /// colibri's `ROUTE_TRACE` stream, and whether its path came from the environment (then
    /// a file that cannot be opened is a warning, as colibri has it).
    pub route_stream: Option<(PathBuf, bool)>,
    /// The expert-use history and pinning.
    pub history: crate::history::HistoryConfig,
    pub n_predict: i64,
    pub threads: Option<usize>,
    pub ctx: Option<usize>,
    pub ubatch: usize,
    /// `--row-prefetch`: `None` keeps the kernel table's choice.
    pub row_prefetch: Option<bool>,
    pub kv_type: KvType,
    pub temp: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: i64,
    pub ignore_eos: bool,
    pub chatml: bool,
    pub system: Option<String>,
    pub no_think: bool,
    pub route_trace: Option<PathBuf>,
    pub route_replay: Option<PathBuf>,
    pub stream: crate::stream::StreamConfig,
    /// `BMOE_LOAD` / `BMOE_PROGRESS` lines per token and the banner block at the end.
    pub progress: bool,
    /// The `bmoe_metrics v2` CSV sink.
    pub csv: Option<PathBuf>,
    /// The `io_trace v1` file.
    pub io_trace: Option<PathBuf>,
    /// The `compute_trace v1` file, and whether by layer.
    pub compute_trace: Option<(PathBuf, bool)>,
}

/// Where generated text goes: the answer to standard output as it arrives, reasoning (of a
/// chat with a reasoning model) to standard error between two marker lines.
struct Streamer {
    splitter: Option<chat::ReasoningSplitter>,
    answer: String,
    reasoning: String,
    in_reasoning: bool,
    /// The last byte written to standard output was not a newline.
    open_line: bool,
    /// `--progress`: nothing is printed; the deltas wait for the token's progress line.
    progress: bool,
    /// The deltas since the last progress line: (reset, reasoning, text).
    pending: (bool, String, String),
}

impl Streamer {
    fn push(&mut self, delta: &str) -> io::Result<()> {
        let d = match &mut self.splitter {
            None => chat::SplitDelta {
                text: delta.to_owned(),
                ..Default::default()
            },
            Some(s) => s.push(delta),
        };
        self.emit(d)
    }

    fn finish(&mut self) -> io::Result<()> {
        if let Some(s) = &mut self.splitter {
            let d = s.finish();
            self.emit(d)?;
        }
        self.end_reasoning();
        Ok(())
    }

    fn end_reasoning(&mut self) {
        if self.in_reasoning && !self.progress {
            eprintln!("\n--- end of reasoning ---");
            self.in_reasoning = false;
        }
    }

    /// The deltas since the last call (for a progress line).
    fn take_deltas(&mut self) -> (bool, String, String) {
        std::mem::take(&mut self.pending)
    }

    fn emit(&mut self, d: chat::SplitDelta) -> io::Result<()> {
        if self.progress {
            if d.reset {
                // The deltas become full snapshots replacing what was delivered.
                self.answer.clear();
                self.reasoning.clear();
                self.pending = (true, String::new(), String::new());
            }
            self.reasoning.push_str(&d.reasoning);
            self.answer.push_str(&d.text);
            if self.pending.0 {
                self.pending.1 = self.reasoning.clone();
                self.pending.2 = self.answer.clone();
            } else {
                self.pending.1.push_str(&d.reasoning);
                self.pending.2.push_str(&d.text);
            }
            return Ok(());
        }
        if d.reset {
            // Text already shown as answer turned out to be reasoning: the reasoning so far is
            // shown again whole; the answer block at the end has the right split.
            self.end_reasoning();
            eprintln!("--- the answer streamed so far was reasoning ---");
            self.answer.clear();
            self.reasoning.clear();
        }
        if !d.reasoning.is_empty() {
            if !self.in_reasoning {
                eprintln!("--- reasoning ---");
                self.in_reasoning = true;
            }
            eprint!("{}", d.reasoning);
            self.reasoning.push_str(&d.reasoning);
        }
        if !d.text.is_empty() {
            self.end_reasoning();
            let mut out = io::stdout().lock();
            out.write_all(d.text.as_bytes())?;
            out.flush()?;
            self.open_line = !d.text.ends_with('\n');
            self.answer.push_str(&d.text);
        }
        Ok(())
    }
}

/// Prompt token ids of a one-shot run: the prompt as is (BOS as the model's metadata says,
/// special-token text not parsed), or with --chatml one user turn (or the `--messages`
/// conversation) rendered with the model's template; with the rendered prompt.
fn prompt_ids(
    opts: &Options,
    format: Option<&ChatFormat>,
    tokenizer: &Tokenizer,
) -> Result<(Vec<u32>, Option<chat::Prompt>)> {
    let text = opts.prompt.as_deref().unwrap_or_default();
    let Some(format) = format else {
        return Ok((tokenizer.encode(text, true, false), None));
    };
    let messages = match &opts.messages {
        Some(path) => crate::prompt::read_json(path)?,
        None => crate::prompt::single_turn(opts.system.as_deref(), text),
    };
    let prompt = crate::prompt::render_prompt(format, &messages, None, !opts.no_think)?;
    Ok((chat_ids(format, tokenizer, &prompt.text), Some(prompt)))
}

/// The token ids of a rendered chat prompt: special tokens parsed, and a BOS the template
/// wrote itself dropped where the tokenizer adds one (as llama.cpp).
pub fn chat_ids(format: &ChatFormat, tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let rendered = if tokenizer.vocab().add_bos {
        format.template().strip_leading_bos(text)
    } else {
        text
    };
    tokenizer.encode(rendered, true, true)
}

/// The `generation:` line of the summary: decode time only.
pub fn generation_line(n_tokens: usize, decode: Duration) -> String {
    if n_tokens == 0 {
        return "generation: 0 tokens, 0.000 s/token (0.00 tok/s)".to_owned();
    }
    let secs = decode.as_secs_f64();
    let per_token = secs / n_tokens as f64;
    let rate = if secs > 0.0 {
        n_tokens as f64 / secs
    } else {
        0.0
    };
    format!("generation: {n_tokens} tokens, {per_token:.3} s/token ({rate:.2} tok/s)")
}

/// The `mode:` line of a run that does not stream. The spec prints the line on every run and has
/// a run that could stream but does not name the flag; a model without routed experts says so.
/// `why` is the automatic decision's reason (empty when a flag decided).
pub fn resident_mode_line(moe: bool, why: &str) -> String {
    let mut line = if moe {
        "mode: resident, experts not streamed (--moe-stream on streams them), dense mmap"
    } else {
        "mode: resident, no routed experts to stream, dense mmap"
    }
    .to_owned();
    if moe && !why.is_empty() {
        line.push_str(&format!(" ({why})"));
    }
    line
}

/// The `moe-stream:` and `moe-cache:` lines for the decode's counters `d` over `n_gen` tokens
/// that took `decode`.
pub fn stream_summary(
    d: &crate::stream::StreamSnapshot,
    n_gen: usize,
    decode: Duration,
    overlap: bool,
    cache: bool,
) -> Vec<String> {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let per_tok = |x: f64| if n_gen > 0 { x / n_gen as f64 } else { 0.0 };
    let io_s = d.io_ns as f64 / 1e9;
    let stall_s = d.stall_ns as f64 / 1e9;
    let mgmt_s = d.mgmt_ns as f64 / 1e9;
    let wall = decode.as_secs_f64();
    // The residual: serial runs lose the read wait, overlapped runs the stall.
    let waited = if overlap { stall_s } else { io_s };
    let compute = (wall - waited - mgmt_s).max(0.0);
    let mut stream = format!(
        "moe-stream: read {:.1} MiB ({:.1} MiB/token), decode {:.3} s/token (compute {:.3} + \
         cache mgmt {:.3} + flash I/O {:.3} s/token, {:.0} MiB/s)",
        mib(d.read_bytes),
        per_tok(mib(d.read_bytes)),
        per_tok(wall),
        per_tok(compute),
        per_tok(mgmt_s),
        per_tok(io_s),
        if io_s > 0.0 {
            mib(d.read_bytes) / io_s
        } else {
            0.0
        }
    );
    if overlap {
        stream.push_str(&format!(", stall_s/tok={:.3}", per_tok(stall_s)));
    }
    let mut lines = vec![stream];
    // Present only when a cache is active.
    if cache {
        lines.push(format!(
            "moe-cache: {:.1}% hit, resident {:.1} MiB",
            d.hit_pct(),
            mib(d.resident_bytes)
        ));
    }
    lines
}

/// Everything a generation needs, set up once: the engine over the loaded model, the
/// tokenizer and chat format, the sampler, the streamer's counters and the telemetry sinks. A
/// one-shot run makes one [`generate`](Runtime::generate) call; a session one per turn.
pub struct Runtime<'a> {
    pub engine: Engine<'a>,
    pub tokenizer: &'a Tokenizer,
    /// The model's chat format (with --chatml).
    pub format: Option<&'a ChatFormat>,
    pub arch: String,
    pub n_ctx: usize,
    pub n_threads: usize,
    pub load_s: f64,
    pub streaming: bool,
    pub cache_bytes: u64,
    pub overlap: bool,
    pub counters: Arc<crate::stream::StreamCounters>,
    pub sampler: Sampler,
    /// Per-token `BMOE_*` lines instead of inline text (`--progress`, and every session).
    pub progress: bool,
    pub ignore_eos: bool,
    /// The `mode:` line (and the route replay's note).
    pub mode: String,
    /// The session's cancel control (a session installs it).
    pub control: Option<Arc<crate::session::Control>>,
    csv: Option<CsvSink>,
    probe: Option<DenseProbe>,
    trace: Option<crate::routes::RouteTraceFile>,
    route_stream: Option<crate::routes::RouteStream>,
    history: Option<crate::history::History>,
    io_trace: Option<Arc<Mutex<crate::telemetry::IoTrace>>>,
    compute_trace: Option<Arc<Mutex<crate::telemetry::ComputeTrace>>>,
    /// Installed after the (first) prefill: decode steps replay a recorded routing.
    replay: Option<engine::RouteReplay>,
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

/// What a generation did.
pub struct Outcome {
    /// The figures of the `# summary` line / `BMOE_DONE`.
    pub summary: Summary,
    pub decode: Duration,
    pub decode_usage: Usage,
    /// The streamer's counters over the decode.
    pub d: crate::stream::StreamSnapshot,
    pub answer: String,
    pub reasoning: String,
    /// Stopped by a cancel request (the context then holds part of the turn).
    pub cancelled: bool,
    /// The generated tokens run into the context, in order.
    pub tokens: Vec<u32>,
    /// The last text written to standard output did not end a line.
    pub open_line: bool,
}

impl Runtime<'_> {
    /// The cumulative hit rate, or -1 without a cache.
    fn hit_pct(&self, snap: &crate::stream::StreamSnapshot) -> f64 {
        if self.streaming && self.cache_bytes > 0 {
            snap.hit_pct()
        } else {
            -1.0
        }
    }

    fn stamp(&self, turn: u32, phase: u8, step: usize) {
        if let Some(t) = &self.io_trace {
            t.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .stamp(turn, phase, step);
        }
    }

    fn ct(&self, f: &mut dyn FnMut(&mut crate::telemetry::ComputeTrace)) {
        if let Some(t) = &self.compute_trace {
            f(&mut t.lock().unwrap_or_else(PoisonError::into_inner));
        }
    }

    /// The expert cache's budget in MiB (0 without one).
    pub fn budget_mib(&self) -> f64 {
        self.cache_bytes as f64 / (1u64 << 20) as f64
    }

    /// Prefill `ids` after the context (with the session's cancel check and test hold), the
    /// last token's logits. The route and I/O traces see it as the prefill of `turn`.
    pub fn prefill(&mut self, ids: &[u32], turn: u32) -> Result<Vec<f32>, engine::ForwardError> {
        if let Some(t) = &self.trace {
            t.start_turn(turn);
        }
        self.stamp(turn, 0, self.engine.n_past());
        let pos = self.engine.n_past();
        self.ct(&mut |c| c.begin(turn, 0, pos));
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
    /// streaming them (inline, or as `BMOE_*` lines), with a CSV row per token and the CSV
    /// summary at the end. A cancel (session) stops between prefill chunks or tokens.
    pub fn generate(&mut self, t: &Turn<'_>) -> Result<Outcome> {
        let reuse = self.engine.n_past();
        let new = &t.ids[reuse.min(t.ids.len())..];
        let prefill_usage0 = Usage::now();
        let prefill_snap0 = self.counters.snapshot();
        let t0 = Instant::now();
        let prefilled = self.prefill(new, t.turn);
        let prefill = t0.elapsed().as_secs_f64();
        let mut last_end = Instant::now();
        let at_decode = self.counters.snapshot();
        let usage_at_decode = Usage::now();
        let prefill_delta = at_decode.since(&prefill_snap0);
        let prefill_usage = usage_at_decode.since(&prefill_usage0);
        let (mut logits, mut cancelled) = match prefilled {
            Ok(l) => (l, false),
            Err(engine::ForwardError::Cancelled) => (Vec::new(), true),
            Err(e) => return Err(e.into()),
        };
        if !cancelled {
            eprintln!(
                "sluice: prompt {} tokens ({} new), prefill {prefill:.3} s ({:.2} tok/s)",
                t.ids.len(),
                new.len(),
                if prefill > 0.0 {
                    new.len() as f64 / prefill
                } else {
                    0.0
                }
            );
        }
        if let Some(tr) = &self.trace {
            tr.start_decode();
        }
        if let Some(r) = self.replay.take() {
            let what = self.mode.clone();
            self.engine
                .set_route_replay(Some(r))
                .with_context(|| format!("--route-replay ({what})"))?;
        }

        let (special, splitter) = match (self.format, t.prompt) {
            (Some(format), Some(prompt)) => (
                // Reasoning tags (and harmony's headers) are special tokens in many
                // vocabularies; the splitter needs their text.
                !matches!(format.reasoning_syntax(), ReasoningSyntax::None),
                Some(format.splitter(prompt)),
            ),
            _ => (false, None),
        };
        let mut decoder = StreamDecoder::continuation(special);
        let mut out = Streamer {
            splitter,
            answer: String::new(),
            reasoning: String::new(),
            in_reasoning: false,
            open_line: false,
            progress: self.progress,
            pending: Default::default(),
        };
        let tokenizer = self.tokenizer;
        let eog = &tokenizer.vocab().eog;
        let n_ctx = self.n_ctx;
        let steps = t.n_max.min(n_ctx.saturating_sub(t.ids.len()));
        let budget_mib = self.budget_mib();
        let mut n_gen = 0usize;
        let mut fed = Vec::new();
        let mut decode = Duration::ZERO;
        let mut loop_overhead = Duration::ZERO;
        // With --progress: the last token's row, printed once its text is known.
        let mut held: Option<TokenRow> = None;
        while !cancelled && n_gen < t.n_max {
            if self.engine.n_past() >= n_ctx {
                eprintln!("\nsluice: the context ({n_ctx} tokens) is full; generation stopped");
                break;
            }
            if self.ignore_eos {
                // As llama.cpp does: end-of-generation tokens are never drawn.
                for &id in eog {
                    if let Some(l) = logits.get_mut(id as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            let id = self.sampler.sample(&logits);
            // The previous token's progress line goes out with its text now, so that the
            // text the decoder holds back at the end can still join the last line.
            if let Some(row) = held.take() {
                progress_lines(&row, &mut out)?;
            }
            if eog.contains(&id) {
                break;
            }
            out.push(&decoder.push(tokenizer, id))?;
            n_gen += 1;
            if let Some(c) = &self.control {
                c.hold_decode(n_gen);
            }
            let pos = self.engine.n_past();
            self.stamp(t.turn, 1, pos);
            self.ct(&mut |c| c.begin(t.turn, 1, pos));
            // (The per-token figures are taken only when something reports them.)
            let before = self
                .probe
                .is_some()
                .then(|| (self.counters.snapshot(), Usage::now()));
            let t1 = Instant::now();
            let gap = t1 - last_end;
            let ran = self.engine.forward(&[id], LogitsWanted::Last);
            let wall = t1.elapsed();
            self.ct(&mut |c| c.end());
            last_end = Instant::now();
            // A cancel stops before the token's forward pass: the token was drawn and its
            // text delivered, so it still gets its row (with no pass: zero time and reads).
            match ran {
                Ok(l) => {
                    logits = l;
                    fed.push(id);
                    decode += wall;
                    loop_overhead += gap;
                }
                Err(engine::ForwardError::Cancelled) => cancelled = true,
                Err(e) => return Err(e.into()),
            }
            if let Some((snap0, usage0)) = before {
                let snap = self.counters.snapshot();
                let (wall_s, d, usage) = if cancelled {
                    (0.0, Default::default(), Usage::default())
                } else {
                    (
                        wall.as_secs_f64(),
                        snap.since(&snap0),
                        Usage::now().since(&usage0),
                    )
                };
                let mut row = TokenRow::new(
                    n_gen,
                    steps,
                    wall_s,
                    &d,
                    self.overlap,
                    &usage,
                    self.hit_pct(&snap),
                    gap.as_secs_f64(),
                );
                if let Some(probe) = &mut self.probe {
                    row.dense_resident_frac = probe.sample();
                }
                row.cache_budget_mib = budget_mib;
                row.turn = t.turn;
                if let Some(csv) = &mut self.csv {
                    row.mem = MemPicture::now();
                    csv.row(&row)?;
                }
                if self.progress {
                    held = Some(row);
                }
            }
        }
        out.push(&decoder.finish())?;
        out.finish()?;
        if let Some(row) = held.take() {
            progress_lines(&row, &mut out)?;
        }
        // The tail after the last decode belongs to the loop's overhead too.
        loop_overhead += last_end.elapsed();
        let decode_usage = Usage::now().since(&usage_at_decode);
        let d = self.counters.snapshot().since(&at_decode);
        let summary = Summary {
            tokens: n_gen,
            decode_s: decode.as_secs_f64(),
            load_s: self.load_s,
            n_prompt: new.len(),
            prefill_s: prefill,
            decode: d,
            overlap: self.overlap,
            usage: decode_usage,
            cache_hit_pct: self.hit_pct(&self.counters.snapshot()),
            cache_budget_mib: budget_mib,
            experts_routed: d.routed,
            loop_overhead_s: loop_overhead.as_secs_f64(),
            prefill: prefill_delta,
            prefill_usage,
        };
        if let Some(csv) = &mut self.csv {
            csv.summary(&summary)?;
        }
        Ok(Outcome {
            summary,
            decode,
            decode_usage,
            d,
            answer: std::mem::take(&mut out.answer),
            reasoning: std::mem::take(&mut out.reasoning),
            cancelled,
            tokens: fed,
            open_line: out.open_line,
        })
    }

    /// Add the routing so far to the usage history file (after each generation).
    pub fn save_history(&self) {
        if let Some(h) = &self.history {
            h.save();
        }
    }

    /// Flush the traces; reports the first write error.
    pub fn finish(&mut self) -> Result<()> {
        if let Some(t) = self.trace.take() {
            t.finish()?;
        }
        if let Some(s) = &self.route_stream {
            s.finish()?;
        }
        if let Some(t) = &self.io_trace {
            t.lock().unwrap_or_else(PoisonError::into_inner).finish()?;
        }
        if let Some(t) = &self.compute_trace {
            t.lock().unwrap_or_else(PoisonError::into_inner).finish()?;
        }
        Ok(())
    }
}

pub fn run(opts: &Options) -> Result<()> {
    if opts.session && opts.route_replay.is_some() {
        bail!(
            "--route-replay replays the decode of one generation and cannot be used with --session"
        );
    }
    let name = opts.model.display().to_string();
    let notices = crate::stderr_notices();
    let t_load = Instant::now();
    let opened = crate::stream::open_for(&opts.model, &opts.stream, &notices)?;
    let streaming = opened.decision.stream;
    let file = opened.file;
    let model = load_model(&file, &opts.model)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let tokenizer = Tokenizer::from_metadata(file.metadata())
        .with_context(|| format!("{name}: cannot build the tokenizer"))?;
    let format = if opts.chatml {
        let template = crate::prompt::load_template(file.metadata(), &tokenizer, None, &name)?;
        Some(ChatFormat::new(template))
    } else {
        None
    };

    let n_ctx_train = model.hparams.n_ctx_train as usize;
    let n_ctx = match opts.ctx {
        None => DEFAULT_CTX.min(n_ctx_train.max(1)),
        Some(0) => n_ctx_train.max(1),
        Some(c) => c,
    };
    if n_ctx > n_ctx_train {
        eprintln!(
            "sluice: warning: context {n_ctx} is larger than the model's training context {n_ctx_train}"
        );
    }
    // A one-shot prompt is checked before anything else is set up.
    let one_shot = if opts.session || opts.ppl.is_some() {
        None
    } else {
        let (ids, prompt) = prompt_ids(opts, format.as_ref(), &tokenizer)?;
        if ids.is_empty() {
            bail!("the prompt is empty (no tokens)");
        }
        if ids.len() > n_ctx {
            bail!(
                "the prompt is {} tokens, longer than the context of {n_ctx} tokens (-c)",
                ids.len()
            );
        }
        Some((ids, prompt))
    };

    let n_threads = thread_count(opts.threads);
    let pool = ThreadPool::new(n_threads).context("cannot start the compute threads")?;
    let cfg = EngineConfig {
        n_ctx,
        kv_type: opts.kv_type,
        ubatch: opts.ubatch,
    };
    let mut engine = build_engine(&model, &pool, cfg, &opts.model)?;
    if let Some(on) = opts.row_prefetch {
        engine.set_row_prefetch(on);
    }
    let counters = Arc::new(crate::stream::StreamCounters::default());
    // The routed experts' tensors (of a resident MoE run too: `dense_resident_frac` samples
    // the rest), and the cycle of one token's experts.
    let layout = match &opened.layout {
        Some(l) => Some(l.clone()),
        None => store::ExpertLayout::from_gguf(&file)
            .ok()
            .flatten()
            .map(store::ExpertLayout::without_biases),
    };
    let expert_tensors: std::collections::HashSet<String> = layout
        .iter()
        .flat_map(|l| {
            l.layers
                .iter()
                .flat_map(|x| x.parts.iter().map(|p| p.tensor.clone()))
        })
        .collect();
    let cycle_mb = layout
        .as_ref()
        .map_or(0, |l| l.token_cycle_bytes().div_ceil(1 << 20));
    let cache_bytes = if streaming { opened.cache_bytes } else { 0 };
    let (mut o_direct, mut io_backend) = (false, "-");
    let io_trace = match &opts.io_trace {
        Some(_) if !streaming => bail!(
            "--io-trace records the expert store's reads, and this run does not stream ({}): \
             add --moe-stream on",
            if opened.decision.why.is_empty() {
                "--moe-stream off".to_owned()
            } else {
                opened.decision.why.clone()
            }
        ),
        Some(path) => Some(Arc::new(Mutex::new(crate::telemetry::IoTrace::create(
            path,
        )?))),
        None => None,
    };
    let arch = file
        .metadata()
        .get_str("general.architecture")
        .unwrap_or("")
        .to_owned();
    let moe_layers: Vec<u32> = layout
        .as_ref()
        .map(|l| l.layers.iter().map(|x| x.layer).collect())
        .unwrap_or_default();
    let history = crate::history::History::open(
        &opts.history,
        &opts.model,
        &arch,
        model.hparams.n_layer,
        model.hparams.n_expert,
        &moe_layers,
        &notices,
    );
    // What each layer batch found in the cache, for the route trace.
    let view = (opts.route_trace.is_some() && streaming)
        .then(|| Arc::new(Mutex::new(crate::stream::BatchView::default())));
    if opened.layout.is_none()
        && !matches!(opts.history.pin, None | Some(crate::history::PinArg::Off))
    {
        eprintln!("sluice: --pin: this run does not stream its experts: nothing pinned");
    }
    if let Some(layout) = opened.layout {
        let layout_cycle_slots = layout.token_cycle_slot_bytes();
        let mut src = opts.stream.source(
            &file,
            layout,
            opened.cache_bytes,
            &name,
            Arc::clone(&counters),
            &notices,
        )?;
        if let Some(v) = &view {
            src.watch(Arc::clone(v));
        }
        if let Some(t) = &io_trace {
            src.trace_io(Arc::clone(t));
        }
        if let Some(h) = &history
            && opts.history.usage_prior
        {
            src.history(h.ranked());
        }
        let hp = &model.hparams;
        let pins = crate::history::plan(
            &opts.history,
            history.as_ref(),
            &arch,
            hp.n_layer,
            hp.n_expert,
            &moe_layers,
            opened.cache_bytes,
            layout_cycle_slots,
            &notices,
        )?;
        if let Some(p) = pins {
            let t = Instant::now();
            let (n, bytes) = src.pin(&p.keys, p.max_bytes)?;
            eprintln!(
                "sluice: pinned {n} experts ({:.1} MiB of {:.1} MiB for pins) from {} in {:.3} s",
                bytes as f64 / (1u64 << 20) as f64,
                p.max_bytes as f64 / (1u64 << 20) as f64,
                p.source.display(),
                t.elapsed().as_secs_f64()
            );
        }
        o_direct = src.direct();
        io_backend = src.backend().name();
        engine.set_expert_source(Some(Box::new(src)))?;
    }
    let replay = match &opts.route_replay {
        Some(path) => {
            if model.hparams.n_expert == 0 {
                bail!("--route-replay: {name} is not a mixture-of-experts model");
            }
            Some(crate::routes::load_replay(path)?)
        }
        None => None,
    };
    let mut taps = Vec::new();
    if let Some(h) = &history {
        taps.push(h.tap());
    }
    let trace = match &opts.route_trace {
        Some(path) => {
            let hp = &model.hparams;
            if hp.n_expert == 0 {
                bail!("--route-trace: {name} is not a mixture-of-experts model");
            }
            let layers = crate::routes::layer_bytes(&file, u64::from(hp.n_expert));
            let t = crate::routes::RouteTraceFile::create(
                path,
                &crate::routes::TraceHeader {
                    model: &opts.model,
                    arch: &arch,
                    n_layer: hp.n_layer,
                    n_expert: hp.n_expert,
                    // A replay may route more experts per token than the model does.
                    n_expert_used: replay
                        .as_ref()
                        .map_or(0, |r| r.max_experts() as u32)
                        .max(hp.n_expert_used.max()),
                    layers: &layers,
                },
            )?;
            taps.push(t.tap(view.clone()));
            Some(t)
        }
        None => None,
    };
    let route_stream = match &opts.route_stream {
        Some((path, from_env)) => {
            let first = layout
                .as_ref()
                .and_then(|l| l.layers.first())
                .map_or(0, |l| l.layer as usize);
            match crate::routes::RouteStream::create(path, first) {
                Ok(s) => {
                    eprintln!("[ROUTE_TRACE] logging routing to {}", path.display());
                    taps.push(s.tap());
                    Some(s)
                }
                Err(_) if *from_env => {
                    eprintln!("[ROUTE_TRACE] cannot open {}", path.display());
                    None
                }
                Err(e) => bail!(
                    "--route-trace-stream: cannot create {}: {e}",
                    path.display()
                ),
            }
        }
        None => None,
    };
    engine.set_route_tap(crate::routes::all_taps(taps));

    let seed = if opts.seed < 0 {
        RANDOM_SEED
    } else {
        u32::try_from(opts.seed).map_err(|_| {
            anyhow::anyhow!(
                "--seed {} is too large (0 to {}, or -1 for a random seed)",
                opts.seed,
                u32::MAX
            )
        })?
    };
    let sampler = Sampler::new(SamplerParams {
        temp: opts.temp,
        top_k: opts.top_k,
        top_p: opts.top_p,
        min_p: opts.min_p,
        seed,
    });
    let hp = &model.hparams;
    let st = &opts.stream;
    let preamble = Preamble {
        model: opts.model.clone(),
        arch: arch.clone(),
        n_layer: hp.n_layer,
        n_expert: hp.n_expert,
        n_expert_used: hp.n_expert_used.max(),
        threads: n_threads,
        n_ctx,
        n_ubatch: opts.ubatch,
        chatml: opts.chatml,
        moe_stream: streaming,
        cache_mb: cache_bytes >> 20,
        cache_auto: streaming
            && matches!(st.cache_mb, None | Some(crate::stream::CacheMb::Auto))
            && !st.load_all,
        cache_floor_mb: st.cache_floor_mb,
        cache_ceil_mb: st.cache_ceil_mb,
        cache_cycle_mb: cycle_mb,
        force_cache: st.force_cache,
        load_all: st.load_all,
        io_threads: st.io_threads,
        o_direct,
        overlap: st.overlap,
        dense_weights: if streaming { st.dense().name() } else { "mmap" }.to_owned(),
        io_backend: io_backend.to_owned(),
        couple: match opts.stream.couple_resolved()? {
            Some((_, k, d)) if streaming => (k, d),
            _ => (0, 0),
        },
        cache_policy: if streaming {
            st.cache_policy.name()
        } else {
            "-"
        }
        .to_owned(),
        route_replay: opts.route_replay.clone(),
        temp: opts.temp,
        top_k: opts.top_k,
        top_p: opts.top_p,
        seed: sampler.seed(),
        compute_trace_layers: opts.compute_trace.as_ref().is_some_and(|c| c.1),
        traces: [
            (opts.route_trace.is_some(), "route"),
            (opts.io_trace.is_some(), "io"),
            (opts.compute_trace.is_some(), "compute"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect(),
    };
    let compute_trace = match &opts.compute_trace {
        Some((path, layers)) => {
            let t = Arc::new(Mutex::new(crate::telemetry::ComputeTrace::create(
                path, *layers, &preamble,
            )?));
            let sink = Arc::clone(&t);
            engine.set_observer(Some(Box::new(move |name, layer, _| {
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .node(name, layer);
            })));
            Some(t)
        }
        None => None,
    };
    let size: u64 = file.shards().iter().map(|s| s.bytes().len() as u64).sum();
    eprintln!(
        "sluice: loaded {name} ({:.2} GiB, {}) in {load_s:.3} s",
        size as f64 / (1u64 << 30) as f64,
        if streaming {
            "experts streamed"
        } else {
            "read into memory"
        }
    );
    eprintln!(
        "sluice: {} threads, context {n_ctx}, seed {}",
        n_threads,
        sampler.seed()
    );
    let csv = match &opts.csv {
        Some(path) => Some(CsvSink::create(path, &preamble)?),
        None => None,
    };
    let progress = opts.progress || opts.session;
    let probe =
        (progress || csv.is_some()).then(|| DenseProbe::new(dense_slices(&file, &expert_tensors)));
    let mut mode = if streaming {
        opts.stream.mode_line(&opened.decision.why)
    } else {
        resident_mode_line(model.hparams.n_expert > 0, &opened.decision.why)
    };
    if let (Some(r), Some(path)) = (&replay, &opts.route_replay) {
        mode.push_str(&format!(
            ", route replay of {} ({} decode steps, wrapping)",
            path.display(),
            r.len()
        ));
    }
    let mut rt = Runtime {
        engine,
        tokenizer: &tokenizer,
        format: format.as_ref(),
        arch,
        n_ctx,
        n_threads,
        load_s,
        streaming,
        cache_bytes,
        overlap: opts.stream.overlap,
        counters,
        sampler,
        progress,
        ignore_eos: opts.ignore_eos,
        mode,
        control: None,
        csv,
        probe,
        trace,
        route_stream,
        history,
        io_trace,
        compute_trace,
        replay,
    };
    if opts.session {
        crate::session::serve(&mut rt, opts)?;
    } else if let Some(path) = &opts.ppl {
        crate::ppl::run(&mut rt, path, opts.ppl_step)?;
    } else if let Some((ids, prompt)) = one_shot {
        generate_once(&mut rt, opts, &ids, prompt.as_ref())?;
    }
    rt.finish()
}

/// A one-shot run: one generation, then the summary lines.
fn generate_once(
    rt: &mut Runtime<'_>,
    opts: &Options,
    ids: &[u32],
    prompt: Option<&chat::Prompt>,
) -> Result<()> {
    let o = rt.generate(&Turn {
        ids,
        n_max: usize::try_from(opts.n_predict).unwrap_or(usize::MAX),
        prompt,
        turn: 0,
    })?;
    let n_gen = o.summary.tokens;
    let mut w = io::stdout().lock();
    if o.open_line {
        writeln!(w)?;
    }
    if opts.progress {
        writeln!(w, "=== answer ===")?;
        writeln!(w, "{}", o.answer)?;
        writeln!(w, "=== perf ===")?;
    }
    writeln!(w, "{}", generation_line(n_gen, o.decode))?;
    writeln!(
        w,
        "{}",
        crate::telemetry::compute_line(
            &o.decode_usage,
            o.decode.as_secs_f64(),
            n_gen,
            rt.n_threads
        )
    )?;
    writeln!(w, "{}", rt.mode)?;
    if rt.streaming {
        for line in stream_summary(&o.d, n_gen, o.decode, rt.overlap, rt.cache_bytes > 0) {
            writeln!(w, "{line}")?;
        }
        let p = &o.summary.prefill;
        let (n, bytes, hits) = (
            o.d.prefetches + p.prefetches,
            o.d.prefetch_bytes + p.prefetch_bytes,
            o.d.prefetch_hits + p.prefetch_hits,
        );
        if n > 0 {
            writeln!(
                w,
                "moe-prefetch: {:.1} MiB speculative, {hits}/{n} experts useful ({:.1}%) [couple]",
                bytes as f64 / (1u64 << 20) as f64,
                100.0 * hits as f64 / n as f64
            )?;
        }
    }
    w.flush()?;
    rt.save_history();
    Ok(())
}

/// A token's `BMOE_LOAD` (when it read experts) and `BMOE_PROGRESS` lines, with the text
/// delivered since the last one.
fn progress_lines(row: &TokenRow, out: &mut Streamer) -> Result<()> {
    let (reset, reasoning, text) = out.take_deltas();
    let mut so = io::stdout().lock();
    if let Some(l) = row.load_line() {
        writeln!(so, "{l}")?;
    }
    writeln!(so, "{}", row.progress_line(reset, &reasoning, &text))?;
    so.flush()?;
    Ok(())
}

/// The bytes of every tensor that is not a routed expert (what `dense_resident_frac` samples).
fn dense_slices<'f>(
    file: &'f GgufFile,
    experts: &std::collections::HashSet<String>,
) -> Vec<&'f [u8]> {
    file.tensors()
        .iter()
        .filter(|t| !experts.contains(&t.name))
        .filter_map(|t| file.tensor_data(t).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_line_follows_the_spec_pattern() {
        assert_eq!(
            generation_line(16, Duration::from_millis(6208)),
            "generation: 16 tokens, 0.388 s/token (2.58 tok/s)"
        );
        assert_eq!(
            generation_line(0, Duration::ZERO),
            "generation: 0 tokens, 0.000 s/token (0.00 tok/s)"
        );
    }
}
