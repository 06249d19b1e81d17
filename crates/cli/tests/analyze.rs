//! `sluice analyze replay` end to end.

use std::path::PathBuf;
use std::process::{Command, Output};

mod common;
use common::ok;

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

/// The real Qwen3-30B-A3B trace the `trace` crate's tests use (see its tests/data/README.md).
fn real_trace() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../telemetry/tests/data/qwen3-30b-a3b.route.csv")
        .display()
        .to_string()
}

#[test]
fn replay_prints_the_table_and_writes_the_csv() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    let out = sluice(&[
        "analyze",
        "replay",
        &real_trace(),
        "--budget-mb",
        "4000,1000,2000",
        "--policy",
        "lru,belady",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("48 prefill + 6144 decode"), "{stdout}");
    assert!(stdout.contains("budget_mib  policy"), "{stdout}");
    // Decode-only figures BigMoeOnEdge published for this trace (qwen-curve.csv, 3 decimals).
    let written = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(
        written,
        "budget_mib,policy,hit_pct\n\
         1000,lru,37.679\n1000,belady,62.671\n\
         2000,lru,56.548\n2000,belady,79.354\n\
         4000,lru,80.287\n4000,belady,92.716\n"
    );
}

#[test]
fn replay_draws_a_png_or_says_which_font_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("curve.png");
    let out = sluice(&[
        "analyze",
        "replay",
        &real_trace(),
        "--budget-mb",
        "1000,2000",
        "--png",
        png.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height as requested by the chart.
        assert_eq!(&bytes[16..24], &[0, 0, 3, 0xc0, 0, 0, 2, 0x58]);
    } else {
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("no TrueType font"), "{stderr}");
    }

    // An explicit font that is not a font is an error, not a panic.
    let not_font = dir.path().join("font.ttf");
    std::fs::write(&not_font, b"not a font").unwrap();
    let out = sluice(&[
        "analyze",
        "replay",
        &real_trace(),
        "--budget-mb",
        "1000",
        "--png",
        png.to_str().unwrap(),
        "--font",
        not_font.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a TrueType/OpenType font"), "{stderr}");
}

#[test]
fn a_malformed_trace_names_file_line_and_expectation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.csv");
    std::fs::write(
        &path,
        "# route_trace v1\n# model=m arch=a n_layer=1 n_expert=4 n_expert_used=1\n\
         # layer=0 expert_bytes=10 dense_bytes=0\nturn,phase,step,layer,slot,expert\n\
         0,1,0,0,0,3\n0,1,1,0,0,9\n",
    )
    .unwrap();
    let out = sluice(&[
        "analyze",
        "replay",
        path.to_str().unwrap(),
        "--budget-mb",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.csv:6: `expert`: expected 0..3 (n_expert=4), found 9"),
        "{stderr}"
    );
}

#[test]
fn bad_arguments_are_refused() {
    let trace = real_trace();
    let out = sluice(&[
        "analyze",
        "replay",
        &trace,
        "--budget-mb",
        "1000",
        "--policy",
        "fifo",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown policy `fifo`"));
    let out = sluice(&["analyze", "replay", &trace]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--budget-mb"));
    let out = sluice(&["analyze", "replay", &trace, "--budget-mb", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

/// The engine's own expert cache replayed (`engine-lru`, `default`): under LRU it hits exactly
/// what the replay's LRU model predicts (the two are written apart), and the default policy
/// (adaptive) lies between LRU and Bélády at every budget, above 0 below one token cycle where
/// LRU hits nothing.
#[test]
fn the_engine_cache_replays_between_lru_and_belady() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    let out = sluice(&[
        "analyze",
        "replay",
        &real_trace(),
        "--budget-mb",
        "500,1000,2000,4000",
        "--policy",
        "lru,engine-lru,default,belady",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    ok(out);
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut hit = std::collections::BTreeMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let mib: u64 = f[0].parse().unwrap();
        hit.insert((mib, f[1].to_owned()), f[2].parse::<f64>().unwrap());
    }
    for mib in [500, 1000, 2000, 4000] {
        let h = |p: &str| hit[&(mib, p.to_owned())];
        assert_eq!(h("engine-lru"), h("lru"), "{mib} MiB");
        assert!(
            h("default") > h("lru") && h("default") < h("belady"),
            "{mib}: {hit:?}"
        );
    }
    assert_eq!(hit[&(500, "lru".to_owned())], 0.0);
    assert!(hit[&(500, "default".to_owned())] > 0.0);
}

/// `analyze pairs` on a hand-made ROUTE_TRACE stream: the counts of who followed whom, one and
/// two MoE layers on, within each token; and the table drives a replay's reads ahead.
#[test]
fn pairs_count_the_followers_of_each_expert() {
    let dir = tempfile::tempdir().unwrap();
    let stream = dir.path().join("route.txt");
    // Two forward batches: a 2-row prefill (layers 0, 2, 4 — the last routes only its last
    // row) and a 1-row decode step.
    std::fs::write(
        &stream,
        "0 0 0 1:0.6000 2:0.4000\n0 1 0 1:0.5000 3:0.5000\n\
         1 0 2 5:0.7000 6:0.3000\n1 1 2 5:0.9000 7:0.1000\n\
         2 1 4 9:1.0000 8:0.0000\n\
         3 0 0 1:0.8000 2:0.2000\n4 0 2 6:0.5000 7:0.5000\n5 0 4 8:0.6000 9:0.4000\n",
    )
    .unwrap();
    let out = dir.path().join("pairs.txt");
    let o = sluice(&[
        "analyze",
        "pairs",
        stream.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    ok(o);
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("# sluice pairs v1"));
    let entries: Vec<&str> = lines.filter(|l| !l.starts_with('#')).collect();
    // Tokens: A = {0:[1,2], 2:[5,6]}, B = {0:[1,3], 2:[5,7], 4:[9,8]}, C = {0:[1,2], 2:[6,7],
    // 4:[8,9]}. Expert 1 of layer 0 is in all three; layer 2 after it: 5 twice, 6 twice, 7
    // twice; layer 4 (two on) in B and C: 8 and 9 both times.
    // Expert 2 of layer 0 (A, C): 6 both times, 5 and 7 once. Layer 2's experts have a layer
    // 4 after them only in B and C (A's last row has none). Nothing is two on from layer 2.
    assert_eq!(
        entries,
        [
            "0 1 1 3 5:0.6667 6:0.6667 7:0.6667",
            "0 1 2 2 8:1.0000 9:1.0000",
            "0 2 1 2 6:1.0000 5:0.5000 7:0.5000",
            "0 2 2 1 8:1.0000 9:1.0000",
            "0 3 1 1 5:1.0000 7:1.0000",
            "0 3 2 1 8:1.0000 9:1.0000",
            "2 5 1 1 8:1.0000 9:1.0000",
            "2 6 1 1 8:1.0000 9:1.0000",
            "2 7 1 2 8:1.0000 9:1.0000",
        ],
        "{text}"
    );
}

/// The real trace: the table built from the first half of the decode predicts the second
/// half's routing from the layer before, and a replay reads ahead from it.
#[test]
fn pairs_from_the_real_trace_predict_and_drive_a_replay() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pairs.txt");
    let o = sluice(&[
        "analyze",
        "pairs",
        &real_trace(),
        "--out",
        out.to_str().unwrap(),
        "--train-tokens",
        "64",
    ]);
    let stdout = ok(o);
    assert!(stdout.contains("on 64 tokens (held out"), "{stdout}");
    let o = sluice(&[
        "analyze",
        "replay",
        &real_trace(),
        "--budget-mb",
        "1000",
        "--policy",
        "default",
        "--couple",
        out.to_str().unwrap(),
    ]);
    let stdout = ok(o);
    let row = stdout
        .lines()
        .skip_while(|l| !l.starts_with("co-activation prefetch"))
        .nth(2)
        .unwrap_or_else(|| panic!("{stdout}"));
    let f: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&f[..2], ["1000", "default"], "{row}");
    let useful: f64 = f[3].trim_end_matches('%').parse().unwrap();
    assert!(useful > 0.0 && useful <= 100.0, "{row}");
}

/// A reader that stops early (`| head`) ends the command quietly, without a panic.
#[test]
fn a_closed_output_pipe_ends_the_command_quietly() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pairs.txt");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["analyze", "pairs", &real_trace(), "--out"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Nobody reads standard output.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    // The table was written before the report.
    assert!(out.is_file());
}
