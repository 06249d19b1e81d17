//! `sluice analyze io` and `sluice analyze compute` on the traces of a real (generated) model's
//! run, checked against the trace files and the metrics CSV read independently here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

mod common;
use common::{ok, sluice};

/// The rows of a CSV file after its `#` lines, as maps by column name (`#` lines between and
/// after the rows are skipped too).
fn rows(path: &Path) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    lines
        .map(|l| {
            header
                .iter()
                .zip(l.split(','))
                .map(|(h, v)| ((*h).to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

fn num(r: &BTreeMap<String, String>, k: &str) -> f64 {
    r[k].parse().unwrap()
}

fn json(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// A PNG of the chart's size, or (no system font) the error that says so.
fn check_png(args: &[&str], png: &Path, size: (u32, u32)) {
    let out = sluice(args);
    if out.status.success() {
        let bytes = std::fs::read(png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(
            u32::from_be_bytes(bytes[16..20].try_into().unwrap()),
            size.0
        );
        assert_eq!(
            u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
            size.1
        );
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("no TrueType font"), "{stderr}");
    }
}

fn share_sum(v: &Value) -> f64 {
    v.as_array().unwrap().iter().map(|s| f(&s["pct"])).sum()
}

#[test]
fn io_and_compute_reports_match_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let (model, io, csv, ct, ctl) = (
        d("m.gguf"),
        d("io.csv"),
        d("m.csv"),
        d("ct.csv"),
        d("ctl.csv"),
    );
    common::gen_olmoe(Path::new(&model), 2);
    let run = |extra: &[&str]| {
        let mut a = vec![
            "run",
            "-m",
            &model,
            "-p",
            "Once upon a time",
            "-n",
            "4",
            "--temp",
            "0",
            "--ignore-eos",
            "-t",
            "2",
            "--moe-stream",
            "on",
            "--cache-mb",
            "0",
        ];
        a.extend_from_slice(extra);
        ok(sluice(&a));
    };
    run(&["--io-trace", &io, "--csv", &csv, "--compute-trace", &ct]);
    run(&["--compute-trace-layers", &ctl]);

    // ---- io ----
    let reads = rows(Path::new(&io));
    let decode: Vec<_> = reads.iter().filter(|r| r["phase"] == "1").collect();
    let file_bytes: f64 = decode.iter().map(|r| num(r, "read_bytes")).sum();
    let csv_bytes: f64 = rows(Path::new(&csv))
        .iter()
        .map(|r| num(r, "read_bytes"))
        .sum();
    let csv_wall: f64 = rows(Path::new(&csv))
        .iter()
        .map(|r| num(r, "wall_ms"))
        .sum();
    assert!(file_bytes > 0.0);
    let j = json(&ok(sluice(&[
        "analyze", "io", &io, "--csv", &csv, "--json",
    ])));
    assert_eq!(j["phase"], "decode");
    assert_eq!(f(&j["read_bytes"]), file_bytes);
    assert_eq!(f(&j["read_bytes"]), csv_bytes);
    assert_eq!(f(&j["reads"]), decode.len() as f64);
    assert_eq!(f(&j["passes"]), 4.0);
    let req: f64 = decode.iter().map(|r| num(r, "req_bytes")).sum();
    assert_eq!(f(&j["req_bytes"]), req);
    let waste = 100.0 * (file_bytes - req) / file_bytes;
    assert!((f(&j["waste_pct"]) - waste).abs() < 1e-9);
    let lat = &j["latency_ms"];
    let [p50, p90, p99, max] = ["p50", "p90", "p99", "max"].map(|k| f(&lat[k]));
    assert!(p50 <= p90 && p90 <= p99 && p99 <= max, "{lat}");
    let max_file = decode
        .iter()
        .map(|r| num(r, "latency_ns"))
        .fold(0.0, f64::max);
    assert!((max - max_file / 1e6).abs() < 1e-9);
    // Lanes and size buckets partition the reads.
    let lanes = j["lanes"].as_array().unwrap();
    let lane_bytes: f64 = lanes.iter().map(|l| f(&l["read_bytes"])).sum();
    assert_eq!(lane_bytes, file_bytes);
    let busy: f64 = lanes.iter().map(|l| f(&l["busy_ms"])).sum();
    let lat_sum: f64 = decode.iter().map(|r| num(r, "latency_ns")).sum();
    assert!((busy - lat_sum / 1e6).abs() < 1e-6);
    let sizes = j["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), 5);
    let size_reads: f64 = sizes.iter().map(|s| f(&s["reads"])).sum();
    assert_eq!(size_reads, decode.len() as f64);
    let hist: f64 = j["latency_hist"]["counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(f)
        .sum();
    assert_eq!(hist, decode.len() as f64);
    let bw = &j["decode_bandwidth"];
    assert_eq!(f(&bw["csv_read_bytes"]), csv_bytes);
    assert_eq!(f(&bw["csv_rows"]), 4.0);
    assert!((f(&bw["csv_wall_ms"]) - csv_wall).abs() < 1e-6);
    let mibs = file_bytes / 1048576.0 / (csv_wall / 1e3);
    assert!((f(&bw["mib_per_s"]) - mibs).abs() < 1e-6 * mibs);

    let all = json(&ok(sluice(&[
        "analyze", "io", &io, "--phase", "all", "--json",
    ])));
    let all_bytes: f64 = reads.iter().map(|r| num(r, "read_bytes")).sum();
    assert_eq!(f(&all["read_bytes"]), all_bytes);
    assert!(all["decode_bandwidth"].is_null());

    let text = ok(sluice(&["analyze", "io", &io, "--csv", &csv]));
    assert!(text.contains("latency ms: p50 "), "{text}");
    assert!(text.contains("alignment waste "), "{text}");
    assert!(text.contains(" MiB/s"), "{text}");
    let png = d("io.png");
    check_png(
        &["analyze", "io", &io, "--png", &png],
        Path::new(&png),
        (960, 600),
    );

    // The wrong kind of file is an error that names it.
    let out = sluice(&["analyze", "io", &ct]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{ct}:1: expected `# io_trace v1`")),
        "{stderr}"
    );

    // ---- compute, per node ----
    let nodes = rows(Path::new(&ct));
    let dn: Vec<_> = nodes.iter().filter(|r| r["phase"] == "1").collect();
    let j = json(&ok(sluice(&["analyze", "compute", &ct, "--json"])));
    assert_eq!(j["granularity"], "node");
    assert_eq!(f(&j["passes"]), 4.0);
    assert_eq!(f(&j["rows"]), dn.len() as f64);
    assert!(
        (share_sum(&j["by_op"]) - 100.0).abs() < 0.1,
        "{}",
        j["by_op"]
    );
    assert!((share_sum(&j["by_layer"]) - 100.0).abs() < 0.1);
    let wall: f64 = dn.iter().map(|r| num(r, "wall_ns")).sum();
    assert!((f(&j["wall_ms"]) - wall / 1e6).abs() < 1e-6);
    let flt: f64 = dn.iter().map(|r| num(r, "majflt")).sum();
    assert_eq!(f(&j["majflt"]), flt);
    let ops: BTreeSet<&str> = dn.iter().map(|r| r["op"].as_str()).collect();
    let got: BTreeSet<&str> = j["by_op"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert_eq!(got, ops);
    let layers: Vec<&str> = j["by_layer"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert_eq!(layers, ["0", "1", "other"]);
    let top = j["top"].as_array().unwrap();
    assert_eq!(top.len(), 10);
    let means: Vec<f64> = top.iter().map(|t| f(&t["mean_ms"])).collect();
    assert!(means.windows(2).all(|w| w[0] >= w[1]), "{means:?}");
    // The first node's mean, recomputed: its wall over the 4 passes it runs in.
    let name = top[0]["name"].as_str().unwrap();
    let its: f64 = dn
        .iter()
        .filter(|r| r["name"] == name)
        .map(|r| num(r, "wall_ns"))
        .sum();
    assert!((means[0] - its / 4.0 / 1e6).abs() < 1e-9);
    let text = ok(sluice(&["analyze", "compute", &ct]));
    assert!(text.contains("per-node"), "{text}");
    assert!(text.contains("MUL_MAT_ID"), "{text}");
    let png = d("ct.png");
    check_png(
        &["analyze", "compute", &ct, "--png", &png],
        Path::new(&png),
        (960, 900),
    );

    // ---- compute, per layer ----
    let j = json(&ok(sluice(&["analyze", "compute", &ctl, "--json"])));
    assert_eq!(j["granularity"], "layer");
    assert_eq!(f(&j["passes"]), 4.0);
    assert!((share_sum(&j["by_layer"]) - 100.0).abs() < 0.1);
    assert_eq!(j["by_op"].as_array().unwrap().len(), 1);
    let layers: Vec<&str> = j["by_layer"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert_eq!(layers, ["0", "1", "other"]);
    let lrows = rows(Path::new(&ctl));
    let post: f64 = lrows
        .iter()
        .filter(|r| r["phase"] == "1" && r["name"] == "post")
        .map(|r| num(r, "wall_ns"))
        .sum();
    assert!((f(&j["by_layer"][2]["wall_ms"]) - post / 1e6).abs() < 1e-9);
    let png = d("ctl.png");
    check_png(
        &["analyze", "compute", &ctl, "--png", &png],
        Path::new(&png),
        (960, 600),
    );
}
