//! `sluice analyze view`: the page of a real traced run (a generated two-layer OLMoE, four
//! streamed tokens with every trace), the error for a directory with two route traces, and the
//! page of a recorded Qwen3-30B-A3B trace alone.

use std::path::Path;

mod common;
use common::{ok, sluice};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Checks what every page must be: no external references, every table closed.
fn well_formed(page: &str) {
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.trim_end().ends_with("</html>"));
    assert!(!page.contains("http://") && !page.contains("https://"));
    assert!(!page.contains("src=") && !page.contains("href="));
    assert_eq!(
        page.matches("<table").count(),
        page.matches("</table>").count()
    );
    assert_eq!(page.matches("<tr").count(), page.matches("</tr>").count());
    assert_eq!(page.matches("<svg").count(), page.matches("</svg>").count());
}

/// The first decode step's routed experts, from the trace read by column name: (step, ids).
fn first_decode_step(trace: &str) -> (String, Vec<String>) {
    let mut lines = trace.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (phase, step, expert) = (col("phase"), col("step"), col("expert"));
    let mut first: Option<String> = None;
    let mut ids = Vec::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        if f[phase] != "1" {
            continue;
        }
        let s = first.get_or_insert_with(|| f[step].to_string());
        if f[step] == s {
            ids.push(f[expert].to_string());
        }
    }
    (first.unwrap(), ids)
}

/// The matrix row of `step` (from its `<tr data-step=` to its `</tr>`).
fn matrix_row<'a>(page: &'a str, step: &str) -> &'a str {
    let start = page
        .find(&format!("<tr data-step=\"{step}\""))
        .expect("a row for the step");
    let row = &page[start..];
    &row[..row.find("</tr>").unwrap()]
}

#[test]
fn a_traced_run_renders_one_page() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    std::fs::create_dir(&run_dir).unwrap();
    let model = run_dir.join("m.gguf");
    common::gen_olmoe(&model, 2);
    // Names say nothing: the files are found by their first lines.
    let (route, csv, io, ct) = (
        run_dir.join("a.csv"),
        run_dir.join("b.csv"),
        run_dir.join("c.csv"),
        run_dir.join("d.csv"),
    );
    ok(sluice(&[
        "run",
        "-m",
        s(&model),
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
        "20",
        "--force-cache",
        "--csv",
        s(&csv),
        "--route-trace",
        s(&route),
        "--io-trace",
        s(&io),
        "--compute-trace",
        s(&ct),
    ]));

    let out = dir.path().join("page.html");
    ok(sluice(&["analyze", "view", s(&run_dir), "--out", s(&out)]));
    let page = std::fs::read_to_string(&out).unwrap();
    well_formed(&page);
    assert_eq!(page.matches("data-step=").count(), 4);
    assert!(!page.contains("Showing the first"));
    let (step, ids) = first_decode_step(&std::fs::read_to_string(&route).unwrap());
    assert_eq!(ids.len(), 2 * 8);
    let row = matrix_row(&page, &step);
    for id in &ids {
        assert!(
            row.contains(&format!(">{id}</span>")),
            "expert {id} in {row}"
        );
    }
    // Every section was drawn from its file.
    for heading in [
        "Decode routing",
        "Hot experts",
        "Per-token metrics",
        "I/O trace",
        "Compute trace",
    ] {
        assert!(page.contains(heading), "{heading}");
    }
    assert!(page.contains("MUL_MAT_ID"));
    assert!(page.contains("<svg"));

    // Capped.
    ok(sluice(&[
        "analyze",
        "view",
        s(&run_dir),
        "--out",
        s(&out),
        "--max-steps",
        "2",
    ]));
    let page = std::fs::read_to_string(&out).unwrap();
    well_formed(&page);
    assert_eq!(page.matches("data-step=").count(), 2);
    assert!(page.contains("Showing the first 2 of 4 decode steps"));

    // A second route trace makes the directory ambiguous.
    std::fs::copy(&route, run_dir.join("z.csv")).unwrap();
    let o = sluice(&["analyze", "view", s(&run_dir), "--out", s(&out)]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("a.csv") && err.contains("z.csv") && err.contains("route"),
        "{err}"
    );
}

#[test]
fn a_recorded_trace_alone_renders() {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../telemetry/tests/data/qwen3-30b-a3b.route.csv");
    let trace = dir.path().join("qwen3-30b-a3b.route.csv");
    std::fs::copy(&src, &trace).unwrap();
    let out = dir.path().join("page.html");
    ok(sluice(&[
        "analyze",
        "view",
        s(dir.path()),
        "--out",
        s(&out),
    ]));
    let page = std::fs::read_to_string(&out).unwrap();
    well_formed(&page);
    let text = std::fs::read_to_string(&trace).unwrap();
    let steps: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("0,1,"))
        .map(|l| l.split(',').nth(2).unwrap())
        .collect();
    assert_eq!(page.matches("data-step=").count(), steps.len().min(256));
    let (step, ids) = first_decode_step(&text);
    assert_eq!(ids.len(), 48 * 6);
    let row = matrix_row(&page, &step);
    for id in &ids {
        assert!(row.contains(&format!(">{id}</span>")), "expert {id}");
    }
    assert!(page.contains("qwen3moe"));
    assert!(!page.contains("Per-token metrics"));
}
