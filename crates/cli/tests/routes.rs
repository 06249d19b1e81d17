//! `sluice run --route-trace` and `--route-replay` on the demo model (qwen3moe layout, 2 layers,
//! 8 experts, top-2): the trace is a valid `route_trace v1` file, and a replayed run routes each
//! decode step exactly as the replayed trace says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use telemetry::{Phase, RouteTrace};

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo-qwen3moe.gguf")
}

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

/// `sluice run` on the demo model, greedy, `n` tokens never stopped early; returns stdout.
fn run(n: usize, extra: &[&str]) -> Result<String, String> {
    let m = demo();
    let n = n.to_string();
    let mut args = vec![
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Hello there",
        "-n",
        &n,
        "--temp",
        "0",
        "--ignore-eos",
        "-t",
        "1",
    ];
    args.extend_from_slice(extra);
    let o = sluice(&args);
    if o.status.success() {
        Ok(String::from_utf8(o.stdout).expect("utf-8"))
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

fn mode_line(out: &str) -> &str {
    out.lines()
        .rev()
        .find(|l| l.starts_with("mode: "))
        .expect("mode: line")
}

/// Decode cells of a parsed trace: (step, layer) → experts in slot order, with their weights.
fn decode_cells(t: &RouteTrace) -> BTreeMap<(i64, u32), Vec<(u32, f32)>> {
    /// (slot, expert, weight) rows of one cell.
    type Rows = Vec<(u32, u32, f32)>;
    let mut cells: BTreeMap<(i64, u32), Rows> = BTreeMap::new();
    for r in t.rows.iter().filter(|r| r.phase == Phase::Decode) {
        let w = r.weight.expect("a weight on every row");
        cells
            .entry((r.step, r.layer))
            .or_default()
            .push((r.slot, r.expert, w));
    }
    cells
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_by_key(|c| c.0);
            (k, v.into_iter().map(|(_, e, w)| (e, w)).collect())
        })
        .collect()
}

/// Prompt tokens: the positions layer 0 routed during the prefill.
fn prompt_len(t: &RouteTrace) -> i64 {
    t.rows
        .iter()
        .filter(|r| r.phase == Phase::Prefill && r.layer == 0 && r.slot == 0)
        .count() as i64
}

#[test]
fn route_trace_is_a_valid_v1_file_with_every_routing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    let out = run(5, &["--route-trace", path.to_str().unwrap()]).unwrap();
    assert!(!mode_line(&out).contains("replay"), "{out}");
    let t = telemetry::read_route_trace(&path).expect("parses as route_trace v1");
    assert_eq!(
        (t.arch.as_str(), t.n_layer, t.n_expert, t.n_expert_used),
        ("qwen3moe", 2, 8, 2)
    );
    // Per layer: one expert is the three projections of one expert (q8_0 64x64: 4352 bytes
    // each); the rest of the layer is dense.
    for l in 0..2 {
        let info = t.layers[&l];
        assert_eq!(info.expert_bytes, 3 * 4352, "layer {l}");
        assert!(info.dense_bytes > 0, "layer {l}");
    }
    // The prompt's p tokens: prefill routes all of them in layer 0 and only the last one in
    // the last layer; then 5 decode steps at positions p..p+5, every layer, 2 experts each.
    let p = prompt_len(&t);
    assert!(p > 1);
    let prefill: Vec<(i64, u32)> = t
        .rows
        .iter()
        .filter(|r| r.phase == Phase::Prefill && r.slot == 0)
        .map(|r| (r.step, r.layer))
        .collect();
    let mut want: Vec<(i64, u32)> = (0..p).map(|s| (s, 0)).collect();
    want.push((p - 1, 1));
    assert_eq!(prefill, want);
    let cells = decode_cells(&t);
    assert_eq!(cells.len(), 5 * 2);
    for ((step, layer), cell) in &cells {
        assert!((p..p + 5).contains(step), "step {step}");
        assert_eq!(cell.len(), 2, "step {step} layer {layer}");
        assert_ne!(cell[0].0, cell[1].0);
        // qwen3moe renormalizes the top-k weights, and slot 0 is the router's top choice.
        let sum: f32 = cell.iter().map(|c| c.1).sum();
        assert!((sum - 1.0).abs() < 2e-6, "{sum}");
        assert!(cell[0].1 >= cell[1].1);
    }
    for r in &t.rows {
        assert_eq!(
            (r.residency, r.expert_bytes, r.dropped),
            (Some(1), Some(0), Some(false))
        );
    }
}

/// A hand-made trace of `steps` decode steps for the demo model (plus a prefill row, which a
/// replay ignores).
fn write_replay(path: &Path, n_expert: u32, steps: &[[&[u32]; 2]]) {
    let mut s = format!(
        "# route_trace v1\n# model=x.gguf arch=qwen3moe n_layer=2 n_expert={n_expert} \
         n_expert_used=3\n# layer=0 expert_bytes=10 dense_bytes=1\n\
         # layer=1 expert_bytes=10 dense_bytes=1\nturn,phase,step,layer,slot,expert\n0,0,0,0,0,7\n",
    );
    for (i, layers) in steps.iter().enumerate() {
        for (l, experts) in layers.iter().enumerate() {
            // slots written in reverse: the replay must follow the slot numbers
            for (slot, e) in experts.iter().enumerate().rev() {
                s += &format!("0,1,{},{l},{slot},{e}\n", 10 + i);
            }
        }
    }
    std::fs::write(path, s).unwrap();
}

#[test]
fn replay_routes_every_decode_step_as_recorded_wrapping_around() {
    let dir = tempfile::tempdir().unwrap();
    let replay = dir.path().join("replay.csv");
    let steps: [[&[u32]; 2]; 3] = [
        [&[5, 1, 2], &[0, 7, 3]],
        [&[6, 4, 0], &[1, 2, 5]],
        [&[3, 5, 7], &[4, 6, 1]],
    ];
    write_replay(&replay, 8, &steps);
    let traced = dir.path().join("t.csv");
    let out = run(
        7,
        &[
            "--route-replay",
            replay.to_str().unwrap(),
            "--route-trace",
            traced.to_str().unwrap(),
        ],
    )
    .unwrap();
    let mode = mode_line(&out);
    assert!(
        mode.contains(&format!("route replay of {}", replay.display()))
            && mode.contains("3 decode steps"),
        "{mode}"
    );
    let t = telemetry::read_route_trace(&traced).unwrap();
    let cells = decode_cells(&t);
    assert_eq!(cells.len(), 7 * 2);
    let p = prompt_len(&t);
    for ((step, layer), cell) in &cells {
        let i = (step - p) as usize % steps.len();
        let want = steps[i][*layer as usize];
        let got: Vec<u32> = cell.iter().map(|c| c.0).collect();
        assert_eq!(got, want, "decode step {step} layer {layer}");
        // This model's router weights of those experts, renormalized as qwen3moe does: to a
        // sum of 1, or less when the router gave them almost nothing (the sum is floored at
        // 2^-14 before dividing).
        let sum: f32 = cell.iter().map(|c| c.1).sum();
        assert!(
            sum <= 1.0 + 2e-6 && cell.iter().all(|c| c.1 >= 0.0),
            "{sum}"
        );
    }
    // The prompt is routed by the router: top-2, as without a replay.
    let plain = dir.path().join("plain.csv");
    run(1, &["--route-trace", plain.to_str().unwrap()]).unwrap();
    let prefill = |t: &RouteTrace| -> Vec<(i64, u32, u32, u32)> {
        t.rows
            .iter()
            .filter(|r| r.phase == Phase::Prefill)
            .map(|r| (r.step, r.layer, r.slot, r.expert))
            .collect()
    };
    let p = telemetry::read_route_trace(&plain).unwrap();
    assert_eq!(prefill(&t), prefill(&p));
}

#[test]
fn replay_refuses_traces_that_do_not_fit_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.csv");
    let cases: [(&[[&[u32]; 2]], &str); 3] = [
        (
            &[[&[1, 9], &[0, 1]]],
            "step 0, layer 0: expert 9 does not exist (8 experts)",
        ),
        (
            &[[&[1, 2], &[3, 3]]],
            "step 0, layer 1: an expert is recorded twice",
        ),
        (&[[&[1, 2], &[]]], "step 0, layer 1: no experts recorded"),
    ];
    for (steps, msg) in cases {
        // The trace says 16 experts (so its parser takes expert 9); the model has 8.
        write_replay(&path, 16, steps);
        let err = run(2, &["--route-replay", path.to_str().unwrap()]).unwrap_err();
        assert!(err.contains(msg), "{err}");
    }
    // A trace without decode rows.
    write_replay(&path, 8, &[]);
    let err = run(2, &["--route-replay", path.to_str().unwrap()]).unwrap_err();
    assert!(err.contains("no decode rows (phase 1) to replay"), "{err}");
}

/// colibri's `ROUTE_TRACE` stream (`--route-trace-stream`, or the environment variable): one
/// line per layer call and batch row in the spec's format (`<call> <row> <layer>` then
/// ` <id>:<gate>` with 4 decimals), holding exactly the routing the `route_trace v1` file of
/// the same run holds; a path the environment names that cannot be created is a warning.
#[test]
fn route_trace_stream_lines_hold_the_same_routing_as_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let stream = dir.path().join("route.txt");
    let out = run(
        3,
        &[
            "--route-trace",
            csv.to_str().unwrap(),
            "--route-trace-stream",
            stream.to_str().unwrap(),
        ],
    );
    out.unwrap();
    let t = telemetry::read_route_trace(&csv).unwrap();
    let text = std::fs::read_to_string(&stream).unwrap();
    // The trace's rows grouped as the stream has them: per layer call (a run of one phase, step
    // span and layer), per token row, the experts in slot order.
    /// A token row: its step and (expert, weight) in slot order.
    type Row = (i64, Vec<(u32, f32)>);
    let mut calls: Vec<(u32, Vec<Row>)> = Vec::new();
    let mut last: Option<(Phase, u32, bool)> = None;
    for r in &t.rows {
        // A decode call is one step; a prefill call is one layer's rows.
        let decode = r.phase == Phase::Decode;
        let key = (r.phase, r.layer, decode);
        let new_step = decode && calls.last().is_some_and(|c| c.1[0].0 != r.step);
        if last != Some(key) || new_step {
            calls.push((r.layer, Vec::new()));
            last = Some(key);
        }
        let rows = &mut calls.last_mut().unwrap().1;
        if rows.last().is_none_or(|x| x.0 != r.step) {
            rows.push((r.step, Vec::new()));
        }
        rows.last_mut()
            .unwrap()
            .1
            .push((r.expert, r.weight.unwrap()));
    }
    let p = prompt_len(&t);
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    for (call, (layer, rows)) in calls.iter().enumerate() {
        // The forward batch's first position: 0 for the prompt, the step itself when decoding.
        let start = if rows[0].0 < p { 0 } else { rows[0].0 };
        for (step, experts) in rows {
            let f: Vec<&str> = lines[i].split(' ').collect();
            i += 1;
            assert_eq!(f.len(), 3 + experts.len(), "{}", lines[i - 1]);
            assert_eq!(f[0], call.to_string(), "{}", lines[i - 1]);
            assert_eq!(f[1], (step - start).to_string(), "{}", lines[i - 1]);
            assert_eq!(f[2], layer.to_string(), "{}", lines[i - 1]);
            for (cell, (e, w)) in f[3..].iter().zip(experts) {
                let (id, gate) = cell.split_once(':').unwrap();
                assert_eq!(id, e.to_string());
                // Exactly 4 decimals, the trace's weight rounded.
                assert_eq!(gate.split_once('.').unwrap().1.len(), 4, "{cell}");
                assert_eq!(gate, format!("{w:.4}"), "{cell}");
            }
        }
    }
    assert_eq!(i, lines.len());
    // Through the environment: an unwritable path is reported and the run goes on.
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "-m", demo().to_str().unwrap(), "-p", "Hi", "-n", "1"])
        .env("ROUTE_TRACE", dir.path().join("missing/dir/route.txt"))
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("[ROUTE_TRACE] cannot open "),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
