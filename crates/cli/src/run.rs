//! `sluice run`: generate text from a prompt, streaming it to standard output, then the
//! end-of-run summary (`=== answer ===`, `=== perf ===`, `generation:`, `mode:`).
//!
//! Standard output carries only the answer and the summary; diagnostics (the seed, the prompt
//! size and prefill time, the reasoning of a reasoning model) go to standard error.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use chat::ChatFormat;
use engine::EngineConfig;
use engine::ops::KvType;
use quant::ThreadPool;
use runtime::Choice as _;
use sampler::{RANDOM_SEED, Sampler, SamplerParams};
use text::Tokenizer;

use runtime::load::{build_engine, load_model, thread_count};

use runtime::generate::{Outcome, Recorders, Runtime, Turn};
use runtime::prompt::chat_ids;
use runtime::sink::{Both, Sink};
use runtime::telemetry::{
    CsvSink, DenseProbe, Preamble, TokenRow, generation_line, resident_mode_line, stream_summary,
};

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
    pub test_hold: Option<runtime::cancel::Hold>,
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

/// Generated text inline: the answer to standard output as it arrives, reasoning (of a chat
/// with a reasoning model) to standard error between two marker lines.
#[derive(Default)]
pub struct TextOut {
    in_reasoning: bool,
    /// The last byte written to standard output was not a newline.
    pub open_line: bool,
}

impl TextOut {
    fn end_reasoning(&mut self) {
        if self.in_reasoning {
            eprintln!("\n--- end of reasoning ---");
            self.in_reasoning = false;
        }
    }
}

impl Sink for TextOut {
    fn delta(&mut self, d: &chat::SplitDelta) -> runtime::Result<()> {
        if d.reset {
            // Text already shown as answer turned out to be reasoning: the reasoning so far is
            // shown again whole; the answer block at the end has the right split.
            self.end_reasoning();
            eprintln!("--- the answer streamed so far was reasoning ---");
        }
        if !d.reasoning.is_empty() {
            if !self.in_reasoning {
                eprintln!("--- reasoning ---");
                self.in_reasoning = true;
            }
            eprint!("{}", d.reasoning);
        }
        if !d.text.is_empty() {
            self.end_reasoning();
            let mut out = io::stdout().lock();
            out.write_all(d.text.as_bytes())?;
            out.flush()?;
            self.open_line = !d.text.ends_with('\n');
        }
        Ok(())
    }

    fn finished(&mut self, _o: &Outcome) -> runtime::Result<()> {
        self.end_reasoning();
        Ok(())
    }
}

/// Generated text as `BMOE_LOAD` / `BMOE_PROGRESS` lines on standard output: each token's
/// line carries the text delivered since the last one (`--progress`, and every session).
#[derive(Default)]
pub struct ProgressOut {
    answer: String,
    reasoning: String,
    /// The deltas since the last line: (reset, reasoning, text).
    pending: (bool, String, String),
}

impl Sink for ProgressOut {
    fn delta(&mut self, d: &chat::SplitDelta) -> runtime::Result<()> {
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
        Ok(())
    }

    /// A token's `BMOE_LOAD` (when it read experts) and `BMOE_PROGRESS` lines, with the text
    /// delivered since the last one.
    fn token(&mut self, row: &TokenRow) -> runtime::Result<()> {
        let (reset, reasoning, text) = std::mem::take(&mut self.pending);
        let mut so = io::stdout().lock();
        if let Some(l) = row.load_line() {
            writeln!(so, "{l}")?;
        }
        writeln!(so, "{}", row.progress_line(reset, &reasoning, &text))?;
        so.flush()?;
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
    let mut csv = match &opts.csv {
        Some(path) => Some(CsvSink::create(path, &preamble)?),
        None => None,
    };
    let progress = opts.progress || opts.session;
    let probe = (progress || csv.is_some())
        .then(|| DenseProbe::new(runtime::generate::dense_slices(&file, &expert_tensors)));
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
        ignore_eos: opts.ignore_eos,
        mode,
        control: None,
        notices,
        recorders: Recorders {
            probe,
            route_trace: trace,
            route_stream,
            history,
            io_trace,
            compute_trace,
        },
        replay,
    };
    if opts.session {
        crate::session::serve(&mut rt, opts, &mut csv)?;
    } else if let Some(path) = &opts.ppl {
        crate::ppl::run(&mut rt, path, opts.ppl_step)?;
    } else if let Some((ids, prompt)) = one_shot {
        generate_once(&mut rt, opts, &ids, prompt.as_ref(), &mut csv)?;
    }
    Ok(rt.finish()?)
}

/// A one-shot run: one generation, then the summary lines.
fn generate_once(
    rt: &mut Runtime<'_>,
    opts: &Options,
    ids: &[u32],
    prompt: Option<&chat::Prompt>,
    csv: &mut Option<CsvSink>,
) -> Result<()> {
    let turn = Turn {
        ids,
        n_max: usize::try_from(opts.n_predict).unwrap_or(usize::MAX),
        prompt,
        turn: 0,
    };
    let (o, open_line) = if opts.progress {
        let o = rt.generate(&turn, &mut Both(ProgressOut::default(), csv))?;
        (o, false)
    } else {
        let mut text = TextOut::default();
        let o = rt.generate(&turn, &mut Both(&mut text, csv))?;
        (o, text.open_line)
    };
    let n_gen = o.summary.tokens;
    let mut w = io::stdout().lock();
    if open_line {
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
