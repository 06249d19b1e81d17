//! Expert streaming (`--moe-stream on`): the output equals the resident run's bit for bit, with
//! no cache, an evicting cache and a large one, with O_DIRECT and buffered reads, with one read
//! in flight or several; its summary
//! lines follow the telemetry spec's patterns; a read failure stops the run naming the expert.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8")
}

fn moe_fixture(name: &str) -> PathBuf {
    testdata::fixtures_root().join("moe").join(name)
}

/// The logits of `prompt` (every position) as raw .npy bytes.
fn logits(model: &Path, dir: &Path, extra: &[&str]) -> Vec<u8> {
    let out = dir.join("l.npy");
    let mut a = vec![
        "logits",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "The quick brown fox jumps over the lazy dog",
        "--out",
        out.to_str().unwrap(),
        "-t",
        "2",
    ];
    a.extend_from_slice(extra);
    ok(sluice(&a));
    std::fs::read(out).unwrap()
}

#[test]
fn streamed_logits_equal_resident_ones_on_every_fixture_architecture() {
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "qwen3moe-q4_k_m.gguf",
        "qwen2moe-q8_0.gguf",
        "olmoe-q4_0.gguf",
        "mixtral-bf16.gguf",
    ] {
        let m = moe_fixture(f);
        let resident = logits(&m, dir.path(), &[]);
        for extra in [
            &["--moe-stream", "on", "--cache-mb", "0"][..],
            &[
                "--moe-stream",
                "on",
                "--cache-mb",
                "64",
                "--force-cache",
                "--no-odirect",
            ][..],
        ] {
            assert!(resident == logits(&m, dir.path(), extra), "{f} {extra:?}");
        }
    }
}

/// A one-layer OLMoE-1B-7B-shaped model (64 experts of 3.9 MiB, top-8: one token cycle is
/// 31.1 MiB), so that a small budget evicts.
fn olmoe_l1(dir: &Path) -> PathBuf {
    let out = dir.join("olmoe-l1.gguf");
    let vocab = testdata::vocab_path("ggml-vocab-gpt-neox.gguf");
    ok(sluice(&[
        "gen-model",
        "--like",
        "olmoe-1b-7b",
        "--layers",
        "1",
        "--vocab",
        vocab.to_str().unwrap(),
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]));
    out
}

fn run(model: &Path, extra: &[&str]) -> String {
    let mut a = vec![
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "Once upon a time",
        "-n",
        "12",
        "--temp",
        "0",
        "--ignore-eos",
        "-t",
        "2",
    ];
    a.extend_from_slice(extra);
    ok(sluice(&a))
}

fn answer(out: &str) -> &str {
    out.split("=== perf ===").next().unwrap()
}

/// `moe-stream: read <mib> MiB (<mib/tok> MiB/token), decode <s> s/token (compute <c> + cache
/// mgmt <m> + flash I/O <i> s/token, <bw> MiB/s)` → read MiB; `moe-cache: <pct>% hit, resident
/// <mib> MiB` → (hit %, resident MiB).
fn stream_lines(out: &str) -> (f64, f64, f64) {
    let line = |p: &str| out.lines().find(|l| l.starts_with(p)).expect(p).to_owned();
    let s = line("moe-stream: read ");
    let num = |t: &str| t.parse::<f64>().expect(t);
    let read = num(s["moe-stream: read ".len()..].split(' ').next().unwrap());
    assert!(s.contains(" MiB/token), decode ") && s.contains(" s/token (compute "));
    assert!(s.contains(" + cache mgmt ") && s.contains(" + flash I/O ") && s.ends_with(" MiB/s)"));
    let c = line("moe-cache: ");
    let (hit, rest) = c["moe-cache: ".len()..]
        .split_once("% hit, resident ")
        .expect(&c);
    let resident = rest.strip_suffix(" MiB").expect(&c);
    (read, num(hit), num(resident))
}

#[test]
fn streamed_generation_equals_resident_with_any_cache() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe_l1(dir.path());
    let resident = run(&m, &[]);
    assert!(
        resident.contains(
            "\nmode: resident, experts not streamed (--moe-stream on streams them), dense mmap\n"
        ) && !resident.contains("moe-stream:"),
        "{resident}"
    );
    let mut hits = Vec::new();
    for (mb, extra) in [
        ("0", &[][..]),
        ("10", &[][..]),
        ("10", &["--no-odirect"][..]),
        ("10", &["--io-threads", "1"][..]),
        ("1000", &[][..]),
    ] {
        let mut a = vec!["--moe-stream", "on", "--cache-mb", mb, "--force-cache"];
        a.extend_from_slice(extra);
        let out = run(&m, &a);
        assert_eq!(answer(&out), answer(&resident), "cache {mb} MiB {extra:?}");
        let cache = if mb == "0" {
            "off".to_owned()
        } else {
            format!("{mb} MiB")
        };
        assert!(
            out.contains(&format!(
                "\nmode: expert streaming, cache {cache}, dense mmap\n"
            )),
            "{out}"
        );
        let (read, hit, resident_mib) = stream_lines(&out);
        assert!(read > 0.0 || hit == 100.0, "{out}");
        // Over budget by at most one batch (the rule of the cache: a batch keeps what it used).
        assert!(resident_mib <= mb.parse::<f64>().unwrap() + 31.2, "{out}");
        hits.push(hit);
    }
    // No cache: nothing hits. A budget that holds every expert: only first uses miss.
    assert_eq!(hits[0], 0.0);
    assert!(hits[4] > hits[1], "{hits:?}");
    // The number of reads in flight changes nothing but the time.
    assert_eq!(hits[1], hits[3]);
}

#[test]
fn a_file_cut_inside_an_expert_tensor_is_refused_at_load_naming_it() {
    // (A file cut while a run reads it: crates/store/tests/read.rs.)
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe_l1(dir.path());
    // The last tensor of the file is layer 0's up experts.
    let len = std::fs::metadata(&m).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m)
        .unwrap()
        .set_len(len - 4096)
        .unwrap();
    let o = sluice(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "x",
        "-n",
        "1",
        "--moe-stream",
        "on",
        "--cache-mb",
        "0",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("blk.0.ffn_up_exps.weight"), "{err}");
}

#[test]
fn streaming_flags_are_checked() {
    let m = moe_fixture("qwen3moe-q8_0.gguf");
    let m = m.to_str().unwrap();
    for (args, msg) in [
        (
            &["--cache-mb", "10"][..],
            "--cache-mb, --force-cache and --no-odirect need --moe-stream on",
        ),
        (
            &["--moe-stream", "on", "--cache-mb", "100"][..],
            "--cache-mb 100 is below 1500 MiB",
        ),
        (
            &["--moe-stream", "on", "--cache-mb", "lots"][..],
            "`lots` is neither `auto` nor a number of MiB",
        ),
        (
            &["--moe-stream", "on", "--io-threads", "0"][..],
            "--io-threads must be at least 1",
        ),
    ] {
        let mut a = vec!["run", "-m", m, "-p", "x", "-n", "1"];
        a.extend_from_slice(args);
        let o = sluice(&a);
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(msg), "{err}");
    }
}

#[test]
fn auto_sizes_the_cache_once_and_small_budgets_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe_l1(dir.path());
    let m = m.to_str().unwrap();
    let base = [
        "run",
        "-m",
        m,
        "-p",
        "Hi",
        "-n",
        "2",
        "--temp",
        "0",
        "--moe-stream",
        "on",
    ];
    // auto (the default): every expert of this small model fits (64 x 3.9 MiB).
    let o = sluice(&base);
    let (out, err) = (
        ok(o.clone()),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(
        out.contains("\nmode: expert streaming, cache auto, dense mmap\n"),
        "{out}"
    );
    assert!(
        err.contains("sluice: expert cache 249 MiB (auto); one token cycle is 31.1 MiB"),
        "{err}"
    );
    assert!(!err.contains("warning"), "{err}");
    // A capped auto, and a forced budget below one token cycle.
    let mut a = base.to_vec();
    a.extend_from_slice(&["--cache-ceil-mb", "100"]);
    let err = String::from_utf8_lossy(&sluice(&a).stderr).into_owned();
    assert!(err.contains("sluice: expert cache 100 MiB (auto)"), "{err}");
    let mut a = base.to_vec();
    a.extend_from_slice(&["--cache-mb", "5", "--force-cache"]);
    let err = String::from_utf8_lossy(&sluice(&a).stderr).into_owned();
    assert!(
        err.contains(
            "warning: the expert cache (5 MiB) is smaller than one token cycle (31.1 MiB)"
        ),
        "{err}"
    );
}

#[test]
fn a_dense_model_says_it_has_nothing_to_stream() {
    let m = testdata::fixtures_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let m = m.to_str().unwrap();
    let out = ok(sluice(&[
        "run", "-m", m, "-p", "Hi", "-n", "1", "--temp", "0",
    ]));
    assert!(
        out.contains("\nmode: resident, no routed experts to stream, dense mmap\n"),
        "{out}"
    );
    let o = sluice(&[
        "run",
        "-m",
        m,
        "-p",
        "Hi",
        "-n",
        "1",
        "--moe-stream",
        "on",
        "--cache-mb",
        "0",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the model has no routed experts to stream"),
        "{err}"
    );
}
