//! `sluice analyze replay` end to end.

use std::path::PathBuf;
use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

/// The real Qwen3-30B-A3B trace the `trace` crate's tests use (see its tests/data/README.md).
fn real_trace() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../trace/tests/data/qwen3-30b-a3b.route.csv")
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
/// (forecast) lies between LRU and Bélády at every budget, above 0 below one token cycle where
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
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
