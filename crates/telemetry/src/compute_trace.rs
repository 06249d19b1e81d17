//! The `compute_trace v1` format (`sluice run --compute-trace` / `--compute-trace-layers`):
//! one row per named intermediate of a forward pass (or per layer segment).
//!
//! ```text
//! # compute_trace v1
//! # model=<path> arch=<string> n_layer=<int> n_threads=<int> io_threads=<int> o_direct=0|1 overlap=0|1
//! turn,phase,step,seq,layer,op,name,wall_ns,majflt
//! 0,1,7,0,0,RMS_NORM,attn_norm-0,5210,0
//! ```
//!
//! A row's `wall_ns` is the time from the previous boundary to the moment the intermediate is
//! complete, `majflt` the major faults in between, `op` the operation the name stands for
//! (`LAYER` for a layer segment, whose `name` is `blk.<il>`, or `post` for the output head,
//! layer -1). The reader finds the columns by name (see [`crate::table`]); the `# model=` line
//! is optional, but read whole when present.

use std::fmt::Write as _;

use crate::Phase;
use crate::route_trace::key_values;
use crate::table::{ReadError, parse_table};

/// The first line of the file.
pub const MAGIC: &str = "# compute_trace v1";

/// The column line the writer writes.
pub const COLUMNS: &str = "turn,phase,step,seq,layer,op,name,wall_ns,majflt";

/// What the `# model=` preamble line states: the model and the run's threads and I/O.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Model path as recorded (may contain spaces).
    pub model: String,
    pub arch: String,
    pub n_layer: u32,
    /// Compute threads.
    pub n_threads: u64,
    /// I/O lanes.
    pub io_threads: u64,
    pub o_direct: bool,
    /// I/O overlapped with compute.
    pub overlap: bool,
}

/// One row of a `compute_trace v1` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Session turn (0 for a one-shot run).
    pub turn: u64,
    pub phase: Phase,
    /// Context position of the forward pass's first token.
    pub step: u64,
    /// The row's place in its pass, from 0.
    pub seq: u64,
    /// The layer, -1 for none (the output head).
    pub layer: i64,
    pub op: String,
    pub name: String,
    pub wall_ns: u64,
    pub majflt: u64,
}

/// A parsed compute trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The `# model=` line, when the file has one.
    pub head: Option<Head>,
    pub nodes: Vec<Node>,
}

impl Head {
    /// Appends the first line, the `# model=` line and the column line to `out`.
    pub fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "{MAGIC}\n# model={} arch={} n_layer={} n_threads={} io_threads={} o_direct={} overlap={}\n{COLUMNS}",
            self.model,
            self.arch,
            self.n_layer,
            self.n_threads,
            self.io_threads,
            u8::from(self.o_direct),
            u8::from(self.overlap)
        );
    }
}

impl Node {
    /// Appends the row (with its newline) to `out`.
    pub fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{}",
            self.turn,
            self.phase.code(),
            self.step,
            self.seq,
            self.layer,
            self.op,
            self.name,
            self.wall_ns,
            self.majflt
        );
    }
}

/// Appends the first line and the column line to `out`: the head of a file without a
/// `# model=` line.
pub fn write_bare_head(out: &mut String) {
    let _ = writeln!(out, "{MAGIC}\n{COLUMNS}");
}

fn model_line(t: &crate::table::Table<'_>, line: usize, text: &str) -> Result<Head, ReadError> {
    let pairs = key_values(text);
    let get = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| {
                ReadError::at(
                    t.file,
                    line,
                    format!("`# model=` line: expected a `{key}=` field"),
                )
            })
    };
    let int = |key: &str| -> Result<u64, ReadError> {
        let v = get(key)?;
        v.parse().map_err(|_| {
            ReadError::at(t.file, line, format!("`{key}`: `{v}` is not a valid value"))
        })
    };
    let flag = |key: &str| -> Result<bool, ReadError> {
        match int(key)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(ReadError::at(
                t.file,
                line,
                format!("`{key}` {v}: expected 0 or 1"),
            )),
        }
    };
    let n_layer = int("n_layer")?;
    Ok(Head {
        model: get("model")?.to_owned(),
        arch: get("arch")?.to_owned(),
        n_layer: u32::try_from(n_layer).map_err(|_| {
            ReadError::at(
                t.file,
                line,
                format!("`n_layer`: `{n_layer}` is not a valid value"),
            )
        })?,
        n_threads: int("n_threads")?,
        io_threads: int("io_threads")?,
        o_direct: flag("o_direct")?,
        overlap: flag("overlap")?,
    })
}

impl Trace {
    /// Parses a `compute_trace v1` file's text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Trace, ReadError> {
        let t = parse_table(file, text, "compute_trace", "v1")?;
        let [turn, phase, step, layer, op, name, wall, flt, seq] = [
            "turn", "phase", "step", "layer", "op", "name", "wall_ns", "majflt", "seq",
        ]
        .map(|c| t.col(c));
        let (turn, phase, step, layer, op, name, wall, flt, seq) =
            (turn?, phase?, step?, layer?, op?, name?, wall?, flt?, seq?);
        let mut head = None;
        for &(line, comment) in &t.preamble {
            let comment = comment.trim_start();
            if comment.starts_with("model=") {
                if head.is_some() {
                    return Err(ReadError::at(file, line, "a second `# model=` line".into()));
                }
                head = Some(model_line(&t, line, comment)?);
            }
        }
        let nodes = t
            .rows
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
                    seq: t.get(r, seq)?,
                })
            })
            .collect::<Result<Vec<Node>, ReadError>>()?;
        Ok(Trace { head, nodes })
    }
}

/// The rows of a `compute_trace v1` file; `file` names it in errors.
pub fn parse_compute_trace(file: &str, text: &str) -> Result<Vec<Node>, ReadError> {
    Trace::parse(file, text).map(|t| t.nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn head() -> impl Strategy<Value = Head> {
        (
            "[a-zA-Z0-9/._-]{1,12}( [a-zA-Z0-9/._-]{1,8}){0,2}",
            "[a-z0-9]{1,8}",
            any::<u32>(),
            (any::<u64>(), any::<u64>(), any::<bool>(), any::<bool>()),
        )
            .prop_map(
                |(model, arch, n_layer, (n_threads, io_threads, o_direct, overlap))| Head {
                    model,
                    arch,
                    n_layer,
                    n_threads,
                    io_threads,
                    o_direct,
                    overlap,
                },
            )
    }

    fn node() -> impl Strategy<Value = Node> {
        (
            (any::<u64>(), any::<bool>(), any::<u64>(), any::<u64>()),
            -1i64..100,
            "[A-Z_]{1,14}",
            "[a-z_.]{1,12}(-[0-9]{1,2})?",
            (any::<u64>(), any::<u64>()),
        )
            .prop_map(
                |((turn, decode, step, seq), layer, op, name, (wall_ns, majflt))| Node {
                    turn,
                    phase: if decode {
                        Phase::Decode
                    } else {
                        Phase::Prefill
                    },
                    step,
                    seq,
                    layer,
                    op,
                    name,
                    wall_ns,
                    majflt,
                },
            )
    }

    fn write(head: Option<&Head>, nodes: &[Node]) -> String {
        let mut text = String::new();
        match head {
            Some(h) => h.write(&mut text),
            None => write_bare_head(&mut text),
        }
        for n in nodes {
            n.write(&mut text);
        }
        text
    }

    proptest! {
        #[test]
        fn written_rows_parse_back_equal(
            head in proptest::option::of(head()),
            nodes in proptest::collection::vec(node(), 0..20),
        ) {
            let text = write(head.as_ref(), &nodes);
            let t = Trace::parse("ct.csv", &text).expect("parses");
            prop_assert_eq!(t, Trace { head, nodes });
        }

        #[test]
        fn parsed_text_writes_back_identical(
            head in proptest::option::of(head()),
            nodes in proptest::collection::vec(node(), 0..20),
        ) {
            let text = write(head.as_ref(), &nodes);
            let t = Trace::parse("ct.csv", &text).expect("parses");
            prop_assert_eq!(write(t.head.as_ref(), &t.nodes), text);
        }
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let err = |text: &str| Trace::parse("ct.csv", text).unwrap_err().to_string();
        assert_eq!(
            err("# compute_trace v1\n"),
            "ct.csv: no column line after the `#` lines"
        );
        assert_eq!(
            err(&format!("{MAGIC}\n# model=m arch=a n_layer=2\n{COLUMNS}\n")),
            "ct.csv:2: `# model=` line: expected a `n_threads=` field"
        );
        assert_eq!(
            err(&format!(
                "{MAGIC}\n# model=m arch=a n_layer=2 n_threads=1 io_threads=1 o_direct=2 overlap=0\n{COLUMNS}\n"
            )),
            "ct.csv:2: `o_direct` 2: expected 0 or 1"
        );
        assert_eq!(
            err(&format!("{MAGIC}\n{COLUMNS}\n0,1,2,0,x,LAYER,blk.0,5,0\n")),
            "ct.csv:3: column `layer`: `x` is not a valid value"
        );
    }
}
