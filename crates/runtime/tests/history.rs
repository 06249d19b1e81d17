//! The usage history through the library, on a copy of a generated MoE test model: a run
//! counts every routing into the history next to the model, another engine's history is
//! refused and left as it was, a run pinned from the history generates the resident tokens.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use runtime::events::Outcome;
use runtime::generate::Turn;
use runtime::history::PinArg;
use runtime::open::{Loaded, RunConfig};
use runtime::settings::stream::{CacheMb, StreamMode};
use runtime::sink::Collect;
use runtime::{Notice, Notices};

use common::{config, moe};

/// The model copied into `dir` (its history is written next to it).
fn model_in(dir: &Path) -> PathBuf {
    let to = dir.join("m.gguf");
    std::fs::copy(moe("qwen3moe-q4_k_m.gguf"), &to).expect("copy the model");
    to
}

/// Runs one generation of `n` tokens and saves the history; the outcome and the notices.
fn run(cfg: &RunConfig, n: usize) -> (Outcome, Vec<Notice>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&seen);
    let notices = Notices::new(move |n| keep.lock().unwrap().push(n.clone()));
    let loaded = Loaded::open(cfg, &notices).expect("open");
    let ids = loaded.tokenizer.encode("The experts", true, false);
    let (mut rt, _) = loaded.runtime(cfg).expect("runtime");
    let o = rt
        .generate(
            &Turn {
                ids: &ids,
                n_max: n,
                prompt: None,
                turn: 0,
            },
            &mut Collect::default(),
        )
        .expect("generate");
    rt.save_history();
    rt.finish().expect("finish");
    drop(rt);
    let notes = seen.lock().unwrap().clone();
    (o, notes)
}

/// The (layer, expert, count) records of a history file, its header lines apart.
fn records(path: &Path) -> (Vec<[i64; 3]>, Vec<[i64; 3]>) {
    let text = std::fs::read_to_string(path).expect("history");
    let all: Vec<[i64; 3]> = text
        .lines()
        .map(|l| {
            let v: Vec<i64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            [v[0], v[1], v[2]]
        })
        .collect();
    all.into_iter().partition(|r| r[0] < 0)
}

fn with_history(model: PathBuf) -> RunConfig {
    let mut cfg = config(model);
    cfg.history.no_usage = false;
    cfg
}

#[test]
fn a_run_counts_every_routing_into_the_history_and_the_next_adds_to_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = with_history(model_in(dir.path()));
    let trace = dir.path().join("route.csv");
    cfg.route_trace = Some(trace.clone());
    run(&cfg, 4);
    let hist = dir.path().join(".coli_usage");
    let (head, data) = records(&hist);
    assert_eq!(head[0][0], -1);
    // One selection per routed row of the route trace of the same run.
    let t = telemetry::read_route_trace(&trace).expect("route trace");
    let mut want = std::collections::BTreeMap::new();
    for r in &t.rows {
        *want
            .entry((i64::from(r.layer), i64::from(r.expert)))
            .or_insert(0i64) += 1;
    }
    let got: std::collections::BTreeMap<(i64, i64), i64> =
        data.iter().map(|r| ((r[0], r[1]), r[2])).collect();
    assert_eq!(got, want);
    // A second run (greedy: the same routing) adds the same again and says what it read.
    cfg.route_trace = None;
    let (_, notes) = run(&cfg, 4);
    assert!(
        notes
            .iter()
            .any(|n| n.text.starts_with("sluice: usage history ")),
        "{notes:?}"
    );
    let doubled: Vec<[i64; 3]> = data.iter().map(|r| [r[0], r[1], 2 * r[2]]).collect();
    assert_eq!(records(&hist).1, doubled);
    // Without a history nothing is read or written.
    let before = std::fs::read(&hist).expect("history");
    cfg.history.no_usage = true;
    let (_, notes) = run(&cfg, 4);
    assert!(
        !notes.iter().any(|n| n.text.contains("usage history")),
        "{notes:?}"
    );
    assert_eq!(std::fs::read(&hist).expect("history"), before);
}

#[test]
fn another_models_history_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = with_history(model_in(dir.path()));
    let hist = dir.path().join(".coli_usage");
    let foreign = "-1 48 128\n0 3 7\n";
    std::fs::write(&hist, foreign).expect("write");
    let (o, notes) = run(&cfg, 3);
    assert_eq!(o.summary.tokens, 3);
    assert!(
        notes
            .iter()
            .any(|n| n.text.starts_with("sluice: not updating ")),
        "{notes:?}"
    );
    assert_eq!(std::fs::read_to_string(&hist).expect("history"), foreign);
}

#[test]
fn a_run_pinned_from_the_history_generates_the_resident_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = model_in(dir.path());
    let mut resident = config(model.clone());
    resident.stream.moe_stream = StreamMode::Off;
    let (want, _) = run(&resident, 8);
    // Build a history, then pin from it in a streamed run with a small cache.
    run(&with_history(model.clone()), 8);
    let hist = dir.path().join(".coli_usage");
    let mut cfg = config(model);
    cfg.stream.moe_stream = StreamMode::On;
    cfg.stream.cache_mb = Some(CacheMb::Mib(1));
    cfg.stream.force_cache = true;
    cfg.history.pin = Some(PinArg::File(hist.clone()));
    cfg.history.pin_mb = Some(1);
    let (got, notes) = run(&cfg, 8);
    assert_eq!(got.tokens, want.tokens);
    let pinned = notes
        .iter()
        .find(|n| n.text.starts_with("sluice: pinned "))
        .unwrap_or_else(|| panic!("nothing pinned: {notes:?}"));
    let n: usize = pinned.text["sluice: pinned ".len()..]
        .split(' ')
        .next()
        .and_then(|x| x.parse().ok())
        .expect("a count");
    assert!(n > 0 && n <= records(&hist).1.len(), "{}", pinned.text);
}
