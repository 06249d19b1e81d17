//! `sluice analyze view DIR --out page.html`: one self-contained HTML page for a traced run.
//!
//! DIR holds one run's files, each recognised by its first line, not its name: a
//! `route_trace v1` file (required), and optionally a `bmoe_metrics v2` CSV, an `io_trace v1`
//! and a `compute_trace v1` file. The page shows the run's facts, the decode step × layer
//! routing matrix (hits and misses coloured), the most routed experts per layer, the per-token
//! metrics with a stacked bar chart drawn as inline SVG, and the I/O and compute totals. It
//! has inline CSS and no script, and refers to nothing outside itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use runtime::read::LooseTable as Table;
use telemetry::{Phase, RouteRow, RouteTrace, read_route_trace};

#[derive(clap::Args, Debug)]
pub struct ViewArgs {
    /// The run's directory: one `route_trace v1` file, and optionally one `bmoe_metrics v2`
    /// CSV, one `io_trace v1` and one `compute_trace v1` file (found by their first line).
    dir: PathBuf,
    /// The HTML page to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Show at most this many decode steps in the matrix and the per-token table.
    #[arg(long, value_name = "N", default_value_t = 256)]
    max_steps: usize,
}

const MIB: f64 = (1u64 << 20) as f64;

/// The kinds of file a run's directory may hold, by their first line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Route,
    Metrics,
    Io,
    Compute,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Route, Kind::Metrics, Kind::Io, Kind::Compute];

    fn magic(self) -> &'static str {
        match self {
            Kind::Route => "# route_trace v1",
            Kind::Metrics => "# bmoe_metrics v2",
            Kind::Io => "# io_trace v1",
            Kind::Compute => "# compute_trace v1",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Kind::Route => "route traces",
            Kind::Metrics => "metrics CSVs",
            Kind::Io => "I/O traces",
            Kind::Compute => "compute traces",
        }
    }
}

/// The first line of a file (at most 256 bytes of it), without its line ending; `None` for a
/// file that cannot be read.
fn first_line(path: &Path) -> Option<String> {
    let f = File::open(path).ok()?;
    let mut line = Vec::new();
    BufReader::new(f.take(256))
        .read_until(b'\n', &mut line)
        .ok()?;
    let text = String::from_utf8_lossy(&line);
    Some(text.trim_end_matches(['\r', '\n']).to_string())
}

/// The run's files, one optional path per kind.
#[derive(Debug, Default)]
struct RunFiles {
    route: PathBuf,
    metrics: Option<PathBuf>,
    io: Option<PathBuf>,
    compute: Option<PathBuf>,
}

fn find_files(dir: &Path) -> Result<RunFiles> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    let mut found: BTreeMap<usize, Vec<PathBuf>> = BTreeMap::new();
    for path in entries {
        let Some(line) = first_line(&path) else {
            continue;
        };
        if let Some(i) = Kind::ALL.iter().position(|k| k.magic() == line) {
            found.entry(i).or_default().push(path);
        }
    }
    let mut one = |kind: Kind| -> Result<Option<PathBuf>> {
        let i = Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        let mut paths = found.remove(&i).unwrap_or_default();
        if paths.len() > 1 {
            let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            bail!(
                "{}: {} {} (first line `{}`): {}; keep one per directory",
                dir.display(),
                paths.len(),
                kind.what(),
                kind.magic(),
                names.join(", ")
            );
        }
        Ok(paths.pop())
    };
    let route = one(Kind::Route)?;
    let metrics = one(Kind::Metrics)?;
    let io = one(Kind::Io)?;
    let compute = one(Kind::Compute)?;
    let Some(route) = route else {
        bail!(
            "{}: no route trace (a file whose first line is `{}`)",
            dir.display(),
            Kind::Route.magic()
        );
    };
    Ok(RunFiles {
        route,
        metrics,
        io,
        compute,
    })
}

/// Escapes text for HTML content and double- or single-quoted attribute values.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' => out.push_str("&#10;"),
            _ => out.push(c),
        }
    }
    out
}

fn read_table(path: &Path) -> Result<Table> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Table::parse(&text, &path.display().to_string())?)
}

pub fn run(args: ViewArgs) -> Result<()> {
    let files = find_files(&args.dir)?;
    let route = read_route_trace(&files.route)?;
    let metrics = files.metrics.as_deref().map(read_table).transpose()?;
    let io = files.io.as_deref().map(read_table).transpose()?;
    let compute = files.compute.as_deref().map(read_table).transpose()?;
    let page = render(&Inputs {
        files: &files,
        route: &route,
        metrics: metrics.as_ref(),
        io: io.as_ref(),
        compute: compute.as_ref(),
        max_steps: args.max_steps,
    })?;
    std::fs::write(&args.out, page).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "analyze view: wrote {} ({} decode steps)",
        args.out.display(),
        route.decode_tokens()
    );
    Ok(())
}

struct Inputs<'a> {
    files: &'a RunFiles,
    route: &'a RouteTrace,
    metrics: Option<&'a Table>,
    io: Option<&'a Table>,
    compute: Option<&'a Table>,
    max_steps: usize,
}

const STYLE: &str = "body{font-family:sans-serif;font-size:13px;margin:1em 2em;color:#222}\
h1{font-size:20px}h2{font-size:16px;margin-top:1.6em}\
table{border-collapse:collapse;margin:.4em 0}\
td,th{border:1px solid #ccc;padding:2px 5px;text-align:right;vertical-align:top}\
th{background:#f0f0f0}td.l,th.l{text-align:left}\
table.m td{font-family:monospace;font-size:11px;text-align:left;white-space:nowrap}\
span.h{color:#1a7f37}span.p{color:#0969da}span.m{color:#cf222e;font-weight:bold}\
span.u{color:#555}span.d{text-decoration:line-through}\
.note{color:#666}.key span{margin-right:1.2em}\
details{margin:.4em 0}code{background:#f4f4f4}";

fn render(inp: &Inputs) -> Result<String> {
    let mut h = String::new();
    let title = format!(
        "sluice run: {} ({})",
        file_name(&inp.route.model),
        inp.route.arch
    );
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        esc(&title),
        esc(&title)
    );
    header(&mut h, inp);
    let cells = Cells::new(inp.route);
    matrix(&mut h, inp.route, &cells, inp.max_steps);
    hot_experts(&mut h, inp.route, &cells);
    if let Some(t) = inp.metrics {
        metrics(&mut h, t, inp.max_steps)?;
    }
    if let Some(t) = inp.io {
        io_totals(&mut h, t)?;
    }
    if let Some(t) = inp.compute {
        compute_totals(&mut h, t)?;
    }
    h.push_str("</body>\n</html>\n");
    Ok(h)
}

fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// A two-column table of facts.
fn facts(h: &mut String, rows: &[(&str, String)]) {
    h.push_str("<table>\n");
    for (k, v) in rows {
        let _ = writeln!(
            h,
            "<tr><th class=\"l\">{}</th><td class=\"l\">{}</td></tr>",
            esc(k),
            esc(v)
        );
    }
    h.push_str("</table>\n");
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / MIB)
}

fn header(h: &mut String, inp: &Inputs) {
    let r = inp.route;
    h.push_str("<h2>Run</h2>\n");
    let mut files = vec![("route trace", inp.files.route.display().to_string())];
    for (what, p) in [
        ("metrics CSV", &inp.files.metrics),
        ("I/O trace", &inp.files.io),
        ("compute trace", &inp.files.compute),
    ] {
        files.push((
            what,
            p.as_ref().map_or("-".into(), |p| p.display().to_string()),
        ));
    }
    let file_rows: Vec<(&str, String)> = files
        .iter()
        .map(|(k, v)| (*k, file_name(v).to_string()))
        .collect();
    let eb: Vec<u64> = r.layers.values().map(|l| l.expert_bytes).collect();
    let db: u64 = r.layers.values().map(|l| l.dense_bytes).sum();
    let expert_bytes = match (eb.iter().min(), eb.iter().max()) {
        (Some(a), Some(b)) if a == b => mib(*a),
        (Some(a), Some(b)) => format!("{} to {}", mib(*a), mib(*b)),
        _ => "-".into(),
    };
    let decode: Vec<&RouteRow> = r.rows.iter().filter(|x| x.phase == Phase::Decode).collect();
    let known: Vec<u8> = decode.iter().filter_map(|x| x.residency).collect();
    let hit = if known.is_empty() {
        "-".to_string()
    } else {
        let hits = known.iter().filter(|&&v| v >= 1).count();
        format!(
            "{:.2}% ({hits} of {} decode routings)",
            100.0 * hits as f64 / known.len() as f64,
            known.len()
        )
    };
    let read: u64 = decode.iter().filter_map(|x| x.expert_bytes).sum();
    let mut rows: Vec<(&str, String)> = vec![
        ("model", r.model.clone()),
        ("arch", r.arch.clone()),
        ("layers", r.n_layer.to_string()),
        ("MoE layers", r.layers.len().to_string()),
        ("experts", r.n_expert.to_string()),
        ("top-k", r.n_expert_used.to_string()),
        ("expert size", expert_bytes),
        ("dense weights (MoE layers)", mib(db)),
        ("one token cycle", mib(r.token_cycle_bytes())),
        ("routings (trace rows)", r.rows.len().to_string()),
        ("decode steps", r.decode_tokens().to_string()),
        ("decode hit rate (trace)", hit),
        ("decode expert reads (trace)", mib(read)),
    ];
    if let Some(t) = inp.metrics {
        let keys = [
            ("engine", "engine"),
            ("threads", "threads"),
            ("n_ctx", "n_ctx"),
            ("moe_stream", "moe_stream"),
            ("cache budget (MiB)", "cache_mb"),
            ("cache_auto", "cache_auto"),
            ("cache_cycle_mb", "cache_cycle_mb"),
            ("force_cache", "force_cache"),
            ("load_all", "load_all"),
            ("io_threads", "io_threads"),
            ("o_direct", "o_direct"),
            ("overlap", "overlap"),
            ("io_backend", "io_backend"),
            ("dense_weights", "dense_weights"),
            ("temp", "temp"),
            ("seed", "seed"),
            ("instrumented", "instrumented"),
            ("traces", "traces"),
        ];
        for (label, key) in keys {
            if let Some(v) = t.pre(key) {
                rows.push((label, v.to_string()));
            }
        }
        let summary = summary_pairs(t);
        for key in [
            "tokens",
            "tok/s",
            "n_prompt",
            "prefill_s",
            "cache_hit_pct",
            "read_MiB",
        ] {
            if let Some((_, v)) = summary.iter().find(|(k, _)| k == key) {
                rows.push((summary_label(key), v.clone()));
            }
        }
    }
    rows.extend(file_rows);
    facts(h, &rows);
    if let Some(t) = inp.metrics {
        h.push_str("<details><summary>Full CSV preamble</summary>\n");
        let all: Vec<(&str, String)> = t
            .preamble
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        facts(h, &all);
        h.push_str("</details>\n");
        let summary = summary_pairs(t);
        if !summary.is_empty() {
            h.push_str("<details><summary>Full <code># summary</code> line</summary>\n");
            let all: Vec<(&str, String)> = summary
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .collect();
            facts(h, &all);
            h.push_str("</details>\n");
        }
    }
}

fn summary_label(key: &str) -> &'static str {
    match key {
        "tokens" => "summary: tokens",
        "tok/s" => "summary: tok/s",
        "n_prompt" => "summary: prompt tokens",
        "prefill_s" => "summary: prefill s",
        "cache_hit_pct" => "summary: cache hit %",
        _ => "summary: read MiB",
    }
}

/// The key=value pairs of the metrics CSV's last `# summary` line.
fn summary_pairs(t: &Table) -> Vec<(String, String)> {
    t.trailer
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("summary"))
        .map(|l| {
            telemetry::key_values(l)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect()
        })
        .unwrap_or_default()
}

/// One routed expert of a cell, in slot order.
#[derive(Clone, Copy)]
struct Routed {
    slot: u32,
    expert: u32,
    weight: Option<f32>,
    residency: Option<u8>,
    bytes: Option<u64>,
    dropped: Option<bool>,
}

/// One decode step: its `(turn, step)` and its cells, per layer.
type StepRow = ((u32, i64), BTreeMap<u32, Vec<Routed>>);

/// The decode phase as a matrix: steps in file order, each with its cells per layer.
struct Cells {
    steps: Vec<StepRow>,
}

impl Cells {
    fn new(r: &RouteTrace) -> Cells {
        let mut index: BTreeMap<(u32, i64), usize> = BTreeMap::new();
        let mut steps: Vec<StepRow> = Vec::new();
        for row in r.rows.iter().filter(|x| x.phase == Phase::Decode) {
            let key = (row.turn, row.step);
            let i = *index.entry(key).or_insert_with(|| {
                steps.push((key, BTreeMap::new()));
                steps.len() - 1
            });
            steps[i].1.entry(row.layer).or_default().push(Routed {
                slot: row.slot,
                expert: row.expert,
                weight: row.weight,
                residency: row.residency,
                bytes: row.expert_bytes,
                dropped: row.dropped,
            });
        }
        for (_, layers) in &mut steps {
            for cell in layers.values_mut() {
                cell.sort_by_key(|x| x.slot);
            }
        }
        Cells { steps }
    }
}

fn residency_name(r: Option<u8>) -> (&'static str, &'static str) {
    match r {
        Some(0) => ("m", "miss"),
        Some(1) => ("h", "hit"),
        Some(_) => ("p", "hit (prefetched)"),
        None => ("u", "residency unknown"),
    }
}

fn matrix(h: &mut String, r: &RouteTrace, cells: &Cells, max_steps: usize) {
    let layers: Vec<u32> = r.layers.keys().copied().collect();
    let total = cells.steps.len();
    let shown = total.min(max_steps);
    h.push_str("<h2>Decode routing: step × layer</h2>\n");
    let _ = writeln!(
        h,
        "<p class=\"key\"><span class=\"h\">hit</span><span class=\"p\">hit on a prefetch</span>\
         <span class=\"m\">miss</span><span class=\"u\">unknown</span>\
         <span class=\"d\">dropped</span> Each cell lists the layer's routed experts in the \
         router's rank order; hover a cell for the weights.</p>"
    );
    if total == 0 {
        h.push_str("<p class=\"note\">The trace has no decode rows.</p>\n");
        return;
    }
    if shown < total {
        let _ = writeln!(
            h,
            "<p class=\"note\">Showing the first {shown} of {total} decode steps \
             (<code>--max-steps</code>).</p>"
        );
    }
    h.push_str("<table class=\"m\">\n<tr><th>#</th><th>turn</th><th>step</th>");
    for l in &layers {
        let _ = write!(h, "<th>L{l}</th>");
    }
    h.push_str("</tr>\n");
    for (i, ((turn, step), row)) in cells.steps.iter().take(shown).enumerate() {
        let _ = write!(
            h,
            "<tr data-step=\"{step}\"><th>{}</th><td>{turn}</td><td>{step}</td>",
            i + 1
        );
        for l in &layers {
            let Some(cell) = row.get(l) else {
                h.push_str("<td></td>");
                continue;
            };
            let mut tip = format!("step {step}, layer {l}");
            let mut body = String::new();
            for (j, x) in cell.iter().enumerate() {
                let (class, name) = residency_name(x.residency);
                let dropped = x.dropped == Some(true);
                let _ = write!(tip, "\n#{} expert {}: ", x.slot, x.expert);
                match x.weight {
                    Some(w) => {
                        let _ = write!(tip, "weight {w:.4}");
                    }
                    None => tip.push_str("weight unknown"),
                }
                let _ = write!(tip, ", {name}");
                if let Some(b) = x.bytes.filter(|&b| b > 0) {
                    let _ = write!(tip, ", read {:.2} MiB", b as f64 / MIB);
                }
                if dropped {
                    tip.push_str(", dropped");
                }
                if j > 0 {
                    body.push(' ');
                }
                let class = if dropped {
                    format!("{class} d")
                } else {
                    class.to_string()
                };
                let _ = write!(body, "<span class=\"{class}\">{}</span>", x.expert);
            }
            let _ = write!(h, "<td title=\"{}\">{body}</td>", esc(&tip));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
}

fn hot_experts(h: &mut String, r: &RouteTrace, cells: &Cells) {
    const TOP: usize = 8;
    let mut counts: BTreeMap<u32, BTreeMap<u32, u64>> = BTreeMap::new();
    let mut routings: BTreeMap<u32, u64> = BTreeMap::new();
    for (_, row) in &cells.steps {
        for (l, cell) in row {
            for x in cell {
                *counts.entry(*l).or_default().entry(x.expert).or_default() += 1;
                *routings.entry(*l).or_default() += 1;
            }
        }
    }
    h.push_str("<h2>Hot experts</h2>\n");
    if counts.is_empty() {
        h.push_str("<p class=\"note\">No decode routings to count.</p>\n");
        return;
    }
    let _ = writeln!(
        h,
        "<p class=\"note\">Per MoE layer, the {TOP} experts routed most often over all {} \
         decode steps (count, and share of the layer's routings); {} experts per layer.</p>",
        cells.steps.len(),
        r.n_expert
    );
    h.push_str("<table>\n<tr><th>layer</th>");
    for i in 1..=TOP {
        let _ = write!(h, "<th>#{i}</th>");
    }
    h.push_str("<th>distinct</th></tr>\n");
    for (l, c) in &counts {
        let mut v: Vec<(u32, u64)> = c.iter().map(|(e, n)| (*e, *n)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let all = routings.get(l).copied().unwrap_or(1).max(1);
        let _ = write!(h, "<tr><th>L{l}</th>");
        for i in 0..TOP {
            match v.get(i) {
                Some((e, n)) => {
                    let _ = write!(
                        h,
                        "<td>{e} <span class=\"note\">×{n} ({:.1}%)</span></td>",
                        100.0 * *n as f64 / all as f64
                    );
                }
                None => h.push_str("<td></td>"),
            }
        }
        let _ = writeln!(h, "<td>{}</td></tr>", v.len());
    }
    h.push_str("</table>\n");
}

/// One per-token row of the metrics CSV.
struct TokenFigures {
    step: String,
    wall: f64,
    io: Option<f64>,
    compute: Option<f64>,
    stall: Option<f64>,
    mgmt: Option<f64>,
    read: Option<f64>,
    hit: Option<f64>,
}

fn metrics(h: &mut String, t: &Table, max_steps: usize) -> Result<()> {
    let step = t.need("step")?;
    let wall = t.need("wall_ms")?;
    let cols = [
        "io_ms",
        "compute_ms",
        "stall_ms",
        "mgmt_ms",
        "read_bytes",
        "cache_hit_pct",
    ]
    .map(|c| t.col(c));
    let mut rows = Vec::new();
    for row in &t.rows {
        rows.push(TokenFigures {
            step: t.text(row, Some(step)).to_string(),
            wall: t.num(row, Some(wall))?.unwrap_or(0.0),
            io: t.num(row, cols[0])?,
            compute: t.num(row, cols[1])?,
            stall: t.num(row, cols[2])?,
            mgmt: t.num(row, cols[3])?,
            read: t.num(row, cols[4])?.map(|b| b / MIB),
            hit: t.num(row, cols[5])?,
        });
    }
    h.push_str("<h2>Per-token metrics</h2>\n");
    if rows.is_empty() {
        h.push_str("<p class=\"note\">The metrics CSV has no token rows.</p>\n");
        return Ok(());
    }
    let total = rows.len();
    rows.truncate(max_steps);
    if rows.len() < total {
        let _ = writeln!(
            h,
            "<p class=\"note\">Showing the first {} of {total} tokens (<code>--max-steps</code>).</p>",
            rows.len()
        );
    }
    chart(h, &rows);
    let opt =
        |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    h.push_str(
        "<table>\n<tr><th>step</th><th>wall_ms</th><th>io_ms</th><th>compute_ms</th>\
         <th>stall_ms</th><th>read MiB</th><th>cache_hit_pct</th></tr>\n",
    );
    for r in &rows {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.step),
            r.wall,
            opt(r.io, 3),
            opt(r.compute, 3),
            opt(r.stall, 3),
            opt(r.read, 3),
            opt(r.hit, 2)
        );
    }
    h.push_str("</table>\n");
    Ok(())
}

/// The stacked bar chart of `wall_ms` per token: waiting for reads (io or stall: what the
/// wall time holds beyond compute and management), compute, management.
fn chart(h: &mut String, rows: &[TokenFigures]) {
    const W: f64 = 900.0;
    const H: f64 = 220.0;
    const LEFT: f64 = 50.0;
    const BOTTOM: f64 = 20.0;
    const TOP: f64 = 10.0;
    let max = rows.iter().map(|r| r.wall).fold(0.0f64, f64::max);
    let max = if max > 0.0 { max } else { 1.0 };
    let plot_h = H - BOTTOM - TOP;
    let slot = (W - LEFT - 10.0) / rows.len() as f64;
    let bar = (slot * 0.8).max(0.5);
    let _ = writeln!(
        h,
        "<p class=\"key\"><span style=\"color:#cf222e\">■ io / stall</span>\
         <span style=\"color:#0969da\">■ compute</span><span style=\"color:#9a6700\">■ mgmt</span> \
         wall_ms per token (io/stall is the wall time beyond compute and mgmt)</p>"
    );
    let _ = writeln!(
        h,
        "<svg width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" \
         role=\"img\" aria-label=\"wall time per token\">"
    );
    let _ = writeln!(
        h,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{:.1}\" stroke=\"#888\"/>\
         <line x1=\"{LEFT}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>",
        H - BOTTOM,
        H - BOTTOM,
        W - 5.0,
        H - BOTTOM
    );
    let _ = writeln!(
        h,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{max:.1} ms</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">0</text>",
        LEFT - 3.0,
        TOP + 8.0,
        LEFT - 3.0,
        H - BOTTOM
    );
    for (i, r) in rows.iter().enumerate() {
        let compute = r.compute.unwrap_or(0.0).max(0.0);
        let mgmt = r.mgmt.unwrap_or(0.0).max(0.0);
        let waited = (r.wall - compute - mgmt).max(0.0);
        let x = LEFT + 2.0 + i as f64 * slot;
        let mut y = H - BOTTOM;
        for (v, color, name) in [
            (waited, "#cf222e", "io/stall"),
            (compute, "#0969da", "compute"),
            (mgmt, "#9a6700", "mgmt"),
        ] {
            let hgt = v / max * plot_h;
            if hgt <= 0.0 {
                continue;
            }
            y -= hgt;
            let _ = writeln!(
                h,
                "<rect x=\"{x:.2}\" y=\"{y:.2}\" width=\"{bar:.2}\" height=\"{hgt:.2}\" fill=\"{color}\">\
                 <title>step {}: {name} {v:.3} ms of {:.3}</title></rect>",
                esc(&r.step),
                r.wall
            );
        }
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        let _ = writeln!(
            h,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">step {}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">step {}</text>",
            LEFT + 2.0,
            H - 5.0,
            esc(&first.step),
            W - 5.0,
            H - 5.0,
            esc(&last.step)
        );
    }
    h.push_str("</svg>\n");
}

fn phase_name(p: &str) -> &str {
    match p {
        "0" => "prefill",
        "1" => "decode",
        other => other,
    }
}

fn io_totals(h: &mut String, t: &Table) -> Result<()> {
    let read = t.need("read_bytes")?;
    let lat = t.need("latency_ns")?;
    let phase = t.col("phase");
    let req = t.col("req_bytes");
    let spec = t.col("spec");
    let lane = t.col("lane");
    #[derive(Default)]
    struct Acc {
        reads: u64,
        bytes: f64,
        req: f64,
        lat_ns: f64,
        max_ns: f64,
        spec: u64,
    }
    let mut by_phase: BTreeMap<String, Acc> = BTreeMap::new();
    let mut by_lane: BTreeMap<String, Acc> = BTreeMap::new();
    for row in &t.rows {
        let b = t.num(row, Some(read))?.unwrap_or(0.0);
        let l = t.num(row, Some(lat))?.unwrap_or(0.0);
        let q = t.num(row, req)?;
        let s = t.num(row, spec)?.unwrap_or(0.0);
        let p = phase_name(t.text(row, phase)).to_string();
        let ln = t.text(row, lane).to_string();
        for acc in [
            by_phase.entry(p).or_default(),
            by_lane.entry(ln).or_default(),
        ] {
            acc.reads += 1;
            acc.bytes += b;
            acc.req += q.unwrap_or(b);
            acc.lat_ns += l;
            acc.max_ns = acc.max_ns.max(l);
            acc.spec += u64::from(s != 0.0);
        }
    }
    h.push_str("<h2>I/O trace</h2>\n");
    if t.rows.is_empty() {
        h.push_str("<p class=\"note\">The I/O trace has no reads.</p>\n");
        return Ok(());
    }
    let table = |h: &mut String, first: &str, m: &BTreeMap<String, Acc>| {
        let _ = writeln!(
            h,
            "<table>\n<tr><th class=\"l\">{}</th><th>reads</th><th>read MiB</th><th>requested MiB</th>\
             <th>mean latency ms</th><th>max latency ms</th><th>MiB/s per read</th><th>speculative</th></tr>",
            esc(first)
        );
        for (k, a) in m {
            let n = a.reads.max(1) as f64;
            let rate = if a.lat_ns > 0.0 {
                format!("{:.1}", a.bytes / MIB / (a.lat_ns / 1e9))
            } else {
                "-".into()
            };
            let _ = writeln!(
                h,
                "<tr><td class=\"l\">{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td>\
                 <td>{:.3}</td><td>{rate}</td><td>{}</td></tr>",
                esc(k),
                a.reads,
                a.bytes / MIB,
                a.req / MIB,
                a.lat_ns / n / 1e6,
                a.max_ns / 1e6,
                a.spec
            );
        }
        h.push_str("</table>\n");
    };
    table(h, "phase", &by_phase);
    if lane.is_some() {
        table(h, "lane", &by_lane);
    }
    Ok(())
}

fn compute_totals(h: &mut String, t: &Table) -> Result<()> {
    let op = t.need("op")?;
    let wall = t.need("wall_ns")?;
    let phase = t.col("phase");
    let layer = t.col("layer");
    let faults = t.col("majflt");
    let has_decode = t.rows.iter().any(|r| t.text(r, phase) == "1");
    let mut by_op: BTreeMap<String, (u64, f64, f64)> = BTreeMap::new();
    let mut by_layer: BTreeMap<i64, (u64, f64, f64)> = BTreeMap::new();
    let mut total = 0.0;
    for row in &t.rows {
        if has_decode && t.text(row, phase) != "1" {
            continue;
        }
        let ns = t.num(row, Some(wall))?.unwrap_or(0.0);
        let f = t.num(row, faults)?.unwrap_or(0.0);
        total += ns;
        for acc in [
            by_op.entry(t.text(row, Some(op)).to_string()).or_default(),
            by_layer
                .entry(t.num(row, layer)?.map_or(-1, |v| v as i64))
                .or_default(),
        ] {
            acc.0 += 1;
            acc.1 += ns;
            acc.2 += f;
        }
    }
    h.push_str("<h2>Compute trace</h2>\n");
    let pre: Vec<(&str, String)> = t
        .preamble
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    if !pre.is_empty() {
        h.push_str("<details><summary>Compute trace preamble</summary>\n");
        facts(h, &pre);
        h.push_str("</details>\n");
    }
    if by_op.is_empty() {
        h.push_str("<p class=\"note\">The compute trace has no rows.</p>\n");
        return Ok(());
    }
    let _ = writeln!(
        h,
        "<p class=\"note\">{} rows; {:.3} ms in all{}. A traced run is slower than an \
         untraced one: read the shares, not the absolutes.</p>",
        by_op.values().map(|a| a.0).sum::<u64>(),
        total / 1e6,
        if has_decode {
            " (decode passes only)"
        } else {
            ""
        }
    );
    let share = |ns: f64| {
        if total > 0.0 { 100.0 * ns / total } else { 0.0 }
    };
    let mut ops: Vec<(&String, &(u64, f64, f64))> = by_op.iter().collect();
    ops.sort_by(|a, b| b.1.1.total_cmp(&a.1.1).then(a.0.cmp(b.0)));
    h.push_str(
        "<table>\n<tr><th class=\"l\">op</th><th>rows</th><th>ms</th><th>share %</th>\
         <th>major faults</th></tr>\n",
    );
    for (k, (n, ns, f)) in ops {
        let _ = writeln!(
            h,
            "<tr><td class=\"l\">{}</td><td>{n}</td><td>{:.3}</td><td>{:.1}</td><td>{f}</td></tr>",
            esc(k),
            ns / 1e6,
            share(*ns)
        );
    }
    h.push_str("</table>\n");
    if layer.is_some() {
        h.push_str(
            "<table>\n<tr><th class=\"l\">layer</th><th>rows</th><th>ms</th><th>share %</th>\
             <th>major faults</th></tr>\n",
        );
        for (l, (n, ns, f)) in &by_layer {
            let name = if *l < 0 {
                "none".to_string()
            } else {
                l.to_string()
            };
            let _ = writeln!(
                h,
                "<tr><td class=\"l\">{name}</td><td>{n}</td><td>{:.3}</td><td>{:.1}</td><td>{f}</td></tr>",
                ns / 1e6,
                share(*ns)
            );
        }
        h.push_str("</table>\n");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_markup_and_quotes() {
        assert_eq!(
            esc(r#"<a href="x">Tom & 'Jerry'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;"
        );
        assert_eq!(esc("a\nb"), "a&#10;b");
        assert_eq!(esc("plain 12.5 µs"), "plain 12.5 µs");
    }

    const ROUTE: &str = "# route_trace v1\n\
        # model=/m/<b>.gguf arch=olmoe n_layer=2 n_expert=4 n_expert_used=2\n\
        # layer=0 expert_bytes=1048576 dense_bytes=10\n\
        # layer=1 expert_bytes=1048576 dense_bytes=10\n\
        turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped\n\
        0,0,0,0,0,1,0.5,0,1048576,0\n0,0,0,0,1,2,0.5,0,1048576,0\n\
        0,0,0,1,0,3,0.5,0,1048576,0\n0,0,0,1,1,0,0.5,0,1048576,0\n\
        0,1,1,0,1,2,0.25,1,0,0\n0,1,1,0,0,3,0.75,0,1048576,0\n\
        0,1,1,1,0,1,0.6,0,1048576,0\n0,1,1,1,1,0,0.4,1,0,0\n\
        0,1,2,0,0,3,0.7,1,0,0\n0,1,2,0,1,2,0.3,1,0,0\n\
        0,1,2,1,0,1,nan,1,0,0\n0,1,2,1,1,2,nan,0,1048576,0\n";

    fn page(max_steps: usize) -> String {
        let route = RouteTrace::parse(ROUTE, "r.csv").unwrap();
        let files = RunFiles {
            route: PathBuf::from("r.csv"),
            ..RunFiles::default()
        };
        render(&Inputs {
            files: &files,
            route: &route,
            metrics: None,
            io: None,
            compute: None,
            max_steps,
        })
        .unwrap()
    }

    #[test]
    fn the_matrix_has_a_row_per_decode_step_in_rank_order() {
        let p = page(256);
        assert_eq!(p.matches("<tr data-step=").count(), 2);
        let first = &p[p.find("<tr data-step=\"1\"").unwrap()..];
        let first = &first[..first.find("</tr>").unwrap()];
        // Layer 0 of step 1: slot 0 is expert 3 (a miss), slot 1 expert 2 (a hit).
        assert!(
            first.contains("<span class=\"m\">3</span> <span class=\"h\">2</span>"),
            "{first}"
        );
        assert!(first.contains("weight 0.7500"), "{first}");
        // The model path is escaped.
        assert!(p.contains("&lt;b&gt;.gguf") && !p.contains("<b>.gguf"));
        assert!(!p.contains("Showing the first"));
        let capped = page(1);
        assert_eq!(capped.matches("<tr data-step=").count(), 1);
        assert!(capped.contains("Showing the first 1 of 2 decode steps"));
    }

    #[test]
    fn hot_experts_count_decode_routings() {
        let p = page(256);
        let hot = &p[p.find("<h2>Hot experts").unwrap()..];
        let l1 = &hot[hot.find("<tr><th>L1</th>").unwrap()..];
        let l1 = &l1[..l1.find("</tr>").unwrap()];
        // Layer 1, decode: expert 1 twice, then 0 and 2 once each (ties by id).
        assert!(
            l1.starts_with(
                "<tr><th>L1</th><td>1 <span class=\"note\">×2 (50.0%)</span></td><td>0 "
            ),
            "{l1}"
        );
    }

    #[test]
    fn files_are_found_by_their_first_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), ROUTE).unwrap();
        std::fs::write(
            dir.path().join("m.csv"),
            "# bmoe_metrics v2\nstep,wall_ms\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("other"), "hello\n").unwrap();
        let f = find_files(dir.path()).unwrap();
        assert!(f.route.ends_with("a.txt"));
        assert!(f.metrics.unwrap().ends_with("m.csv"));
        assert!(f.io.is_none() && f.compute.is_none());
        std::fs::write(dir.path().join("b.txt"), ROUTE).unwrap();
        let err = find_files(dir.path()).unwrap_err().to_string();
        assert!(err.contains("a.txt") && err.contains("b.txt"), "{err}");
        std::fs::remove_file(dir.path().join("a.txt")).unwrap();
        std::fs::remove_file(dir.path().join("b.txt")).unwrap();
        let err = find_files(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no route trace"), "{err}");
    }
}
