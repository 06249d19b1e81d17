//! The `bmoe_metrics v2` CSV (`--csv`), as BigMoeOnEdge's telemetry contract defines it
//! (docs/telemetry.md): a `#` preamble with the run's resolved settings ([`Preamble`]), the
//! column line ([`CSV_COLUMNS`]), one row per decoded token ([`MetricsRow`]) and a
//! `# summary key=value ...` trailer after each generation ([`summary_line`]).
//!
//! ```text
//! # bmoe_metrics v2
//! # engine=sluice <version>
//! # model=<path> arch=<string> n_layer=<int> ...
//! # moe_stream=<0|1> cache_mb=<int> ...
//! # temp=<float> top_k=<int> ...
//! step,steps,wall_ms,io_ms,compute_ms,read_bytes,...
//! 1,16,388.103,120.551,262.010,31457280,...
//! # summary tokens=16 tok/s=2.577 ...
//! ```
//!
//! [`MetricsWriter`] writes a file, [`read`] reads one back. Rows are read by column name (a
//! writer may append columns within `v2`); the preamble's and the trailer's `key=value` pairs
//! are kept as written.

use std::fmt;
use std::io::{self, Write};

/// The first line of the file.
pub const MAGIC: &str = "# bmoe_metrics v2";

/// The per-token CSV columns, in the spec's order.
pub const CSV_COLUMNS: &str = "step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct,\
stall_ms,mgmt_ms,majflt,cpu_ms,dense_resident_frac,turn,majflt_mib,cache_budget_mib,rss_mib,\
rss_anon_mib,rss_file_mib,swap_mib,mem_available_mib,mem_free_mib,swap_free_mib,\
loop_overhead_ms,mtp_batch,mtp_draft_ms,drain_ms,adopt_ms,ra_issue_ms,ra_wd_ms";

/// The page size `majflt_mib` counts in.
const FAULT_PAGE: f64 = 4096.0;

const MIB: f64 = (1u64 << 20) as f64;

/// A file that does not follow the format: the 1-based line (when one is to blame) and what
/// is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{msg}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
pub struct MetricsError {
    /// The 1-based line, when one is to blame.
    pub line: Option<usize>,
    /// What was found and what was expected instead.
    pub msg: String,
}

fn at(line: usize, msg: String) -> MetricsError {
    MetricsError {
        line: Some(line),
        msg,
    }
}

/// One decoded token's row. The columns sluice does not measure (`drain_ms`, `adopt_ms`,
/// `ra_issue_ms`, `ra_wd_ms`) are written `0` and not kept; `majflt_mib` is written from
/// `majflt` (4 KiB pages).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsRow {
    /// 1-based.
    pub step: u64,
    pub steps: u64,
    pub wall_ms: f64,
    pub io_ms: f64,
    /// The residual compute time (clamped at 0).
    pub compute_ms: f64,
    pub read_bytes: u64,
    /// Cumulative, or -1 without a cache.
    pub cache_hit_pct: f64,
    pub stall_ms: f64,
    pub mgmt_ms: f64,
    pub majflt: u64,
    pub cpu_ms: f64,
    /// The resident share of the dense weights, or -1 when unmeasured.
    pub dense_resident_frac: f64,
    /// The session turn (0 in a one-shot run).
    pub turn: u64,
    pub cache_budget_mib: f64,
    pub rss_mib: f64,
    pub rss_anon_mib: f64,
    pub rss_file_mib: f64,
    pub swap_mib: f64,
    pub mem_available_mib: f64,
    pub mem_free_mib: f64,
    pub swap_free_mib: f64,
    pub loop_overhead_ms: f64,
    /// Tokens the pass this row's cost is of confirmed (1 without speculation).
    pub mtp_batch: u64,
    pub mtp_draft_ms: f64,
}

/// The CSV row (columns of [`CSV_COLUMNS`]), without a line break.
impl fmt::Display for MetricsRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
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
            self.rss_mib,
            self.rss_anon_mib,
            self.rss_file_mib,
            self.swap_mib,
            self.mem_available_mib,
            self.mem_free_mib,
            self.swap_free_mib,
            self.loop_overhead_ms,
            self.mtp_batch,
            self.mtp_draft_ms,
        )
    }
}

/// Where each kept column sits in a file's column line.
#[derive(Clone, Debug)]
pub struct Columns {
    idx: [usize; KEPT.len()],
    width: usize,
}

/// The columns a [`MetricsRow`] keeps, in its fields' order.
const KEPT: [&str; 24] = [
    "step",
    "steps",
    "wall_ms",
    "io_ms",
    "compute_ms",
    "read_bytes",
    "cache_hit_pct",
    "stall_ms",
    "mgmt_ms",
    "majflt",
    "cpu_ms",
    "dense_resident_frac",
    "turn",
    "cache_budget_mib",
    "rss_mib",
    "rss_anon_mib",
    "rss_file_mib",
    "swap_mib",
    "mem_available_mib",
    "mem_free_mib",
    "swap_free_mib",
    "loop_overhead_ms",
    "mtp_batch",
    "mtp_draft_ms",
];

impl Columns {
    /// The columns of a column line; every column a [`MetricsRow`] keeps must be there.
    pub fn parse(header: &str) -> Result<Columns, String> {
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        let mut idx = [0; KEPT.len()];
        for (slot, want) in idx.iter_mut().zip(KEPT) {
            *slot = names
                .iter()
                .position(|n| *n == want)
                .ok_or_else(|| format!("the column line has no `{want}` column"))?;
        }
        Ok(Columns {
            idx,
            width: names.len(),
        })
    }
}

impl Default for Columns {
    /// The columns as [`CSV_COLUMNS`] lists them.
    fn default() -> Columns {
        // CSV_COLUMNS has every kept column; the fallback is never taken.
        Columns::parse(CSV_COLUMNS).unwrap_or(Columns {
            idx: [0; KEPT.len()],
            width: 0,
        })
    }
}

impl MetricsRow {
    /// Reads a row written in [`CSV_COLUMNS`]' order.
    pub fn parse(line: &str) -> Result<MetricsRow, String> {
        MetricsRow::parse_with(&Columns::default(), line)
    }

    /// Reads a row of a file whose column line is `cols`.
    pub fn parse_with(cols: &Columns, line: &str) -> Result<MetricsRow, String> {
        let v: Vec<&str> = line.split(',').map(str::trim).collect();
        if v.len() != cols.width {
            return Err(format!(
                "{} fields, but the column line has {}",
                v.len(),
                cols.width
            ));
        }
        let field = |i: usize| v[cols.idx[i]];
        let num = |i: usize| -> Result<f64, String> {
            field(i)
                .parse::<f64>()
                .map_err(|_| format!("column `{}`: `{}` is not a valid value", KEPT[i], field(i)))
        };
        let int = |i: usize| -> Result<u64, String> {
            field(i)
                .parse::<u64>()
                .map_err(|_| format!("column `{}`: `{}` is not a valid value", KEPT[i], field(i)))
        };
        Ok(MetricsRow {
            step: int(0)?,
            steps: int(1)?,
            wall_ms: num(2)?,
            io_ms: num(3)?,
            compute_ms: num(4)?,
            read_bytes: int(5)?,
            cache_hit_pct: num(6)?,
            stall_ms: num(7)?,
            mgmt_ms: num(8)?,
            majflt: int(9)?,
            cpu_ms: num(10)?,
            dense_resident_frac: num(11)?,
            turn: int(12)?,
            cache_budget_mib: num(13)?,
            rss_mib: num(14)?,
            rss_anon_mib: num(15)?,
            rss_file_mib: num(16)?,
            swap_mib: num(17)?,
            mem_available_mib: num(18)?,
            mem_free_mib: num(19)?,
            swap_free_mib: num(20)?,
            loop_overhead_ms: num(21)?,
            mtp_batch: int(22)?,
            mtp_draft_ms: num(23)?,
        })
    }
}

/// What the preamble says of a run: its resolved settings, as written (`0`/`1` for a
/// switch). The engine line is `# engine=<engine> <version>`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Preamble {
    /// The engine's name (`sluice`).
    pub engine: String,
    /// The engine's version.
    pub version: String,
    pub model: String,
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
    /// `--prefetch`'s depth (0: off).
    pub prefetch: usize,
    pub route_ahead: usize,
    pub predict_prefetch: bool,
    pub predict_log: bool,
    pub predict_spec_max: usize,
    pub dense_weights: String,
    pub drop_cold_frac: f32,
    pub drop_renorm: bool,
    pub drop_prefill: bool,
    pub substitute_lambda: f32,
    pub io_backend: String,
    /// The expert cache's eviction policy (`-` without streaming).
    pub cache_policy: String,
    /// Co-activation prefetch: experts per layer (0: off) and layers ahead.
    pub couple_k: usize,
    pub couple_d: u32,
    pub prompt_ahead: bool,
    /// The replayed route trace (`-`: none).
    pub route_replay: String,
    pub temp: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub seed: u32,
    pub compute_trace_layers: bool,
    /// The speculative decoding source (`off`: none).
    pub spec: String,
    pub spec_draft_max: usize,
    pub mtp_p_min: f32,
    pub ngram_min_match: usize,
    /// Traces or prediction logs were written: an instrumented run, not a benchmark run.
    pub instrumented: bool,
    /// The traces written, comma-separated (`-`: none).
    pub traces: String,
}

impl Preamble {
    /// The `key=value` pairs of the settings lines (after the engine line), line by line, the
    /// values as written.
    fn groups(&self) -> [Vec<(&'static str, String)>; 3] {
        let b = |v: bool| u8::from(v).to_string();
        let s = |v: &dyn fmt::Display| v.to_string();
        [
            vec![
                ("model", self.model.clone()),
                ("arch", self.arch.clone()),
                ("n_layer", s(&self.n_layer)),
                ("n_expert", s(&self.n_expert)),
                ("n_expert_used", s(&self.n_expert_used)),
                ("threads", s(&self.threads)),
                ("n_ctx", s(&self.n_ctx)),
                ("n_ubatch", s(&self.n_ubatch)),
                ("chatml", b(self.chatml)),
            ],
            vec![
                ("moe_stream", b(self.moe_stream)),
                ("cache_mb", s(&self.cache_mb)),
                ("cache_auto", b(self.cache_auto)),
                ("cache_floor_mb", s(&self.cache_floor_mb)),
                ("cache_ceil_mb", s(&self.cache_ceil_mb)),
                ("cache_cycle_mb", s(&self.cache_cycle_mb)),
                ("force_cache", b(self.force_cache)),
                ("load_all", b(self.load_all)),
                ("io_threads", s(&self.io_threads)),
                ("o_direct", b(self.o_direct)),
                ("overlap", b(self.overlap)),
                // the spec's two-wave reads: sluice has none
                ("io_two_wave", "0".into()),
                ("prefetch", s(&self.prefetch)),
                ("route_ahead", s(&self.route_ahead)),
                ("predict_prefetch", b(self.predict_prefetch)),
                ("predict_log", b(self.predict_log)),
                ("predict_spec_max", s(&self.predict_spec_max)),
                // the spec's synchronous prefetch: sluice has none
                ("prefetch_sync", "0".into()),
                ("dense_weights", self.dense_weights.clone()),
                ("drop_cold_frac", s(&self.drop_cold_frac)),
                ("drop_renorm", b(self.drop_renorm)),
                ("drop_prefill", b(self.drop_prefill)),
                ("substitute_lambda", s(&self.substitute_lambda)),
                ("io_backend", self.io_backend.clone()),
                ("cache_policy", self.cache_policy.clone()),
                ("couple_k", s(&self.couple_k)),
                ("couple_d", s(&self.couple_d)),
                ("prompt_ahead", b(self.prompt_ahead)),
                ("route_replay", self.route_replay.clone()),
            ],
            vec![
                ("temp", s(&self.temp)),
                ("top_k", s(&self.top_k)),
                ("top_p", s(&self.top_p)),
                ("seed", s(&self.seed)),
                ("compute_trace_layers", b(self.compute_trace_layers)),
                ("spec", self.spec.clone()),
                ("spec_draft_max", s(&self.spec_draft_max)),
                ("mtp_p_min", s(&self.mtp_p_min)),
                ("ngram_min_match", s(&self.ngram_min_match)),
                ("instrumented", b(self.instrumented)),
                ("traces", self.traces.clone()),
            ],
        ]
    }

    /// Every `key=value` fact the preamble states, in its order, the values as written:
    /// `engine` (its name) and then the settings.
    pub fn facts(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![("engine", self.engine.clone())];
        v.extend(self.groups().into_iter().flatten());
        v
    }

    /// Reads the preamble back from the `#` lines of a file (any lines that do not start with
    /// `#` are skipped, and so are the `# summary` trailers). A model path with blanks in it
    /// does not read back.
    pub fn parse(text: &str) -> Result<Preamble, MetricsError> {
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        match lines.next() {
            Some((_, l)) if l.trim_end() == MAGIC => {}
            _ => {
                return Err(at(1, format!("the first line is not `{MAGIC}`")));
            }
        }
        let mut kv = std::collections::HashMap::new();
        let mut engine = None;
        for (n, line) in lines {
            let Some(rest) = line.strip_prefix("# ") else {
                continue;
            };
            if rest.starts_with("summary") {
                continue;
            }
            if let Some(e) = rest.strip_prefix("engine=") {
                let (name, version) = e.split_once(' ').unwrap_or((e, ""));
                engine = Some((name.to_owned(), version.to_owned()));
                continue;
            }
            for pair in rest.split_whitespace() {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or_else(|| at(n, format!("`{pair}` is not key=value")))?;
                kv.insert(k.to_owned(), (n, v.to_owned()));
            }
        }
        let (engine, version) = engine.ok_or_else(|| MetricsError {
            line: None,
            msg: "no `# engine=` line".into(),
        })?;
        let word = |k: &str| -> Result<String, MetricsError> {
            kv.get(k)
                .map(|(_, v)| v.clone())
                .ok_or_else(|| MetricsError {
                    line: None,
                    msg: format!("the preamble has no `{k}`"),
                })
        };
        fn num<T: std::str::FromStr>(
            kv: &std::collections::HashMap<String, (usize, String)>,
            k: &str,
        ) -> Result<T, MetricsError> {
            let (n, v) = kv.get(k).ok_or_else(|| MetricsError {
                line: None,
                msg: format!("the preamble has no `{k}`"),
            })?;
            v.parse()
                .map_err(|_| at(*n, format!("`{k}`: expected a number, found `{v}`")))
        }
        let flag = |k: &str| -> Result<bool, MetricsError> {
            match num::<u8>(&kv, k)? {
                0 => Ok(false),
                1 => Ok(true),
                v => Err(at(kv[k].0, format!("`{k}`: expected 0 or 1, found `{v}`"))),
            }
        };
        Ok(Preamble {
            engine,
            version,
            model: word("model")?,
            arch: word("arch")?,
            n_layer: num(&kv, "n_layer")?,
            n_expert: num(&kv, "n_expert")?,
            n_expert_used: num(&kv, "n_expert_used")?,
            threads: num(&kv, "threads")?,
            n_ctx: num(&kv, "n_ctx")?,
            n_ubatch: num(&kv, "n_ubatch")?,
            chatml: flag("chatml")?,
            moe_stream: flag("moe_stream")?,
            cache_mb: num(&kv, "cache_mb")?,
            cache_auto: flag("cache_auto")?,
            cache_floor_mb: num(&kv, "cache_floor_mb")?,
            cache_ceil_mb: num(&kv, "cache_ceil_mb")?,
            cache_cycle_mb: num(&kv, "cache_cycle_mb")?,
            force_cache: flag("force_cache")?,
            load_all: flag("load_all")?,
            io_threads: num(&kv, "io_threads")?,
            o_direct: flag("o_direct")?,
            overlap: flag("overlap")?,
            prefetch: num(&kv, "prefetch")?,
            route_ahead: num(&kv, "route_ahead")?,
            predict_prefetch: flag("predict_prefetch")?,
            predict_log: flag("predict_log")?,
            predict_spec_max: num(&kv, "predict_spec_max")?,
            dense_weights: word("dense_weights")?,
            drop_cold_frac: num(&kv, "drop_cold_frac")?,
            drop_renorm: flag("drop_renorm")?,
            drop_prefill: flag("drop_prefill")?,
            substitute_lambda: num(&kv, "substitute_lambda")?,
            io_backend: word("io_backend")?,
            cache_policy: word("cache_policy")?,
            couple_k: num(&kv, "couple_k")?,
            couple_d: num(&kv, "couple_d")?,
            prompt_ahead: flag("prompt_ahead")?,
            route_replay: word("route_replay")?,
            temp: num(&kv, "temp")?,
            top_k: num(&kv, "top_k")?,
            top_p: num(&kv, "top_p")?,
            seed: num(&kv, "seed")?,
            compute_trace_layers: flag("compute_trace_layers")?,
            spec: word("spec")?,
            spec_draft_max: num(&kv, "spec_draft_max")?,
            mtp_p_min: num(&kv, "mtp_p_min")?,
            ngram_min_match: num(&kv, "ngram_min_match")?,
            instrumented: flag("instrumented")?,
            traces: word("traces")?,
        })
    }
}

/// The preamble's lines, each with its line break.
impl fmt::Display for Preamble {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{MAGIC}")?;
        writeln!(f, "# engine={} {}", self.engine, self.version)?;
        for group in self.groups() {
            f.write_str("#")?;
            for (k, v) in group {
                write!(f, " {k}={v}")?;
            }
            f.write_str("\n")?;
        }
        Ok(())
    }
}

/// The `# summary k=v ...` trailer of a generation, the pairs in the order given.
pub fn summary_line<K: AsRef<str>, V: AsRef<str>>(fields: &[(K, V)]) -> String {
    let mut line = "# summary".to_owned();
    for (k, v) in fields {
        line.push(' ');
        line.push_str(k.as_ref());
        line.push('=');
        line.push_str(v.as_ref());
    }
    line
}

/// The pairs of a `# summary` trailer, or `None` for any other line.
pub fn parse_summary(line: &str) -> Option<Vec<(String, String)>> {
    let rest = line.strip_prefix("# summary")?;
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    Some(
        rest.split_whitespace()
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect(),
    )
}

/// A `bmoe_metrics v2` file being written: the preamble and the column line at creation, then
/// rows and summaries as they come.
pub struct MetricsWriter<W: Write> {
    w: W,
}

impl<W: Write> MetricsWriter<W> {
    /// Writes the preamble and the column line to `w`.
    pub fn new(mut w: W, preamble: &Preamble) -> io::Result<MetricsWriter<W>> {
        w.write_all(format!("{preamble}{CSV_COLUMNS}\n").as_bytes())?;
        Ok(MetricsWriter { w })
    }

    /// A token's row.
    pub fn row(&mut self, row: &MetricsRow) -> io::Result<()> {
        self.w.write_all(format!("{row}\n").as_bytes())
    }

    /// A generation's `# summary` trailer (see [`summary_line`]), flushed.
    pub fn summary<K: AsRef<str>, V: AsRef<str>>(&mut self, fields: &[(K, V)]) -> io::Result<()> {
        self.w
            .write_all(format!("{}\n", summary_line(fields)).as_bytes())?;
        self.w.flush()
    }

    /// The writer, for its caller to flush or close.
    pub fn into_inner(self) -> W {
        self.w
    }
}

/// What a `bmoe_metrics v2` file holds (a session writes rows and a summary per turn).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// The rows, in order.
    pub rows: Vec<MetricsRow>,
    /// The `# summary` trailers' pairs, in order.
    pub summaries: Vec<Vec<(String, String)>>,
}

/// Reads the rows and trailers of a `bmoe_metrics v2` file: the first line must be
/// [`MAGIC`]; the column line is the first line that is not a `#` line; other `#` lines, blank
/// lines and a repeated column line are skipped. Rows are read by column name.
pub fn read(text: &str) -> Result<Metrics, MetricsError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')));
    match lines.next() {
        Some((_, l)) if l.trim_end() == MAGIC => {}
        Some((_, l)) if l.starts_with("# bmoe_metrics ") => {
            return Err(at(1, format!("`{l}`: only bmoe_metrics v2 is understood")));
        }
        Some((_, l)) => return Err(at(1, format!("expected `{MAGIC}`, found `{l}`"))),
        None => {
            return Err(MetricsError {
                line: None,
                msg: format!("empty file, expected `{MAGIC}`"),
            });
        }
    }
    let mut m = Metrics::default();
    let mut header: Option<(&str, Columns)> = None;
    for (n, line) in lines {
        if let Some(s) = parse_summary(line) {
            m.summaries.push(s);
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        match &header {
            None => {
                let cols = Columns::parse(line).map_err(|e| at(n, e))?;
                header = Some((line, cols));
            }
            Some((h, _)) if *h == line => {}
            Some((_, cols)) => m
                .rows
                .push(MetricsRow::parse_with(cols, line).map_err(|e| at(n, e))?),
        }
    }
    if header.is_none() {
        return Err(MetricsError {
            line: None,
            msg: "no column line after the `#` lines".into(),
        });
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A float the row writes exactly: `k / 10^decimals`.
    fn fixed(decimals: u32) -> impl Strategy<Value = f64> {
        (-100_000_000i64..100_000_000).prop_map(move |k| k as f64 / 10f64.powi(decimals as i32))
    }

    fn row() -> impl Strategy<Value = MetricsRow> {
        (
            prop::array::uniform6(0u64..1 << 50),
            prop::array::uniform8(fixed(3)),
            prop::array::uniform8(fixed(1)),
            (fixed(2), fixed(4)),
        )
            .prop_map(|(n, f3, f1, (hit, frac))| MetricsRow {
                step: n[0],
                steps: n[1],
                wall_ms: f3[0],
                io_ms: f3[1],
                compute_ms: f3[2],
                read_bytes: n[2],
                cache_hit_pct: hit,
                stall_ms: f3[3],
                mgmt_ms: f3[4],
                majflt: n[3],
                cpu_ms: f3[5],
                dense_resident_frac: frac,
                turn: n[4],
                cache_budget_mib: f1[0],
                rss_mib: f1[1],
                rss_anon_mib: f1[2],
                rss_file_mib: f1[3],
                swap_mib: f1[4],
                mem_available_mib: f1[5],
                mem_free_mib: f1[6],
                swap_free_mib: f1[7],
                loop_overhead_ms: f3[6],
                mtp_batch: n[5],
                mtp_draft_ms: f3[7],
            })
    }

    fn word() -> impl Strategy<Value = String> {
        "[a-z0-9_./-]{1,12}"
    }

    fn preamble() -> impl Strategy<Value = Preamble> {
        (
            (word(), word(), word(), word()),
            prop::array::uniform8(any::<u32>()),
            prop::array::uniform16(any::<bool>()),
            (word(), word(), word(), word(), word(), word()),
            prop::array::uniform6(any::<f32>().prop_filter("finite", |v| v.is_finite())),
            (any::<i32>(), any::<u64>(), any::<u64>()),
        )
            .prop_map(|(w, n, b, t, f, (top_k, big, big2))| Preamble {
                engine: w.0,
                version: w.1,
                model: w.2,
                arch: w.3,
                n_layer: n[0],
                n_expert: n[1],
                n_expert_used: n[2],
                threads: n[3] as usize,
                n_ctx: n[4] as usize,
                n_ubatch: n[5] as usize,
                chatml: b[0],
                moe_stream: b[1],
                cache_mb: big,
                cache_auto: b[2],
                cache_floor_mb: big2,
                cache_ceil_mb: big ^ big2,
                cache_cycle_mb: big / 3,
                force_cache: b[3],
                load_all: b[4],
                io_threads: n[6] as usize,
                o_direct: b[5],
                overlap: b[6],
                prefetch: n[7] as usize,
                route_ahead: n[0] as usize / 2,
                predict_prefetch: b[7],
                predict_log: b[8],
                predict_spec_max: n[1] as usize / 2,
                dense_weights: t.0,
                drop_cold_frac: f[0],
                drop_renorm: b[9],
                drop_prefill: b[10],
                substitute_lambda: f[1],
                io_backend: t.1,
                cache_policy: t.2,
                couple_k: n[2] as usize / 2,
                couple_d: n[3] / 2,
                prompt_ahead: b[11],
                route_replay: t.3,
                temp: f[2],
                top_k,
                top_p: f[3],
                seed: n[4] / 2,
                compute_trace_layers: b[12],
                spec: t.4,
                spec_draft_max: n[5] as usize / 2,
                mtp_p_min: f[4],
                ngram_min_match: n[6] as usize / 2,
                instrumented: b[13],
                traces: t.5,
            })
    }

    proptest! {
        #[test]
        fn a_row_reads_back_as_written(r in row()) {
            let line = r.to_string();
            prop_assert_eq!(line.split(',').count(), CSV_COLUMNS.split(',').count());
            let back = MetricsRow::parse(&line).map_err(TestCaseError::fail)?;
            prop_assert_eq!(&back, &r);
            prop_assert_eq!(back.to_string(), line);
        }

        #[test]
        fn a_file_reads_back_as_written(
            p in preamble(),
            rows in prop::collection::vec(row(), 0..5),
            turns in 1usize..3,
        ) {
            let mut w = MetricsWriter::new(Vec::new(), &p).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut summaries = Vec::new();
            for t in 0..turns {
                for r in &rows {
                    w.row(r).map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
                let s = vec![("tokens".to_owned(), rows.len().to_string()), ("turn".to_owned(), t.to_string())];
                w.summary(&s).map_err(|e| TestCaseError::fail(e.to_string()))?;
                summaries.push(s);
            }
            let text = String::from_utf8(w.into_inner()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let m = read(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(m.rows.len(), rows.len() * turns);
            prop_assert_eq!(&m.rows[..rows.len()], &rows[..]);
            prop_assert_eq!(m.summaries, summaries);
            let back = Preamble::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&back, &p);
            prop_assert_eq!(back.to_string(), p.to_string());
        }
    }

    #[test]
    fn a_row_is_written_in_the_spec_columns() {
        let r = MetricsRow {
            step: 1,
            steps: 4,
            wall_ms: 20.0,
            read_bytes: 1 << 20,
            cache_hit_pct: -1.0,
            majflt: 256,
            dense_resident_frac: -1.0,
            rss_mib: 12.25,
            mtp_batch: 1,
            ..MetricsRow::default()
        };
        assert_eq!(
            r.to_string(),
            "1,4,20.000,0.000,0.000,1048576,-1.00,0.000,0.000,256,0.000,-1.0000,0,1.000,0.0,12.2,\
             0.0,0.0,0.0,0.0,0.0,0.0,0.000,1,0.000,0,0,0,0"
        );
    }

    #[test]
    fn the_preamble_states_its_facts_as_written() {
        let p = Preamble {
            engine: "sluice".into(),
            version: "0.1.0".into(),
            model: "m.gguf".into(),
            temp: 0.8,
            ..Preamble::default()
        };
        let text = p.to_string();
        assert!(
            text.starts_with("# bmoe_metrics v2\n# engine=sluice 0.1.0\n# model=m.gguf arch= ")
        );
        assert_eq!(text.lines().count(), 5);
        let facts = p.facts();
        assert_eq!(facts[0], ("engine", "sluice".to_owned()));
        assert!(facts.contains(&("temp", "0.8".to_owned())));
        assert!(facts.contains(&("io_two_wave", "0".to_owned())));
        // Every fact is a key=value the text states.
        for (k, v) in &facts[1..] {
            assert!(text.contains(&format!(" {k}={v}")), "{k}={v}");
        }
    }

    #[test]
    fn a_file_is_read_by_column_name_and_its_faults_are_placed() {
        let row = MetricsRow {
            step: 2,
            wall_ms: 7.25,
            read_bytes: 4096,
            ..MetricsRow::default()
        };
        // Columns in another order, one more column: read by name.
        let header = format!("extra,{CSV_COLUMNS}");
        let text = format!("{MAGIC}\n# x=1\n{header}\n9,{row}\n# summary tokens=1\n");
        let m = read(&text).unwrap();
        assert_eq!(m.rows, std::slice::from_ref(&row));
        // A file with CRLF line ends reads the same.
        assert_eq!(read(&text.replace('\n', "\r\n")), Ok(m.clone()));
        assert_eq!(m.summaries, [vec![("tokens".into(), "1".into())]]);
        let err = read(&format!("{MAGIC}\n{CSV_COLUMNS}\n1,2\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 3: 2 fields, but the column line has 29"
        );
        let err = read(&format!("{MAGIC}\nstep,steps\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 2: the column line has no `wall_ms` column"
        );
        let err = read("# io_trace v1\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 1: expected `# bmoe_metrics v2`, found `# io_trace v1`"
        );
        let err = read("# bmoe_metrics v3\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 1: `# bmoe_metrics v3`: only bmoe_metrics v2 is understood"
        );
        assert_eq!(read("").unwrap_err().line, None);
        let err = read(&format!(
            "{MAGIC}\n{CSV_COLUMNS}\n1,1,zz{}\n",
            ",0".repeat(26)
        ))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 3: column `wall_ms`: `zz` is not a valid value"
        );
        let err = read(&format!(
            "{MAGIC}\n{CSV_COLUMNS}\n1,-1{}\n",
            ",0".repeat(27)
        ))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 3: column `steps`: `-1` is not a valid value"
        );
        assert_eq!(
            read(MAGIC).unwrap_err().msg,
            "no column line after the `#` lines"
        );
    }
}
