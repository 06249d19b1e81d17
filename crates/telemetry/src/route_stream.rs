//! colibri's `ROUTE_TRACE` stream (docs/history.md), written by `sluice run
//! --route-trace-stream` (or `ROUTE_TRACE=PATH`) and read by `sluice analyze pairs`.
//!
//! ```text
//! <call> <row> <layer> <expert>:<gate> <expert>:<gate> ...
//! ```
//!
//! One line per MoE layer call and batch row: `call` counts the layer calls from 0, `row` is the
//! row's place in the forward batch (a prefill's last layer routes only the last row, which
//! keeps its place), then each routed expert with its gate as applied, 4 decimals. There is no
//! header; blank lines are skipped.

use std::fmt::Write as _;

use crate::TraceError;

/// One line of the stream: one batch row's routing at one MoE layer call.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamRow {
    /// The layer call, counted from 0.
    pub call: u64,
    /// The row's place in its forward batch.
    pub row: u64,
    pub layer: u32,
    /// The routed experts in slot order, each with its applied gate.
    pub experts: Vec<(u32, f32)>,
}

impl StreamRow {
    /// Appends the line (with its newline) to `out`.
    pub fn write(&self, out: &mut String) {
        write_row(
            out,
            self.call,
            self.row,
            self.layer,
            self.experts.iter().copied(),
        );
    }
}

/// Appends one line (with its newline) to `out` without building a [`StreamRow`]: what a writer
/// on a hot path calls.
pub fn write_row(
    out: &mut String,
    call: u64,
    row: u64,
    layer: u32,
    experts: impl IntoIterator<Item = (u32, f32)>,
) {
    let _ = write!(out, "{call} {row} {layer}");
    for (id, gate) in experts {
        let _ = write!(out, " {id}:{gate:.4}");
    }
    out.push('\n');
}

/// Parses a stream's text; `name` is used in error messages (normally the file name).
pub fn parse(text: &str, name: &str) -> Result<Vec<StreamRow>, TraceError> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let bad = |message: &str| TraceError::Malformed {
            source_name: name.to_string(),
            line: i + 1,
            message: message.to_string(),
        };
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        if f.len() < 3 {
            return Err(bad("expected `<call> <row> <layer> <expert>:<gate> ...`"));
        }
        let row: u64 = f[1].parse().map_err(|_| bad("row: expected an integer"))?;
        let layer: u32 = f[2]
            .parse()
            .map_err(|_| bad("layer: expected an integer"))?;
        let call: u64 = f[0].parse().map_err(|_| bad("call: expected an integer"))?;
        let mut experts = Vec::with_capacity(f.len() - 3);
        for cell in &f[3..] {
            let (e, g) = cell
                .split_once(':')
                .ok_or_else(|| bad("expected <expert>:<gate>"))?;
            let e: u32 = e.parse().map_err(|_| bad("expert: expected an integer"))?;
            let g: f32 = g.parse().map_err(|_| bad("gate: expected a number"))?;
            experts.push((e, g));
        }
        rows.push(StreamRow {
            call,
            row,
            layer,
            experts,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row() -> impl Strategy<Value = StreamRow> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            proptest::collection::vec((any::<u32>(), 0u32..=10_000), 0..10),
        )
            .prop_map(|(call, row, layer, experts)| StreamRow {
                call,
                row,
                layer,
                // gates that 4 decimals hold exactly
                experts: experts
                    .into_iter()
                    .map(|(e, g)| (e, g as f32 / 1e4))
                    .collect(),
            })
    }

    fn write(rows: &[StreamRow]) -> String {
        let mut text = String::new();
        for r in rows {
            r.write(&mut text);
        }
        text
    }

    proptest! {
        #[test]
        fn written_rows_parse_back_equal(rows in proptest::collection::vec(row(), 0..20)) {
            let text = write(&rows);
            prop_assert_eq!(parse(&text, "s").expect("the writer's text parses"), rows);
        }

        #[test]
        fn parsed_text_writes_back_identical(rows in proptest::collection::vec(row(), 0..20)) {
            let text = write(&rows);
            prop_assert_eq!(write(&parse(&text, "s").expect("parses")), text);
        }
    }

    #[test]
    fn a_line_is_the_call_row_layer_and_the_gates_to_4_decimals() {
        let mut text = String::new();
        write_row(&mut text, 7, 0, 3, [(12, 0.123_456), (5, 0.5)]);
        assert_eq!(text, "7 0 3 12:0.1235 5:0.5000\n");
        write_row(&mut text, 8, 1, 4, []);
        assert_eq!(
            parse(&text, "s").unwrap()[1],
            StreamRow {
                call: 8,
                row: 1,
                layer: 4,
                experts: vec![],
            }
        );
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let err = |text: &str| parse(text, "s.txt").unwrap_err().to_string();
        assert_eq!(
            err("0 0 1 2:0.5\n\n0 1\n"),
            "s.txt:3: expected `<call> <row> <layer> <expert>:<gate> ...`"
        );
        assert_eq!(err("0 x 1\n"), "s.txt:1: row: expected an integer");
        assert_eq!(err("0 0 -1\n"), "s.txt:1: layer: expected an integer");
        assert_eq!(err("c 0 1\n"), "s.txt:1: call: expected an integer");
        assert_eq!(err("0 0 1 2\n"), "s.txt:1: expected <expert>:<gate>");
        assert_eq!(err("0 0 1 x:0.5\n"), "s.txt:1: expert: expected an integer");
        assert_eq!(err("0 0 1 2:y\n"), "s.txt:1: gate: expected a number");
    }
}
