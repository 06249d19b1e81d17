//! Opening a model to generate: the file with its resolved configuration (whether the experts
//! stream, the cache budget, where the dense weights live), its tokenizer and chat format and
//! the context size ([`Loaded::open`]); then the [`Runtime`] over it ([`Loaded::runtime`]): the
//! engine, the expert source over the store with its pins, the sampler and the recorders.

use crate::error::{refuse, refused};
use crate::refusal::{ConfigError, Part, Problem, Refusal, Setting, problem};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use chat::ChatFormat;
use std::collections::HashSet;

use engine::ops::KvType;
use engine::{Engine, EngineConfig};
use gguf::GgufFile;
use model::HParams;
use quant::{Kernels, ThreadPool};
use sampler::{RANDOM_SEED, Sampler, SamplerParams};
use text::Tokenizer;

use crate::Choice as _;
use crate::budget::{self, Decision, ExpertFacts, FileFacts};
use crate::error::{Context, Error, Result, fail};
use crate::facts::Preamble;
use crate::generate::{Recorders, Runtime, dense_slices};
use crate::history::{self, HistoryConfig};
use crate::load::{build_engine, load_model, load_model_routed, route_to, thread_count};
use crate::notice::Notices;
use crate::probes::{DenseProbe, MemoryFacts};
use crate::routes;
use crate::settings::stream::{CacheMb, DenseWeights, ReadAhead, StreamConfig, StreamMode};
use crate::source::{BatchView, Speculation, StoreSource, StreamCounters};
use crate::spec::{Ngram, Spec};
use crate::traces::{ComputeTrace, IoTrace};
use store::ExpertLayout;

const MIB: u64 = 1 << 20;

/// Context size when none is given (capped at the model's training context).
pub const DEFAULT_CTX: usize = 4096;

/// The sampling settings (llama.cpp's chain and defaults, see `sampler`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub temp: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    /// The seed; negative for a random one.
    pub seed: i64,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            seed: -1,
        }
    }
}

/// Everything that decides how a model is opened and run (each field is the `sluice run` flag
/// of the same name).
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub model: PathBuf,
    pub stream: StreamConfig,
    pub history: HistoryConfig,
    /// Compute threads (every core the process may use when `None`).
    pub threads: Option<usize>,
    /// Context size: `None` the default, `Some(0)` the model's training context.
    pub ctx: Option<usize>,
    pub ubatch: usize,
    /// The row prefetch of the weight kernels: `None` keeps the kernel table's choice.
    pub row_prefetch: Option<bool>,
    /// The multi-row kernels in one-token products: `None` measures which way streams
    /// weights faster on this CPU, per weight type and order
    /// (`quant::multi_row_calibration_for`); same bits either way.
    pub multi_row: Option<bool>,
    pub kv_type: KvType,
    pub sampling: Sampling,
    pub ignore_eos: bool,
    /// Render prompts with the model's chat template.
    pub chatml: bool,
    /// With `chatml`: a model without a (usable) chat template is opened without one, with a
    /// warning, instead of refused.
    pub chat_if_present: bool,
    pub route_trace: Option<PathBuf>,
    pub route_replay: Option<PathBuf>,
    /// colibri's `ROUTE_TRACE` stream.
    pub route_stream: Option<RouteStreamFile>,
    pub io_trace: Option<PathBuf>,
    /// The `compute_trace v1` file.
    pub compute_trace: Option<ComputeTraceFile>,
    /// Take the per-token figures (a [`crate::events::TokenRow`] per token for the sink).
    pub token_figures: bool,
    /// `--predict-log`: score the stale gate, the previous-token bet and the control on every
    /// decode routing (an instrumented run).
    pub predict_log: bool,
    /// `--route-ahead N` (lossy): commit each decode layer's routing N MoE layers early.
    pub route_ahead: usize,
    /// `--n-expert-used K` (lossy): route each token to K experts in every MoE layer instead
    /// of the model's own count.
    pub n_expert_used: Option<u32>,
    /// The cache-aware routing policies (lossy: `--drop-cold-experts`, `--expert-substitute`);
    /// they need streamed experts and a cache.
    pub cache_aware: engine::CacheAware,
    /// Keep a live picture of the routing and what the cache found ([`routes::RouteHeat`],
    /// a dashboard's heatmap).
    pub route_heat: bool,
    /// Speculative decoding (`--ngram`, `--mtp`): exact, each verified row with a one-token
    /// pass's bits.
    pub spec: Option<crate::spec::Spec>,
}

/// Where colibri's `ROUTE_TRACE` stream goes, and whether the path came from the environment
/// (then a file that cannot be opened is a warning, as colibri has it).
#[derive(Clone, Debug)]
pub struct RouteStreamFile {
    pub path: PathBuf,
    pub from_env: bool,
}

/// Where the `compute_trace v1` file goes, and whether it times layer segments
/// (`--compute-trace-layers`) instead of every named node.
#[derive(Clone, Debug)]
pub struct ComputeTraceFile {
    pub path: PathBuf,
    pub by_layer: bool,
}

impl RunConfig {
    /// A model with the defaults of `sluice run`.
    pub fn new(model: impl Into<PathBuf>) -> RunConfig {
        RunConfig {
            model: model.into(),
            stream: StreamConfig::default(),
            history: HistoryConfig::default(),
            threads: None,
            ctx: None,
            ubatch: 512,
            row_prefetch: None,
            multi_row: None,
            kv_type: KvType::F16,
            sampling: Sampling::default(),
            ignore_eos: false,
            chatml: false,
            chat_if_present: false,
            route_trace: None,
            route_replay: None,
            route_stream: None,
            io_trace: None,
            compute_trace: None,
            token_figures: false,
            predict_log: false,
            route_ahead: 0,
            n_expert_used: None,
            cache_aware: engine::CacheAware::default(),
            route_heat: false,
            spec: None,
        }
    }
}

/// A model file opened to run: the file (its experts to stream, or read whole), its tokenizer
/// and chat format, the context size and the compute threads.
pub struct Loaded {
    pub file: GgufFile,
    pub name: String,
    pub tokenizer: Tokenizer,
    /// With [`RunConfig::chatml`]: the model's chat format.
    pub format: Option<ChatFormat>,
    /// The hyperparameters the run uses (`--n-expert-used` applied).
    pub hparams: HParams,
    /// The model file's own experts per token (its largest `expert_used_count`).
    pub model_n_expert_used: u32,
    pub n_ctx: usize,
    pub n_threads: usize,
    /// Seconds from opening the file to the model's description.
    pub load_s: f64,
    /// Whether the experts stream, and why.
    pub decision: Decision,
    /// The experts' layout when they stream.
    pub layout: Option<store::ExpertLayout>,
    /// The expert cache's budget (0 when not streaming).
    pub cache_bytes: u64,
    pool: ThreadPool,
    notices: Notices,
}

impl Loaded {
    /// Opens `cfg.model` as `cfg` says; what it decides is said in `notices`.
    pub fn open(cfg: &RunConfig, notices: &Notices) -> Result<Loaded> {
        let name = cfg.model.display().to_string();
        let t_load = Instant::now();
        let opened = open_for(&cfg.model, &cfg.stream, cfg.n_expert_used, notices)?;
        let file = opened.file;
        let mut hparams = load_model(&file, &cfg.model)?.hparams;
        let model_n_expert_used = hparams.n_expert_used.max();
        route_to(&mut hparams, cfg.n_expert_used, &cfg.model)?;
        let load_s = t_load.elapsed().as_secs_f64();
        let tokenizer = Tokenizer::from_metadata(file.metadata())
            .with_context(|| format!("{name}: cannot build the tokenizer"))?;
        let format = if cfg.chatml {
            match crate::prompt::load_template(file.metadata(), &tokenizer, None, &name) {
                Ok(template) => Some(ChatFormat::new(template)),
                Err(e) if cfg.chat_if_present => {
                    notices.warn(format!(
                        "sluice: warning: {}; prompts are taken as raw text",
                        crate::error::chain(&e)
                    ));
                    None
                }
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let n_ctx_train = hparams.n_ctx_train as usize;
        let n_ctx = match cfg.ctx {
            None => DEFAULT_CTX.min(n_ctx_train.max(1)),
            Some(0) => n_ctx_train.max(1),
            Some(c) => c,
        };
        if n_ctx > n_ctx_train {
            notices.warn(format!(
                "sluice: warning: context {n_ctx} is larger than the model's training context {n_ctx_train}"
            ));
        }
        let n_threads = thread_count(cfg.threads);
        let pool = ThreadPool::new(n_threads).context("cannot start the compute threads")?;
        let cache_bytes = if opened.decision.stream {
            opened.cache_bytes
        } else {
            0
        };
        Ok(Loaded {
            file,
            name,
            tokenizer,
            format,
            hparams,
            model_n_expert_used,
            n_ctx,
            n_threads,
            load_s,
            decision: opened.decision,
            layout: opened.layout,
            cache_bytes,
            pool,
            notices: notices.clone(),
        })
    }

    /// Whether the experts stream.
    pub fn streaming(&self) -> bool {
        self.decision.stream
    }

    /// The runtime over this model: the engine, the expert source (with its pins), the
    /// sampler and the recorders `cfg` asks for; with the preamble of its CSV and trace files.
    pub fn runtime(&self, cfg: &RunConfig) -> Result<(Runtime<'_>, Preamble)> {
        let model = load_model_routed(&self.file, &cfg.model, cfg.n_expert_used)?;
        let hp = &model.hparams;
        let engine_cfg = EngineConfig {
            n_ctx: self.n_ctx,
            kv_type: cfg.kv_type,
            ubatch: cfg.ubatch,
        };
        let mut engine = build_engine(&model, &self.pool, engine_cfg, &cfg.model)?;
        if let Some(on) = cfg.row_prefetch {
            engine.set_row_prefetch(on);
        }
        crate::load::apply_multi_row(
            &mut engine,
            &self.file,
            cfg.multi_row,
            cfg.row_prefetch,
            &self.notices,
        );
        let predict = self.lookahead(cfg, hp, &mut engine)?;
        let counters = Arc::new(StreamCounters::default());
        let layout = self.expert_layout();
        let arch = self
            .file
            .metadata()
            .get_str("general.architecture")
            .unwrap_or("")
            .to_owned();
        let moe_layers: Vec<u32> = layout
            .as_ref()
            .map(|l| l.layers.iter().map(|x| x.layer).collect())
            .unwrap_or_default();
        let io_trace = self.io_trace(cfg)?;
        let history = history::History::open(
            &cfg.history,
            &cfg.model,
            &arch,
            hp.n_layer,
            hp.n_expert,
            &moe_layers,
            &self.notices,
        );
        // What each layer batch found in the cache, for the route trace.
        let view = ((cfg.route_trace.is_some() || cfg.route_heat) && self.streaming())
            .then(|| Arc::new(Mutex::new(BatchView::default())));
        let reads = self.attach_source(
            cfg,
            &mut engine,
            &Wiring {
                hparams: hp,
                arch: &arch,
                moe_layers: &moe_layers,
                counters: &counters,
                history: history.as_ref(),
                view: view.as_ref(),
                io_trace: io_trace.as_ref(),
            },
        )?;
        if cfg.cache_aware.any() {
            if !self.streaming() || self.cache_bytes == 0 {
                let setting = if cfg.cache_aware.drop_frac > 0.0 {
                    Setting::DropColdExperts
                } else {
                    Setting::ExpertSubstitute
                };
                refuse!(setting;
                    Setting::DropColdExperts,
                    " / ",
                    Setting::ExpertSubstitute,
                    format!(
                        " act on what the expert cache holds, and this run {}: add ",
                        if self.streaming() {
                            "has no expert cache"
                        } else {
                            "does not stream its experts"
                        }
                    ),
                    Setting::StreamMode,
                    " on and a cache",
                );
            }
            engine.set_cache_aware(cfg.cache_aware).map_err(|e| {
                let setting = if cfg.cache_aware.drop_frac > 0.0 {
                    Setting::DropColdExperts
                } else {
                    Setting::ExpertSubstitute
                };
                refused!(setting; e.to_string())
            })?;
            if let Some(warning) = narrow_drop_warning(cfg.cache_aware.drop_frac, hp) {
                self.notices.warn(warning);
            }
        }
        let replay = match &cfg.route_replay {
            Some(path) => {
                if hp.n_expert == 0 {
                    refuse!(Setting::RouteReplay;
                        Setting::RouteReplay,
                        format!(": {} is not a mixture-of-experts model", self.name),
                    );
                }
                Some(routes::load_replay(path)?)
            }
            None => None,
        };
        if let Some(sp) = cfg.spec {
            let flag = check_spec(
                sp,
                cfg.route_replay.is_some(),
                cfg.route_trace.is_some(),
                cfg.route_stream.is_some(),
                cfg.predict_log,
            )?;
            if let Err(e) = engine.check_rows() {
                refuse!(flag; flag, format!(" on {}: {e}", self.name));
            }
            if let Spec::Mtp(_) = sp
                && let Err(e) = engine.enable_mtp(&model, Kernels::detect())
            {
                refuse!(Setting::Mtp; Setting::Mtp, format!(" on {}: {e}", self.name));
            }
        }
        let (route_trace, route_stream, heat) = self.route_taps(
            cfg,
            &mut engine,
            &RouteWiring {
                hparams: hp,
                arch: &arch,
                history: history.as_ref(),
                view,
                replay: replay.as_ref(),
                layout: layout.as_ref(),
            },
        )?;
        let sampler = sampler(&cfg.sampling)?;
        let cycle_mb = layout
            .as_ref()
            .map_or(0, |l| l.token_cycle_bytes().div_ceil(1 << 20));
        let preamble = self.preamble(cfg, hp, &arch, &sampler, cycle_mb, reads)?;
        let compute_trace = compute_trace(cfg, &mut engine, &preamble)?;
        self.say_loaded(&sampler);
        let probe = cfg.token_figures.then(|| {
            let expert_tensors: HashSet<String> = layout
                .iter()
                .flat_map(|l| {
                    l.layers
                        .iter()
                        .flat_map(|x| x.parts.iter().map(|p| p.tensor.clone()))
                        .chain(l.nextn_tensors.iter().cloned())
                })
                .collect();
            DenseProbe::new(dense_slices(&self.file, &expert_tensors))
        });
        let mode = self.mode_line(cfg, hp.n_expert > 0, replay.as_ref());
        let rt = Runtime {
            engine,
            tokenizer: &self.tokenizer,
            format: self.format.as_ref(),
            arch,
            n_ctx: self.n_ctx,
            n_threads: self.n_threads,
            load_s: self.load_s,
            streaming: self.streaming(),
            cache_bytes: self.cache_bytes,
            overlap: cfg.stream.overlap,
            counters,
            sampler,
            ignore_eos: cfg.ignore_eos,
            mode,
            control: None,
            notices: self.notices.clone(),
            recorders: Recorders {
                probe,
                route_trace,
                route_stream,
                history,
                io_trace,
                compute_trace,
                predict,
                heat,
            },
            replay,
            route_ahead: cfg.route_ahead,
            prefetch_tag: Speculation::from_settings(&cfg.stream, cfg.route_ahead).tag(),
            spec: cfg.spec,
        };
        Ok((rt, preamble))
    }

    /// What the engine ranks ahead of the router (`--predict-log`, `--predict-prefetch`,
    /// `--route-ahead`), with the scorer of what it ranked when something reports it. Refuses
    /// the combinations that measure or read ahead on a routing another flag rewrote.
    fn lookahead(
        &self,
        cfg: &RunConfig,
        hp: &HParams,
        engine: &mut Engine<'_>,
    ) -> Result<Option<crate::predict::PredictLog>> {
        let st = &cfg.stream;
        let ra = cfg.route_ahead;
        if (cfg.predict_log || ra > 0 || st.predict_prefetch) && hp.n_expert == 0 {
            let setting = if cfg.predict_log {
                Setting::PredictLog
            } else if ra > 0 {
                Setting::RouteAhead
            } else {
                Setting::PredictPrefetch
            };
            refuse!(setting;
                setting,
                format!(
                    ": {} is not a mixture-of-experts model: there is no routing to rank ahead",
                    self.name
                ),
            );
        }
        if ra > 0 {
            let mut with = Vec::new();
            for (set, flag) in [
                (cfg.predict_log, Setting::PredictLog),
                (st.prefetch > 0, Setting::Prefetch),
                (st.predict_prefetch, Setting::PredictPrefetch),
                (st.couple.is_some(), Setting::Couple),
                (cfg.route_replay.is_some(), Setting::RouteReplay),
            ] {
                if set {
                    with.push(flag);
                }
            }
            if !with.is_empty() {
                let mut problem = problem!(
                    Setting::RouteAhead,
                    " commits the routing to its own early ranking: "
                );
                problem.0.extend(Problem::join(&with, ", "));
                problem.0.push(Part::from(
                    " would measure or read ahead on the routing it rewrites",
                ));
                return Err(Error::Rejected(Refusal::Setting(ConfigError {
                    setting: Setting::RouteAhead,
                    problem,
                })));
            }
        }
        let lookahead = engine::Lookahead {
            stale_gate: cfg.predict_log,
            control: cfg.predict_log,
            hint: st.predict_prefetch && self.streaming(),
            route_ahead: ra,
        };
        let log = (cfg.predict_log || ra > 0).then(crate::predict::PredictLog::default);
        engine
            .set_lookahead(lookahead, log.as_ref().map(crate::predict::PredictLog::tap))
            .map_err(
                |e| refused!(Setting::RouteAhead; Setting::RouteAhead, format!(" {ra}: {e}")),
            )?;
        Ok(log)
    }

    /// The routed experts' tensors: the streamed layout, or (a resident MoE run) the file's,
    /// so that `dense_resident_frac` samples the rest and the cycle of one token's experts is
    /// known.
    fn expert_layout(&self) -> Option<store::ExpertLayout> {
        match &self.layout {
            Some(l) => Some(l.clone()),
            None => store::ExpertLayout::from_gguf(&self.file)
                .ok()
                .flatten()
                .map(store::ExpertLayout::without_biases)
                .map(|mut l| {
                    // the routed count in effect (`--n-expert-used`)
                    l.n_expert_used = self.hparams.n_expert_used.max();
                    l
                }),
        }
    }

    /// The `--io-trace` file; refused when the experts do not stream (nothing would be read).
    fn io_trace(&self, cfg: &RunConfig) -> Result<Option<Arc<Mutex<IoTrace>>>> {
        match &cfg.io_trace {
            Some(_) if !self.streaming() => {
                let mut problem = problem!(
                    Setting::IoTrace,
                    " records the expert store's reads, and this run does not stream ("
                );
                if self.decision.why.is_empty() {
                    problem
                        .0
                        .extend([Part::from(Setting::StreamMode), Part::from(" off")]);
                } else {
                    problem.0.push(Part::from(self.decision.why.clone()));
                }
                problem.0.extend([
                    Part::from("): add "),
                    Part::from(Setting::StreamMode),
                    Part::from(" on"),
                ]);
                Err(Error::Rejected(Refusal::Setting(ConfigError {
                    setting: Setting::IoTrace,
                    problem,
                })))
            }
            Some(path) => Ok(Some(Arc::new(Mutex::new(IoTrace::create(path)?)))),
            None => Ok(None),
        }
    }

    /// When the experts stream: the expert source over the store, with the recorders that
    /// watch it, the history's ranking and the pins, plugged into the engine. Says how it
    /// reads (direct I/O, the backend).
    fn attach_source(
        &self,
        cfg: &RunConfig,
        engine: &mut Engine<'_>,
        w: &Wiring<'_>,
    ) -> Result<Reads> {
        let Some(layout) = self.layout.clone() else {
            if !matches!(cfg.history.pin, None | Some(history::PinArg::Off)) {
                self.notices
                    .info("sluice: --pin: this run does not stream its experts: nothing pinned");
            }
            return Ok(Reads {
                o_direct: false,
                io_backend: "-",
            });
        };
        let layout_cycle_slots = layout.token_cycle_slot_bytes();
        let mut src = StoreSource::from_settings(
            &cfg.stream,
            &self.file,
            layout,
            self.cache_bytes,
            &self.name,
            Arc::clone(w.counters),
            &self.notices,
        )?;
        src.set_speculation(Speculation::from_settings(&cfg.stream, cfg.route_ahead));
        if let Some(v) = w.view {
            src.watch(Arc::clone(v));
        }
        if let Some(t) = w.io_trace {
            src.trace_io(Arc::clone(t));
        }
        if let Some(h) = w.history
            && cfg.history.usage_prior
        {
            src.history(h.ranked());
        }
        let pins = history::plan(
            &cfg.history,
            w.history,
            w.arch,
            w.hparams.n_layer,
            w.hparams.n_expert,
            w.moe_layers,
            self.cache_bytes,
            layout_cycle_slots,
            &self.notices,
        )?;
        if let Some(p) = pins {
            let t = Instant::now();
            let (n, bytes) = src.pin(&p.keys, p.max_bytes)?;
            self.notices.info(format!(
                "sluice: pinned {n} experts ({:.1} MiB of {:.1} MiB for pins) from {} in {:.3} s",
                bytes as f64 / (1u64 << 20) as f64,
                p.max_bytes as f64 / (1u64 << 20) as f64,
                p.source.display(),
                t.elapsed().as_secs_f64()
            ));
        }
        let reads = Reads {
            o_direct: src.direct(),
            io_backend: src.backend().name(),
        };
        engine.set_expert_source(Some(Box::new(src)))?;
        Ok(reads)
    }

    /// The engine's routing taps: the history's counts, the `route_trace v1` file and
    /// colibri's `ROUTE_TRACE` stream, as `cfg` asks.
    fn route_taps(
        &self,
        cfg: &RunConfig,
        engine: &mut Engine<'_>,
        w: &RouteWiring<'_>,
    ) -> Result<RouteTaps> {
        let mut taps = Vec::new();
        if let Some(h) = w.history {
            taps.push(h.tap());
        }
        let hp = w.hparams;
        let heat = (cfg.route_heat && hp.n_expert > 0).then(|| {
            let first = w
                .layout
                .and_then(|l| l.layers.first())
                .map_or(0, |l| l.layer as usize);
            Arc::new(routes::RouteHeat::new(
                hp.n_layer as usize,
                hp.n_expert as usize,
                first,
            ))
        });
        if let Some(h) = &heat {
            taps.push(h.tap(w.view.clone()));
        }
        let trace = match &cfg.route_trace {
            Some(path) => {
                let hp = w.hparams;
                if hp.n_expert == 0 {
                    refuse!(Setting::RouteTrace;
                        Setting::RouteTrace,
                        format!(": {} is not a mixture-of-experts model", self.name),
                    );
                }
                let layers = routes::layer_bytes(&self.file, u64::from(hp.n_expert));
                let t = routes::RouteTraceFile::create(
                    path,
                    &routes::TraceHeader {
                        model: &cfg.model,
                        arch: w.arch,
                        n_layer: hp.n_layer,
                        n_expert: hp.n_expert,
                        // A replay may route more experts per token than the model does.
                        n_expert_used: w
                            .replay
                            .map_or(0, |r| r.max_experts() as u32)
                            .max(hp.n_expert_used.max()),
                        layers: &layers,
                    },
                )?;
                taps.push(t.tap(w.view.clone()));
                Some(t)
            }
            None => None,
        };
        let route_stream = match &cfg.route_stream {
            Some(RouteStreamFile { path, from_env }) => {
                let first = w
                    .layout
                    .and_then(|l| l.layers.first())
                    .map_or(0, |l| l.layer as usize);
                match routes::RouteStream::create(path, first) {
                    Ok(s) => {
                        self.notices.info(format!(
                            "[ROUTE_TRACE] logging routing to {}",
                            path.display()
                        ));
                        taps.push(s.tap());
                        Some(s)
                    }
                    Err(_) if *from_env => {
                        self.notices
                            .info(format!("[ROUTE_TRACE] cannot open {}", path.display()));
                        None
                    }
                    Err(e) => refuse!(Setting::RouteTraceStream;
                        Setting::RouteTraceStream,
                        format!(": cannot create {}: {e}", path.display()),
                    ),
                }
            }
            None => None,
        };
        engine.set_route_tap(routes::all_taps(taps));
        Ok((trace, route_stream, heat))
    }

    /// The `# bmoe_metrics v2` preamble: the run's resolved settings.
    fn preamble(
        &self,
        cfg: &RunConfig,
        hp: &HParams,
        arch: &str,
        sampler: &Sampler,
        cycle_mb: u64,
        reads: Reads,
    ) -> Result<Preamble> {
        let streaming = self.streaming();
        let st = &cfg.stream;
        // (what the expert source was set to read ahead; nothing without streaming)
        let speculation = if streaming {
            Speculation::from_settings(st, cfg.route_ahead)
        } else {
            Speculation::Off
        };
        Ok(Preamble {
            model: cfg.model.clone(),
            arch: arch.to_owned(),
            n_layer: hp.n_layer,
            n_expert: hp.n_expert,
            n_expert_used: hp.n_expert_used.max(),
            threads: self.n_threads,
            n_ctx: self.n_ctx,
            n_ubatch: cfg.ubatch,
            chatml: cfg.chatml,
            moe_stream: streaming,
            cache_mb: self.cache_bytes >> 20,
            cache_auto: streaming
                && matches!(st.cache_mb, None | Some(CacheMb::Auto))
                && !st.load_all,
            cache_floor_mb: st.cache_floor_mb,
            cache_ceil_mb: st.cache_ceil_mb,
            cache_cycle_mb: cycle_mb,
            force_cache: st.force_cache,
            load_all: st.load_all,
            io_threads: st.io_threads,
            o_direct: reads.o_direct,
            overlap: st.overlap,
            prompt_ahead: streaming && st.prompt_ahead,
            dense_weights: if streaming { st.dense().name() } else { "mmap" }.to_owned(),
            io_backend: reads.io_backend.to_owned(),
            couple: match st.couple_resolved()? {
                Some((_, ahead)) if streaming => ahead,
                _ => ReadAhead::default(),
            },
            cache_policy: if streaming {
                st.cache_policy.name()
            } else {
                "-"
            }
            .to_owned(),
            route_replay: cfg.route_replay.clone(),
            temp: cfg.sampling.temp,
            top_k: cfg.sampling.top_k,
            top_p: cfg.sampling.top_p,
            seed: sampler.seed(),
            compute_trace_layers: cfg.compute_trace.as_ref().is_some_and(|c| c.by_layer),
            prefetch: match speculation {
                Speculation::Temporal(k) => k,
                _ => 0,
            },
            predict_prefetch: matches!(speculation, Speculation::StaleGate(_)),
            predict_spec_max: match speculation {
                Speculation::StaleGate(n) => n,
                _ => 0,
            },
            predict_log: cfg.predict_log,
            route_ahead: cfg.route_ahead,
            cache_aware: cfg.cache_aware,
            spec: cfg.spec,
            traces: [
                (cfg.route_trace.is_some(), "route"),
                (cfg.io_trace.is_some(), "io"),
                (cfg.compute_trace.is_some(), "compute"),
            ]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect(),
        })
    }

    /// What was loaded and how it will run.
    fn say_loaded(&self, sampler: &Sampler) {
        let size: u64 = self
            .file
            .shards()
            .iter()
            .map(|s| s.bytes().len() as u64)
            .sum();
        self.notices.info(format!(
            "sluice: loaded {} ({:.2} GiB, {}) in {:.3} s",
            self.name,
            size as f64 / (1u64 << 30) as f64,
            if self.streaming() {
                "experts streamed"
            } else {
                "read into memory"
            },
            self.load_s
        ));
        self.notices.info(format!(
            "sluice: {} threads, context {}, seed {}, kernels {}",
            self.n_threads,
            self.n_ctx,
            sampler.seed(),
            quant::Kernels::detect().name()
        ));
    }

    /// The `mode:` line (with the route replay's note).
    fn mode_line(
        &self,
        cfg: &RunConfig,
        moe: bool,
        replay: Option<&engine::RouteReplay>,
    ) -> String {
        let mut mode = if self.streaming() {
            cfg.stream.mode_line(&self.decision.why)
        } else {
            resident_mode_line(moe, &self.decision.why)
        };
        if let Some(k) = cfg.n_expert_used {
            mode.push_str(&format!(
                ", {k} expert{} per token (lossy: --n-expert-used, the model routes {})",
                if k == 1 { "" } else { "s" },
                self.model_n_expert_used
            ));
        }
        mode.push_str(&cache_aware_mode(&cfg.cache_aware));
        let per_pass = |d: usize| {
            format!(
                "up to {d} token{} per verify pass",
                if d == 1 { "" } else { "s" }
            )
        };
        match cfg.spec {
            Some(Spec::Ngram(ng)) => mode.push_str(&format!(
                ", ngram drafting ({}, matches of {}+; exact)",
                per_pass(ng.draft),
                ng.min_match
            )),
            Some(Spec::Mtp(m)) => mode.push_str(&format!(
                ", mtp drafting (the NextN head of layer {}, {}{}; exact)",
                self.hparams.n_layer,
                per_pass(m.draft),
                if m.p_min > 0.0 {
                    format!(", while its probability is {}+", m.p_min)
                } else {
                    String::new()
                }
            )),
            None => {}
        }
        if cfg.route_ahead > 0 {
            mode.push_str(&format!(
                ", route-ahead {} (lossy: routing committed {} MoE layer{} early)",
                cfg.route_ahead,
                cfg.route_ahead,
                if cfg.route_ahead == 1 { "" } else { "s" }
            ));
        }
        if let (Some(r), Some(path)) = (replay, &cfg.route_replay) {
            mode.push_str(&format!(
                ", route replay of {} ({} decode steps, wrapping)",
                path.display(),
                r.len()
            ));
        }
        mode
    }
}

/// The `mode:` line of a run that does not stream. The spec prints the line on every run and has
/// a run that could stream but does not name the flag; a model without routed experts says so.
/// `why` is the automatic decision's reason (empty when a flag decided).
fn resident_mode_line(moe: bool, why: &str) -> String {
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

/// What the expert source is wired to.
struct Wiring<'w> {
    hparams: &'w HParams,
    arch: &'w str,
    moe_layers: &'w [u32],
    counters: &'w Arc<StreamCounters>,
    history: Option<&'w history::History>,
    view: Option<&'w Arc<Mutex<BatchView>>>,
    io_trace: Option<&'w Arc<Mutex<IoTrace>>>,
}

/// The recorders among the routing taps: the route trace, the routing stream, the heat.
type RouteTaps = (
    Option<routes::RouteTraceFile>,
    Option<routes::RouteStream>,
    Option<Arc<routes::RouteHeat>>,
);

/// What the routing taps need.
struct RouteWiring<'w> {
    hparams: &'w HParams,
    arch: &'w str,
    history: Option<&'w history::History>,
    view: Option<Arc<Mutex<BatchView>>>,
    replay: Option<&'w engine::RouteReplay>,
    layout: Option<&'w store::ExpertLayout>,
}

/// How the expert source reads (for the preamble).
#[derive(Clone, Copy)]
struct Reads {
    o_direct: bool,
    io_backend: &'static str,
}

/// The top-k at which cache-aware dropping was measured: the reference's evidence covers
/// routings this wide, its threshold means a tail trim there.
const DROP_MEASURED_TOPK: u32 = 8;

/// The warning for cache-aware dropping at `frac` on a routing of four experts or fewer, where
/// the threshold (`frac / k` of the routing) stops being a tail trim; `None` otherwise.
fn narrow_drop_warning(frac: f32, hp: &HParams) -> Option<String> {
    let k = hp.n_expert_used.max();
    (frac > 0.0 && (1..=4).contains(&k)).then(|| {
        let share = |k: u32| 100.0 * f64::from(frac) / f64::from(k);
        format!(
            "sluice: warning: --drop-cold-experts {frac} with top-k {k}: the threshold is {:.1}% \
             of the routing here, against {:.1}% at the top-k {DROP_MEASURED_TOPK} it was \
             measured on; expect it to drop much more, and check the output quality on your task",
            share(k),
            share(DROP_MEASURED_TOPK)
        )
    })
}

/// The `mode:` line's entries for the cache-aware routing policies in force (empty when none
/// is): each named lossy, with the flag that set it.
fn cache_aware_mode(ca: &engine::CacheAware) -> String {
    let mut s = String::new();
    if ca.drop_frac > 0.0 {
        s.push_str(&format!(
            ", drop-cold-experts {} x uniform (lossy: cache misses weighted below it are \
             skipped{}{})",
            ca.drop_frac,
            if ca.drop_renorm {
                ""
            } else {
                ", weights not renormalized"
            },
            if ca.drop_in_prefill {
                ", in prefill too"
            } else {
                ""
            }
        ));
    }
    if ca.substitute > 0.0 {
        s.push_str(&format!(
            ", expert-substitute {} (lossy: decode routings re-ranked toward resident experts)",
            ca.substitute
        ));
    }
    s
}

/// Refuses a speculative decoding setting out of range, or combined with a route replay or a
/// recording of one-token passes (`replay`, `trace`, `stream`, `predict_log`: whether each is
/// set). Returns the setting that turned speculation on.
pub fn check_spec(
    sp: Spec,
    replay: bool,
    trace: bool,
    stream: bool,
    predict_log: bool,
) -> Result<Setting> {
    let flag = match sp.source() {
        crate::spec::Source::Ngram => Setting::Ngram,
        crate::spec::Source::Mtp => Setting::Mtp,
    };
    if !(1..=Ngram::MAX_DRAFT).contains(&sp.draft()) {
        refuse!(Setting::Draft;
            flag,
            ": ",
            Setting::Draft,
            format!(" {} must be 1 to {}", sp.draft(), Ngram::MAX_DRAFT),
        );
    }
    match sp {
        Spec::Ngram(ng) if ng.min_match == 0 => {
            refuse!(Setting::NgramMinMatch;
                Setting::Ngram,
                ": ",
                Setting::NgramMinMatch,
                " must be at least 1",
            );
        }
        Spec::Mtp(m) if !(0.0..=1.0).contains(&m.p_min) => {
            refuse!(Setting::MtpPMin;
                Setting::Mtp,
                ": ",
                Setting::MtpPMin,
                format!(" {} must be 0 to 1", m.p_min),
            );
        }
        _ => {}
    }
    if replay {
        refuse!(flag; flag, ": a route replay acts on one-token passes only");
    }
    // A verify pass routes its rejected drafts too, at positions the next pass runs
    // again: a trace would hold two routings of one decode step, and the scorer sees
    // one-token passes only.
    for (set, what) in [
        (trace, problem!(Setting::RouteTrace)),
        (
            stream,
            problem!(
                Setting::RouteTraceStream,
                " (or ",
                Setting::RouteTraceEnv,
                ")"
            ),
        ),
        (predict_log, problem!(Setting::PredictLog)),
    ] {
        if set {
            let mut problem = problem!(flag, ": ");
            problem.0.extend(what.0);
            problem.0.push(Part::from(
                " records decode steps one token at a time, and a verify pass also \
                 routes the drafts it then rejects",
            ));
            return Err(Error::Rejected(Refusal::Setting(ConfigError {
                setting: flag,
                problem,
            })));
        }
    }
    Ok(flag)
}

/// The sampler `sampling` asks for; a seed past u32 is refused.
fn sampler(sampling: &Sampling) -> Result<Sampler> {
    let seed = if sampling.seed < 0 {
        RANDOM_SEED
    } else {
        u32::try_from(sampling.seed).map_err(|_| {
            refused!(Setting::Seed;
                Setting::Seed,
                format!(
                    " {} is too large (0 to {}, or -1 for a random seed)",
                    sampling.seed,
                    u32::MAX
                ),
            )
        })?
    };
    Ok(Sampler::new(SamplerParams {
        temp: sampling.temp,
        top_k: sampling.top_k,
        top_p: sampling.top_p,
        min_p: sampling.min_p,
        seed,
    }))
}

/// A model opened for running.
pub struct Opened {
    /// The model, its experts left to the store when they stream.
    pub file: GgufFile,
    /// Set when the experts are streamed.
    pub layout: Option<ExpertLayout>,
    /// The expert cache's budget, decided once, before the dense weights took memory.
    pub cache_bytes: u64,
    /// Whether the experts stream, and why.
    pub decision: Decision,
}

/// Open `path` for running with `args`: decide whether to stream ([`budget::decide`], from the
/// memory probed now); when streaming, place the
/// dense weights as --dense-weights says (experts are read by the store, never through the
/// map); otherwise read the whole file into memory.
/// `n_expert_used` (`--n-expert-used`) replaces the model's experts per token in the layout
/// (its cache sizing and token cycle).
pub fn open_for(
    path: &std::path::Path,
    args: &StreamConfig,
    n_expert_used: Option<u32>,
    notices: &Notices,
) -> Result<Opened> {
    args.validate()?;
    let name = path.display().to_string();
    let file = GgufFile::open(path)?;
    let mut why_not = None;
    let layout = match args.moe_stream {
        StreamMode::Off => None,
        StreamMode::On => ExpertLayout::from_gguf(&file)
            .with_context(|| format!("{name}: cannot stream the experts"))?,
        // Under auto a model whose experts cannot be streamed runs resident (and the model
        // loader names what is wrong with it, if anything).
        StreamMode::Auto => ExpertLayout::from_gguf(&file).unwrap_or_else(|e| {
            why_not = Some(format!("auto: the experts cannot be streamed: {e}"));
            None
        }),
    };
    // The engine keeps the experts' biases resident (gpt-oss): only the matrices stream.
    let mut layout = layout.map(ExpertLayout::without_biases);
    if let (Some(l), Some(k)) = (layout.as_mut(), n_expert_used) {
        crate::load::check_n_expert_used(k, l.n_expert, path)?;
        l.n_expert_used = k;
    }
    let facts = FileFacts {
        file_bytes: file.file_len(),
        experts: layout.as_ref().map(ExpertFacts::of),
    };
    // (A budget refused is told after what is wrong with the file, below.)
    let mut decided = budget::decide(args, &facts, &MemoryFacts::probe());
    if let (Ok(d), Some(why)) = (&mut decided, why_not) {
        d.why = why;
    }
    let decided = match decided {
        Ok(decision) if !decision.stream => {
            drop(file);
            return Ok(Opened {
                file: crate::load::open_model(path)?,
                layout: None,
                cache_bytes: 0,
                decision,
            });
        }
        other => other,
    };
    let Some(layout) = layout else {
        fail!("{name}: the model has no routed experts to stream");
    };
    // Every expert byte must lie inside the files: a file cut short is refused here.
    for l in &layout.layers {
        for p in &l.parts {
            let end = p.expert_offset(layout.n_expert.saturating_sub(1)) + p.stride;
            let len = file.shards().get(p.shard).map_or(0, |s| s.file_len());
            if end > len {
                fail!(
                    "{name}: {} ends at byte {end}, past the end of its file ({len} bytes): the \
                     file is truncated",
                    p.tensor
                );
            }
        }
    }
    let decision = decided?;
    let cache_bytes = decision.cache_bytes;
    // Routed experts and NextN layers stay out of the dense set.
    let experts: std::collections::HashSet<&str> = layout
        .layers
        .iter()
        .flat_map(|l| l.parts.iter().map(|p| p.tensor.as_str()))
        .chain(layout.nextn_tensors.iter().map(String::as_str))
        .collect();
    let experts: std::collections::HashSet<String> =
        experts.into_iter().map(str::to_owned).collect();
    let dense = |t: &gguf::TensorInfo| !experts.contains(&t.name);
    let file = match args.dense() {
        DenseWeights::Mmap => file,
        DenseWeights::Warm => {
            let t = Instant::now();
            let n = file.warm(&dense);
            notices.info(format!(
                "sluice: dense weights warmed: {:.1} MiB in {:.2} s",
                n as f64 / MIB as f64,
                t.elapsed().as_secs_f64()
            ));
            file
        }
        DenseWeights::Anon => {
            let t = Instant::now();
            let total = file.kept_bytes(&dense);
            let mut last = Instant::now();
            let mut progress = |done: u64, all: u64| {
                if last.elapsed().as_secs_f64() >= 1.0 && done < all {
                    notices.progress_of(
                        format!(
                            "sluice: reading dense weights: {:.0} of {:.0} MiB",
                            done as f64 / MIB as f64,
                            all as f64 / MIB as f64
                        ),
                        done,
                        all,
                    );
                    last = Instant::now();
                }
            };
            let file = file
                .into_anon(&dense, !args.no_odirect, &mut progress)
                .with_context(|| format!("{name}: cannot read the dense weights"))?;
            notices.info(format!(
                "sluice: dense weights read into memory: {:.1} MiB in {:.2} s",
                total as f64 / MIB as f64,
                t.elapsed().as_secs_f64()
            ));
            file
        }
    };
    Ok(Opened {
        file,
        layout: Some(layout),
        cache_bytes,
        decision,
    })
}

/// The `--compute-trace` file, fed by the engine's observer.
fn compute_trace(
    cfg: &RunConfig,
    engine: &mut Engine<'_>,
    preamble: &Preamble,
) -> Result<Option<Arc<Mutex<ComputeTrace>>>> {
    let Some(file) = &cfg.compute_trace else {
        return Ok(None);
    };
    let t = Arc::new(Mutex::new(ComputeTrace::create(
        &file.path,
        file.by_layer,
        preamble,
    )?));
    let sink = Arc::clone(&t);
    engine.set_observer(Some(Box::new(move |name, layer, _| {
        sink.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .node(name, layer);
    })));
    Ok(Some(t))
}

#[cfg(test)]
mod refusal_tests {
    use super::*;
    use crate::history::{HistoryConfig, PinArg};
    use crate::settings::stream::{CacheMb, ReadBackend, StreamConfig, StreamMode};
    use crate::spec::Mtp;

    /// The refusal in `r`, which must be a setting's.
    fn config_error<T: std::fmt::Debug>(r: Result<T>) -> ConfigError {
        match r {
            Err(Error::Rejected(Refusal::Setting(c))) => c,
            other => panic!("not a setting's refusal: {other:?}"),
        }
    }

    /// Every refusal the settings' checks can give, one case per check.
    fn every_refusal() -> Vec<ConfigError> {
        let off = StreamConfig {
            moe_stream: StreamMode::Off,
            ..StreamConfig::default()
        };
        let mut streams = vec![
            StreamConfig {
                cache_mb: Some(CacheMb::Auto),
                force_cache: true,
                no_odirect: true,
                overlap: true,
                prompt_ahead: true,
                load_all: true,
                io_backend: ReadBackend::Auto,
                prefetch: 1,
                predict_prefetch: true,
                ..off.clone()
            },
            StreamConfig {
                io_threads: 0,
                ..StreamConfig::default()
            },
            StreamConfig {
                prefetch: 1,
                couple: Some("pairs".into()),
                ..StreamConfig::default()
            },
            StreamConfig {
                predict_spec_max: Some(2),
                ..StreamConfig::default()
            },
            StreamConfig {
                load_all: true,
                cache_mb: Some(CacheMb::Mib(4096)),
                ..StreamConfig::default()
            },
            StreamConfig {
                cache_mb: Some(CacheMb::Mib(10)),
                ..StreamConfig::default()
            },
        ];
        if !store::uring_available() {
            streams.push(StreamConfig {
                io_backend: ReadBackend::Uring,
                ..StreamConfig::default()
            });
        }
        let mut all: Vec<ConfigError> =
            streams.iter().map(|s| config_error(s.validate())).collect();
        let ngram = Ngram::default();
        let mtp = Mtp {
            draft: 1,
            p_min: 0.5,
        };
        let specs = [
            Spec::Ngram(Ngram { draft: 0, ..ngram }),
            Spec::Ngram(Ngram {
                min_match: 0,
                ..ngram
            }),
            Spec::Mtp(Mtp { p_min: 2.0, ..mtp }),
        ];
        for sp in specs {
            all.push(config_error(check_spec(sp, false, false, false, false)));
        }
        for sp in [Spec::Ngram(ngram), Spec::Mtp(mtp)] {
            for i in 0..4 {
                let on = |j| i == j;
                all.push(config_error(check_spec(sp, on(0), on(1), on(2), on(3))));
            }
        }
        let history = HistoryConfig {
            usage_decay: Some(2.0),
            pin: Some(PinArg::Auto),
            pin_mb: Some(0),
            ..HistoryConfig::default()
        };
        all.push(config_error(history.with_env()));
        all.push(config_error(sampler(&Sampling {
            seed: i64::MAX,
            ..Sampling::default()
        })));
        all
    }

    #[test]
    fn no_refusal_of_a_setting_names_a_flag() {
        let all = every_refusal();
        assert!(all.len() >= 18, "{}", all.len());
        for c in &all {
            let text = c.to_string();
            assert!(!text.contains("--"), "{text}");
            assert!(!text.is_empty());
            // the refused setting is among those its sentence names
            assert!(
                c.problem.settings().any(|s| s == c.setting),
                "{:?} not named in {text}",
                c.setting
            );
        }
    }

    #[test]
    fn the_settings_checks_refuse_what_they_say() {
        let settings: Vec<Setting> = every_refusal().iter().map(|c| c.setting).collect();
        assert_eq!(
            &settings[..6],
            &[
                Setting::CacheMb,
                Setting::IoThreads,
                Setting::Couple,
                Setting::PredictSpecMax,
                Setting::LoadAll,
                Setting::CacheMb,
            ]
        );
        let ngram = config_error(check_spec(
            Spec::Ngram(Ngram {
                min_match: 0,
                ..Ngram::default()
            }),
            false,
            false,
            false,
            false,
        ));
        assert_eq!(ngram.setting, Setting::NgramMinMatch);
        assert_eq!(
            ngram.to_string(),
            "spec.ngram: spec.ngram_min_match must be at least 1"
        );
        assert!(check_spec(Spec::Ngram(Ngram::default()), false, false, false, false).is_ok());
    }

    #[test]
    fn every_setting_has_its_own_name_and_none_is_a_flag() {
        let mut seen = std::collections::HashSet::new();
        for s in Setting::ALL {
            assert!(!s.name().starts_with('-'), "{s}");
            assert!(s.name().contains('.'), "{s}");
            assert!(seen.insert(s.name()), "{s} twice");
        }
    }
}
