//! `sluice analyze route` end to end.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

/// The real Qwen3-30B-A3B trace the `trace` crate's tests use (see its tests/data/README.md).
fn real_trace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../telemetry/tests/data/qwen3-30b-a3b.route.csv")
}

fn json_of(args: &[&str]) -> Value {
    let out = sluice(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn the_text_report_has_every_section() {
    let trace = real_trace();
    let out = sluice(&["analyze", "route", trace.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // 128 decoded tokens x 48 layers x top-6 (tests/data/README.md of the trace crate).
    assert!(
        text.contains("phase: decode (128 steps, 36864 routings"),
        "{text}"
    );
    for section in [
        "== hot experts",
        "concentration:",
        "== reuse distance",
        "== working set",
        "== predictability",
        "previous-token",
        "static-hot (k=6)",
    ] {
        assert!(text.contains(section), "missing {section}:\n{text}");
    }
    // One hot-expert row per MoE layer, eight experts each by default.
    let hot_rows = text
        .lines()
        .filter(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells.len() == 10 && cells[0].parse::<u32>().is_ok() && cells[2].contains(":")
        })
        .count();
    assert_eq!(hot_rows, 48, "{text}");
}

/// The previous-token hit rate recomputed from the CSV: per decode step (a `(turn, step)` in
/// file order) the set of experts per layer; a routing is a hit when the same layer routed
/// its expert at the previous step.
fn previous_token_from_csv(text: &str) -> (u64, u64) {
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (turn, phase, step, layer, expert) = (
        col("turn"),
        col("phase"),
        col("step"),
        col("layer"),
        col("expert"),
    );
    let mut order: Vec<(String, String)> = Vec::new();
    let mut cells: BTreeMap<(String, String), BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for line in lines {
        let v: Vec<&str> = line.split(',').collect();
        if v[phase] != "1" {
            continue;
        }
        let key = (v[turn].to_string(), v[step].to_string());
        if !cells.contains_key(&key) {
            order.push(key.clone());
        }
        cells
            .entry(key)
            .or_default()
            .entry(v[layer].to_string())
            .or_default()
            .push(v[expert].to_string());
    }
    let (mut hits, mut scored) = (0, 0);
    for pair in order.windows(2) {
        let (prev, cur) = (&cells[&pair[0]], &cells[&pair[1]]);
        for (l, experts) in cur {
            if let Some(before) = prev.get(l) {
                scored += experts.len() as u64;
                hits += experts.iter().filter(|e| before.contains(e)).count() as u64;
            }
        }
    }
    (hits, scored)
}

#[test]
fn the_json_of_the_real_trace_is_consistent() {
    let trace = real_trace();
    let j = json_of(&["analyze", "route", trace.to_str().unwrap(), "--json"]);
    assert_eq!(j["phase"], "decode");
    assert_eq!(j["steps"], 128);
    assert_eq!(j["n_expert_used"], 6);

    let buckets = j["reuse_distance"]["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 10);
    let sum: f64 = buckets.iter().map(|b| f(&b["share_pct"])).sum();
    assert!((sum - 100.0).abs() <= 0.1, "reuse shares sum to {sum}");
    let counted: u64 = buckets
        .iter()
        .map(|b| b["routings"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, j["routings"].as_u64().unwrap());

    let ws = j["working_set"].as_array().unwrap();
    let windows: Vec<u64> = ws.iter().map(|p| p["window"].as_u64().unwrap()).collect();
    assert_eq!(windows, [1, 2, 4, 8, 16, 32, 64]);
    for pair in ws.windows(2) {
        assert!(
            f(&pair[1]["mean_pairs"]) >= f(&pair[0]["mean_pairs"]),
            "{pair:?}"
        );
        assert!(
            f(&pair[1]["mean_mib"]) >= f(&pair[0]["mean_mib"]),
            "{pair:?}"
        );
    }
    // One step routes 48 layers x 6 experts.
    assert!(close(f(&ws[0]["mean_pairs"]), 288.0));

    let layers = j["hot_experts"]["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 48);
    for l in layers {
        let top = l["top"].as_array().unwrap();
        assert_eq!(top.len(), 8);
        let mut total = 0.0;
        for e in top {
            let share = f(&e["share_pct"]);
            assert!((0.0..=100.0).contains(&share));
            total += share;
        }
        assert!(total <= 100.0 + 1e-9);
    }
    let conc = f(&j["hot_experts"]["concentration_pct"]);
    assert!((0.0..=100.0).contains(&conc));

    let pred = &j["predictability"];
    for p in ["previous_token", "static_hot"] {
        let pct = f(&pred[p]["pct"]);
        assert!((0.0..=100.0).contains(&pct), "{p}: {pct}");
    }
    let csv = std::fs::read_to_string(&trace).unwrap();
    let (hits, scored) = previous_token_from_csv(&csv);
    assert_eq!(pred["previous_token"]["hits"].as_u64(), Some(hits));
    assert_eq!(pred["previous_token"]["scored"].as_u64(), Some(scored));
    assert!(close(
        f(&pred["previous_token"]["pct"]),
        hits as f64 * 100.0 / scored as f64
    ));
    // A previous-token hit is a reuse at distance 1.
    assert_eq!(pred["previous_token"]["hits"], buckets[0]["routings"]);
    // Steps 1..128 can be scored, every layer of them.
    assert_eq!(scored, 127 * 48 * 6);
    assert_eq!(pred["static_hot"]["scored"], 128 * 48 * 6);
}

/// One MoE layer (1 MiB experts), 8 experts, top-2; one prompt token, then three decode steps:
///
/// ```text
/// prefill s0: {3,4}
/// decode  s5: {1,2}   s6: {1,3}   s7: {2,1}
/// ```
///
/// Decode, by hand:
/// - hot: e1 3 of 6 (50%), e2 2 of 6 (33.3%); top 10% of 8 experts is 1 expert: 50%.
/// - reuse: s5 both cold; s6 e1 at 1, e3 cold; s7 e2 at 2, e1 at 1
///   -> distance 1: 2 (33.3%), 2: 1 (16.7%), cold: 3 (50%).
/// - working set: W=1 2 pairs (2 MiB) over 3 windows; W=2 {1,2,3} and {1,3,2}: 3 pairs
///   (3 MiB) over 2 windows; W=4 longer than the trace.
/// - previous-token: s6 {1,3} vs {1,2} 1 hit, s7 {2,1} vs {1,3} 1 hit: 2 of 4 = 50%.
/// - static-hot k=2: {1,2} covers 3+2 = 5 of 6 = 83.3%.
///
/// All phases: s0 joins first; previous-token adds s5 {1,2} vs {3,4}: 0 of 2 -> 2 of 6.
const TINY: &str = "# route_trace v1
# model=tiny.gguf arch=test n_layer=1 n_expert=8 n_expert_used=2
# layer=0 expert_bytes=1048576 dense_bytes=4096
turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped
0,0,0,0,0,3,0.6,0,1048576,0
0,0,0,0,1,4,0.4,0,1048576,0
0,1,5,0,0,1,0.7,0,1048576,0
0,1,5,0,1,2,0.3,0,1048576,0
0,1,6,0,0,1,0.5,1,0,0
0,1,6,0,1,3,0.5,1,0,0
0,1,7,0,0,2,0.9,1,0,0
0,1,7,0,1,1,0.1,1,0,0
";

#[test]
fn a_tiny_trace_gives_the_hand_computed_figures() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.csv");
    std::fs::write(&path, TINY).unwrap();
    let p = path.to_str().unwrap();

    let j = json_of(&["analyze", "route", p, "--json", "--top", "2"]);
    assert_eq!(j["steps"], 3);
    assert_eq!(j["routings"], 6);
    let hot = &j["hot_experts"];
    let top = hot["layers"][0]["top"].as_array().unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!(
        (&top[0]["expert"], &top[0]["routings"]),
        (&1.into(), &3.into())
    );
    assert!(close(f(&top[0]["share_pct"]), 50.0));
    assert_eq!(
        (&top[1]["expert"], &top[1]["routings"]),
        (&2.into(), &2.into())
    );
    assert!(close(f(&top[1]["share_pct"]), 200.0 / 6.0));
    assert_eq!(hot["decile_experts"], 1);
    assert!(close(f(&hot["concentration_pct"]), 50.0));

    let counts: Vec<u64> = j["reuse_distance"]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["routings"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [2, 1, 0, 0, 0, 0, 0, 0, 0, 3]);
    assert!(close(
        f(&j["reuse_distance"]["buckets"][0]["share_pct"]),
        100.0 / 3.0
    ));

    let ws = &j["working_set"];
    assert_eq!(ws[0]["windows"], 3);
    assert!(close(f(&ws[0]["mean_pairs"]), 2.0));
    assert!(close(f(&ws[0]["mean_mib"]), 2.0));
    assert_eq!(ws[1]["windows"], 2);
    assert!(close(f(&ws[1]["mean_pairs"]), 3.0));
    assert!(close(f(&ws[1]["mean_mib"]), 3.0));
    assert_eq!(ws[2]["windows"], 0);
    assert!(ws[2]["mean_pairs"].is_null());

    let pred = &j["predictability"];
    assert_eq!(pred["previous_token"]["hits"], 2);
    assert_eq!(pred["previous_token"]["scored"], 4);
    assert!(close(f(&pred["previous_token"]["pct"]), 50.0));
    assert_eq!(pred["static_hot"]["k"], 2);
    assert_eq!(pred["static_hot"]["hits"], 5);
    assert!(close(f(&pred["static_hot"]["pct"]), 500.0 / 6.0));

    let all = json_of(&["analyze", "route", p, "--json", "--phase", "all"]);
    assert_eq!(all["steps"], 4);
    assert_eq!(all["predictability"]["previous_token"]["hits"], 2);
    assert_eq!(all["predictability"]["previous_token"]["scored"], 6);

    // One prompt token: nothing to score against.
    let prefill = json_of(&["analyze", "route", p, "--json", "--phase", "prefill"]);
    assert_eq!(prefill["steps"], 1);
    assert!(prefill["predictability"]["previous_token"]["pct"].is_null());

    // The text report of the same figures.
    let out = sluice(&["analyze", "route", p, "--top", "2"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("1:50.0%"), "{text}");
    assert!(text.contains("2:33.3%"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["previous-token", "2", "4", "50.00"]),
        "{text}"
    );
}

#[test]
fn png_draws_two_panels_or_says_which_font_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("route.png");
    let trace = real_trace();
    let out = sluice(&[
        "analyze",
        "route",
        trace.to_str().unwrap(),
        "--png",
        png.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: 1280 x 560.
        assert_eq!(&bytes[16..24], &[0, 0, 5, 0, 0, 0, 2, 0x30]);
    } else {
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("no TrueType font"), "{stderr}");
    }
}

#[test]
fn bad_arguments_are_refused() {
    let trace = real_trace();
    let t = trace.to_str().unwrap();
    let out = sluice(&["analyze", "route", t, "--phase", "both"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--phase"));
    let out = sluice(&["analyze", "route", t, "--top", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.csv");
    let out = sluice(&["analyze", "route", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.csv"));
}
