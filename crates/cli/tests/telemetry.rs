//! The telemetry contract, checked by a parser written from BigMoeOnEdge's contract (the key
//! lists, types, column names and order below are the spec's, not read from our writer): the
//! `BMOE_LOAD` / `BMOE_PROGRESS` lines, the end-of-run lines, and the `--csv` file (preamble,
//! rows, `# summary` trailer), on resident, streaming and overlapped runs; and the consistency
//! of the numbers (wall = io + compute + mgmt in serial mode, the rows' reads against the
//! summary's, the hit rate).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;
use common::spec::*;
use common::{ok, sluice};

// ---- the spec, transcribed ----

// ---- the parser ----

fn check_type(key: &str, v: &Value, ty: &str) {
    let good = match ty {
        "int" => v.is_u64() || v.is_i64(),
        "float" => v.is_number(),
        "string" => v.is_string(),
        _ => false,
    };
    assert!(good, "{key}: {v} is not a {ty}");
}

/// A `BMOE_<TAG> {json}` line's object, checked against `keys` (every key present with its
/// type; no other key except those in `optional`).
fn parse_tagged(line: &str, tag: &str, keys: &[(&str, &str)], optional: &[&str]) -> Value {
    let json = line
        .strip_prefix(tag)
        .and_then(|r| r.strip_prefix(' '))
        .unwrap_or_else(|| panic!("not a {tag} line: {line}"));
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let obj = v.as_object().expect("an object");
    for (k, ty) in keys {
        let x = obj
            .get(*k)
            .unwrap_or_else(|| panic!("{tag}: no {k} in {json}"));
        check_type(k, x, ty);
    }
    for k in obj.keys() {
        assert!(
            keys.iter().any(|(n, _)| n == k) || optional.contains(&k.as_str()),
            "{tag}: unknown key {k}"
        );
    }
    v
}

/// `key=value` pairs of a `#` line.
fn kv(line: &str) -> BTreeMap<String, String> {
    line.trim_start_matches('#')
        .split_whitespace()
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

struct Csv {
    preamble: BTreeMap<String, String>,
    rows: Vec<BTreeMap<String, f64>>,
    summary: BTreeMap<String, f64>,
}

fn parse_csv(text: &str) -> Csv {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "# bmoe_metrics v2");
    assert!(lines[1].starts_with("# engine="), "{}", lines[1]);
    assert!(lines[2].starts_with("# model="), "{}", lines[2]);
    let mut preamble = BTreeMap::new();
    let mut i = 1;
    while lines[i].starts_with('#') {
        preamble.extend(kv(lines[i]));
        i += 1;
    }
    for k in PREAMBLE_MODEL
        .iter()
        .chain(PREAMBLE_STREAM)
        .chain(PREAMBLE_SAMPLING)
        .chain(&["engine"])
    {
        assert!(preamble.contains_key(*k), "preamble: no {k}");
    }
    let header: Vec<&str> = lines[i].split(',').collect();
    assert_eq!(header, CSV_COLUMNS, "the column line");
    i += 1;
    let mut rows = Vec::new();
    while i < lines.len() && !lines[i].starts_with('#') {
        let fields: Vec<&str> = lines[i].split(',').collect();
        assert_eq!(fields.len(), header.len(), "{}", lines[i]);
        let mut row = BTreeMap::new();
        for (name, f) in header.iter().zip(fields) {
            if CSV_INT_COLUMNS.contains(name) {
                f.parse::<i64>()
                    .unwrap_or_else(|_| panic!("{name}: {f} is not an integer"));
            }
            let x: f64 = f.parse().unwrap_or_else(|_| panic!("{name}: {f}"));
            row.insert((*name).to_owned(), x);
        }
        rows.push(row);
        i += 1;
    }
    assert_eq!(i, lines.len() - 1, "one # summary line ends the file");
    let s = lines[i];
    assert!(s.starts_with("# summary "), "{s}");
    let summary: BTreeMap<String, f64> = kv(s)
        .into_iter()
        .map(|(k, v)| {
            let x = v.parse().unwrap_or_else(|_| panic!("summary {k}={v}"));
            (k, x)
        })
        .collect();
    for k in SUMMARY_KEYS.iter().chain(BMOE_SUMMARY_KEYS) {
        assert!(summary.contains_key(*k), "summary: no {k}");
    }
    Csv {
        preamble,
        rows,
        summary,
    }
}

/// Checks the end-of-run lines of the spec; returns them by their prefix.
fn end_lines(out: &str, streaming: bool, cache: bool) -> BTreeMap<&'static str, String> {
    let mut found = BTreeMap::new();
    for p in [
        "generation: ",
        "compute: ",
        "mode: ",
        "moe-stream: ",
        "moe-cache: ",
    ] {
        if let Some(l) = out.lines().find(|l| l.starts_with(p)) {
            found.insert(p, l.to_owned());
        }
    }
    let g = &found["generation: "];
    let rest = g.strip_prefix("generation: ").unwrap();
    let (n, rest) = rest.split_once(" tokens, ").expect(g);
    n.parse::<usize>().expect(g);
    let (s, rest) = rest.split_once(" s/token (").expect(g);
    s.parse::<f64>().expect(g);
    rest.strip_suffix(" tok/s)")
        .expect(g)
        .parse::<f64>()
        .expect(g);
    // compute: <pct>% CPU occupancy (<c> cpu-s/token over <n> threads), <f> major faults/token
    let c = &found["compute: "];
    let rest = c.strip_prefix("compute: ").unwrap();
    let (pct, rest) = rest.split_once("% CPU occupancy (").expect(c);
    pct.parse::<f64>().expect(c);
    let (cpu, rest) = rest.split_once(" cpu-s/token over ").expect(c);
    cpu.parse::<f64>().expect(c);
    let (threads, rest) = rest.split_once(" threads), ").expect(c);
    threads.parse::<usize>().expect(c);
    rest.strip_suffix(" major faults/token")
        .expect(c)
        .parse::<f64>()
        .expect(c);
    let m = &found["mode: "];
    if streaming {
        assert!(m.starts_with("mode: expert streaming, cache "), "{m}");
        assert!(m.contains(", dense "), "{m}");
        let s = found.get("moe-stream: ").expect("moe-stream: line");
        assert!(s.starts_with("moe-stream: read ") && s.contains(" MiB/token), decode "));
        assert_eq!(found.contains_key("moe-cache: "), cache, "{out}");
    } else {
        assert!(
            !found.contains_key("moe-stream: ") && !found.contains_key("moe-cache: "),
            "without streaming the moe-* lines are absent: {out}"
        );
    }
    found
}

fn olmoe(dir: &Path) -> PathBuf {
    common::olmoe(dir, 2)
}

fn run(model: &Path, csv: &Path, extra: &[&str]) -> String {
    let mut a = vec![
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "Once upon a time",
        "-n",
        "6",
        "--temp",
        "0",
        "--ignore-eos",
        "-t",
        "2",
        "--progress",
        "--csv",
        csv.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    ok(sluice(&a))
}

#[test]
fn every_line_and_file_follows_the_spec() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe(dir.path());
    let csv_path = dir.path().join("m.csv");
    for (extra, streaming, cache, overlap) in [
        (&["--moe-stream", "off"][..], false, false, false),
        (
            &["--moe-stream", "on", "--cache-mb", "0"][..],
            true,
            false,
            false,
        ),
        (
            &["--moe-stream", "on", "--cache-mb", "20", "--force-cache"][..],
            true,
            true,
            false,
        ),
        (
            &[
                "--moe-stream",
                "on",
                "--cache-mb",
                "20",
                "--force-cache",
                "--overlap",
            ][..],
            true,
            true,
            true,
        ),
    ] {
        let out = run(&m, &csv_path, extra);
        // The progress lines, then the banner block.
        let (progress, rest) = out.split_once("=== answer ===\n").expect(&out);
        let (answer, perf) = rest.rsplit_once("\n=== perf ===\n").expect(&out);
        let mut steps = Vec::new();
        let mut text = String::new();
        let mut loads = Vec::new();
        for l in progress.lines() {
            if l.starts_with("BMOE_LOAD ") {
                loads.push(parse_tagged(l, "BMOE_LOAD", LOAD_KEYS, &[]));
                continue;
            }
            let v = parse_tagged(l, "BMOE_PROGRESS", PROGRESS_KEYS, &["reset"]);
            if let Some(r) = v.get("reset") {
                assert_eq!(r, 1);
            }
            assert_eq!(v["steps"], 6);
            steps.push(v["step"].as_u64().unwrap());
            text.push_str(v["delta_text"].as_str().unwrap());
            let hit = v["cache_hit_pct"].as_f64().unwrap();
            if cache {
                assert!((0.0..=100.0).contains(&hit), "{l}");
            } else {
                assert_eq!(hit, -1.0, "-1 without a cache: {l}");
            }
            let frac = v["dense_resident_frac"].as_f64().unwrap();
            assert!(frac == -1.0 || (0.0..=1.0).contains(&frac), "{l}");
            if !streaming {
                assert_eq!(v["read_mb"], 0.0);
            }
            if !overlap {
                assert_eq!(v["stall_ms"], 0.0, "stall is overlap-only: {l}");
            }
        }
        assert_eq!(steps, (1..=6).collect::<Vec<_>>());
        assert_eq!(text, answer);
        // BMOE_LOAD only for tokens that read: never without streaming, on every token
        // without a cache (each token reads its experts).
        if !streaming {
            assert!(loads.is_empty());
        }
        if streaming && !cache {
            assert_eq!(loads.len(), 6);
        }
        end_lines(perf, streaming, cache);

        let csv = parse_csv(&std::fs::read_to_string(&csv_path).unwrap());
        let p = &csv.preamble;
        assert_eq!(p["moe_stream"], if streaming { "1" } else { "0" });
        assert_eq!(p["overlap"], if overlap { "1" } else { "0" });
        assert_eq!(p["arch"], "olmoe");
        assert_eq!(p["n_layer"], "2");
        assert_eq!(p["n_expert_used"], "8");
        assert_eq!(csv.rows.len(), 6);
        let s = &csv.summary;
        // Consistency: wall = io + compute + mgmt in serial mode (to the rounding of 3
        // decimals), unless the clamp fired; the rows' reads add up to the summary's.
        let mut read = 0.0;
        for r in &csv.rows {
            read += r["read_bytes"];
            if !overlap && r["compute_ms"] > 0.0 {
                let sum = r["io_ms"] + r["compute_ms"] + r["mgmt_ms"];
                assert!((r["wall_ms"] - sum).abs() <= 0.002, "{r:?}");
            }
            if overlap {
                let sum = r["stall_ms"] + r["compute_ms"] + r["mgmt_ms"];
                assert!(r["compute_ms"] == 0.0 || (r["wall_ms"] - sum).abs() <= 0.002);
            }
            assert_eq!(r["mtp_batch"], 1.0);
        }
        let read_mib = read / (1u64 << 20) as f64;
        assert!(
            (read_mib - s["read_MiB"]).abs() < 0.001,
            "{read_mib} vs {s:?}"
        );
        assert_eq!(s["tokens"], 6.0);
        // The last row's cumulative hit rate is the summary's.
        let last = csv.rows.last().unwrap();
        assert!((last["cache_hit_pct"] - s["cache_hit_pct"]).abs() < 0.01);
        if streaming {
            // Every decode token routes 8 experts in each of the 2 layers.
            assert_eq!(s["experts_routed"], 6.0 * 2.0 * 8.0);
        }
    }
}

/// The data rows of a trace file (after its `#` lines and column line) as maps by column name.
fn trace_rows(text: &str, version_line: &str, columns: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(version_line));
    let mut header = None;
    for l in lines.by_ref() {
        if !l.starts_with('#') {
            header = Some(l);
            break;
        }
    }
    let header: Vec<&str> = header.expect("a column line").split(',').collect();
    assert_eq!(header.join(","), columns);
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), header.len(), "{l}");
            header
                .iter()
                .zip(f)
                .map(|(h, v)| ((*h).to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

/// The route and I/O traces agree with the CSV and the summary lines: the route trace has a
/// row per routed expert (the last layer routing only the last prompt token, as the spec's
/// prefill rule says), its decode residency gives the reported hit rate, and its bytes, like the
/// I/O trace's, add up to the CSV's reads; a traced run says it is instrumented.
#[test]
fn traces_agree_with_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe(dir.path());
    let csv_path = dir.path().join("m.csv");
    let rt = dir.path().join("route.csv");
    let io = dir.path().join("io.csv");
    for overlap in [false, true] {
        let mut extra = vec![
            "--moe-stream",
            "on",
            "--cache-mb",
            "20",
            "--force-cache",
            "--route-trace",
            rt.to_str().unwrap(),
            "--io-trace",
            io.to_str().unwrap(),
        ];
        if overlap {
            extra.push("--overlap");
        }
        let out = run(&m, &csv_path, &extra);
        let csv = parse_csv(&std::fs::read_to_string(&csv_path).unwrap());
        assert_eq!(csv.preamble["instrumented"], "1");
        assert_eq!(csv.preamble["traces"], "route,io");
        let n_prompt = csv.summary["n_prompt"] as usize;
        let csv_read: f64 = csv.rows.iter().map(|r| r["read_bytes"]).sum();

        let route = trace_rows(
            &std::fs::read_to_string(&rt).unwrap(),
            "# route_trace v1",
            "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped",
        );
        let (layers, k) = (2, 8);
        let prefill: Vec<_> = route.iter().filter(|r| r["phase"] == "0").collect();
        let decode: Vec<_> = route.iter().filter(|r| r["phase"] == "1").collect();
        assert_eq!(prefill.len(), n_prompt * (layers - 1) * k + k);
        // The last layer's prefill rows carry the final prompt position.
        assert!(
            prefill
                .iter()
                .filter(|r| r["layer"] == "1")
                .all(|r| r["step"] == (n_prompt - 1).to_string())
        );
        assert_eq!(decode.len(), 6 * layers * k);
        let hits = decode.iter().filter(|r| r["residency"] == "1").count();
        let hit_pct = 100.0 * hits as f64 / decode.len() as f64;
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("moe-cache: "))
            .unwrap();
        let reported: f64 = line.split('%').next().unwrap().parse().unwrap();
        assert!((hit_pct - reported).abs() < 0.051, "{hit_pct} vs {line}");
        let route_bytes: f64 = decode
            .iter()
            .map(|r| r["expert_bytes"].parse::<f64>().unwrap())
            .sum();
        assert_eq!(route_bytes, csv_read);

        let reads = trace_rows(
            &std::fs::read_to_string(&io).unwrap(),
            "# io_trace v1",
            "turn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns",
        );
        let io_bytes: f64 = reads
            .iter()
            .filter(|r| r["phase"] == "1")
            .map(|r| r["read_bytes"].parse::<f64>().unwrap())
            .sum();
        assert_eq!(io_bytes, csv_read, "overlap {overlap}");
        for r in &reads {
            let req: u64 = r["req_bytes"].parse().unwrap();
            let got: u64 = r["read_bytes"].parse().unwrap();
            assert!(got >= req && got.is_multiple_of(4096), "{r:?}");
            assert_eq!(r["spec"], "0");
        }
    }
}

/// The compute traces: per node, every decode pass has the same sequence of named
/// intermediates (layer parsed from the name's `-<il>` suffix, `-1` for the output head); per
/// layer, one `blk.<il>` row per layer and a `post` row per pass. Without streaming too, and
/// marked in the CSV preamble.
#[test]
fn compute_traces_have_a_row_per_node_or_layer() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe(dir.path());
    let csv_path = dir.path().join("m.csv");
    let ct = dir.path().join("ct.csv");
    let columns = "turn,phase,step,seq,layer,op,name,wall_ns,majflt";
    run(
        &m,
        &csv_path,
        &[
            "--moe-stream",
            "off",
            "--compute-trace",
            ct.to_str().unwrap(),
        ],
    );
    let text = std::fs::read_to_string(&ct).unwrap();
    assert!(text.lines().nth(1).unwrap().starts_with("# model="));
    let rows = trace_rows(&text, "# compute_trace v1", columns);
    let mut passes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r["phase"] == "1") {
        let name = &r["name"];
        let layer: i64 = r["layer"].parse().unwrap();
        match name.rsplit_once('-') {
            Some((_, il)) if il.parse::<i64>().is_ok() => {
                assert_eq!(il.parse::<i64>().unwrap(), layer, "{r:?}")
            }
            _ => assert_eq!(layer, -1, "{r:?}"),
        }
        r["wall_ns"].parse::<u64>().unwrap();
        passes
            .entry(r["step"].clone())
            .or_default()
            .push(name.clone());
    }
    assert_eq!(passes.len(), 6);
    let first = passes.values().next().unwrap();
    assert!(first.contains(&"ffn_moe_out-1".to_owned()), "{first:?}");
    assert_eq!(first.last().unwrap(), "result_output");
    assert!(passes.values().all(|p| p == first));
    let csv = parse_csv(&std::fs::read_to_string(&csv_path).unwrap());
    assert_eq!(csv.preamble["compute_trace_layers"], "0");
    assert_eq!(csv.preamble["traces"], "compute");

    run(
        &m,
        &csv_path,
        &[
            "--moe-stream",
            "on",
            "--cache-mb",
            "0",
            "--compute-trace-layers",
            ct.to_str().unwrap(),
        ],
    );
    let rows = trace_rows(
        &std::fs::read_to_string(&ct).unwrap(),
        "# compute_trace v1",
        columns,
    );
    let decode: Vec<_> = rows.iter().filter(|r| r["phase"] == "1").collect();
    assert_eq!(decode.len(), 6 * 3);
    for pass in decode.chunks(3) {
        let names: Vec<&str> = pass.iter().map(|r| r["name"].as_str()).collect();
        assert_eq!(names, ["blk.0", "blk.1", "post"]);
        assert!(pass.iter().all(|r| r["op"] == "LAYER"));
    }
    let csv = parse_csv(&std::fs::read_to_string(&csv_path).unwrap());
    assert_eq!(csv.preamble["compute_trace_layers"], "1");
    assert_eq!(csv.preamble["instrumented"], "1");
}

/// `moe-drop: <dropped>/<routed> routed experts dropped (<pct>%), threshold <F> x uniform`,
/// parsed: (dropped, routed, pct, F).
fn parse_drop_line(out: &str) -> Option<(u64, u64, f64, f64)> {
    let l = out.lines().find_map(|l| l.strip_prefix("moe-drop: "))?;
    let (dropped, rest) = l.split_once('/').expect(l);
    let (routed, rest) = rest.split_once(" routed experts dropped (").expect(l);
    let (pct, rest) = rest.split_once("%), threshold ").expect(l);
    let frac = rest.strip_suffix(" x uniform").expect(l);
    Some((
        dropped.parse().expect(l),
        routed.parse().expect(l),
        pct.parse().expect(l),
        frac.parse().expect(l),
    ))
}

/// The cache-aware levers (`--drop-cold-experts`, `--expert-substitute`), as the spec reports
/// them: the `mode:` line names them lossy, the `moe-drop:` line, the CSV preamble's values,
/// the summary's ledger (`experts_routed` counts the dropped routings too), and `dropped=1`
/// route-trace rows that are misses with no bytes read, in decode steps only unless
/// `--drop-in-prefill`. A cache of about 50 of the 128 experts: hits and misses both.
#[test]
fn cache_aware_levers_are_reported_as_the_spec_says() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe(dir.path());
    let csv_path = dir.path().join("m.csv");
    let rt = dir.path().join("route.csv");
    let stream = [
        "--moe-stream",
        "on",
        "--cache-mb",
        "200",
        "--force-cache",
        "--no-usage",
        "--route-trace",
        rt.to_str().unwrap(),
    ];
    let (layers, k, n) = (2, 8, 6);
    let route = || {
        trace_rows(
            &std::fs::read_to_string(&rt).unwrap(),
            "# route_trace v1",
            "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped",
        )
    };

    // off: no line, zero ledger, the defaults in the preamble
    let out = run(&m, &csv_path, &stream);
    assert_eq!(parse_drop_line(&out), None);
    let csv = parse_csv(&std::fs::read_to_string(&csv_path).unwrap());
    let p = &csv.preamble;
    assert_eq!(
        [
            &p["drop_cold_frac"],
            &p["drop_renorm"],
            &p["drop_prefill"],
            &p["substitute_lambda"]
        ],
        ["0", "1", "0", "0"]
    );
    for key in ["experts_dropped", "experts_reranked", "experts_substituted"] {
        assert_eq!(csv.summary[key], 0.0, "{key}");
    }
    assert!(route().iter().all(|r| r["dropped"] == "0"));

    for in_prefill in [false, true] {
        let mut extra = vec!["--drop-cold-experts", "1"];
        if in_prefill {
            extra.extend(["--drop-in-prefill", "--drop-no-renorm"]);
        }
        extra.extend(stream);
        let out = run(&m, &csv_path, &extra);
        let mode = out.lines().find(|l| l.starts_with("mode: ")).unwrap();
        assert!(
            mode.contains(", drop-cold-experts 1 x uniform (lossy: "),
            "{mode}"
        );
        let csv = parse_csv(&std::fs::read_to_string(&csv_path).unwrap());
        let (p, s) = (&csv.preamble, &csv.summary);
        assert_eq!(p["drop_cold_frac"], "1");
        assert_eq!(p["drop_renorm"], if in_prefill { "0" } else { "1" });
        assert_eq!(p["drop_prefill"], if in_prefill { "1" } else { "0" });
        let (dropped, routed, pct, frac) = parse_drop_line(&out).expect("a moe-drop: line");
        assert_eq!(frac, 1.0);
        assert_eq!(routed, (n * layers * k) as u64);
        assert!(dropped > 0 && dropped < routed, "{dropped}/{routed}");
        assert!((pct - 100.0 * dropped as f64 / routed as f64).abs() < 0.051);
        assert_eq!(s["experts_routed"], routed as f64);
        assert_eq!(s["experts_dropped"], dropped as f64);

        let rows = route();
        let decode_dropped: Vec<_> = rows
            .iter()
            .filter(|r| r["phase"] == "1" && r["dropped"] == "1")
            .collect();
        assert_eq!(decode_dropped.len() as u64, dropped);
        // a dropped routing is a miss that was never read, below the uniform share
        for r in &decode_dropped {
            assert_eq!(
                (r["residency"].as_str(), r["expert_bytes"].as_str()),
                ("0", "0")
            );
            assert!(
                r["weight"].parse::<f64>().unwrap() < 1.0 / k as f64,
                "{r:?}"
            );
        }
        let prefill_dropped = rows
            .iter()
            .filter(|r| r["phase"] == "0" && r["dropped"] == "1")
            .count();
        assert_eq!(prefill_dropped > 0, in_prefill, "{prefill_dropped}");
    }

    // substitution: every decode slot re-ranked, some moved to a resident expert
    let mut extra = vec!["--expert-substitute", "0.5"];
    extra.extend(stream);
    let out = run(&m, &csv_path, &extra);
    assert!(out.contains(", expert-substitute 0.5 (lossy: "), "{out}");
    assert_eq!(parse_drop_line(&out), None);
    let csv = parse_csv(&std::fs::read_to_string(&csv_path).unwrap());
    assert_eq!(csv.preamble["substitute_lambda"], "0.5");
    let s = &csv.summary;
    assert_eq!(s["experts_reranked"], (n * layers * k) as f64);
    assert!(s["experts_substituted"] > 0.0, "{s:?}");
    assert!(s["experts_substituted"] <= s["experts_reranked"]);
    assert_eq!(s["experts_dropped"], 0.0);
    // sluice's own line for it (the spec has none)
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("moe-substitute: "))
        .expect("a moe-substitute: line");
    assert_eq!(
        line,
        format!(
            "{}/{} routed experts moved to a resident expert ({:.1}%), lambda 0.5",
            s["experts_substituted"],
            s["experts_reranked"],
            100.0 * s["experts_substituted"] / s["experts_reranked"]
        )
    );
}

/// Cache-aware dropping on a routing of four experts or fewer is warned about (the threshold
/// is a large share of the routing there); without a cache the levers are refused, naming
/// the flags; a strength past 1 is refused before anything loads.
#[test]
fn cache_aware_levers_warn_and_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe(dir.path());
    let m = m.to_str().unwrap();
    let base = [
        "run",
        "-m",
        m,
        "-p",
        "Once",
        "-n",
        "1",
        "--temp",
        "0",
        "--no-usage",
        "--moe-stream",
        "on",
    ];
    let narrow = sluice(
        &[
            &base[..],
            &[
                "--cache-mb",
                "200",
                "--force-cache",
                "--n-expert-used",
                "2",
                "--drop-cold-experts",
                "0.75",
            ],
        ]
        .concat(),
    );
    let err = String::from_utf8_lossy(&narrow.stderr);
    assert!(narrow.status.success(), "{err}");
    assert!(
        err.contains("warning: --drop-cold-experts 0.75 with top-k 2: the threshold is 37.5%"),
        "{err}"
    );
    let no_cache = sluice(
        &[
            &base[..],
            &["--cache-mb", "0", "--expert-substitute", "0.1"],
        ]
        .concat(),
    );
    assert!(!no_cache.status.success());
    let err = String::from_utf8_lossy(&no_cache.stderr);
    assert!(
        err.contains("--drop-cold-experts / --expert-substitute"),
        "{err}"
    );
    assert!(err.contains("has no expert cache"), "{err}");
    let past = sluice(&[&base[..], &["--drop-cold-experts", "1.5"]].concat());
    assert!(!past.status.success());
    let err = String::from_utf8_lossy(&past.stderr);
    assert!(err.contains("1.5 is not between 0 and 1"), "{err}");
}

/// `--ngram`'s flags are checked, and the combinations it cannot keep exact are refused.
#[test]
fn ngram_flags_are_checked_and_inexact_combinations_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe(dir.path());
    let m = m.to_str().unwrap();
    let base = [
        "run",
        "-m",
        m,
        "-p",
        "Once",
        "-n",
        "2",
        "--temp",
        "0",
        "--no-usage",
    ];
    let fails = |extra: &[&str], says: &str| {
        let out = sluice(&[&base[..], extra].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} ran: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
    };
    fails(&["--draft", "2"], "--ngram");
    fails(&["--ngram-min-match", "2"], "--ngram");
    fails(&["--ngram", "--draft", "9"], "9 is not in 1..=8");
    fails(&["--ngram", "--draft", "0"], "0 is not in 1..=8");
    fails(&["--ngram", "--ngram-min-match", "0"], "--ngram-min-match");
    let ppl = dir.path().join("t.txt");
    std::fs::write(&ppl, "Once upon a time").unwrap();
    let out = sluice(&[
        "run",
        "-m",
        m,
        "--no-usage",
        "--ngram",
        "--ppl",
        ppl.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--ngram speeds up decoding; --ppl decodes nothing"),
        "{err}"
    );
    fails(
        &[
            "--ngram",
            "--moe-stream",
            "on",
            "--cache-mb",
            "200",
            "--force-cache",
            "--drop-cold-experts",
            "0.5",
        ],
        "the cache-aware policies act on one-token passes only",
    );
    fails(&["--ngram", "--route-ahead", "1"], "route-ahead");
    fails(
        &["--ngram", "--predict-log"],
        "--ngram: --predict-log records decode steps",
    );
    let trace = dir.path().join("r.csv");
    fails(
        &["--ngram", "--route-trace", trace.to_str().unwrap()],
        "--ngram: --route-trace records decode steps",
    );
    // and on its own it runs, saying so in the mode line
    let out = sluice(&[&base[..], &["--ngram"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(", ngram drafting (up to 3 tokens per verify pass, matches of 3+; exact)"),
        "{stdout}"
    );
    assert!(stdout.contains("\nngram: drafted on "), "{stdout}");
}

/// `--mtp` drafts with the model's NextN head: its flags are checked, a model without a head
/// (or whose drafts cannot be verified row by row) is refused, and a run says what the head
/// drafted in the mode line, its `mtp:` lines and the CSV preamble.
#[test]
fn mtp_flags_are_checked_and_the_head_reported() {
    let dir = tempfile::tempdir().unwrap();
    let glm = testdata::fixtures_root().join("moe/glm4moe-q8_0.gguf");
    let glm = glm.to_str().unwrap();
    let olmoe = olmoe(dir.path());
    let base = |m: &str| -> Vec<String> {
        [
            "run",
            "-m",
            m,
            "-p",
            "Once",
            "-n",
            "6",
            "--temp",
            "0",
            "--no-usage",
        ]
        .map(String::from)
        .to_vec()
    };
    let run = |m: &str, extra: &[&str]| {
        let mut a = base(m);
        a.extend(extra.iter().map(|s| s.to_string()));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        sluice(&a)
    };
    let fails = |m: &str, extra: &[&str], says: &str| {
        let out = run(m, extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} ran: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
    };
    fails(glm, &["--mtp", "--ngram"], "cannot be used with");
    fails(glm, &["--mtp-p-min", "0.5"], "--mtp");
    fails(glm, &["--mtp", "--mtp-p-min", "1.5"], "not between 0 and 1");
    fails(glm, &["--mtp", "--ngram-min-match", "2"], "--ngram");
    fails(
        olmoe.to_str().unwrap(),
        &["--mtp"],
        "has no NextN (multi-token prediction) layer",
    );
    let ds = testdata::fixtures_root().join("moe/deepseek2-q8_0.gguf");
    fails(
        ds.to_str().unwrap(),
        &["--mtp"],
        "latent or linear attention",
    );
    let csv = dir.path().join("t.csv");
    let out = run(
        glm,
        &[
            "--mtp",
            "--draft",
            "2",
            "--mtp-p-min",
            "0.001",
            "--csv",
            csv.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(
            ", mtp drafting (the NextN head of layer 3, up to 2 tokens per verify pass, \
             while its probability is 0.001+; exact)"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("\nmtp: drafting costs "), "{stdout}");
    assert!(!stdout.contains("drafted on"), "{stdout}");
    let first = stdout
        .lines()
        .find(|l| l.starts_with("mtp: ") && l.contains("drafts accepted"))
        .expect("the acceptance line");
    assert!(first.ends_with(" for 6 tokens)"), "{first}");
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert!(
        csv.contains(" spec=mtp spec_draft_max=2 mtp_p_min=0.001 ngram_min_match=0 "),
        "{csv}"
    );
    let plain = run(glm, &[]);
    let answer = |o: &[u8]| String::from_utf8_lossy(o).lines().next().map(str::to_owned);
    assert_eq!(answer(&out.stdout), answer(&plain.stdout));
}
