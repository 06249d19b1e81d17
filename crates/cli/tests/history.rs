//! The expert-use history of `sluice run` (`.coli_usage`, colibri's format: docs/history.md)
//! end to end: where it is written, what it counts, decay, another engine's history, a folder
//! that cannot be written, and pinning (same output, pinned experts read at load).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn demo_in(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo-qwen3moe.gguf");
    let dst = dir.join("demo.gguf");
    std::fs::copy(src, &dst).unwrap();
    dst
}

fn sluice(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.args(args);
    for k in [
        "PIN",
        "PIN_GB",
        "AUTOPIN",
        "COLI_USAGE_DECAY",
        "ROUTE_TRACE",
    ] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run sluice")
}

fn ok(o: Output) -> (String, String) {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    (String::from_utf8(o.stdout).unwrap(), err)
}

/// FNV-1a 32 (offset basis 2166136261, prime 16777619), per the contract.
fn fnv(s: &str) -> u32 {
    s.bytes().fold(2_166_136_261u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(16_777_619)
    })
}

/// A greedy 3-token run of the demo model with `extra` flags.
fn run(m: &Path, extra: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let mut a = vec![
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Hello there",
        "-n",
        "3",
        "--temp",
        "0",
        "--ignore-eos",
    ];
    a.extend_from_slice(extra);
    ok(sluice(&a, env))
}

/// The history's records: (header records, data records).
fn records(path: &Path) -> (Vec<[i64; 3]>, Vec<[i64; 3]>) {
    let text = std::fs::read_to_string(path).unwrap();
    let recs: Vec<[i64; 3]> = text
        .lines()
        .map(|l| {
            let f: Vec<i64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            assert_eq!(f.len(), 3, "{l}");
            [f[0], f[1], f[2]]
        })
        .collect();
    recs.into_iter().partition(|r| r[0] < 0)
}

#[test]
fn a_run_counts_every_routing_into_the_history_next_to_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_in(dir.path());
    let hist = dir.path().join(".coli_usage");
    let trace = dir.path().join("t.csv");
    let (_, err) = run(&m, &["--route-trace", trace.to_str().unwrap()], &[]);
    assert!(err.contains("[STATS] "), "{err}");
    let (head, data) = records(&hist);
    // The model's dimensions and this engine's identity (demo: 2 layers of 8 experts).
    assert_eq!(
        head,
        vec![[-1, 2, 8], [-2, 1, i64::from(fnv("sluice_qwen3moe"))]]
    );
    // One selection per routed row of the route trace of the same run.
    let t = telemetry::read_route_trace(&trace).unwrap();
    let mut want = std::collections::BTreeMap::new();
    for r in &t.rows {
        *want
            .entry((r.layer as i64, r.expert as i64))
            .or_insert(0i64) += 1;
    }
    let got: std::collections::BTreeMap<(i64, i64), i64> =
        data.iter().map(|r| ((r[0], r[1]), r[2])).collect();
    assert_eq!(got, want);
    // A second run adds the same again (greedy: the same routing).
    let (_, err) = run(&m, &[], &[]);
    assert!(err.contains("sluice: usage history "), "{err}");
    let (_, data2) = records(&hist);
    let doubled: Vec<[i64; 3]> = data.iter().map(|r| [r[0], r[1], 2 * r[2]]).collect();
    assert_eq!(data2, doubled);
    // Decay at the save: (c + c) · 0.5, rounded half up, from the environment or the flag.
    run(&m, &[], &[("COLI_USAGE_DECAY", "0.5")]);
    let (_, data3) = records(&hist);
    let want3: Vec<[i64; 3]> = data
        .iter()
        .map(|r| [r[0], r[1], (3 * r[2] + 1) / 2])
        .collect();
    assert_eq!(data3, want3);
    let o = sluice(
        &[
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "x",
            "--usage-decay",
            "1.5",
        ],
        &[],
    );
    assert!(!o.status.success());
    // --no-usage: nothing read or written.
    let before = std::fs::read(&hist).unwrap();
    let (_, err) = run(&m, &["--no-usage"], &[]);
    assert!(
        !err.contains("[STATS]") && !err.contains("usage history"),
        "{err}"
    );
    assert_eq!(std::fs::read(&hist).unwrap(), before);
    // --usage-file: that file instead.
    let other = dir.path().join("elsewhere.usage");
    run(&m, &["--usage-file", other.to_str().unwrap()], &[]);
    assert_eq!(records(&other).1, data);
    assert_eq!(std::fs::read(&hist).unwrap(), before);
}

#[test]
fn another_engines_history_is_refused_unless_named_and_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_in(dir.path());
    let hist = dir.path().join(".coli_usage");
    let foreign = format!("-1 2 8\n-2 1 {}\n0 3 7\n", fnv("olmoe"));
    std::fs::write(&hist, &foreign).unwrap();
    let (_, err) = run(&m, &[], &[]);
    let shown = hist.display().to_string();
    assert!(
        err.contains(&format!(
            "[USAGE] {shown}: written by olmoe, this engine is sluice_qwen3moe \u{2014} refusing \
             (pass PIN=<path> to use it anyway)"
        )),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&hist).unwrap(), foreign);
    // Named by the user: honoured (with the notice), and updated.
    let (_, err) = run(&m, &["--usage-file", hist.to_str().unwrap()], &[]);
    assert!(
        err.contains(&format!(
            "[USAGE] {shown}: written by olmoe, this engine is sluice_qwen3moe\n        \u{2014} \
             honouring it because you named it explicitly\n          (placement only; expert \
             ids do not transfer between engines)"
        )),
        "{err}"
    );
    let (head, data) = records(&hist);
    assert_eq!(head[1], [-2, 1, i64::from(fnv("sluice_qwen3moe"))]);
    assert!(
        data.iter().any(|r| r[..2] == [0, 3] && r[2] >= 7),
        "{data:?}"
    );
    // Another model's dimensions: refused even when named.
    std::fs::write(&hist, "-1 48 128\n0 3 7\n").unwrap();
    let (_, err) = run(&m, &["--usage-file", hist.to_str().unwrap()], &[]);
    assert!(
        err.contains("history is 48 layers x 128 experts, this engine is 2 x 8"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&hist).unwrap(),
        "-1 48 128\n0 3 7\n"
    );
}

#[test]
fn a_history_that_cannot_be_written_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_in(dir.path());
    // A folder that does not exist: nothing to read, and the save fails (as it does in a
    // read-only folder, which root could still write to).
    let path = dir.path().join("missing").join(".coli_usage");
    let (out, err) = run(&m, &["--usage-file", path.to_str().unwrap()], &[]);
    assert!(out.contains("generation: 3 tokens"), "{out}");
    assert!(
        err.contains("sluice: warning: the usage history was not saved: "),
        "{err}"
    );
    // A "folder" that is a file: it cannot even be read; a warning too.
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "x").unwrap();
    let path = blocker.join(".coli_usage");
    let (out, err) = run(&m, &["--usage-file", path.to_str().unwrap()], &[]);
    assert!(out.contains("generation: 3 tokens"), "{out}");
    assert!(
        err.contains("sluice: warning: cannot read the usage history: "),
        "{err}"
    );
}

/// Pinned experts are read at load and never evicted; the output is the resident run's.
#[test]
fn pinning_reads_the_hottest_experts_at_load_and_changes_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_in(dir.path());
    let (resident, _) = run(&m, &["--moe-stream", "off", "--no-usage"], &[]);
    let answer = |out: &str| out.split("\ngeneration:").next().unwrap().to_owned();
    // Build a history, then pin from it.
    run(&m, &[], &[]);
    let hist = dir.path().join(".coli_usage");
    let stream = ["--moe-stream", "on", "--cache-mb", "1", "--force-cache"];
    let mut a = stream.to_vec();
    a.extend_from_slice(&["--pin", hist.to_str().unwrap(), "--pin-mb", "1"]);
    let (out, err) = run(&m, &a, &[]);
    assert_eq!(answer(&out), answer(&resident));
    let (_, data) = records(&hist);
    assert!(
        err.contains(&format!("sluice: pinned {} experts", data.len())),
        "{err}"
    );
    // auto: only once the history holds 5000 selections.
    let mut a = stream.to_vec();
    a.extend_from_slice(&["--pin", "auto"]);
    let (out, err) = run(&m, &a, &[]);
    assert_eq!(answer(&out), answer(&resident));
    assert!(err.contains("fewer than 5000: nothing pinned yet"), "{err}");
    // The same through colibri's environment names.
    let (_, err) = run(
        &m,
        &stream,
        &[("PIN", hist.to_str().unwrap()), ("PIN_GB", "0.001")],
    );
    assert!(err.contains("sluice: pinned "), "{err}");
    // A history seeding the forecast policy changes no output either.
    let mut a = stream.to_vec();
    a.push("--usage-prior");
    assert_eq!(answer(&run(&m, &a, &[]).0), answer(&resident));
}
