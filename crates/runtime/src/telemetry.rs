//! Run telemetry as BigMoeOnEdge's telemetry contract defines it (docs/telemetry.md): one sample per decoded token (time,
//! reads, cache, faults, CPU, memory), the `BMOE_LOAD` / `BMOE_PROGRESS` lines of `--progress`,
//! and the `--csv` sink (`# bmoe_metrics v2` preamble, the per-token rows, the `# summary`
//! trailer). The formats themselves live in `telemetry` (`bmoe_metrics`, `bmoe_session`): the
//! types here turn into their records (`TokenRow::metrics`, `Preamble::record`) and are written
//! through them.
//!
//! Where the spec speaks of `llama_decode`, sluice's decode call (`Engine::forward` of one
//! token) is meant: `wall_ms` brackets it and nothing else.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::Instant;

use telemetry::bmoe_metrics::{self, MetricsRow, MetricsWriter};

use crate::error::{Context, Result};
use crate::events::{Summary, TokenRow};

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

impl TokenRow {
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

impl Summary {
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

    fn finished(&mut self, o: &crate::events::Outcome) -> Result<()> {
        self.summary(&o.summary)
    }
}

/// Which pass of a turn a trace row belongs to: the trace formats' own type (one definition
/// for the writers and the readers in the `telemetry` crate).
pub use telemetry::Phase;

/// The `--io-trace` and `--compute-trace` writers live in [`crate::traces`]; named here too for
/// the modules that reach them through this one.
pub use crate::traces::{ComputeTrace, IoTrace};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_bytes() {
        let text = "Name:\tx\nVmRSS:\t  2048 kB\nRssAnon:\t 1024 kB\n";
        assert_eq!(kib_field(text, "VmRSS"), 2048 * 1024);
        assert_eq!(kib_field(text, "RssAnon"), 1024 * 1024);
        assert_eq!(kib_field(text, "VmSwap"), 0);
    }

    #[test]
    fn a_row_has_every_column() {
        let r = TokenRow::default();
        assert_eq!(
            r.metrics().to_string().split(',').count(),
            bmoe_metrics::CSV_COLUMNS.split(',').count()
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
}
