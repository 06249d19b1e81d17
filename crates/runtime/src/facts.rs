//! The resolved facts of a run: what was opened and how (model shape, threads, context,
//! streaming, cache budget, read-ahead, lossy settings). One record for every front end that
//! states them: the `# bmoe_metrics v2` preamble of the CSV (through [`Preamble::record`]), the
//! compute trace's head, and `sluice serve`'s model information.

use std::path::PathBuf;

use telemetry::bmoe_metrics;

/// What the `# bmoe_metrics v2` preamble says of a run (resolved values).
#[derive(Clone, Debug, Default)]
pub struct Preamble {
    pub model: PathBuf,
    pub arch: String,
    pub n_layer: u32,
    pub n_expert: u32,
    pub n_expert_used: u32,
    pub threads: usize,
    pub n_ctx: usize,
    pub n_ubatch: usize,
    pub chatml: bool,
    pub moe_stream: bool,
    pub cache_mb: u64,
    pub cache_auto: bool,
    pub cache_floor_mb: u64,
    pub cache_ceil_mb: u64,
    pub cache_cycle_mb: u64,
    pub force_cache: bool,
    pub load_all: bool,
    pub io_threads: usize,
    pub o_direct: bool,
    pub overlap: bool,
    /// Prompt batches read the next MoE layer's experts ahead (`--prompt-ahead`).
    pub prompt_ahead: bool,
    pub dense_weights: String,
    pub io_backend: String,
    /// The expert cache's eviction policy (`-` without streaming).
    pub cache_policy: String,
    /// Co-activation prefetch (`--couple`): experts per layer (0: off) and layers ahead.
    pub couple: crate::settings::stream::ReadAhead,
    pub route_replay: Option<PathBuf>,
    pub temp: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub seed: u32,
    /// `--compute-trace-layers`.
    pub compute_trace_layers: bool,
    /// `--prefetch`'s depth (0: off).
    pub prefetch: usize,
    pub predict_prefetch: bool,
    /// `--predict-spec-max` in force (0 without `--predict-prefetch`).
    pub predict_spec_max: usize,
    /// `--predict-log`: an instrumented run.
    pub predict_log: bool,
    pub route_ahead: usize,
    /// The cache-aware routing policies in force (`--drop-cold-experts`, `--drop-no-renorm`,
    /// `--drop-in-prefill`, `--expert-substitute`).
    pub cache_aware: engine::CacheAware,
    /// Speculative decoding by prompt lookup (`--ngram`), if on.
    pub spec: Option<crate::spec::Spec>,
    /// The diagnostic traces written (`route`, `io`, `compute`): a traced run is
    /// instrumented, not a benchmark run.
    pub traces: Vec<&'static str>,
}

impl Preamble {
    /// The preamble as the `bmoe_metrics` CSV writes it (the values as written).
    pub fn record(&self) -> bmoe_metrics::Preamble {
        bmoe_metrics::Preamble {
            engine: "sluice".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            model: self.model.display().to_string(),
            arch: self.arch.clone(),
            n_layer: self.n_layer,
            n_expert: self.n_expert,
            n_expert_used: self.n_expert_used,
            threads: self.threads,
            n_ctx: self.n_ctx,
            n_ubatch: self.n_ubatch,
            chatml: self.chatml,
            moe_stream: self.moe_stream,
            cache_mb: self.cache_mb,
            cache_auto: self.cache_auto,
            cache_floor_mb: self.cache_floor_mb,
            cache_ceil_mb: self.cache_ceil_mb,
            cache_cycle_mb: self.cache_cycle_mb,
            force_cache: self.force_cache,
            load_all: self.load_all,
            io_threads: self.io_threads,
            o_direct: self.o_direct,
            overlap: self.overlap,
            prefetch: self.prefetch,
            route_ahead: self.route_ahead,
            predict_prefetch: self.predict_prefetch,
            predict_log: self.predict_log,
            predict_spec_max: self.predict_spec_max,
            dense_weights: self.dense_weights.clone(),
            drop_cold_frac: self.cache_aware.drop_frac,
            drop_renorm: self.cache_aware.drop_renorm,
            drop_prefill: self.cache_aware.drop_in_prefill,
            substitute_lambda: self.cache_aware.substitute,
            io_backend: self.io_backend.clone(),
            cache_policy: self.cache_policy.clone(),
            couple_k: self.couple.k,
            couple_d: self.couple.depth,
            prompt_ahead: self.prompt_ahead,
            route_replay: self
                .route_replay
                .as_ref()
                .map_or_else(|| "-".to_owned(), |p| p.display().to_string()),
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
            compute_trace_layers: self.compute_trace_layers,
            spec: self.spec.map_or("off", |s| s.source().name()).to_owned(),
            spec_draft_max: self.spec.map_or(0, |s| s.draft()),
            mtp_p_min: match self.spec {
                Some(crate::spec::Spec::Mtp(m)) => m.p_min,
                _ => 0.0,
            },
            ngram_min_match: match self.spec {
                Some(crate::spec::Spec::Ngram(n)) => n.min_match,
                _ => 0,
            },
            instrumented: !self.traces.is_empty() || self.predict_log,
            traces: if self.traces.is_empty() {
                "-".to_owned()
            } else {
                self.traces.join(",")
            },
        }
    }

    /// The preamble's lines, each with its line break.
    pub fn lines(&self) -> String {
        self.record().to_string()
    }
}
