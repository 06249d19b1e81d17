//! Readers of the telemetry files a run writes: the `io_trace v1` and `compute_trace v1`
//! readers are the `telemetry` crate's (named here for the runtime's reports), the rows of
//! `bmoe_metrics v2` are read here on the same table layout ([`telemetry::table`]: columns by
//! name, `#` lines skipped, a malformed file an error naming the file and line), and
//! [`LooseTable`] reads any of them leniently for a display.

pub use telemetry::compute_trace::{Node, parse_compute_trace};
pub use telemetry::io_trace::{IoRead, parse_io_trace};
pub use telemetry::table::{Col, ReadError, Table, parse_table};

type Result<T> = std::result::Result<T, ReadError>;

fn at(file: &str, line: usize, msg: String) -> ReadError {
    ReadError::at(file, line, msg)
}

fn whole(file: &str, msg: String) -> ReadError {
    ReadError::whole(file, msg)
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
                        telemetry::key_values(rest)
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
    use crate::facts::Preamble;
    use crate::telemetry::CsvSink;

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
