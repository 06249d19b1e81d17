//! `sluice analyze io` and `sluice analyze compute`: readers of the decode traces that
//! `sluice run --io-trace` (`# io_trace v1`) and `--compute-trace` / `--compute-trace-layers`
//! (`# compute_trace v1`) write, as BigMoeOnEdge's telemetry contract defines them (docs/telemetry.md, "Traces").
//!
//! The `telemetry` crate reads the traces (`telemetry::io_trace`, `telemetry::compute_trace`),
//! the runtime the metrics CSV (`runtime::read`) and computes the figures (`runtime::report`);
//! the commands print them as tables or as one JSON object, and can draw a chart.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use runtime::Choice;
use runtime::read::parse_metrics_wall;
use runtime::report::{
    ComputeReport, IoReport, MIB, PhaseSel, SIZE_LABELS, Share, compute_report, io_report,
};
use serde_json::{Value, json};
use telemetry::compute_trace::parse_compute_trace;
use telemetry::io_trace::parse_io_trace;

use crate::args::choice;

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn io_json(r: &IoReport, file: &str) -> Value {
    let [p50, p90, p99, max] = r.latency_ns.map(ms);
    json!({
        "trace": file,
        "phase": r.phase.name(),
        "reads": r.reads,
        "spec_reads": r.spec_reads,
        "passes": r.passes,
        "req_bytes": r.req_bytes,
        "read_bytes": r.read_bytes,
        "waste_pct": r.waste_pct(),
        "read_bytes_per_pass": r.bytes_per_pass(),
        "latency_ms": {"p50": p50, "p90": p90, "p99": p99, "max": max},
        "lanes": r.lanes.iter().map(|l| json!({
            "lane": l.lane,
            "reads": l.reads,
            "read_bytes": l.read_bytes,
            "busy_ms": l.busy_ms,
        })).collect::<Vec<_>>(),
        "sizes": SIZE_LABELS.iter().zip(&r.sizes).map(|(label, (n, b))| json!({
            "bucket": label,
            "reads": n,
            "read_bytes": b,
        })).collect::<Vec<_>>(),
        "latency_hist": {
            "width_ms": ms(r.hist.width_ns),
            "counts": r.hist.counts,
        },
        "decode_bandwidth": r.bandwidth.as_ref().map(|b| json!({
            "csv_rows": b.csv.rows,
            "csv_wall_ms": b.csv.wall_ms,
            "csv_read_bytes": b.csv.read_bytes,
            "trace_read_bytes": b.trace_read_bytes,
            "mib_per_s": b.mib_per_s,
        })),
    })
}

fn io_text(r: &IoReport, file: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "io trace: {file} (phase {}): {} reads ({} speculative) over {} passes",
        r.phase.name(),
        r.reads,
        r.spec_reads,
        r.passes
    );
    let _ = writeln!(
        o,
        "bytes: requested {:.3} MiB, read {:.3} MiB, alignment waste {:.2}%; {:.3} MiB read per pass",
        r.req_bytes as f64 / MIB,
        r.read_bytes as f64 / MIB,
        r.waste_pct(),
        r.bytes_per_pass() / MIB
    );
    let [p50, p90, p99, max] = r.latency_ns.map(ms);
    let _ = writeln!(
        o,
        "latency ms: p50 {p50:.3}  p90 {p90:.3}  p99 {p99:.3}  max {max:.3}"
    );
    if let Some(b) = &r.bandwidth {
        let _ = writeln!(
            o,
            "decode bandwidth: {:.3} MiB read by the trace over {:.3} s of decode wall ({} CSV rows, which read {:.3} MiB): {:.1} MiB/s",
            b.trace_read_bytes as f64 / MIB,
            b.csv.wall_ms / 1e3,
            b.csv.rows,
            b.csv.read_bytes as f64 / MIB,
            b.mib_per_s
        );
    }
    let _ = writeln!(
        o,
        "{:>6} {:>8} {:>12} {:>12}",
        "lane", "reads", "read_MiB", "busy_ms"
    );
    for l in &r.lanes {
        let _ = writeln!(
            o,
            "{:>6} {:>8} {:>12.3} {:>12.3}",
            l.lane,
            l.reads,
            l.read_bytes as f64 / MIB,
            l.busy_ms
        );
    }
    let _ = writeln!(o, "{:>8} {:>8} {:>12}", "size", "reads", "read_MiB");
    for (label, (n, b)) in SIZE_LABELS.iter().zip(&r.sizes) {
        let _ = writeln!(o, "{label:>8} {n:>8} {:>12.3}", *b as f64 / MIB);
    }
    o
}

fn share_json(s: &[Share]) -> Vec<Value> {
    s.iter()
        .map(|s| {
            json!({
                "key": s.key,
                "rows": s.rows,
                "wall_ms": ms(s.wall_ns),
                "pct": s.pct,
                "majflt": s.majflt,
            })
        })
        .collect()
}

fn compute_json(r: &ComputeReport, file: &str) -> Value {
    json!({
        "trace": file,
        "phase": r.phase.name(),
        "granularity": if r.layer_file { "layer" } else { "node" },
        "rows": r.rows,
        "passes": r.passes,
        "wall_ms": ms(r.wall_ns),
        "wall_ms_per_pass": if r.passes == 0 { 0.0 } else { ms(r.wall_ns) / r.passes as f64 },
        "majflt": r.majflt,
        "by_op": share_json(&r.by_op),
        "by_layer": share_json(&r.by_layer),
        "top": r.top.iter().map(|t| json!({
            "name": t.name,
            "op": t.op,
            "layer": t.layer,
            "passes": t.passes,
            "mean_ms": t.mean_ns / 1e6,
            "wall_ms": ms(t.wall_ns),
            "majflt": t.majflt,
        })).collect::<Vec<_>>(),
    })
}

fn compute_text(r: &ComputeReport, file: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "compute trace: {file} (phase {}, {} rows): {} rows over {} passes, {:.3} ms ({:.3} ms/pass), {} major faults",
        r.phase.name(),
        if r.layer_file {
            "layer-segment"
        } else {
            "per-node"
        },
        r.rows,
        r.passes,
        ms(r.wall_ns),
        if r.passes == 0 {
            0.0
        } else {
            ms(r.wall_ns) / r.passes as f64
        },
        r.majflt
    );
    for (title, s) in [("op", &r.by_op), ("layer", &r.by_layer)] {
        let _ = writeln!(
            o,
            "{title:<16} {:>8} {:>12} {:>8} {:>8}",
            "rows", "wall_ms", "share%", "majflt"
        );
        for s in s.iter() {
            let _ = writeln!(
                o,
                "{:<16} {:>8} {:>12.3} {:>8.2} {:>8}",
                s.key,
                s.rows,
                ms(s.wall_ns),
                s.pct,
                s.majflt
            );
        }
    }
    let _ = writeln!(
        o,
        "{:<20} {:<14} {:>6} {:>7} {:>12} {:>8}",
        "top node", "op", "layer", "passes", "mean_ms", "majflt"
    );
    for t in &r.top {
        let _ = writeln!(
            o,
            "{:<20} {:<14} {:>6} {:>7} {:>12.4} {:>8}",
            t.name,
            t.op,
            t.layer,
            t.passes,
            t.mean_ns / 1e6,
            t.majflt
        );
    }
    o
}

// ---- the commands ----

#[derive(clap::Args, Debug)]
pub struct IoArgs {
    /// The trace (`io_trace v1`, as written by `sluice run --io-trace`).
    trace: PathBuf,
    /// Which forward passes to report.
    #[arg(long, value_parser = choice::<PhaseSel>(), default_value_t = PhaseSel::Decode)]
    phase: PhaseSel,
    /// The `--csv` metrics file (`bmoe_metrics v2`) of the same run: adds the decode bandwidth
    /// (the trace's decode bytes over the rows' summed wall_ms).
    #[arg(long, value_name = "METRICS.csv")]
    csv: Option<PathBuf>,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
    /// Also draw the read-latency histogram as a PNG.
    #[arg(long, value_name = "OUT")]
    png: Option<PathBuf>,
    /// TrueType font for the chart's text (default: a system sans-serif font).
    #[arg(long, value_name = "FILE", requires = "png")]
    font: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct ComputeArgs {
    /// The trace (`compute_trace v1`, as written by `sluice run --compute-trace` or
    /// `--compute-trace-layers`).
    trace: PathBuf,
    /// Which forward passes to report.
    #[arg(long, value_parser = choice::<PhaseSel>(), default_value_t = PhaseSel::Decode)]
    phase: PhaseSel,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
    /// Also draw the shares of the wall time by op (per-node files) and by layer as a PNG.
    #[arg(long, value_name = "OUT")]
    png: Option<PathBuf>,
    /// TrueType font for the chart's text (default: a system sans-serif font).
    #[arg(long, value_name = "FILE", requires = "png")]
    font: Option<PathBuf>,
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

pub fn run_io(args: IoArgs) -> Result<()> {
    let file = args.trace.display().to_string();
    let reads = parse_io_trace(&file, &read_text(&args.trace)?)?;
    let metrics = match &args.csv {
        Some(p) => Some(parse_metrics_wall(
            &p.display().to_string(),
            &read_text(p)?,
        )?),
        None => None,
    };
    let report = io_report(&reads, args.phase, metrics);
    if args.json {
        println!("{}", io_json(&report, &file));
    } else {
        print!("{}", io_text(&report, &file));
    }
    if let Some(path) = &args.png {
        if report.reads == 0 {
            bail!("--png: no {} reads in {file} to draw", args.phase.name());
        }
        let font = crate::plot::load_font(args.font.as_deref())?;
        draw_io_png(path, &report, font).with_context(|| format!("drawing {}", path.display()))?;
    }
    Ok(())
}

pub fn run_compute(args: ComputeArgs) -> Result<()> {
    let file = args.trace.display().to_string();
    let nodes = parse_compute_trace(&file, &read_text(&args.trace)?)?;
    let report = compute_report(&nodes, args.phase);
    if args.json {
        println!("{}", compute_json(&report, &file));
    } else {
        print!("{}", compute_text(&report, &file));
    }
    if let Some(path) = &args.png {
        if report.rows == 0 {
            bail!("--png: no {} rows in {file} to draw", args.phase.name());
        }
        let font = crate::plot::load_font(args.font.as_deref())?;
        draw_compute_png(path, &report, font)
            .with_context(|| format!("drawing {}", path.display()))?;
    }
    Ok(())
}

// ---- charts ----

const BAR: plotters::style::RGBColor = crate::plot::COLORS[0];

fn draw_io_png(path: &Path, r: &IoReport, font: &'static [u8]) -> Result<()> {
    use plotters::prelude::*;

    let width = ms(r.hist.width_ns);
    let n = r.hist.counts.len();
    let top = r.hist.counts.iter().copied().max().unwrap_or(1).max(1) as f64;
    let root = crate::plot::canvas(path, (960, 600), font)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Read latency ({}, {} reads; p50 {:.3} ms, p99 {:.3} ms)",
                r.phase.name(),
                r.reads,
                ms(r.latency_ns[0]),
                ms(r.latency_ns[2])
            ),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..width * n as f64, 0.0..top * 1.1)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(format!("latency (ms, buckets of {width} ms)"))
        .y_desc("reads")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()?;
    chart.draw_series(r.hist.counts.iter().enumerate().map(|(i, &c)| {
        let x0 = i as f64 * width;
        Rectangle::new(
            [(x0 + width * 0.05, 0.0), (x0 + width * 0.95, c as f64)],
            BAR.filled(),
        )
    }))?;
    root.present()?;
    Ok(())
}

/// A bar chart of shares (`(label, pct)`) on `area`.
fn draw_shares(
    area: &crate::plot::Area<'_>,
    title: &str,
    x_desc: &str,
    bars: &[(String, f64)],
) -> Result<()> {
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};

    let n = bars.len().max(2) as u32;
    let top = bars.iter().map(|b| b.1).fold(1.0f64, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((0u32..n - 1).into_segmented(), 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => bars
                .get(*i as usize)
                .map(|b| b.0.clone())
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .x_desc(x_desc)
        .y_desc("share of wall time (%)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 12))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    let right = |i: u32| {
        if i + 1 >= n {
            SegmentValue::Last
        } else {
            SegmentValue::Exact(i + 1)
        }
    };
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        let i = i as u32;
        let mut bar = Rectangle::new(
            [(SegmentValue::Exact(i), 0.0), (right(i), b.1)],
            BAR.filled(),
        );
        bar.set_margin(0, 0, 6, 6);
        bar
    }))?;
    let style =
        TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        Text::new(
            format!("{:.1}", b.1),
            (SegmentValue::CenterOf(i as u32), b.1),
            style.clone(),
        )
    }))?;
    Ok(())
}

fn draw_compute_png(path: &Path, r: &ComputeReport, font: &'static [u8]) -> Result<()> {
    let bars =
        |s: &[Share]| -> Vec<(String, f64)> { s.iter().map(|s| (s.key.clone(), s.pct)).collect() };
    let what = format!("{}, {} passes", r.phase.name(), r.passes);
    if r.layer_file {
        let root = crate::plot::canvas(path, (960, 600), font)?;
        draw_shares(
            &root,
            &format!("Wall time by layer segment ({what})"),
            "layer (other = before layer 0 and after the last)",
            &bars(&r.by_layer),
        )?;
        root.present()?;
    } else {
        let root = crate::plot::canvas(path, (960, 900), font)?;
        let panels = root.split_evenly((2, 1));
        draw_shares(
            &panels[0],
            &format!("Wall time by op ({what})"),
            "op",
            &bars(&r.by_op),
        )?;
        draw_shares(
            &panels[1],
            "Wall time by layer",
            "layer (other = no layer: embeddings, output head)",
            &bars(&r.by_layer),
        )?;
        root.present()?;
    }
    Ok(())
}
