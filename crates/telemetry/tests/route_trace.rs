//! `route_trace v1` parser tests on small hand-written traces.

use telemetry::{Phase, RouteTrace, TraceError};

const PREAMBLE: &str = "# route_trace v1
# model=/models/My Model.gguf arch=qwen3moe n_layer=2 n_expert=8 n_expert_used=2
# layer=0 expert_bytes=1000 dense_bytes=50
# layer=1 expert_bytes=2000 dense_bytes=60
";

fn parse(text: &str) -> Result<RouteTrace, TraceError> {
    RouteTrace::parse(text, "t.csv")
}

/// The error's line number and message; panics if parsing succeeded.
fn error(text: &str) -> (usize, String) {
    match parse(text) {
        Err(TraceError::Malformed {
            source_name,
            line,
            message,
        }) => {
            assert_eq!(source_name, "t.csv");
            (line, message)
        }
        other => panic!("expected a Malformed error, got {other:?}"),
    }
}

#[test]
fn full_trace_with_every_column() {
    let text = format!(
        "{PREAMBLE}turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped
0,0,0,0,0,3,0.5,0,1000,0
0,0,0,0,1,7,nan,2,0,0
0,1,1,1,0,7,0.25,1,0,1
"
    );
    let t = parse(&text).unwrap();
    assert_eq!(t.model, "/models/My Model.gguf");
    assert_eq!(t.arch, "qwen3moe");
    assert_eq!((t.n_layer, t.n_expert, t.n_expert_used), (2, 8, 2));
    assert_eq!(t.layers.len(), 2);
    assert_eq!(t.layers[&1].expert_bytes, 2000);
    assert_eq!(t.layers[&1].dense_bytes, 60);
    assert_eq!(t.expert_bytes(0), 1000);
    assert_eq!(t.rows.len(), 3);
    let r = &t.rows[0];
    assert_eq!(r.line, 6);
    assert_eq!(
        (r.turn, r.phase, r.step, r.layer, r.slot, r.expert),
        (0, Phase::Prefill, 0, 0, 0, 3)
    );
    assert_eq!(r.weight, Some(0.5));
    assert_eq!(r.residency, Some(0));
    assert_eq!(r.expert_bytes, Some(1000));
    assert_eq!(r.dropped, Some(false));
    assert_eq!(t.rows[1].weight, None, "nan means unknown");
    assert_eq!(t.rows[1].residency, Some(2));
    assert_eq!(t.rows[2].phase, Phase::Decode);
    assert_eq!(t.rows[2].dropped, Some(true));
    assert_eq!(t.decode_tokens(), 1);
    // 2 experts per layer: 2 * 1000 + 2 * 2000
    assert_eq!(t.token_cycle_bytes(), 6000);
}

#[test]
fn columns_are_read_by_name_optional_ones_may_be_missing_unknown_ones_skipped() {
    // Reordered, no weight/residency/expert_bytes/dropped, one future column.
    let text = format!(
        "{PREAMBLE}expert,layer,future,slot,step,phase,turn
5,1,xyz,1,-1,1,2

0,0,,0,9,0,2
"
    );
    let t = parse(&text).unwrap();
    assert_eq!(t.rows.len(), 2);
    let r = &t.rows[0];
    assert_eq!(
        (r.turn, r.phase, r.step, r.layer, r.slot, r.expert),
        (2, Phase::Decode, -1, 1, 1, 5)
    );
    assert_eq!(
        (r.weight, r.residency, r.expert_bytes, r.dropped),
        (None, None, None, None)
    );
    assert_eq!(t.rows[1].line, 8, "blank lines still count in line numbers");
}

#[test]
fn unknown_comment_lines_and_keys_are_skipped() {
    let text = "# route_trace v1
# written by a newer engine
# model=m.gguf arch=a n_layer=1 n_expert=4 n_expert_used=1 rope=yes
# layer=0 expert_bytes=10 dense_bytes=0 quant=q4_k
turn,phase,step,layer,slot,expert
0,1,0,0,0,3
# summary hit=100
";
    let t = parse(text).unwrap();
    assert_eq!(t.rows.len(), 1);
    assert_eq!(t.layers[&0].expert_bytes, 10);
}

#[test]
fn crlf_line_endings_are_accepted() {
    let text =
        PREAMBLE.replace('\n', "\r\n") + "turn,phase,step,layer,slot,expert\r\n0,1,4,1,1,2\r\n";
    let t = parse(&text).unwrap();
    assert_eq!(t.rows[0].expert, 2);
}

#[test]
fn wrong_first_line() {
    let (line, msg) = error("# route_trace v2\n");
    assert_eq!(line, 1);
    assert!(msg.contains("expected `# route_trace v1`"), "{msg}");
    let (line, _) = error("");
    assert_eq!(line, 1);
}

#[test]
fn missing_required_column_names_the_header_line() {
    let text = format!("{PREAMBLE}turn,phase,step,layer,expert\n");
    let (line, msg) = error(&text);
    assert_eq!(line, 5);
    assert!(msg.contains("`slot` column"), "{msg}");
}

#[test]
fn field_count_mismatch() {
    let text = format!("{PREAMBLE}turn,phase,step,layer,slot,expert\n0,1,0,0,0,1\n0,1,1,0,0\n");
    let (line, msg) = error(&text);
    assert_eq!(line, 7);
    assert!(msg.contains("expected 6 comma-separated fields"), "{msg}");
    assert!(msg.contains("found 5"), "{msg}");
}

#[test]
fn out_of_range_and_malformed_values() {
    let header = "turn,phase,step,layer,slot,expert,weight,residency,dropped\n";
    let cases = [
        (
            "0,2,0,0,0,1,0.5,0,0",
            "`phase`: expected 0 (prefill) or 1 (decode)",
        ),
        (
            "0,1,0,0,0,8,0.5,0,0",
            "`expert`: expected 0..7 (n_expert=8), found 8",
        ),
        (
            "0,1,0,0,2,1,0.5,0,0",
            "`slot`: expected 0..1 (n_expert_used=2), found 2",
        ),
        ("0,1,0,5,0,1,0.5,0,0", "`layer`: 5 has no `# layer=5"),
        (
            "0,1,0,0,0,1,heavy,0,0",
            "`weight`: expected a number or `nan`",
        ),
        ("0,1,0,0,0,1,0.5,3,0", "`residency`: expected 0, 1 or 2"),
        ("0,1,0,0,0,1,0.5,0,yes", "`dropped`: expected 0 or 1"),
        (
            "-1,1,0,0,0,1,0.5,0,0",
            "`turn`: expected a non-negative integer, found `-1`",
        ),
        (
            "0,1,x,0,0,1,0.5,0,0",
            "`step`: expected an integer, found `x`",
        ),
        (
            "0,1,0,0,0,99999999999,0.5,0,0",
            "`expert`: expected a non-negative integer",
        ),
    ];
    for (row, want) in cases {
        let (line, msg) = error(&format!("{PREAMBLE}{header}{row}\n"));
        assert_eq!(line, 6, "{row}");
        assert!(msg.contains(want), "{row}: {msg}");
    }
}

#[test]
fn duplicate_row_names_the_first_occurrence() {
    let text = format!(
        "{PREAMBLE}turn,phase,step,layer,slot,expert\n0,1,3,0,1,2\n0,1,3,0,0,2\n0,1,3,0,1,4\n"
    );
    let (line, msg) = error(&text);
    assert_eq!(line, 8);
    assert!(msg.contains("already on line 6"), "{msg}");
}

#[test]
fn preamble_errors() {
    let (line, msg) = error("# route_trace v1\n# layer=0 expert_bytes=1 dense_bytes=1\n");
    assert_eq!(line, 2);
    assert!(msg.contains("before the `# model=` line"), "{msg}");

    let (line, msg) = error("# route_trace v1\n# model=m arch=a n_layer=2 n_expert=8\n");
    assert_eq!(line, 2);
    assert!(msg.contains("`n_expert_used=`"), "{msg}");

    let (line, msg) =
        error("# route_trace v1\n# model=m arch=a n_layer=2 n_expert=8 n_expert_used=9\n");
    assert_eq!(line, 2);
    assert!(msg.contains("exceeds `n_expert`"), "{msg}");

    let (line, msg) = error(
        "# route_trace v1\n# model=m arch=a n_layer=2 n_expert=8 n_expert_used=2\n# layer=2 expert_bytes=1 dense_bytes=1\n",
    );
    assert_eq!(line, 3);
    assert!(msg.contains("below n_layer=2"), "{msg}");

    let (line, msg) = error(&format!(
        "{PREAMBLE}# layer=1 expert_bytes=1 dense_bytes=1\n"
    ));
    assert_eq!(line, 5);
    assert!(msg.contains("a second `# layer=1` line"), "{msg}");

    let (line, msg) = error("# route_trace v1\nturn,phase,step,layer,slot,expert\n");
    assert_eq!(line, 2);
    assert!(msg.contains("`# model=` preamble line"), "{msg}");

    let (line, msg) = error(PREAMBLE);
    assert_eq!(line, 4);
    assert!(msg.contains("expected the column header"), "{msg}");
}

#[test]
fn error_display_names_file_and_line() {
    let err = parse("nope\n").unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("t.csv:1: expected `# route_trace v1`"),
        "{text}"
    );
}

#[test]
fn read_route_trace_reports_missing_file_and_bad_utf8() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.csv");
    let err = telemetry::read_route_trace(&missing).unwrap_err();
    assert!(matches!(err, TraceError::Io { .. }));
    assert!(err.to_string().contains("missing.csv"), "{err}");

    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, b"# route_trace v1\n\xff\xfe\n").unwrap();
    let err = telemetry::read_route_trace(&bad).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("bad.csv:2: expected UTF-8 text"), "{text}");
}

mod garbage {
    use super::*;
    use proptest::prelude::*;

    /// Lines drawn from the characters a trace is made of, so that many get past the first
    /// checks and reach the deeper ones.
    fn line() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9,\\-.#= a-z_]{0,40}",
            "[0-9]{1,3},[0-9]{1,2},-?[0-9]{1,4},[0-9]{1,2},[0-9],[0-9]{1,3}(,[0-9.na]{0,6}){0,4}",
            "# (model|layer)=[a-z0-9 =_]{0,40}",
            any::<String>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Garbage after a valid preamble gives a trace or an error naming a real line,
        /// never a panic.
        #[test]
        fn random_lines_after_the_header(lines in proptest::collection::vec(line(), 0..12)) {
            let text = format!(
                "{PREAMBLE}turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped\n{}",
                lines.join("\n")
            );
            match parse(&text) {
                Ok(t) => prop_assert!(t.rows.len() <= lines.len()),
                Err(TraceError::Malformed { line, .. }) => {
                    prop_assert!(line >= 1 && line <= text.lines().count().max(1));
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }

        /// Garbage anywhere, including the preamble; whatever parses also replays.
        #[test]
        fn random_whole_files(lines in proptest::collection::vec(line(), 0..10)) {
            let text = format!("# route_trace v1\n{}", lines.join("\n"));
            if let Ok(t) = parse(&text) {
                for policy in [telemetry::Policy::Lru, telemetry::Policy::Belady] {
                    let stats = telemetry::replay(&t, policy, 1 << 20);
                    prop_assert!(stats.total().lookups as usize <= t.rows.len());
                    prop_assert!(stats.total().hits <= stats.total().lookups);
                }
            }
        }
    }
}

#[test]
fn decode_steps_group_rows_by_step_and_order_them_by_slot() {
    let text = format!(
        "{PREAMBLE}turn,phase,step,layer,slot,expert
0,0,0,0,0,1
0,0,0,0,1,2
0,1,5,1,1,6
0,1,5,1,0,4
0,1,5,0,0,3
0,1,5,0,1,0
0,1,6,0,0,7
0,1,6,0,1,5
1,1,2,0,0,2
1,1,2,0,1,1
"
    );
    let t = parse(&text).unwrap();
    let steps = t.decode_steps();
    assert_eq!(steps.len(), 3, "prefill rows are not steps");
    assert_eq!(steps[0].get(&0), Some(&vec![3, 0]));
    assert_eq!(
        steps[0].get(&1),
        Some(&vec![4, 6]),
        "slot order, not file order"
    );
    assert_eq!(steps[1].get(&0), Some(&vec![7, 5]));
    assert_eq!(steps[1].get(&1), None);
    // a later turn's step 2 comes after turn 0's steps 5 and 6 (file order)
    assert_eq!(steps[2].get(&0), Some(&vec![2, 1]));
}

/// The phase codes the writers put in every trace format read back as the same phase; other
/// codes are none.
#[test]
fn phase_codes_round_trip() {
    for p in [Phase::Prefill, Phase::Decode] {
        assert_eq!(Phase::from_code(p.code()), Some(p));
    }
    assert_eq!(Phase::Prefill.code(), 0);
    assert_eq!(Phase::Decode.code(), 1);
    assert_eq!(Phase::from_code(2), None);
}
