//! The `io_trace v1` format (`sluice run --io-trace`): one row per window the expert store
//! read, stamped with the forward pass it was collected in.
//!
//! ```text
//! # io_trace v1
//! turn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns
//! 0,1,12,3,41,0,1,0,1409024,1062912,1064960,183211
//! ```
//!
//! `phase` 0 = prefill, 1 = decode; `step` = the context position of the pass's first token;
//! `proj` is the part's index in the layer's expert tensors (gate 0, up 1, down 2 for separate
//! tensors), `lane` the I/O lane, `spec` 1 for a speculative read, `offset` where the part's
//! bytes start, `req_bytes` the part's bytes, `read_bytes` the aligned window, `latency_ns` the
//! read's latency. The reader finds the columns by name (see [`crate::table`]).

use std::fmt::Write as _;

use crate::Phase;
use crate::table::{ReadError, parse_table};

/// The first line of the file.
pub const MAGIC: &str = "# io_trace v1";

/// The column line the writer writes.
pub const COLUMNS: &str =
    "turn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns";

/// One row of an `io_trace v1` file: one window read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoRead {
    /// Session turn (0 for a one-shot run).
    pub turn: u64,
    pub phase: Phase,
    /// Context position of the forward pass's first token.
    pub step: u64,
    pub layer: u32,
    pub expert: u32,
    /// The part's index in the layer's expert tensors.
    pub proj: u32,
    /// The I/O lane that read it.
    pub lane: u32,
    /// A speculative read (read ahead of the routing).
    pub spec: bool,
    /// Where the part's bytes start in the file.
    pub offset: u64,
    /// The part's bytes.
    pub req_bytes: u64,
    /// The aligned window read.
    pub read_bytes: u64,
    pub latency_ns: u64,
}

/// Appends the first line and the column line to `out`.
pub fn write_head(out: &mut String) {
    out.push_str(MAGIC);
    out.push('\n');
    out.push_str(COLUMNS);
    out.push('\n');
}

impl IoRead {
    /// Appends the row (with its newline) to `out`.
    pub fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            self.turn,
            self.phase.code(),
            self.step,
            self.layer,
            self.expert,
            self.proj,
            self.lane,
            u8::from(self.spec),
            self.offset,
            self.req_bytes,
            self.read_bytes,
            self.latency_ns
        );
    }
}

/// The rows of an `io_trace v1` file; `file` names it in errors.
pub fn parse_io_trace(file: &str, text: &str) -> Result<Vec<IoRead>, ReadError> {
    let t = parse_table(file, text, "io_trace", "v1")?;
    let [
        turn,
        phase,
        step,
        lane,
        spec,
        req,
        read,
        lat,
        layer,
        expert,
        proj,
        offset,
    ] = [
        "turn",
        "phase",
        "step",
        "lane",
        "spec",
        "req_bytes",
        "read_bytes",
        "latency_ns",
        "layer",
        "expert",
        "proj",
        "offset",
    ]
    .map(|c| t.col(c));
    let (turn, phase, step, lane, spec, req, read, lat) =
        (turn?, phase?, step?, lane?, spec?, req?, read?, lat?);
    let (layer, expert, proj, offset) = (layer?, expert?, proj?, offset?);
    t.rows
        .iter()
        .map(|r| {
            Ok(IoRead {
                spec: t.flag(r, spec)?,
                turn: t.get(r, turn)?,
                phase: t.phase(r, phase)?,
                step: t.get(r, step)?,
                layer: t.get(r, layer)?,
                expert: t.get(r, expert)?,
                proj: t.get(r, proj)?,
                lane: t.get(r, lane)?,
                offset: t.get(r, offset)?,
                req_bytes: t.get(r, req)?,
                read_bytes: t.get(r, read)?,
                latency_ns: t.get(r, lat)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read() -> impl Strategy<Value = IoRead> {
        (
            (any::<u64>(), any::<bool>(), any::<u64>()),
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
            any::<bool>(),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
        )
            .prop_map(
                |(
                    (turn, decode, step),
                    (layer, expert, proj, lane),
                    spec,
                    (offset, req_bytes, read_bytes, latency_ns),
                )| IoRead {
                    turn,
                    phase: if decode {
                        Phase::Decode
                    } else {
                        Phase::Prefill
                    },
                    step,
                    layer,
                    expert,
                    proj,
                    lane,
                    spec,
                    offset,
                    req_bytes,
                    read_bytes,
                    latency_ns,
                },
            )
    }

    fn write(rows: &[IoRead]) -> String {
        let mut text = String::new();
        write_head(&mut text);
        for r in rows {
            r.write(&mut text);
        }
        text
    }

    proptest! {
        #[test]
        fn written_rows_parse_back_equal(rows in proptest::collection::vec(read(), 0..20)) {
            let text = write(&rows);
            prop_assert_eq!(parse_io_trace("io.csv", &text).expect("parses"), rows);
        }

        #[test]
        fn parsed_text_writes_back_identical(rows in proptest::collection::vec(read(), 0..20)) {
            let text = write(&rows);
            prop_assert_eq!(write(&parse_io_trace("io.csv", &text).expect("parses")), text);
        }
    }

    #[test]
    fn columns_are_found_by_name() {
        // Reordered columns and an extra one are fine.
        let text = "# io_trace v1
latency_ns,read_bytes,extra,offset,req_bytes,spec,proj,lane,expert,step,phase,layer,turn
5,4096,x,8192,10,0,2,3,9,7,1,4,2
";
        let r = parse_io_trace("t", text).unwrap();
        assert_eq!(
            r,
            vec![IoRead {
                turn: 2,
                phase: Phase::Decode,
                step: 7,
                layer: 4,
                expert: 9,
                proj: 2,
                lane: 3,
                spec: false,
                offset: 8192,
                req_bytes: 10,
                read_bytes: 4096,
                latency_ns: 5
            }]
        );
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let err = |text: &str| format!("{:#}", parse_io_trace("io.csv", text).unwrap_err());
        let head = format!("{MAGIC}\n# note\n{COLUMNS}\n");
        let e = err(&format!("{head}0,1,2,0,0,0,0,0,0,10,4096,abc\n"));
        assert!(e.starts_with("io.csv:4: column `latency_ns`"), "{e}");
        let e = err(&format!("{head}0,1,2,0,0\n"));
        assert!(e.starts_with("io.csv:4: 5 fields"), "{e}");
        let e = err(&format!("{head}0,2,2,0,0,0,0,0,0,10,4096,1\n"));
        assert!(e.starts_with("io.csv:4: phase 2"), "{e}");
        let e = err(&format!("{head}0,1,2,0,0,0,0,2,0,10,4096,1\n"));
        assert!(e.starts_with("io.csv:4: spec 2: expected 0 or 1"), "{e}");
        let e = err("# io_trace v1\nturn,phase,step\n");
        assert!(
            e.starts_with("io.csv:2: the column line has no `lane`"),
            "{e}"
        );
        let e = err("# io_trace v1\nturn,phase,step,lane,spec,req_bytes,read_bytes,latency_ns\n");
        assert!(
            e.starts_with("io.csv:2: the column line has no `layer`"),
            "{e}"
        );
        let e = err("# io_trace v2\n");
        assert!(
            e.contains("io.csv:1:") && e.contains("only io_trace v1"),
            "{e}"
        );
        let e = err("# compute_trace v1\n");
        assert!(e.contains("expected `# io_trace v1`"), "{e}");
        let e = err("");
        assert_eq!(e, "io.csv: empty file, expected `# io_trace v1`");
    }
}
