//! Readers of the telemetry files the runtime writes, beside their writers in
//! [`crate::telemetry`]: `io_trace v1`, `compute_trace v1` and the rows of `bmoe_metrics v2`.
//! Columns are found by their names in the column line (added columns do not break a reader),
//! `#` lines are skipped, and a malformed file is an error naming the file and line.

use std::str::FromStr;

use crate::telemetry::Phase;

/// A malformed telemetry file: which file, which line (when one is to blame), what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {msg}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ReadError {
    pub file: String,
    pub line: Option<usize>,
    pub msg: String,
}

type Result<T> = std::result::Result<T, ReadError>;

fn at(file: &str, line: usize, msg: String) -> ReadError {
    ReadError {
        file: file.to_owned(),
        line: Some(line),
        msg,
    }
}

fn whole(file: &str, msg: String) -> ReadError {
    ReadError {
        file: file.to_owned(),
        line: None,
        msg,
    }
}

/// A trace file's column line and data rows, each row with its 1-based line number.
pub struct Table<'a> {
    pub file: &'a str,
    pub header_line: usize,
    pub columns: Vec<&'a str>,
    pub rows: Vec<(usize, Vec<&'a str>)>,
}

/// A column of a [`Table`], found by name.
#[derive(Clone, Copy)]
pub struct Col<'n> {
    pub idx: usize,
    pub name: &'n str,
}

/// Splits `text` (the file `file`) into its column line and rows. The first line must be
/// `# <kind> v<version>`; other `#` lines and blank lines are skipped wherever they are, as is a
/// repeated column line.
pub fn parse_table<'a>(
    file: &'a str,
    text: &'a str,
    kind: &str,
    version: &str,
) -> Result<Table<'a>> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')));
    let want = format!("# {kind} {version}");
    match lines.next() {
        Some((_, l)) if l.trim_end() == want => {}
        Some((_, l)) if l.starts_with(&format!("# {kind} ")) => {
            return Err(at(
                file,
                1,
                format!("`{l}`: only {kind} {version} is understood"),
            ));
        }
        Some((_, l)) => return Err(at(file, 1, format!("expected `{want}`, found `{l}`"))),
        None => return Err(whole(file, format!("empty file, expected `{want}`"))),
    }
    let mut header: Option<(usize, &str)> = None;
    let mut columns: Vec<&str> = Vec::new();
    let mut rows = Vec::new();
    for (n, l) in lines {
        if l.starts_with('#') || l.trim().is_empty() {
            continue;
        }
        match header {
            None => {
                header = Some((n, l));
                columns = l.split(',').map(str::trim).collect();
            }
            Some((_, h)) if l == h => {}
            Some(_) => {
                let fields: Vec<&str> = l.split(',').map(str::trim).collect();
                if fields.len() != columns.len() {
                    return Err(at(
                        file,
                        n,
                        format!(
                            "{} fields, but the column line has {}",
                            fields.len(),
                            columns.len()
                        ),
                    ));
                }
                rows.push((n, fields));
            }
        }
    }
    let Some((header_line, _)) = header else {
        return Err(whole(file, "no column line after the `#` lines".into()));
    };
    Ok(Table {
        file,
        header_line,
        columns,
        rows,
    })
}

impl Table<'_> {
    /// The column named `name`.
    pub fn col<'n>(&self, name: &'n str) -> Result<Col<'n>> {
        let idx = self
            .columns
            .iter()
            .position(|c| *c == name)
            .ok_or_else(|| {
                at(
                    self.file,
                    self.header_line,
                    format!("the column line has no `{name}` column"),
                )
            })?;
        Ok(Col { idx, name })
    }

    /// A row's field in column `col`, parsed.
    pub fn get<T: FromStr>(&self, row: &(usize, Vec<&str>), col: Col<'_>) -> Result<T> {
        let v = row.1[col.idx];
        v.parse().map_err(|_| {
            at(
                self.file,
                row.0,
                format!("column `{}`: `{v}` is not a valid value", col.name),
            )
        })
    }

    /// A row's `phase` field: 0 (prefill) or 1 (decode).
    pub fn phase(&self, row: &(usize, Vec<&str>), col: Col<'_>) -> Result<Phase> {
        let p: u8 = self.get(row, col)?;
        Phase::from_code(p).ok_or_else(|| {
            at(
                self.file,
                row.0,
                format!("phase {p}: expected 0 (prefill) or 1 (decode)"),
            )
        })
    }
}

/// One row of an `io_trace v1` file (the columns the analysis uses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoRead {
    pub turn: u64,
    pub phase: Phase,
    pub step: u64,
    pub lane: u32,
    pub spec: bool,
    pub req_bytes: u64,
    pub read_bytes: u64,
    pub latency_ns: u64,
}

/// The rows of an `io_trace v1` file; `file` names it in errors.
pub fn parse_io_trace(file: &str, text: &str) -> Result<Vec<IoRead>> {
    let t = parse_table(file, text, "io_trace", "v1")?;
    let [turn, phase, step, lane, spec, req, read, lat] = [
        "turn",
        "phase",
        "step",
        "lane",
        "spec",
        "req_bytes",
        "read_bytes",
        "latency_ns",
    ]
    .map(|c| t.col(c));
    let (turn, phase, step, lane, spec, req, read, lat) =
        (turn?, phase?, step?, lane?, spec?, req?, read?, lat?);
    t.rows
        .iter()
        .map(|r| {
            let s: u8 = t.get(r, spec)?;
            if s > 1 {
                return Err(at(file, r.0, format!("spec {s}: expected 0 or 1")));
            }
            Ok(IoRead {
                turn: t.get(r, turn)?,
                phase: t.phase(r, phase)?,
                step: t.get(r, step)?,
                lane: t.get(r, lane)?,
                spec: s == 1,
                req_bytes: t.get(r, req)?,
                read_bytes: t.get(r, read)?,
                latency_ns: t.get(r, lat)?,
            })
        })
        .collect()
}

/// The decode rows of a `bmoe_metrics v2` CSV (`--csv`): their count, wall time and reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsWall {
    pub rows: u64,
    pub wall_ms: f64,
    pub read_bytes: u64,
}

/// Sums `wall_ms` and `read_bytes` over the rows of a `bmoe_metrics v2` CSV (every row is a
/// decoded token; the preamble and `# summary` lines are skipped).
pub fn parse_metrics_wall(file: &str, text: &str) -> Result<MetricsWall> {
    let t = parse_table(file, text, "bmoe_metrics", "v2")?;
    let (wall, read) = (t.col("wall_ms")?, t.col("read_bytes")?);
    let mut m = MetricsWall::default();
    for r in &t.rows {
        let w: f64 = t.get(r, wall)?;
        m.wall_ms += w;
        m.read_bytes += t.get::<u64>(r, read)?;
        m.rows += 1;
    }
    Ok(m)
}

/// One row of a `compute_trace v1` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub turn: u64,
    pub phase: Phase,
    pub step: u64,
    pub layer: i64,
    pub op: String,
    pub name: String,
    pub wall_ns: u64,
    pub majflt: u64,
}

/// The rows of a `compute_trace v1` file; `file` names it in errors.
pub fn parse_compute_trace(file: &str, text: &str) -> Result<Vec<Node>> {
    let t = parse_table(file, text, "compute_trace", "v1")?;
    let [turn, phase, step, layer, op, name, wall, flt] = [
        "turn", "phase", "step", "layer", "op", "name", "wall_ns", "majflt",
    ]
    .map(|c| t.col(c));
    let (turn, phase, step, layer, op, name, wall, flt) =
        (turn?, phase?, step?, layer?, op?, name?, wall?, flt?);
    t.rows
        .iter()
        .map(|r| {
            Ok(Node {
                turn: t.get(r, turn)?,
                phase: t.phase(r, phase)?,
                step: t.get(r, step)?,
                layer: t.get(r, layer)?,
                op: r.1[op.idx].to_owned(),
                name: r.1[name.idx].to_owned(),
                wall_ns: t.get(r, wall)?,
                majflt: t.get(r, flt)?,
            })
        })
        .collect()
}

/// A `#`-preambled CSV read leniently by column name, for displays that show whatever a file
/// holds: the `key=value` pairs of the `#` lines before the column line (the first, magic line
/// is skipped whatever it says), the column line, the data rows, and the `#` lines after the
/// column line. Columns may be missing ([`LooseTable::col`] is an `Option`); only a file without
/// a column line, or a number that is not one, is an error.
#[derive(Debug)]
pub struct LooseTable {
    pub file: String,
    pub preamble: Vec<(String, String)>,
    pub header: Vec<String>,
    /// (1-based line number, fields).
    pub rows: Vec<(usize, Vec<String>)>,
    pub trailer: Vec<String>,
}

impl LooseTable {
    /// Reads `text` (the file `file`).
    pub fn parse(text: &str, file: &str) -> Result<LooseTable> {
        let mut t = LooseTable {
            file: file.to_string(),
            preamble: Vec::new(),
            header: Vec::new(),
            rows: Vec::new(),
            trailer: Vec::new(),
        };
        let fields = |line: &str| line.split(',').map(|s| s.trim().to_string()).collect();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if i == 0 || line.trim().is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix('#') {
                if t.header.is_empty() {
                    t.preamble.extend(
                        telemetry::parse::key_values(rest)
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v)),
                    );
                } else {
                    t.trailer.push(rest.trim().to_string());
                }
            } else if t.header.is_empty() {
                t.header = fields(line);
            } else {
                t.rows.push((i + 1, fields(line)));
            }
        }
        if t.header.is_empty() {
            return Err(whole(file, "no column header line".into()));
        }
        Ok(t)
    }

    /// The index of the column named `name`, if there is one.
    pub fn col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    /// The index of the column named `name`, which the reader cannot do without.
    pub fn need(&self, name: &str) -> Result<usize> {
        self.col(name).ok_or_else(|| {
            whole(
                &self.file,
                format!("the column header has no `{name}` column (columns are read by name)"),
            )
        })
    }

    /// The value of preamble key `key`.
    pub fn pre(&self, key: &str) -> Option<&str> {
        self.preamble
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Field `col` of a row as a number; `None` for an absent column. A field that is not a
    /// number is an error naming the file and line.
    pub fn num(&self, row: &(usize, Vec<String>), col: Option<usize>) -> Result<Option<f64>> {
        let Some(c) = col else { return Ok(None) };
        let (line, fields) = row;
        let text = fields.get(c).map(String::as_str).unwrap_or("");
        let v = text.parse::<f64>().map_err(|_| {
            at(
                &self.file,
                *line,
                format!(
                    "`{}`: expected a number, found `{}`",
                    self.header[c],
                    text.chars().take(40).collect::<String>()
                ),
            )
        })?;
        Ok(Some(v))
    }

    /// Field `col` of a row as text; empty for an absent column or field.
    pub fn text<'a>(&self, row: &'a (usize, Vec<String>), col: Option<usize>) -> &'a str {
        col.and_then(|c| row.1.get(c))
            .map(String::as_str)
            .unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Summary, TokenRow};
    use crate::telemetry::{ComputeTrace, CsvSink, IoTrace, Phase, Preamble};

    #[test]
    fn columns_are_found_by_name() {
        // Reordered columns and an extra one are fine.
        let text = "# io_trace v1
latency_ns,read_bytes,extra,req_bytes,spec,lane,step,phase,turn
5,4096,x,10,0,3,7,1,2
";
        let r = parse_io_trace("t", text).unwrap();
        assert_eq!(
            r,
            vec![IoRead {
                turn: 2,
                phase: Phase::Decode,
                step: 7,
                lane: 3,
                spec: false,
                req_bytes: 10,
                read_bytes: 4096,
                latency_ns: 5
            }]
        );
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let err = |text: &str| format!("{:#}", parse_io_trace("io.csv", text).unwrap_err());
        let head = "# io_trace v1\n# note\nturn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns\n";
        let e = err(&format!("{head}0,1,2,0,0,0,0,0,0,10,4096,abc\n"));
        assert!(e.starts_with("io.csv:4: column `latency_ns`"), "{e}");
        let e = err(&format!("{head}0,1,2,0,0\n"));
        assert!(e.starts_with("io.csv:4: 5 fields"), "{e}");
        let e = err(&format!("{head}0,2,2,0,0,0,0,0,0,10,4096,1\n"));
        assert!(e.starts_with("io.csv:4: phase 2"), "{e}");
        let e = err("# io_trace v1\nturn,phase,step\n");
        assert!(
            e.starts_with("io.csv:2: the column line has no `lane`"),
            "{e}"
        );
        let e = err("# io_trace v2\n");
        assert!(
            e.contains("io.csv:1:") && e.contains("only io_trace v1"),
            "{e}"
        );
        let e = err("# compute_trace v1\n");
        assert!(e.contains("expected `# io_trace v1`"), "{e}");
        let e = format!(
            "{:#}",
            parse_compute_trace("ct.csv", "# compute_trace v1\n").unwrap_err()
        );
        assert!(e.starts_with("ct.csv: no column line"), "{e}");
    }

    #[test]
    fn an_io_trace_reads_back_what_was_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("io.csv");
        let mut w = IoTrace::create(&path).expect("create");
        let window = |part: usize, offset: u64, req: u64, read: u64, ns: u64| store::WindowRead {
            part,
            offset,
            req_bytes: req,
            read_bytes: read,
            latency_ns: ns,
        };
        w.stamp(0, Phase::Prefill, 0);
        w.record(1, 7, 2, false, &[window(0, 4096, 100, 4096, 900)]);
        w.stamp(3, Phase::Decode, 12);
        w.record(
            0,
            5,
            1,
            true,
            &[window(2, 8192, 50, 512, 70), window(1, 0, 9, 9, 3)],
        );
        w.finish().expect("finish");
        let text = std::fs::read_to_string(&path).expect("read");
        let rows = parse_io_trace("io.csv", &text).expect("parse");
        let got: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.turn,
                    r.phase.code(),
                    r.step,
                    r.lane,
                    r.spec,
                    r.req_bytes,
                    r.read_bytes,
                    r.latency_ns,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0, 0, 2, false, 100, 4096, 900),
                (3, 1, 12, 1, true, 50, 512, 70),
                (3, 1, 12, 1, true, 9, 9, 3),
            ]
        );
    }

    #[test]
    fn a_compute_trace_reads_back_its_nodes_and_layer_segments() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pre = Preamble {
            arch: "olmoe".into(),
            n_layer: 2,
            ..Preamble::default()
        };
        for layers in [false, true] {
            let path = dir.path().join(format!("ct-{layers}.csv"));
            let mut w = ComputeTrace::create(&path, layers, &pre).expect("create");
            w.begin(2, Phase::Decode, 9);
            w.node("attn_norm", Some(0));
            w.node("ffn_moe_out", Some(0));
            w.node("l_out", Some(1));
            w.node("result_output", None);
            w.end();
            w.finish().expect("finish");
            let text = std::fs::read_to_string(&path).expect("read");
            let nodes = parse_compute_trace("ct.csv", &text).expect("parse");
            let got: Vec<_> = nodes
                .iter()
                .map(|n| {
                    (
                        n.turn,
                        n.phase.code(),
                        n.step,
                        n.layer,
                        n.op.as_str(),
                        n.name.as_str(),
                    )
                })
                .collect();
            let want = if layers {
                vec![
                    (2, 1, 9, 0, "LAYER", "blk.0"),
                    (2, 1, 9, 1, "LAYER", "blk.1"),
                    (2, 1, 9, -1, "LAYER", "post"),
                ]
            } else {
                vec![
                    (2, 1, 9, 0, "RMS_NORM", "attn_norm-0"),
                    (2, 1, 9, 0, "MUL_MAT_ID", "ffn_moe_out-0"),
                    (2, 1, 9, 1, "ADD", "l_out-1"),
                    (2, 1, 9, -1, "MUL_MAT", "result_output"),
                ]
            };
            assert_eq!(got, want, "layers {layers}");
        }
    }

    #[test]
    fn the_metrics_csv_reads_back_its_rows_past_the_preamble_and_summary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.csv");
        let mut w = CsvSink::create(&path, &Preamble::default()).expect("create");
        for (step, wall_ms, read_bytes) in [(1, 12.5, 4096u64), (2, 7.25, 0), (3, 1.0, 1 << 20)] {
            w.row(&TokenRow {
                step,
                steps: 3,
                wall_ms,
                read_bytes,
                ..TokenRow::default()
            })
            .expect("row");
        }
        w.summary(&Summary::default()).expect("summary");
        drop(w);
        let text = std::fs::read_to_string(&path).expect("read");
        let m = parse_metrics_wall("m.csv", &text).expect("parse");
        assert_eq!(m.rows, 3);
        assert_eq!(m.read_bytes, 4096 + (1 << 20));
        assert!((m.wall_ms - 20.75).abs() < 1e-9, "{}", m.wall_ms);
    }

    #[test]
    fn loose_tables_are_read_by_column_name() {
        let text = "# io_trace v1\n# a=1 model=/x y/z.gguf b=2\nlane,read_bytes,latency_ns\n\
                    0,4096,1000\n1,8192,3000\n# summary k=v\n";
        let t = LooseTable::parse(text, "io.csv").unwrap();
        assert_eq!(t.pre("model"), Some("/x y/z.gguf"));
        assert_eq!(t.pre("b"), Some("2"));
        assert_eq!(t.header, ["lane", "read_bytes", "latency_ns"]);
        assert_eq!(t.rows.len(), 2);
        let c = t.col("latency_ns");
        assert_eq!(t.num(&t.rows[1], c).unwrap(), Some(3000.0));
        assert_eq!(t.num(&t.rows[1], t.col("nope")).unwrap(), None);
        assert_eq!(t.text(&t.rows[0], Some(0)), "0");
        assert_eq!(t.text(&t.rows[0], None), "");
        assert_eq!(t.trailer, ["summary k=v"]);
        let bad = LooseTable::parse("# io_trace v1\nx\nzz\n", "f.csv").unwrap();
        let err = bad.num(&bad.rows[0], Some(0)).unwrap_err().to_string();
        assert_eq!(err, "f.csv:3: `x`: expected a number, found `zz`");
        let err = bad.need("y").unwrap_err().to_string();
        assert_eq!(
            err,
            "f.csv: the column header has no `y` column (columns are read by name)"
        );
        let err = LooseTable::parse("# m\n# a=1\n", "e.csv").unwrap_err();
        assert_eq!(err.to_string(), "e.csv: no column header line");
    }
}
