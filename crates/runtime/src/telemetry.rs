//! Run telemetry as BigMoeOnEdge's telemetry contract defines it (docs/telemetry.md): one sample per decoded token (time,
//! reads, cache, faults, CPU, memory), the `BMOE_LOAD` / `BMOE_PROGRESS` lines of `--progress`,
//! and the `--csv` sink (`# bmoe_metrics v2` preamble, the per-token rows, the `# summary`
//! trailer).
//!
//! Where the spec speaks of `llama_decode`, sluice's decode call (`Engine::forward` of one
//! token) is meant: `wall_ms` brackets it and nothing else.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Context, Result};

use crate::probes::{MemPicture, Usage};
use crate::source::StreamSnapshot;

const MIB: f64 = (1u64 << 20) as f64;

/// The per-token CSV columns, in the spec's order.
pub const CSV_COLUMNS: &str = "step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct,\
stall_ms,mgmt_ms,majflt,cpu_ms,dense_resident_frac,turn,majflt_mib,cache_budget_mib,rss_mib,\
rss_anon_mib,rss_file_mib,swap_mib,mem_available_mib,mem_free_mib,swap_free_mib,\
loop_overhead_ms,mtp_batch,mtp_draft_ms,drain_ms,adopt_ms,ra_issue_ms,ra_wd_ms";

/// One decoded token's figures.
#[derive(Clone, Debug, Default)]
pub struct TokenRow {
    /// 1-based.
    pub step: usize,
    pub steps: usize,
    pub wall_ms: f64,
    pub io_ms: f64,
    pub compute_ms: f64,
    pub read_bytes: u64,
    /// Cumulative, or -1 without a cache.
    pub cache_hit_pct: f64,
    pub stall_ms: f64,
    pub mgmt_ms: f64,
    pub majflt: u64,
    pub cpu_ms: f64,
    pub dense_resident_frac: f64,
    pub turn: u32,
    pub cache_budget_mib: f64,
    pub mem: MemPicture,
    pub loop_overhead_ms: f64,
    /// Tokens the pass this row's cost is of confirmed (speculation: a verify pass's whole
    /// cost is on its group's first row, which says how many tokens it confirmed; the others
    /// carry zeros, this one too). 1 without speculation.
    pub mtp_batch: usize,
    /// What drafting before this row's pass and cutting its rejected drafts out of the
    /// context after it took (outside the passes, in the loop's overhead).
    pub mtp_draft_ms: f64,
}

/// The compute share of a wall time (any one unit for all four): what is left after the wait
/// for reads — the read time itself when serial, the stall when the reads overlap compute —
/// and the cache management; never negative.
pub fn compute_residual(wall: f64, io: f64, stall: f64, mgmt: f64, overlap: bool) -> f64 {
    let waited = if overlap { stall } else { io };
    (wall - waited - mgmt).max(0.0)
}

impl StreamSnapshot {
    /// [`compute_residual`] of `wall_s` seconds with these counters.
    pub fn compute_s(&self, wall_s: f64, overlap: bool) -> f64 {
        let s = |ns: u64| ns as f64 / 1e9;
        compute_residual(
            wall_s,
            s(self.io_ns),
            s(self.stall_ns),
            s(self.mgmt_ns),
            overlap,
        )
    }
}

/// The `moe-prompt-ahead:` line of a run whose prompt batches read experts ahead
/// (`StoreSource::prompt_ahead`; decode and prefill counters pooled): what they read and how
/// many of those experts their layer then routed.
pub fn prompt_ahead_line(decode: &StreamSnapshot, prefill: &StreamSnapshot) -> Option<String> {
    let [n, bytes, hits] = pooled(decode, prefill, |s| {
        [s.prompt_ahead, s.prompt_ahead_bytes, s.prompt_ahead_hits]
    });
    (n > 0).then(|| {
        format!(
            "moe-prompt-ahead: {:.1} MiB read ahead for the next layer, {hits}/{n} experts used ({:.1}%)",
            bytes as f64 / MIB,
            store::cache::hit_pct(hits, n),
        )
    })
}

/// The `moe-prefetch:` line of a run whose reads ahead read anything (decode and prefill
/// counters pooled): how much it read and how many of its experts were then used, tagged with
/// the predictor (`tag`; none for `--prefetch`'s previous-token bet).
pub fn prefetch_line(
    decode: &StreamSnapshot,
    prefill: &StreamSnapshot,
    tag: &str,
) -> Option<String> {
    let [n, bytes, hits] = pooled(decode, prefill, |s| {
        [s.prefetches, s.prefetch_bytes, s.prefetch_hits]
    });
    (n > 0).then(|| {
        let tag = if tag.is_empty() {
            String::new()
        } else {
            format!(" [{tag}]")
        };
        format!(
            "moe-prefetch: {:.1} MiB speculative, {hits}/{n} experts useful ({:.1}%){tag}",
            bytes as f64 / MIB,
            store::cache::hit_pct(hits, n),
        )
    })
}

/// Counters `pick` takes from each snapshot, summed.
fn pooled<const N: usize>(
    a: &StreamSnapshot,
    b: &StreamSnapshot,
    pick: impl Fn(&StreamSnapshot) -> [u64; N],
) -> [u64; N] {
    let (x, y) = (pick(a), pick(b));
    std::array::from_fn(|i| x[i] + y[i])
}

/// The `moe-drop:` line of a run with cache-aware dropping at `frac` (`--drop-cold-experts`):
/// of the `routed` expert slots of the decode (the dropped ones included), how many were
/// dropped. The flag sets a threshold; this line is what the run traded.
pub fn drop_line(dropped: u64, routed: u64, frac: f32) -> String {
    let pct = store::cache::hit_pct(dropped, routed);
    format!(
        "moe-drop: {dropped}/{routed} routed experts dropped ({pct:.1}%), threshold {frac} x uniform"
    )
}

/// The `moe-substitute:` line of a run with cache-aware substitution at `lambda`
/// (`--expert-substitute`; a sluice line, not the spec's): of the routed slots it re-ranked,
/// how many it moved to a resident expert.
pub fn substitute_line(substituted: u64, reranked: u64, lambda: f32) -> String {
    let pct = store::cache::hit_pct(substituted, reranked);
    format!(
        "moe-substitute: {substituted}/{reranked} routed experts moved to a resident expert ({pct:.1}%), lambda {lambda}"
    )
}

/// The lines of the cache-aware policies `cfg` turns on: `moe-drop:` and `moe-substitute:`,
/// from their counts `c` over `routed` expert slots (the dropped ones included).
pub fn cache_aware_lines(
    cfg: &engine::CacheAware,
    c: &engine::CacheAwareCounts,
    routed: u64,
) -> Vec<String> {
    let mut lines = Vec::new();
    if cfg.drop_frac > 0.0 {
        lines.push(drop_line(c.dropped, routed, cfg.drop_frac));
    }
    if cfg.substitute > 0.0 {
        lines.push(substitute_line(c.substituted, c.reranked, cfg.substitute));
    }
    lines
}

/// The page size `majflt_mib` counts in.
const FAULT_PAGE: f64 = 4096.0;

impl TokenRow {
    /// A row from the decode's wall time, the streamer's and the process's deltas over it.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        step: usize,
        steps: usize,
        wall_s: f64,
        d: &StreamSnapshot,
        overlap: bool,
        usage: &Usage,
        hit_pct: f64,
        loop_overhead_s: f64,
    ) -> TokenRow {
        let ms = |ns: u64| ns as f64 / 1e6;
        let wall_ms = wall_s * 1e3;
        let (io_ms, stall_ms, mgmt_ms) = (ms(d.io_ns), ms(d.stall_ns), ms(d.mgmt_ns));
        TokenRow {
            step,
            steps,
            wall_ms,
            io_ms,
            compute_ms: compute_residual(wall_ms, io_ms, stall_ms, mgmt_ms, overlap),
            read_bytes: d.read_bytes,
            cache_hit_pct: hit_pct,
            stall_ms,
            mgmt_ms,
            majflt: usage.majflt,
            cpu_ms: ms(usage.cpu_ns),
            dense_resident_frac: -1.0,
            turn: 0,
            cache_budget_mib: 0.0,
            mem: MemPicture::default(),
            loop_overhead_ms: loop_overhead_s * 1e3,
            mtp_batch: 1,
            mtp_draft_ms: 0.0,
        }
    }

    /// The CSV row (columns of [`CSV_COLUMNS`]).
    pub fn csv(&self) -> String {
        let mib = |b: u64| b as f64 / MIB;
        let m = &self.mem;
        format!(
            "{},{},{:.3},{:.3},{:.3},{},{:.2},{:.3},{:.3},{},{:.3},{:.4},{},{:.3},{:.1},{:.1},{:.1},\
             {:.1},{:.1},{:.1},{:.1},{:.1},{:.3},{},{:.3},0,0,0,0",
            self.step,
            self.steps,
            self.wall_ms,
            self.io_ms,
            self.compute_ms,
            self.read_bytes,
            self.cache_hit_pct,
            self.stall_ms,
            self.mgmt_ms,
            self.majflt,
            self.cpu_ms,
            self.dense_resident_frac,
            self.turn,
            self.majflt as f64 * FAULT_PAGE / MIB,
            self.cache_budget_mib,
            mib(m.rss),
            mib(m.rss_anon),
            mib(m.rss_file),
            mib(m.swap),
            mib(m.mem_available),
            mib(m.mem_free),
            mib(m.swap_free),
            self.loop_overhead_ms,
            self.mtp_batch,
            self.mtp_draft_ms,
        )
    }

    /// `BMOE_LOAD {...}` when experts were read this token.
    pub fn load_line(&self) -> Option<String> {
        (self.read_bytes > 0).then(|| {
            format!(
                "BMOE_LOAD {{\"mb\":{:.3},\"ms\":{:.3}}}",
                self.read_bytes as f64 / MIB,
                self.io_ms
            )
        })
    }

    /// `BMOE_PROGRESS {...}` with this token's text deltas.
    pub fn progress_line(&self, reset: bool, delta_reasoning: &str, delta_text: &str) -> String {
        let mut s = format!(
            "BMOE_PROGRESS {{\"step\":{},\"steps\":{},\"wall_ms\":{:.3},\"io_ms\":{:.3},\
             \"compute_ms\":{:.3},\"mgmt_ms\":{:.3},\"stall_ms\":{:.3},\"read_mb\":{:.3},\
             \"cache_hit_pct\":{:.2},\"majflt\":{},\"cpu_ms\":{:.3},\"dense_resident_frac\":{:.4},",
            self.step,
            self.steps,
            self.wall_ms,
            self.io_ms,
            self.compute_ms,
            self.mgmt_ms,
            self.stall_ms,
            self.read_bytes as f64 / MIB,
            self.cache_hit_pct,
            self.majflt,
            self.cpu_ms,
            self.dense_resident_frac,
        );
        if reset {
            s.push_str("\"reset\":1,");
        }
        let _ = write!(
            s,
            "\"delta_reasoning\":{},\"delta_text\":{}}}",
            json_str(delta_reasoning),
            json_str(delta_text)
        );
        s
    }
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

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
    pub fn lines(&self) -> String {
        let b = |v: bool| u8::from(v);
        format!(
            "# bmoe_metrics v2\n\
             # engine=sluice {}\n\
             # model={} arch={} n_layer={} n_expert={} n_expert_used={} threads={} n_ctx={} \
             n_ubatch={} chatml={}\n\
             # moe_stream={} cache_mb={} cache_auto={} cache_floor_mb={} cache_ceil_mb={} \
             cache_cycle_mb={} force_cache={} load_all={} io_threads={} o_direct={} overlap={} \
             io_two_wave=0 prefetch={} route_ahead={} predict_prefetch={} predict_log={} \
             predict_spec_max={} prefetch_sync=0 dense_weights={} drop_cold_frac={} drop_renorm={} \
             drop_prefill={} substitute_lambda={} io_backend={} cache_policy={} couple_k={} couple_d={} prompt_ahead={} route_replay={}\n\
             # temp={} top_k={} top_p={} seed={} compute_trace_layers={} spec={} \
             spec_draft_max={} mtp_p_min={} ngram_min_match={} instrumented={} traces={}\n",
            env!("CARGO_PKG_VERSION"),
            self.model.display(),
            self.arch,
            self.n_layer,
            self.n_expert,
            self.n_expert_used,
            self.threads,
            self.n_ctx,
            self.n_ubatch,
            b(self.chatml),
            b(self.moe_stream),
            self.cache_mb,
            b(self.cache_auto),
            self.cache_floor_mb,
            self.cache_ceil_mb,
            self.cache_cycle_mb,
            b(self.force_cache),
            b(self.load_all),
            self.io_threads,
            b(self.o_direct),
            b(self.overlap),
            self.prefetch,
            self.route_ahead,
            b(self.predict_prefetch),
            b(self.predict_log),
            self.predict_spec_max,
            self.dense_weights,
            self.cache_aware.drop_frac,
            b(self.cache_aware.drop_renorm),
            b(self.cache_aware.drop_in_prefill),
            self.cache_aware.substitute,
            self.io_backend,
            self.cache_policy,
            self.couple.k,
            self.couple.depth,
            b(self.prompt_ahead),
            self.route_replay
                .as_ref()
                .map_or_else(|| "-".to_owned(), |p| p.display().to_string()),
            self.temp,
            self.top_k,
            self.top_p,
            self.seed,
            b(self.compute_trace_layers),
            self.spec.map_or("off", |s| s.source().name()),
            self.spec.map_or(0, |s| s.draft()),
            match self.spec {
                Some(crate::spec::Spec::Mtp(m)) => m.p_min,
                _ => 0.0,
            },
            match self.spec {
                Some(crate::spec::Spec::Ngram(n)) => n.min_match,
                _ => 0,
            },
            b(!self.traces.is_empty() || self.predict_log),
            if self.traces.is_empty() {
                "-".to_owned()
            } else {
                self.traces.join(",")
            },
        )
    }
}

/// The figures of the `# summary` trailer (decode-phase totals unless named `prefill_`).
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub tokens: usize,
    pub decode_s: f64,
    pub load_s: f64,
    pub n_prompt: usize,
    pub prefill_s: f64,
    pub decode: StreamSnapshot,
    pub overlap: bool,
    pub usage: Usage,
    /// Cumulative hit rate, or -1 without a cache.
    pub cache_hit_pct: f64,
    pub cache_budget_mib: f64,
    /// Routed expert slots of the decode, those cache-aware dropping skipped included.
    pub experts_routed: u64,
    /// What the cache-aware policies did during the decode.
    pub cache_aware: engine::CacheAwareCounts,
    pub loop_overhead_s: f64,
    pub prefill: StreamSnapshot,
    pub prefill_usage: Usage,
    /// What was ranked ahead of the router during the generation (`--predict-log`,
    /// `--route-ahead`).
    pub ahead: crate::predict::AheadFigures,
    /// What speculative decoding did (`--ngram`; `None` without it).
    pub spec: Option<crate::spec::SpecCounts>,
}

impl Summary {
    /// Speculation's counters (zeros without it, as the spec writes them).
    fn spec_counts(&self) -> crate::spec::SpecCounts {
        self.spec.unwrap_or_default()
    }

    /// The `# summary ...` line.
    pub fn line(&self) -> String {
        let n = self.tokens.max(1) as f64;
        let per = |x: f64| if self.tokens == 0 { 0.0 } else { x / n };
        let s = |ns: u64| ns as f64 / 1e9;
        let d = &self.decode;
        let compute = d.compute_s(self.decode_s, self.overlap);
        let rate = if self.decode_s > 0.0 {
            self.tokens as f64 / self.decode_s
        } else {
            0.0
        };
        let p = &self.prefill;
        let sp = self.spec_counts();
        let fields: Vec<(&str, String)> = vec![
            ("tokens", self.tokens.to_string()),
            ("tok/s", format!("{rate:.3}")),
            ("s/tok", format!("{:.4}", per(self.decode_s))),
            ("load_s", format!("{:.3}", self.load_s)),
            ("n_prompt", self.n_prompt.to_string()),
            ("prefill_s", format!("{:.3}", self.prefill_s)),
            (
                "prefill_tps",
                format!(
                    "{:.3}",
                    if self.prefill_s > 0.0 {
                        self.n_prompt as f64 / self.prefill_s
                    } else {
                        0.0
                    }
                ),
            ),
            ("cache_hit_pct", format!("{:.2}", self.cache_hit_pct)),
            ("cache_budget_MiB", format!("{:.1}", self.cache_budget_mib)),
            // budget changes during the run: sluice sizes its cache once, before the first token
            ("cache_resizes", "0".into()),
            (
                "cache_resident_MiB",
                format!("{:.1}", d.resident_bytes as f64 / MIB),
            ),
            ("read_MiB", format!("{:.3}", d.read_bytes as f64 / MIB)),
            // the generation's expert read time in all (`io_s/tok` is its share per token)
            ("io_s", format!("{:.3}", s(d.io_ns))),
            ("io_s/tok", format!("{:.4}", per(s(d.io_ns)))),
            ("compute_s/tok", format!("{:.4}", per(compute))),
            ("stall_s/tok", format!("{:.4}", per(s(d.stall_ns)))),
            ("mgmt_s/tok", format!("{:.4}", per(s(d.mgmt_ns)))),
            (
                "majflt/tok",
                format!("{:.3}", per(self.usage.majflt as f64)),
            ),
            ("cpu_s/tok", format!("{:.4}", per(s(self.usage.cpu_ns)))),
            (
                "token_demand_MiB",
                format!("{:.3}", per(d.demand_bytes as f64 / MIB)),
            ),
            ("experts_routed", self.experts_routed.to_string()),
            ("experts_dropped", self.cache_aware.dropped.to_string()),
            ("experts_reranked", self.cache_aware.reranked.to_string()),
            (
                "experts_substituted",
                self.cache_aware.substituted.to_string(),
            ),
            ("row_table_MiB", "0".into()),
            ("row_resident_MiB", "0".into()),
            ("row_rows", "0".into()),
            ("row_reads", "0".into()),
            ("row_read_MiB", "0".into()),
            ("row_evictions", "0".into()),
            ("row_io_errors", "0".into()),
            (
                "layer_demand_MiB",
                format!("{:.3}", d.layer_demand_max as f64 / MIB),
            ),
            (
                "loop_overhead_s/tok",
                format!("{:.4}", per(self.loop_overhead_s)),
            ),
            ("drain_s/tok", "0".into()),
            ("adopt_s/tok", "0".into()),
            ("evictions", d.evictions.to_string()),
            ("rereads", d.rereads.to_string()),
            (
                "spec_read_MiB",
                format!("{:.3}", d.prefetch_bytes as f64 / MIB),
            ),
            ("spec_experts", d.prefetches.to_string()),
            ("spec_useful", d.prefetch_hits.to_string()),
            // speculative decoding (`--ngram`; zeros without it)
            ("mtp_drafted", sp.drafted.to_string()),
            ("mtp_accepted", sp.accepted.to_string()),
            ("mtp_decodes", sp.decodes.to_string()),
            ("mtp_draft_s/tok", format!("{:.4}", per(sp.draft_s))),
            ("drafted_steps", sp.drafted_steps.to_string()),
            ("ra_committed", self.ahead.committed.to_string()),
            ("ra_passthrough", self.ahead.passed.to_string()),
            ("ra_agree_pct", format!("{:.2}", self.ahead.agree_pct())),
            (
                "ra_gemv_ms/tok",
                format!("{:.4}", per(self.ahead.rank_ns as f64 / 1e6)),
            ),
            ("ra_issue_ms/tok", "0".into()),
            ("ra_wd_ms/tok", "0".into()),
            (
                "prefill_cpu_s",
                format!("{:.3}", s(self.prefill_usage.cpu_ns)),
            ),
            (
                "prefill_read_mib",
                format!("{:.3}", p.read_bytes as f64 / MIB),
            ),
            ("prefill_io_s", format!("{:.3}", s(p.io_ns))),
            ("prefill_stall_s", format!("{:.3}", s(p.stall_ns))),
            ("prefill_mgmt_s", format!("{:.3}", s(p.mgmt_ns))),
            ("prefill_dev_tokens", "0".into()),
            ("prefill_dev_nodes", "0".into()),
            ("prefill_dev_read_mib", "0".into()),
            ("prefill_dev_stall_s", "0".into()),
        ];
        let mut line = "# summary".to_owned();
        for (k, v) in fields {
            let _ = write!(line, " {k}={v}");
        }
        line
    }

    /// The session's `BMOE_DONE {...}` line of generation `id` (the spec's keys, in its order):
    /// the same figures as [`line`](Self::line), with the context length after the turn and
    /// the answer's split.
    pub fn done_line(
        &self,
        id: i64,
        cancelled: bool,
        n_past: usize,
        reasoning: &str,
        text: &str,
    ) -> String {
        let per = |x: f64| {
            if self.tokens == 0 {
                0.0
            } else {
                x / self.tokens as f64
            }
        };
        let s = |ns: u64| ns as f64 / 1e9;
        let d = &self.decode;
        let p = &self.prefill;
        let compute = d.compute_s(self.decode_s, self.overlap);
        let rate = |n: usize, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let sp = self.spec_counts();
        let mut o = JsonObject::default();
        o.int("id", id)
            .bool("cancelled", cancelled)
            .int("tokens", self.tokens as i64)
            .float("tok_s", rate(self.tokens, self.decode_s), 3)
            .float("prefill_s", self.prefill_s, 3)
            .float("prefill_tps", rate(self.n_prompt, self.prefill_s), 3)
            .float("load_s", self.load_s, 3)
            .float("cache_hit_pct", self.cache_hit_pct, 2)
            .int("n_prompt", self.n_prompt as i64)
            .int("n_past", n_past as i64)
            .float("compute_s_tok", per(compute), 4)
            .float("io_s_tok", per(s(d.io_ns)), 4)
            .float("cache_resident_mib", d.resident_bytes as f64 / MIB, 1)
            .float("cache_budget_mib", self.cache_budget_mib, 1)
            .float("read_mib", d.read_bytes as f64 / MIB, 3)
            .float("stall_s_tok", per(s(d.stall_ns)), 4)
            .float("mgmt_s_tok", per(s(d.mgmt_ns)), 4)
            .float("majflt_tok", per(self.usage.majflt as f64), 3)
            .float("cpu_s_tok", per(s(self.usage.cpu_ns)), 4)
            .float("prefill_cpu_s", s(self.prefill_usage.cpu_ns), 3)
            .float("prefill_read_mib", p.read_bytes as f64 / MIB, 3)
            .float("prefill_io_s", s(p.io_ns), 3)
            .float("prefill_stall_s", s(p.stall_ns), 3)
            .float("prefill_mgmt_s", s(p.mgmt_ns), 3)
            .int("prefill_dev_tokens", 0)
            .int("prefill_dev_nodes", 0)
            .float("prefill_dev_read_mib", 0.0, 1)
            .float("prefill_dev_stall_s", 0.0, 1)
            .float("token_demand_mib", per(d.demand_bytes as f64 / MIB), 3)
            .int("mtp_drafted", sp.drafted as i64)
            .int("mtp_accepted", sp.accepted as i64)
            .int("mtp_decodes", sp.decodes as i64)
            .float("mtp_draft_s_tok", per(sp.draft_s), 4)
            .int("drafted_steps", sp.drafted_steps as i64)
            .float("loop_overhead_s_tok", per(self.loop_overhead_s), 4)
            .str("reasoning", reasoning)
            .str("text", text);
        format!("BMOE_DONE {}", o.finish())
    }
}

/// A JSON object written key by key in the order given (the protocol lines list their keys in
/// the spec's order). Floats are written with a fixed number of decimals, or exactly (shortest
/// round-trip form) with [`exact`](Self::exact); a value that is not finite becomes `null`.
#[derive(Default)]
pub struct JsonObject {
    s: String,
}

impl JsonObject {
    fn key(&mut self, k: &str) -> &mut String {
        self.s.push(if self.s.is_empty() { '{' } else { ',' });
        self.s.push_str(&json_str(k));
        self.s.push(':');
        &mut self.s
    }

    pub fn int(&mut self, k: &str, v: i64) -> &mut Self {
        let _ = write!(self.key(k), "{v}");
        self
    }

    pub fn bool(&mut self, k: &str, v: bool) -> &mut Self {
        let _ = write!(self.key(k), "{v}");
        self
    }

    pub fn float(&mut self, k: &str, v: f64, decimals: usize) -> &mut Self {
        let out = self.key(k);
        if v.is_finite() {
            let _ = write!(out, "{v:.decimals$}");
        } else {
            out.push_str("null");
        }
        self
    }

    pub fn str(&mut self, k: &str, v: &str) -> &mut Self {
        let v = json_str(v);
        self.key(k).push_str(&v);
        self
    }

    /// A value already written as JSON.
    pub fn raw(&mut self, k: &str, json: &str) -> &mut Self {
        self.key(k).push_str(json);
        self
    }

    pub fn finish(&mut self) -> String {
        if self.s.is_empty() {
            self.s.push('{');
        }
        self.s.push('}');
        std::mem::take(&mut self.s)
    }
}

/// `v` in JSON's shortest round-trip form (parsing it gives back the same bits), `null` when
/// not finite.
pub fn json_exact(v: f64) -> String {
    serde_json::Number::from_f64(v).map_or_else(|| "null".to_owned(), |n| n.to_string())
}

/// The `--csv` file: preamble once, a row per token, a summary after each generation (one
/// for a one-shot run, one per turn of a session).
pub struct CsvSink {
    path: PathBuf,
    w: BufWriter<File>,
}

impl CsvSink {
    pub fn create(path: &Path, preamble: &Preamble) -> Result<CsvSink> {
        let f = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut sink = CsvSink {
            path: path.to_owned(),
            w: BufWriter::new(f),
        };
        let head = format!("{}{CSV_COLUMNS}\n", preamble.lines());
        sink.write(&head)?;
        Ok(sink)
    }

    fn write(&mut self, s: &str) -> Result<()> {
        self.w
            .write_all(s.as_bytes())
            .with_context(|| format!("writing {}", self.path.display()))
    }

    pub fn row(&mut self, r: &TokenRow) -> Result<()> {
        let line = format!("{}\n", r.csv());
        self.write(&line)
    }

    /// The `# summary` line of a generation (a session writes one per turn), flushed.
    pub fn summary(&mut self, summary: &Summary) -> Result<()> {
        let line = format!("{}\n", summary.line());
        self.write(&line)?;
        self.w
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// The CSV as a generation's sink: a row per token (with the memory picture at that moment),
/// the summary when the generation ends.
impl crate::sink::Sink for CsvSink {
    fn delta(&mut self, _d: &chat::SplitDelta) -> Result<()> {
        Ok(())
    }

    fn token(&mut self, row: &TokenRow) -> Result<()> {
        let mut row = row.clone();
        row.mem = MemPicture::now();
        self.row(&row)
    }

    fn finished(&mut self, o: &crate::generate::Outcome) -> Result<()> {
        self.summary(&o.summary)
    }
}

/// The `compute:` line: CPU occupancy over the compute threads and major faults, per token.
pub fn compute_line(usage: &Usage, decode_s: f64, tokens: usize, threads: usize) -> String {
    let n = tokens.max(1) as f64;
    let cpu_tok = usage.cpu_ns as f64 / 1e9 / n;
    let wall_tok = decode_s / n;
    let pct = if wall_tok > 0.0 && threads > 0 {
        100.0 * cpu_tok / (wall_tok * threads as f64)
    } else {
        0.0
    };
    format!(
        "compute: {pct:.1}% CPU occupancy ({cpu_tok:.3} cpu-s/token over {threads} threads), {:.2} major faults/token",
        usage.majflt as f64 / n
    )
}

/// A trace file: its header written at creation, rows appended (the first write error is kept
/// and reported by [`finish`](Self::finish)).
struct TraceWriter {
    path: PathBuf,
    w: BufWriter<File>,
    error: Option<std::io::Error>,
}

impl TraceWriter {
    fn create(path: &Path, header: &str) -> Result<TraceWriter> {
        let f = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut w = BufWriter::new(f);
        w.write_all(header.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(TraceWriter {
            path: path.to_owned(),
            w,
            error: None,
        })
    }

    fn write(&mut self, s: &str) {
        if self.error.is_none()
            && let Err(e) = self.w.write_all(s.as_bytes())
        {
            self.error = Some(e);
        }
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e).with_context(|| format!("writing {}", self.path.display()));
        }
        self.w
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Which pass of a turn a trace row belongs to: the trace formats' own type (one definition
/// for the writers here and the readers in `trace`).
pub use telemetry::Phase;

/// The `--io-trace` file (`# io_trace v1`): one row per window the expert store read, stamped
/// with the forward pass it was collected in (`phase` 0 = prefill, 1 = decode; `step` = the
/// context position of the pass's first token). `proj` is the part's index in the layer's
/// expert tensors (gate 0, up 1, down 2 for separate tensors), `lane` the I/O lane, `spec` 1
/// for a speculative read.
pub struct IoTrace {
    w: TraceWriter,
    turn: u32,
    phase: Phase,
    step: usize,
}

impl IoTrace {
    pub fn create(path: &Path) -> Result<IoTrace> {
        Ok(IoTrace {
            w: TraceWriter::create(
                path,
                "# io_trace v1\nturn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns\n",
            )?,
            turn: 0,
            phase: Phase::Prefill,
            step: 0,
        })
    }

    /// The forward pass the next rows belong to (the session turn, the phase, the position).
    pub fn stamp(&mut self, turn: u32, phase: Phase, step: usize) {
        self.turn = turn;
        self.phase = phase;
        self.step = step;
    }

    /// A finished read's windows.
    pub fn record(
        &mut self,
        layer: u32,
        expert: u32,
        lane: usize,
        spec: bool,
        windows: &[store::WindowRead],
    ) {
        let mut rows = String::new();
        for w in windows {
            let _ = writeln!(
                rows,
                "{},{},{},{layer},{expert},{},{lane},{},{},{},{},{}",
                self.turn,
                self.phase.code(),
                self.step,
                w.part,
                u8::from(spec),
                w.offset,
                w.req_bytes,
                w.read_bytes,
                w.latency_ns
            );
        }
        self.w.write(&rows);
    }

    /// Flush; reports the first write error.
    pub fn finish(&mut self) -> Result<()> {
        self.w.finish()
    }
}

/// The ggml operation a named intermediate of the forward pass stands for (the `op` column of a
/// compute trace; the `name` column keeps the intermediate's own name).
pub fn op_of(name: &str) -> &'static str {
    match name {
        "attn_norm" | "ffn_norm" | "result_norm" => "RMS_NORM",
        "Qcur" | "Kcur" | "Vcur" | "attn_out" | "ffn_moe_logits" | "ffn_shexp_out"
        | "result_output" => "MUL_MAT",
        "kqv_out" => "FLASH_ATTN_EXT",
        "ffn_inp" | "ffn_out" | "l_out" => "ADD",
        "ffn_moe_probs" => "SOFT_MAX",
        "ffn_moe_topk" => "ARGSORT",
        "ffn_moe_weights" => "GET_ROWS",
        "ffn_moe_out" => "MUL_MAT_ID",
        _ => "OTHER",
    }
}

/// The `--compute-trace` / `--compute-trace-layers` file (`# compute_trace v1`). sluice's
/// named intermediates (the engine's observer points) play the role of graph nodes: a node's
/// `wall_ns` is the time from the previous boundary (the decode's start for the first) to the
/// moment the intermediate is complete, and `majflt` the major faults in between. With
/// `layers`, one row per layer segment instead (`op` = `LAYER`, `name` = `blk.<il>`, and
/// `post` for the final norm and output head).
pub struct ComputeTrace {
    w: TraceWriter,
    layers: bool,
    turn: u32,
    phase: Phase,
    step: usize,
    seq: usize,
    last: Instant,
    last_flt: u64,
    /// Layer-segment sums of the pass: (layer or -1, ns, faults), in order.
    segs: Vec<(i64, u64, u64)>,
}

impl ComputeTrace {
    pub fn create(path: &Path, layers: bool, pre: &Preamble) -> Result<ComputeTrace> {
        let head = format!(
            "# compute_trace v1\n# model={} arch={} n_layer={} n_threads={} io_threads={} o_direct={} overlap={}\nturn,phase,step,seq,layer,op,name,wall_ns,majflt\n",
            pre.model.display(),
            pre.arch,
            pre.n_layer,
            pre.threads,
            pre.io_threads,
            u8::from(pre.o_direct),
            u8::from(pre.overlap)
        );
        Ok(ComputeTrace {
            w: TraceWriter::create(path, &head)?,
            layers,
            turn: 0,
            phase: Phase::Prefill,
            step: 0,
            seq: 0,
            last: Instant::now(),
            last_flt: 0,
            segs: Vec::new(),
        })
    }

    /// A forward pass starts (of session turn `turn`; `phase` 0 = prefill, 1 = decode; `step` =
    /// its first position).
    pub fn begin(&mut self, turn: u32, phase: Phase, step: usize) {
        self.turn = turn;
        self.phase = phase;
        self.step = step;
        self.seq = 0;
        self.segs.clear();
        self.last_flt = Usage::now().majflt;
        self.last = Instant::now();
    }

    /// The intermediate `name` of `layer` is complete.
    pub fn node(&mut self, name: &str, layer: Option<usize>) {
        let now = Instant::now();
        let flt = Usage::now().majflt;
        let ns = now.duration_since(self.last).as_nanos() as u64;
        let faults = flt.saturating_sub(self.last_flt);
        let il = layer.map_or(-1, |l| l as i64);
        if self.layers {
            match self.segs.last_mut() {
                Some(s) if s.0 == il => {
                    s.1 += ns;
                    s.2 += faults;
                }
                _ => self.segs.push((il, ns, faults)),
            }
        } else {
            let full = match layer {
                Some(l) => format!("{name}-{l}"),
                None => name.to_owned(),
            };
            let row = format!(
                "{},{},{},{},{il},{},{full},{ns},{faults}\n",
                self.turn,
                self.phase.code(),
                self.step,
                self.seq,
                op_of(name)
            );
            self.write(&row);
        }
        self.seq += 1;
        // The trace's own work is not charged to the next node.
        self.last_flt = flt;
        self.last = Instant::now();
    }

    /// The pass is done: the layer segments' rows.
    pub fn end(&mut self) {
        if !self.layers {
            return;
        }
        let mut rows = String::new();
        for (seq, &(il, ns, faults)) in self.segs.iter().enumerate() {
            let name = if il < 0 {
                "post".to_owned()
            } else {
                format!("blk.{il}")
            };
            let _ = writeln!(
                rows,
                "{},{},{},{seq},{il},LAYER,{name},{ns},{faults}",
                self.turn,
                self.phase.code(),
                self.step
            );
        }
        self.write(&rows);
    }

    fn write(&mut self, s: &str) {
        self.w.write(s);
    }

    /// Flush; reports the first write error.
    pub fn finish(&mut self) -> Result<()> {
        self.w.finish()
    }
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
    d: &StreamSnapshot,
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
    let compute = compute_residual(wall, io_s, stall_s, mgmt_s, overlap);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_is_what_the_wait_and_the_management_leave() {
        // Serial: the reads' own time is waited; overlapped: only the stall.
        assert_eq!(compute_residual(10.0, 3.0, 1.0, 2.0, false), 5.0);
        assert_eq!(compute_residual(10.0, 3.0, 1.0, 2.0, true), 7.0);
        assert_eq!(compute_residual(1.0, 3.0, 1.0, 2.0, false), 0.0);
        let d = StreamSnapshot {
            io_ns: 2_000_000_000,
            stall_ns: 500_000_000,
            mgmt_ns: 250_000_000,
            ..StreamSnapshot::default()
        };
        assert_eq!(d.compute_s(4.0, false), 1.75);
        assert_eq!(d.compute_s(4.0, true), 3.25);
    }

    #[test]
    fn a_prefetch_line_only_when_something_was_read_ahead() {
        let none = StreamSnapshot::default();
        assert_eq!(prefetch_line(&none, &none, "couple"), None);
        let d = StreamSnapshot {
            prefetches: 3,
            prefetch_bytes: 3 << 20,
            prefetch_hits: 1,
            ..StreamSnapshot::default()
        };
        let p = StreamSnapshot {
            prefetches: 1,
            prefetch_bytes: 1 << 19,
            prefetch_hits: 1,
            ..StreamSnapshot::default()
        };
        assert_eq!(
            prefetch_line(&d, &p, "couple").as_deref(),
            Some("moe-prefetch: 3.5 MiB speculative, 2/4 experts useful (50.0%) [couple]")
        );
        assert_eq!(
            prefetch_line(&d, &p, "").as_deref(),
            Some("moe-prefetch: 3.5 MiB speculative, 2/4 experts useful (50.0%)")
        );
    }

    #[test]
    fn a_prompt_ahead_line_only_when_a_prompt_read_ahead_and_apart_from_the_prefetches() {
        let d = StreamSnapshot {
            prefetches: 3,
            prefetch_bytes: 3 << 20,
            prefetch_hits: 1,
            ..StreamSnapshot::default()
        };
        assert_eq!(prompt_ahead_line(&d, &StreamSnapshot::default()), None);
        let p = StreamSnapshot {
            prompt_ahead: 4,
            prompt_ahead_bytes: 5 << 19,
            prompt_ahead_hits: 3,
            ..StreamSnapshot::default()
        };
        assert_eq!(
            prompt_ahead_line(&d, &p).as_deref(),
            Some(
                "moe-prompt-ahead: 2.5 MiB read ahead for the next layer, 3/4 experts used (75.0%)"
            )
        );
    }

    #[test]
    fn a_row_has_every_column_and_the_residual_is_clamped() {
        let d = StreamSnapshot {
            io_ns: 30_000_000,
            mgmt_ns: 5_000_000,
            read_bytes: 1 << 20,
            ..StreamSnapshot::default()
        };
        let r = TokenRow::new(1, 4, 0.020, &d, false, &Usage::default(), 50.0, 0.001);
        // 20 ms of wall against 35 ms measured: the residual is clamped at 0.
        assert_eq!(r.compute_ms, 0.0);
        assert_eq!(r.csv().split(',').count(), CSV_COLUMNS.split(',').count());
        assert_eq!(
            r.load_line().unwrap(),
            "BMOE_LOAD {\"mb\":1.000,\"ms\":30.000}"
        );
        let p = r.progress_line(false, "", "a\"b\n");
        assert!(
            p.ends_with("\"delta_reasoning\":\"\",\"delta_text\":\"a\\\"b\\n\"}"),
            "{p}"
        );
    }

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
