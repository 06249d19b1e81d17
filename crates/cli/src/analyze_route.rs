//! `sluice analyze route`: routing statistics of a `route_trace v1` file — hot experts per
//! layer, reuse distance, working set per window of steps, and how well two simple predictors
//! guess the next step's experts. The computations are the `trace` crate's
//! (`telemetry::analysis`); this file reads the arguments and prints or draws the results.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use telemetry::analysis::{PhaseFilter, REUSE_BUCKETS, RouteAnalysis, analyze};
use telemetry::read_route_trace;
use telemetry::replay::MIB;

#[derive(clap::Args, Debug)]
pub struct RouteArgs {
    /// The trace (`route_trace v1` CSV, as written by `--route-trace`).
    trace: PathBuf,
    /// Which tokens to analyse: decode (generated tokens), prefill (the prompt) or all.
    #[arg(long, value_enum, default_value = "decode")]
    phase: PhaseArg,
    /// Hot experts listed per layer.
    #[arg(long, default_value_t = 8, value_name = "N")]
    top: usize,
    /// Also draw the reuse-distance histogram and the working-set curve as a PNG.
    #[arg(long, value_name = "OUT")]
    png: Option<PathBuf>,
    /// TrueType font for the chart's text (default: a system sans-serif font such as DejaVu
    /// Sans or Liberation Sans).
    #[arg(long, value_name = "FILE", requires = "png")]
    font: Option<PathBuf>,
    /// Print the results as one JSON object instead of the text report.
    #[arg(long)]
    json: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum PhaseArg {
    Decode,
    Prefill,
    All,
}

impl From<PhaseArg> for PhaseFilter {
    fn from(p: PhaseArg) -> Self {
        match p {
            PhaseArg::Decode => PhaseFilter::Decode,
            PhaseArg::Prefill => PhaseFilter::Prefill,
            PhaseArg::All => PhaseFilter::All,
        }
    }
}

pub fn run(args: RouteArgs) -> Result<()> {
    if args.top == 0 {
        bail!("--top: expected at least 1");
    }
    let trace = read_route_trace(&args.trace)?;
    let a = analyze(&trace, args.phase.into(), args.top);
    if args.json {
        println!("{}", to_json(&args.trace, &trace, &a));
    } else {
        print!("{}", report(&args.trace, &trace, &a));
    }
    if let Some(path) = &args.png {
        let font = crate::plot::load_font(args.font.as_deref())?;
        draw_png(path, &a, font).with_context(|| format!("drawing {}", path.display()))?;
    }
    Ok(())
}

fn mib(bytes: f64) -> f64 {
    bytes / MIB as f64
}

/// A percentage with one decimal, or `-` when undefined.
fn pct_text(p: Option<f64>, decimals: usize) -> String {
    p.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
}

fn report(path: &Path, trace: &telemetry::RouteTrace, a: &RouteAnalysis) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", crate::analyze::trace_line(path, trace));
    let _ = writeln!(
        out,
        "phase: {} ({} steps, {} routings, {} distinct layer-expert pairs)",
        a.phase.name(),
        a.steps,
        a.routings,
        a.distinct_pairs
    );

    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "== hot experts: the {} most-routed experts per layer (expert:share of the layer's routings) ==",
        a.hot.layers.iter().map(|l| l.top.len()).max().unwrap_or(0)
    );
    let _ = writeln!(
        out,
        "concentration: a layer's {} most-routed experts (top 10% of {}) take {}% of its routings (mean over {} layers)",
        a.hot.decile_experts,
        trace.n_expert,
        pct_text(a.hot.concentration_pct, 1),
        a.hot.layers.len()
    );
    let width = a.hot.layers.iter().map(|l| l.top.len()).max().unwrap_or(0);
    let _ = write!(out, "{:>5} {:>9}", "layer", "routings");
    for i in 0..width {
        let _ = write!(out, " {:>11}", format!("top-{}", i + 1));
    }
    let _ = writeln!(out);
    for l in &a.hot.layers {
        let _ = write!(out, "{:>5} {:>9}", l.layer, l.routings);
        for &(e, c) in &l.top {
            let _ = write!(out, " {:>11}", format!("{e}:{:.1}%", l.share_pct(c)));
        }
        let _ = writeln!(out);
    }

    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "== reuse distance: steps since the layer last routed the expert (cold = first use) =="
    );
    let _ = writeln!(out, "{:>8} {:>10} {:>8}", "distance", "routings", "share%");
    for (i, label) in REUSE_BUCKETS.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:>8} {:>10} {:>8.2}",
            label,
            a.reuse.counts[i],
            a.reuse.share_pct(i)
        );
    }

    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "== working set: distinct layer-expert pairs in W consecutive steps (sliding windows) =="
    );
    let _ = writeln!(
        out,
        "{:>4} {:>8} {:>11} {:>10}",
        "W", "windows", "mean_pairs", "mean_MiB"
    );
    for p in &a.working_set {
        let _ = writeln!(
            out,
            "{:>4} {:>8} {:>11} {:>10}",
            p.window,
            p.windows,
            p.mean_pairs
                .map_or_else(|| "-".to_string(), |v| format!("{v:.1}")),
            p.mean_bytes
                .map_or_else(|| "-".to_string(), |v| format!("{:.1}", mib(v)))
        );
    }

    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "== predictability: share of routings a predictor names in advance =="
    );
    let _ = writeln!(
        out,
        "{:<24} {:>10} {:>10} {:>7}",
        "predictor", "hits", "scored", "hit%"
    );
    let rows = [
        ("previous-token".to_string(), a.previous_token),
        (format!("static-hot (k={})", a.static_k), a.static_hot),
    ];
    for (name, p) in rows {
        let _ = writeln!(
            out,
            "{:<24} {:>10} {:>10} {:>7}",
            name,
            p.hits,
            p.scored,
            pct_text(p.pct(), 2)
        );
    }
    let _ = writeln!(
        out,
        "(previous-token: the layer's experts at the previous step; static-hot: the layer's {} most-routed experts over all steps, in hindsight)",
        a.static_k
    );
    out
}

fn to_json(path: &Path, trace: &telemetry::RouteTrace, a: &RouteAnalysis) -> Value {
    let layers: Vec<Value> = a
        .hot
        .layers
        .iter()
        .map(|l| {
            let top: Vec<Value> = l
                .top
                .iter()
                .map(|&(e, c)| json!({"expert": e, "routings": c, "share_pct": l.share_pct(c)}))
                .collect();
            json!({"layer": l.layer, "routings": l.routings, "top": top})
        })
        .collect();
    let buckets: Vec<Value> = REUSE_BUCKETS
        .iter()
        .enumerate()
        .map(|(i, label)| {
            json!({"distance": label, "routings": a.reuse.counts[i], "share_pct": a.reuse.share_pct(i)})
        })
        .collect();
    let working_set: Vec<Value> = a
        .working_set
        .iter()
        .map(|p| {
            json!({
                "window": p.window,
                "windows": p.windows,
                "mean_pairs": p.mean_pairs,
                "mean_mib": p.mean_bytes.map(mib),
            })
        })
        .collect();
    json!({
        "trace": path.display().to_string(),
        "model": trace.model,
        "arch": trace.arch,
        "n_layer": trace.n_layer,
        "n_expert": trace.n_expert,
        "n_expert_used": trace.n_expert_used,
        "phase": a.phase.name(),
        "steps": a.steps,
        "routings": a.routings,
        "distinct_pairs": a.distinct_pairs,
        "hot_experts": {
            "decile_experts": a.hot.decile_experts,
            "concentration_pct": a.hot.concentration_pct,
            "layers": layers,
        },
        "reuse_distance": {
            "routings": a.reuse.total(),
            "buckets": buckets,
        },
        "working_set": working_set,
        "predictability": {
            "previous_token": {
                "hits": a.previous_token.hits,
                "scored": a.previous_token.scored,
                "pct": a.previous_token.pct(),
            },
            "static_hot": {
                "k": a.static_k,
                "hits": a.static_hot.hits,
                "scored": a.static_hot.scored,
                "pct": a.static_hot.pct(),
            },
        },
    })
}

/// Two panels: the reuse-distance shares as bars, and the mean working set (MiB) against the
/// window size on a log2 axis.
fn draw_png(path: &Path, a: &RouteAnalysis, font: &'static [u8]) -> Result<()> {
    use plotters::prelude::*;

    let root = crate::plot::canvas(path, (1280, 560), font)?;
    let panels = root.split_evenly((1, 2));
    let blue = crate::plot::COLORS[0];

    let max_share = (0..REUSE_BUCKETS.len())
        .map(|i| a.reuse.share_pct(i))
        .fold(0.0f64, f64::max);
    let mut bars = ChartBuilder::on(&panels[0])
        .caption(
            format!("Reuse distance ({} steps)", a.phase.name()),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5f64..9.5f64, 0.0..(max_share * 1.1).max(1.0))?;
    bars.configure_mesh()
        .disable_x_mesh()
        .x_labels(REUSE_BUCKETS.len())
        .x_desc("steps since the layer last routed the expert")
        .y_desc("share of routings (%)")
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && (0.0..REUSE_BUCKETS.len() as f64).contains(&i) {
                REUSE_BUCKETS[i as usize].to_string()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;
    bars.draw_series((0..REUSE_BUCKETS.len()).map(|i| {
        let x = i as f64;
        Rectangle::new(
            [(x - 0.4, 0.0), (x + 0.4, a.reuse.share_pct(i))],
            blue.filled(),
        )
    }))?;

    let points: Vec<(f64, f64)> = a
        .working_set
        .iter()
        .filter_map(|p| Some(((p.window as f64).log2(), mib(p.mean_bytes?))))
        .collect();
    let max_x = points.iter().map(|p| p.0).fold(1.0f64, f64::max);
    let max_y = points.iter().map(|p| p.1).fold(1.0f64, f64::max);
    let mut curve = ChartBuilder::on(&panels[1])
        .caption(
            "Working set: mean distinct experts in W steps",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.2f64..max_x + 0.2, 0.0..max_y * 1.1)?;
    curve
        .configure_mesh()
        .x_desc("window W (steps, log scale)")
        .y_desc("mean MiB of experts in the window")
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 {
                format!("{}", 2f64.powf(i))
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;
    curve.draw_series(LineSeries::new(points.clone(), blue.stroke_width(2)))?;
    curve.draw_series(points.iter().map(|&p| Circle::new(p, 4, blue.filled())))?;
    root.present()?;
    Ok(())
}
