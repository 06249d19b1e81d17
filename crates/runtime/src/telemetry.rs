//! Run telemetry as BigMoeOnEdge's telemetry contract defines it (docs/telemetry.md): one sample per decoded token (time,
//! reads, cache, faults, CPU, memory), the `BMOE_LOAD` / `BMOE_PROGRESS` lines of `--progress`,
//! and the `--csv` sink (`# bmoe_metrics v2` preamble, the per-token rows, the `# summary`
//! trailer). The formats themselves live in `telemetry` (`bmoe_metrics`, `bmoe_session`): the
//! types here turn into their records (`TokenRow::metrics`, `Preamble::record`) and are written
//! through them.
//!
//! Where the spec speaks of `llama_decode`, sluice's decode call (`Engine::forward` of one
//! token) is meant: `wall_ms` brackets it and nothing else.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use telemetry::bmoe_metrics::{self, MetricsRow, MetricsWriter};
use telemetry::bmoe_session::{self, Line};

use crate::error::{Context, Result};

use crate::stream::StreamSnapshot;

const MIB: f64 = (1u64 << 20) as f64;

/// This process's CPU time and major faults so far (`getrusage`); zeros where unavailable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_ns: u64,
    pub majflt: u64,
}

impl Usage {
    pub fn now() -> Usage {
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: the pointer is valid for a write of one rusage for the duration of the call.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
            return Usage::default();
        }
        let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        Usage {
            cpu_ns: ns(ru.ru_utime) + ns(ru.ru_stime),
            majflt: ru.ru_majflt as u64,
        }
    }

    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
            majflt: self.majflt.saturating_sub(earlier.majflt),
        }
    }
}

/// The memory picture of a CSV row, in bytes: this process (`/proc/self/status`) and the
/// machine (`/proc/meminfo`). Zeros where unreadable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemPicture {
    pub rss: u64,
    pub rss_anon: u64,
    pub rss_file: u64,
    pub swap: u64,
    pub mem_available: u64,
    pub mem_free: u64,
    pub swap_free: u64,
}

/// `Key:   123 kB` → bytes.
fn kib_field(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |k| k * 1024)
}

impl MemPicture {
    pub fn now() -> MemPicture {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        MemPicture {
            rss: kib_field(&status, "VmRSS"),
            rss_anon: kib_field(&status, "RssAnon"),
            rss_file: kib_field(&status, "RssFile"),
            swap: kib_field(&status, "VmSwap"),
            mem_available: kib_field(&meminfo, "MemAvailable"),
            mem_free: kib_field(&meminfo, "MemFree"),
            swap_free: kib_field(&meminfo, "SwapFree"),
        }
    }
}

/// The share of the dense weights in RAM, by `mincore` over the pages that hold them (our own
/// buffers under `--dense-weights anon`, the model's map otherwise), sampled at most once a
/// second.
pub struct DenseProbe {
    /// Page-aligned (address, length) ranges.
    ranges: Vec<(usize, usize)>,
    last: Option<(Instant, f64)>,
    page: usize,
}

impl DenseProbe {
    /// A probe of the byte slices `dense` (they must stay mapped while the probe is used).
    pub fn new<'a>(dense: impl IntoIterator<Item = &'a [u8]>) -> DenseProbe {
        // SAFETY: sysconf only reads its argument.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|&p| p > 0)
            .unwrap_or(4096);
        let mut ranges: Vec<(usize, usize)> = dense
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(|s| {
                let start = s.as_ptr() as usize;
                let begin = start - start % page;
                let end = (start + s.len()).next_multiple_of(page);
                (begin, end)
            })
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (b, e) in ranges {
            match merged.last_mut() {
                Some(m) if b <= m.1 => m.1 = m.1.max(e),
                _ => merged.push((b, e)),
            }
        }
        DenseProbe {
            ranges: merged.into_iter().map(|(b, e)| (b, e - b)).collect(),
            last: None,
            page,
        }
    }

    /// The resident share (0 to 1), or -1 when nothing can be measured.
    pub fn sample(&mut self) -> f64 {
        if let Some((t, v)) = self.last
            && t.elapsed().as_secs_f64() < 1.0
        {
            return v;
        }
        let v = self.measure();
        self.last = Some((Instant::now(), v));
        v
    }

    fn measure(&self) -> f64 {
        let (mut resident, mut total) = (0usize, 0usize);
        let mut vec = Vec::new();
        for &(addr, len) in &self.ranges {
            let pages = len / self.page;
            vec.clear();
            vec.resize(pages, 0u8);
            // SAFETY: `addr` is page-aligned and `addr..addr + len` lies within mappings the
            // caller keeps alive (the model's map or our dense buffers); `vec` has one byte per
            // page of it, as mincore requires. mincore only reports residency.
            let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) };
            if rc != 0 {
                return -1.0;
            }
            resident += vec.iter().filter(|&&b| b & 1 == 1).count();
            total += pages;
        }
        if total == 0 {
            -1.0
        } else {
            resident as f64 / total as f64
        }
    }
}

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

    /// The row as the `bmoe_metrics` CSV writes it (its memory in MiB).
    pub fn metrics(&self) -> MetricsRow {
        let mib = |b: u64| b as f64 / MIB;
        let m = &self.mem;
        MetricsRow {
            step: self.step as u64,
            steps: self.steps as u64,
            wall_ms: self.wall_ms,
            io_ms: self.io_ms,
            compute_ms: self.compute_ms,
            read_bytes: self.read_bytes,
            cache_hit_pct: self.cache_hit_pct,
            stall_ms: self.stall_ms,
            mgmt_ms: self.mgmt_ms,
            majflt: self.majflt,
            cpu_ms: self.cpu_ms,
            dense_resident_frac: self.dense_resident_frac,
            turn: u64::from(self.turn),
            cache_budget_mib: self.cache_budget_mib,
            rss_mib: mib(m.rss),
            rss_anon_mib: mib(m.rss_anon),
            rss_file_mib: mib(m.rss_file),
            swap_mib: mib(m.swap),
            mem_available_mib: mib(m.mem_available),
            mem_free_mib: mib(m.mem_free),
            swap_free_mib: mib(m.swap_free),
            loop_overhead_ms: self.loop_overhead_ms,
            mtp_batch: self.mtp_batch as u64,
            mtp_draft_ms: self.mtp_draft_ms,
        }
    }

    /// `BMOE_LOAD {...}` when experts were read this token.
    pub fn load_line(&self) -> Option<String> {
        (self.read_bytes > 0).then(|| {
            Line::Load(bmoe_session::Load {
                mb: self.read_bytes as f64 / MIB,
                ms: self.io_ms,
            })
            .to_string()
        })
    }

    /// `BMOE_PROGRESS {...}` with this token's text deltas.
    pub fn progress_line(&self, reset: bool, delta_reasoning: &str, delta_text: &str) -> String {
        Line::Progress(bmoe_session::Progress {
            step: self.step as u64,
            steps: self.steps as u64,
            wall_ms: self.wall_ms,
            io_ms: self.io_ms,
            compute_ms: self.compute_ms,
            mgmt_ms: self.mgmt_ms,
            stall_ms: self.stall_ms,
            read_mb: self.read_bytes as f64 / MIB,
            cache_hit_pct: self.cache_hit_pct,
            majflt: self.majflt,
            cpu_ms: self.cpu_ms,
            dense_resident_frac: self.dense_resident_frac,
            reset,
            delta_reasoning: delta_reasoning.to_owned(),
            delta_text: delta_text.to_owned(),
        })
        .to_string()
    }
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
    pub couple: crate::stream::ReadAhead,
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
        bmoe_metrics::summary_line(&self.fields())
    }

    /// The `key=value` pairs of the `# summary` trailer, in the spec's order, as written.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
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
        vec![
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
        ]
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
        Line::Done(bmoe_session::Done {
            id,
            cancelled,
            tokens: self.tokens as u64,
            tok_s: rate(self.tokens, self.decode_s),
            prefill_s: self.prefill_s,
            prefill_tps: rate(self.n_prompt, self.prefill_s),
            load_s: self.load_s,
            cache_hit_pct: self.cache_hit_pct,
            n_prompt: self.n_prompt as u64,
            n_past: n_past as u64,
            compute_s_tok: per(compute),
            io_s_tok: per(s(d.io_ns)),
            cache_resident_mib: d.resident_bytes as f64 / MIB,
            cache_budget_mib: self.cache_budget_mib,
            read_mib: d.read_bytes as f64 / MIB,
            stall_s_tok: per(s(d.stall_ns)),
            mgmt_s_tok: per(s(d.mgmt_ns)),
            majflt_tok: per(self.usage.majflt as f64),
            cpu_s_tok: per(s(self.usage.cpu_ns)),
            prefill_cpu_s: s(self.prefill_usage.cpu_ns),
            prefill_read_mib: p.read_bytes as f64 / MIB,
            prefill_io_s: s(p.io_ns),
            prefill_stall_s: s(p.stall_ns),
            prefill_mgmt_s: s(p.mgmt_ns),
            prefill_dev_tokens: 0,
            prefill_dev_nodes: 0,
            prefill_dev_read_mib: 0.0,
            prefill_dev_stall_s: 0.0,
            token_demand_mib: per(d.demand_bytes as f64 / MIB),
            mtp_drafted: sp.drafted,
            mtp_accepted: sp.accepted,
            mtp_decodes: sp.decodes,
            mtp_draft_s_tok: per(sp.draft_s),
            drafted_steps: sp.drafted_steps,
            loop_overhead_s_tok: per(self.loop_overhead_s),
            reasoning: reasoning.to_owned(),
            text: text.to_owned(),
        })
        .to_string()
    }
}

/// The `--csv` file: preamble once, a row per token, a summary after each generation (one
/// for a one-shot run, one per turn of a session), written by [`bmoe_metrics::MetricsWriter`].
pub struct CsvSink {
    path: PathBuf,
    w: MetricsWriter<BufWriter<File>>,
}

impl CsvSink {
    pub fn create(path: &Path, preamble: &Preamble) -> Result<CsvSink> {
        let f = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let w = MetricsWriter::new(BufWriter::new(f), &preamble.record())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(CsvSink {
            path: path.to_owned(),
            w,
        })
    }

    pub fn row(&mut self, r: &TokenRow) -> Result<()> {
        self.w
            .row(&r.metrics())
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// The `# summary` line of a generation (a session writes one per turn), flushed.
    pub fn summary(&mut self, summary: &Summary) -> Result<()> {
        self.w
            .summary(&summary.fields())
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
    fn status_fields_are_read_in_bytes() {
        let text = "Name:\tx\nVmRSS:\t  2048 kB\nRssAnon:\t 1024 kB\n";
        assert_eq!(kib_field(text, "VmRSS"), 2048 * 1024);
        assert_eq!(kib_field(text, "RssAnon"), 1024 * 1024);
        assert_eq!(kib_field(text, "VmSwap"), 0);
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
        assert_eq!(
            r.metrics().to_string().split(',').count(),
            bmoe_metrics::CSV_COLUMNS.split(',').count()
        );
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
    fn the_dense_probe_sees_touched_anonymous_pages() {
        let mut v = vec![1u8; 64 << 10];
        v[0] = 2;
        let mut p = DenseProbe::new([v.as_slice()]);
        let f = p.sample();
        assert!(f > 0.9 && f <= 1.0, "{f}");
        assert_eq!(DenseProbe::new([]).sample(), -1.0);
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
