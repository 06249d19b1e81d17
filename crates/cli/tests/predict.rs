//! `sluice run --predict-log`, `--prefetch`, `--predict-prefetch` and `--route-ahead` on the
//! generated qwen3moe test model (two MoE layers, top-4 of 16): the report lines as the
//! telemetry contract writes them, the CSV preamble's keys, what the route and I/O traces
//! record of reads ahead, and the refused combinations.

use std::path::PathBuf;
use std::process::{Command, Output};

use telemetry::{Phase, read_route_trace};

fn model() -> PathBuf {
    let p = testdata::fixtures_root()
        .join("moe")
        .join("qwen3moe-q4_k_m.gguf");
    assert!(
        p.is_file(),
        "{} missing: run `bash scripts/fetch_moe_fixtures.sh`",
        p.display()
    );
    p
}

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

/// A greedy run of 12 tokens with `extra` flags: (stdout, stderr, success).
fn run(extra: &[&str]) -> (String, String, bool) {
    let m = model();
    let mut args = vec![
        "run",
        "-m",
        m.to_str().expect("utf-8 path"),
        "-p",
        "The experts",
        "-n",
        "12",
        "--temp",
        "0",
        "--ignore-eos",
        "--no-usage",
        "-t",
        "2",
    ];
    args.extend_from_slice(extra);
    let o = sluice(&args);
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        o.status.success(),
    )
}

const STREAM: &[&str] = &["--moe-stream", "on", "--cache-mb", "2", "--force-cache"];

fn with(a: &[&str], b: &[&str]) -> Vec<String> {
    a.iter().chain(b).map(|s| (*s).to_owned()).collect()
}

fn run_with(a: &[&str], b: &[&str]) -> (String, String, bool) {
    let v = with(a, b);
    let refs: Vec<&str> = v.iter().map(String::as_str).collect();
    run(&refs)
}

/// The generated text (the first line of stdout).
fn text(out: &str) -> &str {
    out.lines().next().unwrap_or("")
}

#[test]
fn the_predict_log_prints_the_contract_lines_and_changes_nothing() {
    let (base, _, ok) = run(STREAM);
    assert!(ok);
    let (out, err, ok) = run_with(STREAM, &["--predict-log"]);
    assert!(ok, "{err}");
    assert_eq!(text(&out), text(&base), "the probe changed the output");
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("moe-predict:"))
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    let head = lines[0];
    assert!(head.starts_with("moe-predict: stale-gate "), "{head}");
    assert!(head.contains(" of routed slots ("), "{head}");
    assert!(head.contains("whole routings) | prev-token "), "{head}");
    assert!(
        head.ends_with("| fresh-gate control 100.0% (100.0%)"),
        "{head}"
    );
    // 12 decode passes × 2 MoE layers; the stale gate cannot rank layer 0
    assert_eq!(
        lines[1],
        "moe-predict: scored — stale-gate 12 routings/48 slots, prev-token 22/88, control 24/96; 12 routings the stale-gate could not rank"
    );
    let table: Vec<Vec<&str>> = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("layer"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(table[0], ["layer", "stale", "prev", "ctrl", "routings"]);
    assert_eq!(table[1][..2], ["0", "-"]);
    assert_eq!(table[1][3..], ["100.0", "12"]);
    assert_eq!(table[2][0], "1");
    assert!(table[2][1].parse::<f64>().is_ok(), "{:?}", table[2]);
    assert_eq!(table.len(), 3);
}

#[test]
fn the_preamble_records_the_predictors_and_marks_a_probed_run_instrumented() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    let csv = dir.join("m.csv");
    let csv_s = csv.to_str().expect("utf-8 path");
    let (_, err, ok) = run_with(
        STREAM,
        &[
            "--predict-log",
            "--predict-prefetch",
            "--predict-spec-max",
            "3",
            "--csv",
            csv_s,
        ],
    );
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&csv).expect("csv");
    let kv = |key: &str| -> String {
        text.lines()
            .filter(|l| l.starts_with('#'))
            .flat_map(|l| l.split_whitespace())
            .find_map(|p| p.strip_prefix(&format!("{key}=")).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {key}= in {text}"))
    };
    assert_eq!(kv("predict_log"), "1");
    assert_eq!(kv("predict_prefetch"), "1");
    assert_eq!(kv("predict_spec_max"), "3");
    assert_eq!(kv("prefetch"), "0");
    assert_eq!(kv("route_ahead"), "0");
    assert_eq!(kv("instrumented"), "1");
    for key in [
        "spec_read_MiB",
        "spec_experts",
        "spec_useful",
        "ra_committed",
    ] {
        kv(key);
    }
    let (_, err, ok) = run_with(STREAM, &["--prefetch", "2", "--csv", csv_s]);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&csv).expect("csv");
    assert!(text.contains(" prefetch=2 "), "{text}");
    assert!(text.contains(" instrumented=0 "), "{text}");
}

#[test]
fn route_ahead_is_named_lossy_commits_its_routing_and_reads_it_early() {
    let (base, _, _) = run(STREAM);
    let (zero, _, ok) = run_with(STREAM, &["--route-ahead", "0"]);
    assert!(ok);
    assert_eq!(text(&zero), text(&base));
    assert!(!zero.contains("moe-route-ahead:"));

    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    let io = dir.join("io.csv");
    let rt = dir.join("route.csv");
    let (out, err, ok) = run_with(
        STREAM,
        &[
            "--route-ahead",
            "1",
            "--io-trace",
            io.to_str().expect("utf-8"),
            "--route-trace",
            rt.to_str().expect("utf-8"),
        ],
    );
    assert!(ok, "{err}");
    let mode = out.lines().find(|l| l.starts_with("mode: ")).expect("mode");
    assert!(mode.contains("route-ahead 1 (lossy"), "{mode}");
    let line = out
        .lines()
        .find(|l| l.starts_with("moe-route-ahead: "))
        .expect("a moe-route-ahead: line");
    assert!(
        line.starts_with("moe-route-ahead: 1 layers early — 12 routings committed, 12 passed through; committed selection agreed with the router on "),
        "{line}"
    );
    let pf = out
        .lines()
        .find(|l| l.starts_with("moe-prefetch: "))
        .expect("a moe-prefetch: line");
    assert!(pf.ends_with("[route-ahead]"), "{pf}");
    // every early read is a speculative row of the I/O trace, and the routings it served are
    // residency 2 at their first lookup
    let io_text = std::fs::read_to_string(&io).expect("io trace");
    let spec_rows = io_text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("turn"))
        .filter(|l| l.split(',').nth(7) == Some("1"))
        .count();
    assert!(spec_rows > 0, "no spec=1 row in {io_text}");
    let t = read_route_trace(&rt).expect("route trace");
    let ahead = t
        .rows
        .iter()
        .filter(|r| r.phase == Phase::Decode && r.residency == Some(2))
        .count();
    assert!(ahead > 0, "no residency=2 row");
    assert!(
        t.rows
            .iter()
            .filter(|r| r.residency == Some(2))
            .all(|r| r.layer == 1 && r.expert_bytes == Some(0)),
        "a read-ahead hit outside the committed layer, or charged bytes"
    );
}

#[test]
fn conflicting_predictors_are_refused_in_one_line() {
    for (flags, says) in [
        (
            &["--route-ahead", "1", "--predict-log"][..],
            "--route-ahead",
        ),
        (&["--route-ahead", "1", "--prefetch", "1"][..], "--prefetch"),
        (
            &["--prefetch", "1", "--predict-prefetch"][..],
            "--predict-prefetch",
        ),
        (&["--predict-spec-max", "1"][..], "--predict-spec-max"),
        (&["--route-ahead", "2"][..], "MoE layers"),
    ] {
        let (_, err, ok) = run_with(STREAM, flags);
        assert!(!ok, "{flags:?} accepted");
        assert!(err.contains(says), "{flags:?}: {err}");
    }
    let (_, err, ok) = run(&["--moe-stream", "off", "--prefetch", "1"]);
    assert!(!ok && err.contains("--prefetch"), "{err}");
}
