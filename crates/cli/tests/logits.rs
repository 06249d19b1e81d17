//! End-to-end tests of `sluice logits`: the .npy it writes holds exactly the engine library's
//! logits for the same tokens and configuration.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use engine::ops::KvType;
use engine::{Engine, EngineConfig, LogitsWanted};
use gguf::GgufFile;
use model::Model;
use quant::{Kernels, ThreadPool};

mod common;
use common::read_npy;

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo-qwen3moe.gguf")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The engine library's logits of every position, for `tokens` with context `n_ctx`.
fn library_logits(tokens: &[u32], kv_type: KvType, n_ctx: usize, ubatch: usize) -> Vec<f32> {
    let file = GgufFile::open(demo()).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    let cfg = EngineConfig {
        n_ctx,
        kv_type,
        ubatch,
    };
    let mut eng = Engine::new(&model, Kernels::detect(), &pool, cfg).unwrap();
    eng.forward(tokens, LogitsWanted::All).unwrap()
}

#[test]
fn prompt_logits_equal_the_library_for_every_position() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("l.npy");
    let prompt = "The quick brown fox";
    let o = sluice(&[
        "logits",
        "-m",
        demo().to_str().unwrap(),
        "-p",
        prompt,
        "--out",
        out.to_str().unwrap(),
        "--kv-type",
        "f32",
        "-t",
        "2",
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let (shape, data) = read_npy(&out);

    // The prompt's ids as `sluice tokenize` gives them (BOS as the metadata says).
    let tok = sluice(&["tokenize", "-m", demo().to_str().unwrap(), prompt]);
    assert!(tok.status.success());
    let ids: Vec<u32> = serde_json::from_slice(&tok.stdout).unwrap();
    assert!(ids.len() > 3);
    assert_eq!(shape, vec![ids.len(), 275]);
    let want = library_logits(&ids, KvType::F32, ids.len(), 512);
    assert_eq!(data, want);

    // The default KV type is f16, which gives other values (so the option is really used).
    let out16 = dir.path().join("l16.npy");
    let o = sluice(&[
        "logits",
        "-m",
        demo().to_str().unwrap(),
        "-p",
        prompt,
        "--out",
        out16.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let (shape16, data16) = read_npy(&out16);
    assert_eq!(shape16, shape);
    assert_eq!(data16, library_logits(&ids, KvType::F16, ids.len(), 512));
    assert_ne!(data16, data);
}

#[test]
fn tokens_are_run_exactly_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.npy");
    let ids = [5u32, 17, 200, 3, 99];
    let o = sluice(&[
        "logits",
        "-m",
        demo().to_str().unwrap(),
        "--tokens",
        "5,17,200,3,99",
        "--out",
        out.to_str().unwrap(),
        "--kv-type",
        "f32",
        "--ubatch",
        "2",
        "-c",
        "8",
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let (shape, data) = read_npy(&out);
    assert_eq!(shape, vec![5, 275]);
    assert_eq!(data, library_logits(&ids, KvType::F32, 8, 2));
    // Another sequence gives other logits: the ids are really the ones run.
    let other = library_logits(&[1, 17, 200, 3, 99], KvType::F32, 8, 2);
    assert_ne!(data, other);
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.npy");
    let m = demo();
    let m = m.to_str().unwrap();
    let out = out.to_str().unwrap();
    for (args, needle) in [
        (
            vec![
                "logits", "-m", m, "--tokens", "1,2,3", "-c", "2", "--out", out,
            ],
            "longer than the context",
        ),
        (
            vec!["logits", "-m", m, "--tokens", "1,275", "--out", out],
            "outside the vocabulary",
        ),
    ] {
        let o = sluice(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("sluice: error: ") && err.contains(needle),
            "{err}"
        );
    }
}

/// `--dump DIR` writes every named intermediate of every layer, [n_tokens, width], the same
/// whether the prompt runs in one batch or in chunks; `result_output` is the logits file.
#[test]
fn dump_writes_the_named_intermediates() {
    let dir = tempfile::tempdir().unwrap();
    let run = |sub: &str, ubatch: &str, names: Option<&str>| {
        let d = dir.path().join(sub);
        let out = dir.path().join(format!("{sub}.npy"));
        let mut args: Vec<String> = vec![
            "logits".into(),
            "-m".into(),
            demo().to_string_lossy().into_owned(),
            "--tokens".into(),
            "1,2,3,100,200,150,40".into(),
            "--out".into(),
            out.to_string_lossy().into_owned(),
            "--dump".into(),
            d.to_string_lossy().into_owned(),
            "--ubatch".into(),
            ubatch.into(),
        ];
        if let Some(n) = names {
            args.extend(["--dump-names".into(), n.into()]);
        }
        let o = sluice(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{}", stderr(&o));
        (d, out)
    };
    let (whole, logits) = run("whole", "512", None);
    // chunks of 4 and 3 tokens: both batched, so the same kernels as one batch of 7 (a chunk
    // of one token would take the decode kernels, whose sums run in another order)
    let (chunked, _) = run("chunked", "4", None);
    let mut names: Vec<String> = std::fs::read_dir(&whole)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // the demo model: 2 MoE layers without shared experts
    for stem in [
        "attn_norm",
        "Qcur",
        "Kcur",
        "Vcur",
        "kqv_out",
        "ffn_moe_topk",
        "l_out",
    ] {
        for il in 0..2 {
            assert!(
                names.contains(&format!("{stem}-{il}.npy")),
                "{stem}-{il}: {names:?}"
            );
        }
    }
    assert!(names.contains(&"result_norm.npy".to_owned()));
    for n in &names {
        let (shape, a) = read_npy(&whole.join(n));
        assert_eq!(shape[0], 7, "{n}: one row per token");
        let (_, b) = read_npy(&chunked.join(n));
        assert_eq!(a, b, "{n}: one batch and chunks of 4 differ");
    }
    assert_eq!(
        read_npy(&whole.join("result_output.npy")),
        read_npy(&logits)
    );
    let (only, _) = run("only", "512", Some("l_out,result_norm"));
    let mut got: Vec<String> = std::fs::read_dir(&only)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    got.sort();
    assert_eq!(got, ["l_out-0.npy", "l_out-1.npy", "result_norm.npy"]);
}

/// `--last` writes the last position's logits as a generation computes them: the library's
/// `LogitsWanted::Last` forward, bit for bit.
#[test]
fn last_writes_the_generation_logits_of_the_last_position() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("last.npy");
    let m = demo();
    let o = sluice(&[
        "logits",
        "-m",
        m.to_str().unwrap(),
        "--tokens",
        "1,2,3,100,200",
        "--last",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (shape, data) = read_npy(&out);
    let file = GgufFile::open(&m).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let cfg = EngineConfig {
        n_ctx: 5,
        kv_type: KvType::F16,
        ubatch: 512,
    };
    let mut e = Engine::new(&model, Kernels::detect(), &pool, cfg).unwrap();
    let want = e.forward(&[1, 2, 3, 100, 200], LogitsWanted::Last).unwrap();
    assert_eq!(shape, vec![1, want.len()]);
    assert_eq!(data, want);
}

/// The perplexity line of `run --ppl`, recomputed from `sluice logits` of the same tokens:
/// the f64 log-softmax of every position at the text's next token, summed in order, and the
/// argmax hits. `--ppl-step` (one token per pass) equals the logits of a one-token batch
/// (`--ubatch 1`), and a streaming run scores as the resident one.
#[test]
fn perplexity_is_the_log_softmax_of_the_logits() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(
        &text,
        "The quick brown fox jumps over the lazy dog, and then the dog sleeps in the sun.",
    )
    .unwrap();
    let m = demo();
    let m = m.to_str().unwrap();
    let t = sluice(&["tokenize", "-m", m, "--file", text.to_str().unwrap()]);
    assert!(t.status.success(), "{}", stderr(&t));
    let ids: Vec<u32> = serde_json::from_slice(&t.stdout).unwrap();
    assert!(ids.len() > 10);
    let scored: Vec<String> = ids[..ids.len() - 1].iter().map(u32::to_string).collect();
    for (step, ubatch) in [(false, "512"), (true, "1")] {
        let out = dir.path().join(format!("l{ubatch}.npy"));
        let o = sluice(&[
            "logits",
            "-m",
            m,
            "--tokens",
            &scored.join(","),
            "--ubatch",
            ubatch,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let (shape, data) = read_npy(&out);
        let mut nll = 0f64;
        let mut hits = 0usize;
        for (row, &next) in data.chunks_exact(shape[1]).zip(&ids[1..]) {
            let mx = row
                .iter()
                .map(|&x| f64::from(x))
                .fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|&x| (f64::from(x) - mx).exp()).sum();
            nll -= (f64::from(row[next as usize]) - mx) - s.ln();
            let mut best = 0;
            for (i, &x) in row.iter().enumerate() {
                if x > row[best] {
                    best = i;
                }
            }
            hits += usize::from(best == next as usize);
        }
        let n = ids.len() - 1;
        let want = format!(
            "perplexity: {:.4} over {n} tokens ({:.4} nats/token), next-token hit {:.1}%",
            (nll / n as f64).exp(),
            nll / n as f64,
            100.0 * hits as f64 / n as f64
        );
        let mut args = vec!["run", "-m", m, "--ppl", text.to_str().unwrap()];
        if step {
            args.push("--ppl-step");
        }
        for extra in [&[][..], &["--moe-stream", "on", "--cache-mb", "0"][..]] {
            let mut a = args.clone();
            a.extend_from_slice(extra);
            let o = sluice(&a);
            assert!(o.status.success(), "{}", stderr(&o));
            let first = String::from_utf8(o.stdout).unwrap();
            let first = first.lines().next().unwrap_or_default().to_owned();
            assert!(first.starts_with(&want), "{first}\nwant {want}");
        }
    }
    // A text longer than the context is refused, naming the file.
    let o = sluice(&["run", "-m", m, "--ppl", text.to_str().unwrap(), "-c", "4"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("text.txt"), "{}", stderr(&o));
}
