//! `sluice analyze`: offline analyses of recorded runs.
//!
//! `analyze replay` replays a routing trace (`route_trace v1`) through a fixed-budget expert
//! cache at several budgets and policies; the simulation itself is the `trace` crate's.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use telemetry::replay::{MIB, ReplayStats, Workload};
use telemetry::{Phase, Policy, read_route_trace};

#[derive(Args, Debug)]
pub struct AnalyzeArgs {
    #[command(subcommand)]
    command: AnalyzeCommand,
}

#[derive(Subcommand, Debug)]
enum AnalyzeCommand {
    /// Replay a routing trace through an expert cache of each budget, under each policy.
    ///
    /// One lookup per distinct expert per layer batch (one layer's routing of one decode
    /// token, or of the whole prompt), a miss reads that layer's expert size, eviction runs
    /// after the batch and spares what the batch touched. hit_pct is decode-only; hit_all
    /// counts prefill too. Budgets are MiB (2^20 bytes). See docs/replay.md.
    Replay(ReplayArgs),
    /// Routing statistics of a trace: hot experts per layer, reuse distance, working set per
    /// window of steps, and previous-token vs static-hot predictability. Decode steps by
    /// default (--phase). See docs/telemetry-readers.md.
    Route(crate::analyze_route::RouteArgs),
    /// Summarize an I/O trace (`io_trace v1`, from `run --io-trace`): reads, requested vs read
    /// bytes (alignment waste), latency percentiles, per-lane reads and busy time, read sizes.
    ///
    /// Decode passes by default (--phase). With --csv (the same run's metrics file) also the
    /// decode bandwidth over the decode wall time. See docs/telemetry-readers.md.
    Io(crate::analyze_trace::IoArgs),
    /// Summarize a compute trace (`compute_trace v1`, from `run --compute-trace` or
    /// `--compute-trace-layers`): shares of the wall time by op and by layer, the nodes with
    /// the largest mean time, passes and major faults.
    ///
    /// Decode passes by default (--phase). See docs/telemetry-readers.md.
    Compute(crate::analyze_trace::ComputeArgs),
    /// Build the co-activation table `run --couple` reads ahead from: for each (layer, expert),
    /// the experts of the next MoE layers that followed it in the same token, and how often,
    /// from routing traces or ROUTE_TRACE streams; prints the recall of its predictions.
    /// See docs/policy.md.
    Pairs(crate::analyze_pairs::PairsArgs),
    /// Write one self-contained HTML page for a traced run's directory.
    ///
    /// DIR holds one `route_trace v1` file and optionally a `bmoe_metrics v2` CSV, an
    /// `io_trace v1` and a `compute_trace v1` file, each found by its first line. The page
    /// shows the run's facts, the decode step x layer routing matrix (hits and misses
    /// coloured, weights on hover), the most routed experts per layer, the per-token metrics
    /// with a bar chart, and the I/O and compute totals. See docs/telemetry-readers.md.
    View(crate::analyze_view::ViewArgs),
}

#[derive(Args, Debug)]
struct ReplayArgs {
    /// The trace (`route_trace v1` CSV, as written by `--route-trace`).
    trace: PathBuf,
    /// Cache budgets in MiB, comma-separated.
    #[arg(
        long = "budget-mb",
        value_delimiter = ',',
        required = true,
        value_name = "MIB,..."
    )]
    budget_mb: Vec<u64>,
    /// Eviction policies, comma-separated: lru, belady (the replay's own models), and the
    /// engine's expert cache itself under its policies: default (what `run` streams with),
    /// forecast, engine-lru, adaptive.
    #[arg(long, value_delimiter = ',', default_value = "lru,belady", value_parser = parse_policy, value_name = "POLICY,...")]
    policy: Vec<ReplayPolicy>,
    /// Also write `budget_mib,policy,hit_pct` rows (decode-only hit %) to this CSV file.
    #[arg(long, value_name = "OUT")]
    csv: Option<PathBuf>,
    /// Also draw decode hit % against budget, one curve per policy, as a PNG.
    #[arg(long, value_name = "OUT")]
    png: Option<PathBuf>,
    /// Model the engine's co-activation prefetch (`run --couple FILE`) in the engine-cache
    /// replays (default, forecast, engine-lru): after each decode batch, the K experts of the
    /// next layers the table predicts are read into the cache. A prefetched expert's lookup is
    /// a hit; its read is reported apart.
    #[arg(long, value_name = "FILE")]
    couple: Option<PathBuf>,
    /// With --couple: experts read ahead per layer.
    #[arg(long, default_value_t = 8, value_name = "K")]
    couple_k: usize,
    /// With --couple: MoE layers ahead (1 or 2).
    #[arg(long, default_value_t = 1, value_name = "D", value_parser = clap::value_parser!(u32).range(1..=2))]
    couple_d: u32,
    /// TrueType font for the chart's text (default: a system sans-serif font such as DejaVu
    /// Sans or Liberation Sans).
    #[arg(long, value_name = "FILE", requires = "png")]
    font: Option<PathBuf>,
}

/// A policy to replay: one the replay models itself, or the engine's cache under one of its
/// policies (named as asked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayPolicy {
    Model(Policy),
    Engine(&'static str, runtime::settings::stream::CachePolicy),
}

impl ReplayPolicy {
    pub fn name(self) -> &'static str {
        match self {
            ReplayPolicy::Model(p) => p.name(),
            ReplayPolicy::Engine(name, _) => name,
        }
    }
}

fn parse_policy(name: &str) -> Result<ReplayPolicy, String> {
    use runtime::settings::stream::CachePolicy;
    let engine = |n, p| Ok(ReplayPolicy::Engine(n, p));
    match name.trim().to_ascii_lowercase().as_str() {
        "default" => engine("default", CachePolicy::DEFAULT),
        "forecast" => engine("forecast", CachePolicy::Forecast),
        "engine-lru" => engine("engine-lru", CachePolicy::Lru),
        "adaptive" => engine("adaptive", CachePolicy::Adaptive),
        _ => Policy::from_name(name).map(ReplayPolicy::Model).ok_or_else(|| {
            format!(
                "unknown policy `{name}` (expected lru, belady, default, forecast, engine-lru or adaptive)"
            )
        }),
    }
}

/// Co-activation prefetch in a replay: the table, experts per layer, layers ahead.
pub type CoupleCfg = (store::Couple, usize, u32);

/// The engine's expert cache, driven by the replay; with a co-activation table it reads
/// ahead after each decode batch as the expert store does.
struct EngineCache<'c> {
    cache: store::ExpertCache<Box<dyn store::EvictionPolicy + Send>>,
    couple: Option<&'c CoupleCfg>,
    /// The MoE layers in order, and each one's expert bytes.
    layers: Vec<u32>,
    bytes: HashMap<u32, u64>,
    /// The batch: its layer, whether it is a decode batch, its distinct experts.
    layer: u32,
    decode: bool,
    routed: Vec<u32>,
}

impl telemetry::CacheModel for EngineCache<'_> {
    fn begin_batch(&mut self, layer: u32, decode: bool) {
        self.cache.begin_batch(layer);
        self.layer = layer;
        self.decode = decode;
        self.routed.clear();
    }
    fn lookup(&mut self, key: (u32, u32), bytes: u64) -> bool {
        self.routed.push(key.1);
        // (Slots are charged, never allocated: the replay fills none.)
        self.cache.lookup(key, bytes as usize) == store::Lookup::Hit
    }
    fn touch(&mut self, key: (u32, u32)) {
        self.cache.touch(key);
    }
    fn end_batch(&mut self) {
        if let (Some((table, k, depth)), true) = (self.couple, self.decode)
            && let Some(pos) = self.layers.iter().position(|&l| l == self.layer)
        {
            for d in 1..=*depth {
                let Some(&next) = self.layers.get(pos + d as usize) else {
                    break;
                };
                let size = self.bytes.get(&next).copied().unwrap_or(0) as usize;
                for e in table.predict(self.layer, &self.routed, d, *k) {
                    // (The read is only counted: the replay fills no slot.)
                    let _ = self.cache.prefetch((next, e), size);
                }
            }
        }
        self.cache.end_batch();
    }
    fn resident_bytes(&self) -> u64 {
        self.cache.used_bytes()
    }
}

/// Replays `trace` through the engine's cache of `bytes` under `policy` (reading ahead from
/// `couple` when given); with the cache's own counters (prefetches).
pub fn replay_engine(
    workload: &Workload,
    trace: &telemetry::RouteTrace,
    name: &'static str,
    policy: runtime::settings::stream::CachePolicy,
    bytes: u64,
    couple: Option<&CoupleCfg>,
) -> (ReplayStats, store::CacheStats) {
    let mut layers: Vec<u32> = trace.layers.keys().copied().collect();
    layers.sort_unstable();
    let p = policy.build(&layers, trace.n_expert_used, trace.n_expert);
    let mut cache = EngineCache {
        cache: store::ExpertCache::new(bytes, p),
        couple,
        bytes: trace
            .layers
            .iter()
            .map(|(&l, i)| (l, i.expert_bytes))
            .collect(),
        layers,
        layer: 0,
        decode: false,
        routed: Vec::new(),
    };
    let stats = workload.replay_model(name, &mut cache, bytes);
    (stats, cache.cache.stats())
}

pub fn run(args: AnalyzeArgs) -> Result<()> {
    match args.command {
        AnalyzeCommand::Replay(args) => replay(args),
        AnalyzeCommand::Route(args) => crate::analyze_route::run(args),
        AnalyzeCommand::Io(args) => crate::analyze_trace::run_io(args),
        AnalyzeCommand::Compute(args) => crate::analyze_trace::run_compute(args),
        AnalyzeCommand::View(args) => crate::analyze_view::run(args),
        AnalyzeCommand::Pairs(args) => crate::analyze_pairs::run(args),
    }
}

fn replay(args: ReplayArgs) -> Result<()> {
    let mut budgets = args.budget_mb.clone();
    budgets.sort_unstable();
    budgets.dedup();
    let mut policies = args.policy.clone();
    policies.dedup();
    if budgets.contains(&0) {
        bail!("--budget-mb: budgets must be positive");
    }

    let trace = read_route_trace(&args.trace)?;
    let workload = Workload::new(&trace);
    let couple = match &args.couple {
        Some(path) => Some((store::Couple::read(path)?, args.couple_k, args.couple_d)),
        None => None,
    };
    let mut prefetched: Vec<(u64, &'static str, store::CacheStats)> = Vec::new();
    let prefill_batches = workload
        .batches()
        .iter()
        .filter(|b| b.phase == Phase::Prefill)
        .count();
    let mut results: Vec<(u64, ReplayStats)> = Vec::new();
    for &policy in &policies {
        for &mib in &budgets {
            let bytes = mib
                .checked_mul(MIB)
                .with_context(|| format!("--budget-mb {mib}: too large"))?;
            results.push((
                mib,
                match policy {
                    ReplayPolicy::Model(p) => workload.replay(p, bytes),
                    ReplayPolicy::Engine(name, p) => {
                        let (stats, cache) =
                            replay_engine(&workload, &trace, name, p, bytes, couple.as_ref());
                        if couple.is_some() {
                            prefetched.push((mib, name, cache));
                        }
                        stats
                    }
                },
            ));
        }
    }
    // Table order: budget, then policy as given.
    results.sort_by_key(|(mib, s)| (*mib, policies.iter().position(|p| p.name() == s.policy)));

    let mut out = String::new();
    let _ = writeln!(out, "{}", trace_line(&args.trace, &trace));
    let _ = writeln!(
        out,
        "layer batches: {} ({} prefill + {} decode), {} decoded tokens; one token cycle {:.1} MiB",
        workload.batches().len(),
        prefill_batches,
        workload.batches().len() - prefill_batches,
        trace.decode_tokens(),
        trace.token_cycle_bytes() as f64 / MIB as f64
    );
    let _ = writeln!(
        out,
        "{:>10}  {:<10} {:>8} {:>8} {:>15} {:>12}",
        "budget_mib", "policy", "hit_pct", "hit_all", "read_MiB/token", "read_MiB_all"
    );
    for (mib, s) in &results {
        let _ = writeln!(
            out,
            "{:>10}  {:<10} {:>8.3} {:>8.3} {:>15.2} {:>12.1}",
            mib,
            s.policy,
            s.decode.hit_pct(),
            s.total().hit_pct(),
            s.decode_miss_mib_per_token(),
            s.total().miss_bytes as f64 / MIB as f64
        );
    }
    let _ = writeln!(
        out,
        "(hit_pct and read_MiB/token: decode only; hit_all and read_MiB_all: prefill too)"
    );
    if !prefetched.is_empty() {
        let _ = writeln!(
            out,
            "co-activation prefetch ({} experts, {} layer(s) ahead), engine-cache policies:",
            args.couple_k, args.couple_d
        );
        let _ = writeln!(
            out,
            "{:>10}  {:<10} {:>14} {:>13} {:>15}",
            "budget_mib", "policy", "prefetch/token", "prefetch_hit%", "total_MiB/token"
        );
        let tokens = trace.decode_tokens().max(1) as f64;
        for (mib, name, c) in &prefetched {
            let demand = results
                .iter()
                .find(|(m, s)| m == mib && s.policy == *name)
                .map_or(0.0, |(_, s)| s.decode_miss_mib_per_token());
            let pf = c.prefetch_bytes as f64 / MIB as f64 / tokens;
            let _ = writeln!(
                out,
                "{:>10}  {:<10} {:>14.2} {:>12.1}% {:>15.2}",
                mib,
                name,
                pf,
                if c.prefetches == 0 {
                    0.0
                } else {
                    100.0 * c.prefetch_hits as f64 / c.prefetches as f64
                },
                demand + pf
            );
        }
        let _ = writeln!(
            out,
            "(prefetch/token: MiB read ahead per decoded token (decode batches read ahead); \
             prefetch_hit%: reads ahead a lookup used; total: demand misses + reads ahead)"
        );
    }
    print!("{out}");

    if let Some(path) = &args.csv {
        let mut csv = String::from("budget_mib,policy,hit_pct\n");
        for (mib, s) in &results {
            let _ = writeln!(csv, "{mib},{},{:.3}", s.policy, s.decode.hit_pct());
        }
        std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.png {
        let font = crate::plot::load_font(args.font.as_deref())?;
        draw_png(path, &policies, &results, font)
            .with_context(|| format!("drawing {}", path.display()))?;
    }
    Ok(())
}

/// The first line of a report on a routing trace: the file and the model it describes.
pub(crate) fn trace_line(path: &Path, trace: &telemetry::RouteTrace) -> String {
    format!(
        "trace: {} ({} {}, {} layers with experts, {} experts, top-{})",
        path.display(),
        trace.arch,
        trace.model,
        trace.layers.len(),
        trace.n_expert,
        trace.n_expert_used
    )
}

fn draw_png(
    path: &Path,
    policies: &[ReplayPolicy],
    results: &[(u64, ReplayStats)],
    font: &'static [u8],
) -> Result<()> {
    use plotters::prelude::*;

    let max_mib = results.iter().map(|(m, _)| *m).max().unwrap_or(1) as f64;
    let root = crate::plot::canvas(path, (960, 600), font)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Expert-cache replay: decode hit % vs budget",
            ("sans-serif", 24),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..max_mib * 1.05, 0.0..100.0)?;
    chart
        .configure_mesh()
        .x_desc("cache budget (MiB)")
        .y_desc("decode hit %")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()?;
    let colors = crate::plot::COLORS;
    for (i, &policy) in policies.iter().enumerate() {
        let color = colors[i % colors.len()];
        let points: Vec<(f64, f64)> = results
            .iter()
            .filter(|(_, s)| s.policy == policy.name())
            .map(|(m, s)| (*m as f64, s.decode.hit_pct()))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(policy.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
