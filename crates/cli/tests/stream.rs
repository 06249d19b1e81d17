//! Expert streaming (`--moe-stream`): the output equals the resident run's bit for bit for every
//! combination of cache (none, evicting, large), lanes (1, 4), overlap (off, on), dense weights
//! (mmap, anon) and O_DIRECT (on, off), with io_uring where the kernel has it, and on a split
//! model; its summary lines follow the telemetry spec's patterns; a read failure stops the run
//! naming the expert; conflicting flags are refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{ok, olmoe, sluice};

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

/// The io_uring backend when this kernel has it (the lanes' probe is in the store's tests).
fn uring() -> bool {
    store::uring_available()
}

#[test]
fn streamed_logits_equal_resident_ones_on_every_fixture_architecture() {
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "qwen3moe-q4_k_m.gguf",
        "qwen2moe-q8_0.gguf",
        "olmoe-q4_0.gguf",
        "mixtral-bf16.gguf",
        "gptoss-mxfp4.gguf",
        "glm4moe-q4_k_m.gguf",
        "deepseek2-q4_k_m.gguf",
        "deepseek2-lite-q4_0.gguf",
        "deepseek2-fused-q4_k_m.gguf",
        "gemma4-q8_0.gguf",
        "qwen35moe-q8_0.gguf",
        "qwen3vlmoe-q4_k_m.gguf",
        "granitemoe-q8_0.gguf",
        "minimax-q8_0.gguf",
        "smallthinker-q8_0.gguf",
        "bailingmoe2-q8_0.gguf",
        "qwen3next-q8_0.gguf",
        "llama4-q8_0.gguf",
        "lfm2moe-q8_0.gguf",
        "nemotron_h_moe-q8_0.gguf",
        "nemotron_h_moe-latent-q8_0.gguf",
    ] {
        let m = moe_fixture(f);
        let resident = logits(&m, dir.path(), &["--moe-stream", "off"]);
        let mut combos = vec![
            vec!["--moe-stream", "on", "--cache-mb", "0", "--overlap"],
            // a cache that holds part of the experts (every fixture's experts exceed 1 MiB)
            vec!["--moe-stream", "on", "--cache-mb", "1", "--force-cache"],
            vec![
                "--moe-stream",
                "on",
                "--cache-mb",
                "64",
                "--force-cache",
                "--no-odirect",
                "--dense-weights",
                "mmap",
                "--io-threads",
                "1",
            ],
            vec![
                "--moe-stream",
                "on",
                "--load-all",
                "--dense-weights",
                "warm",
            ],
        ];
        if uring() {
            combos.push(vec![
                "--moe-stream",
                "on",
                "--cache-mb",
                "0",
                "--overlap",
                "--io-backend",
                "uring",
            ]);
        }
        for extra in combos {
            assert!(resident == logits(&m, dir.path(), &extra), "{f} {extra:?}");
        }
        // Greedy decoding too (16 positions: past gpt-oss's sliding window of 8), through an
        // evicting cache with the reads overlapped.
        let resident = run(&m, &["--moe-stream", "off"]);
        let streamed = run(
            &m,
            &[
                "--moe-stream",
                "on",
                "--cache-mb",
                "1",
                "--force-cache",
                "--overlap",
            ],
        );
        assert_eq!(answer(&streamed), answer(&resident), "{f}");
    }
}

/// `model` rewritten as two shards (the metadata and the first half of the tensors, then the
/// rest), so that layers' expert tensors sit in different files.
fn split_model(model: &Path, dir: &Path) -> PathBuf {
    use gguf::{GgufFile, GgufWriter, Value};
    let f = GgufFile::open(model).unwrap();
    let n = f.tensors().len();
    let half = n / 2;
    for (i, range) in [(0u16, 0..half), (1u16, half..n)] {
        let mut w = GgufWriter::new();
        if i == 0 {
            for (k, v) in f.metadata().iter() {
                if k != "general.alignment" {
                    w.add_metadata(k, v.clone()).unwrap();
                }
            }
        }
        w.add_metadata("split.no", Value::U16(i)).unwrap();
        w.add_metadata("split.count", Value::U16(2)).unwrap();
        w.add_metadata("split.tensors.count", Value::I32(n as i32))
            .unwrap();
        for t in &f.tensors()[range] {
            let data = f.tensor_data(t).unwrap();
            w.add_tensor_raw(t.name.clone(), &t.dims, t.ty.id(), data)
                .unwrap();
        }
        w.write_to_path(dir.join(gguf::split_path("split", i, 2)))
            .unwrap();
    }
    dir.join(gguf::split_path("split", 0, 2))
}

#[test]
fn a_split_model_streams_across_its_shards() {
    let dir = tempfile::tempdir().unwrap();
    let m = moe_fixture("qwen3moe-q4_k_m.gguf");
    let split = split_model(&m, dir.path());
    let resident = logits(&m, dir.path(), &["--moe-stream", "off"]);
    // The expert tensors of some layer are in each shard.
    let f = gguf::GgufFile::open(&split).unwrap();
    let shards: std::collections::BTreeSet<usize> = f
        .tensors()
        .iter()
        .filter(|t| t.name.contains("_exps"))
        .map(|t| t.shard)
        .collect();
    assert_eq!(shards.len(), 2);
    for extra in [
        &["--moe-stream", "off"][..],
        &["--moe-stream", "on", "--cache-mb", "0"][..],
        &[
            "--moe-stream",
            "on",
            "--cache-mb",
            "64",
            "--force-cache",
            "--overlap",
            "--no-odirect",
        ][..],
        &["--moe-stream", "on", "--overlap", "--dense-weights", "mmap"][..],
    ] {
        assert!(resident == logits(&split, dir.path(), extra), "{extra:?}");
    }
}

/// A one-layer OLMoE-1B-7B-shaped model (one token cycle is 31.1 MiB), so that a small budget
/// evicts.
fn olmoe_l1(dir: &Path) -> PathBuf {
    olmoe(dir, 1)
}

/// A greedy 12-token run of `model` with `extra` flags.
fn run_output(model: &Path, extra: &[&str]) -> Output {
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
    sluice(&a)
}

fn run(model: &Path, extra: &[&str]) -> String {
    ok(run_output(model, extra))
}

/// The text a run streamed (before its summary lines).
fn answer(out: &str) -> &str {
    out.split("\ngeneration: ").next().unwrap()
}

/// `moe-stream: read <mib> MiB (<mib/tok> MiB/token), decode <s> s/token (compute <c> + cache
/// mgmt <m> + flash I/O <i> s/token, <bw> MiB/s)` → read MiB; `moe-cache: <pct>% hit, resident
/// <mib> MiB` → (hit %, resident MiB); that line is present only with a cache (else the hit
/// rate is taken as 0 and nothing as resident).
fn stream_lines(out: &str, overlap: bool) -> (f64, f64, f64) {
    let line = |p: &str| out.lines().find(|l| l.starts_with(p)).expect(p).to_owned();
    let s = line("moe-stream: read ");
    let num = |t: &str| t.parse::<f64>().expect(t);
    let read = num(s["moe-stream: read ".len()..].split(' ').next().unwrap());
    assert!(s.contains(" MiB/token), decode ") && s.contains(" s/token (compute "));
    assert!(s.contains(" + cache mgmt ") && s.contains(" + flash I/O "));
    if overlap {
        // Under overlap the line ends with the mean stall per token.
        let (head, stall) = s.rsplit_once(", stall_s/tok=").expect(&s);
        assert!(head.ends_with(" MiB/s)"), "{s}");
        num(stall);
    } else {
        assert!(s.ends_with(" MiB/s)"), "{s}");
    }
    let Some(c) = out.lines().find(|l| l.starts_with("moe-cache: ")) else {
        assert!(out.contains(", cache off, "), "{out}");
        return (read, 0.0, 0.0);
    };
    let (hit, rest) = c["moe-cache: ".len()..]
        .split_once("% hit, resident ")
        .expect(c);
    let resident = rest.strip_suffix(" MiB").expect(c);
    (read, num(hit), num(resident))
}

/// The logits of the olmoe-l1 model for a fixed prompt, as raw .npy bytes.
fn olmoe_logits(m: &Path, dir: &Path, extra: &[&str]) -> Vec<u8> {
    logits(m, dir, extra)
}

/// Every combination of cache {0, evicting (below one token cycle), large} × lanes {1, 4} ×
/// overlap {off, on} × dense {mmap, anon} × O_DIRECT {on, off}: the same greedy tokens as the
/// resident run, and the same logits at every position of a prompt (also with io_uring).
#[test]
fn streamed_generation_equals_resident_for_every_combination() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe_l1(dir.path());
    let resident = run(&m, &["--moe-stream", "off"]);
    assert!(
        resident.contains(
            "\nmode: resident, experts not streamed (--moe-stream on streams them), dense mmap\n"
        ) && !resident.contains("moe-stream:"),
        "{resident}"
    );
    let resident_logits = olmoe_logits(&m, dir.path(), &["--moe-stream", "off"]);
    let mut hits = std::collections::BTreeMap::new();
    let mut n = 0;
    for mb in ["0", "10", "1000"] {
        for lanes in ["1", "4"] {
            for overlap in [false, true] {
                for dense in ["mmap", "anon"] {
                    for direct in [true, false] {
                        let mut a = vec![
                            "--moe-stream",
                            "on",
                            "--cache-mb",
                            mb,
                            "--force-cache",
                            "--io-threads",
                            lanes,
                            "--dense-weights",
                            dense,
                        ];
                        if overlap {
                            a.push("--overlap");
                        }
                        if !direct {
                            a.push("--no-odirect");
                        }
                        let out = run(&m, &a);
                        assert_eq!(answer(&out), answer(&resident), "{a:?}");
                        let cache = if mb == "0" {
                            "off".to_owned()
                        } else {
                            format!("{mb} MiB")
                        };
                        let mode = format!(
                            "\nmode: expert streaming, cache {cache}, dense {dense}{}\n",
                            if overlap { ", overlap" } else { "" }
                        );
                        assert!(out.contains(&mode), "{a:?}: {out}");
                        let (read, hit, resident_mib) = stream_lines(&out, overlap);
                        assert!(read > 0.0 || hit == 100.0, "{out}");
                        // Over budget by at most one batch (the rule of the cache: a batch
                        // keeps what it used).
                        assert!(resident_mib <= mb.parse::<f64>().unwrap() + 31.2, "{out}");
                        hits.entry(mb).or_insert_with(Vec::new).push(hit);
                        // The logits of every position of a prompt (a batch of tokens per
                        // layer).
                        assert!(resident_logits == olmoe_logits(&m, dir.path(), &a), "{a:?}");
                        n += 1;
                    }
                }
            }
        }
    }
    assert_eq!(n, 48);
    // The policy decides what stays, never the output: an evicting LRU cache too.
    for overlap in [&[][..], &["--overlap"][..]] {
        let mut a = vec![
            "--moe-stream",
            "on",
            "--cache-mb",
            "10",
            "--force-cache",
            "--cache-policy",
            "lru",
        ];
        a.extend_from_slice(overlap);
        assert_eq!(answer(&run(&m, &a)), answer(&resident), "{a:?}");
        assert!(resident_logits == olmoe_logits(&m, dir.path(), &a), "{a:?}");
    }
    // No cache: nothing hits. A budget that holds every expert: only first uses miss. The
    // lanes, the overlap, the dense placement and O_DIRECT change nothing but the time.
    assert!(hits["0"].iter().all(|&h| h == 0.0), "{hits:?}");
    for v in hits.values() {
        assert!(v.iter().all(|&h| h == v[0]), "{hits:?}");
    }
    assert!(hits["1000"][0] > hits["10"][0], "{hits:?}");
    if uring() {
        for extra in [
            &["--cache-mb", "0"][..],
            &["--cache-mb", "10", "--force-cache"][..],
        ] {
            for overlap in [false, true] {
                let mut a = vec!["--moe-stream", "on", "--io-backend", "uring"];
                a.extend_from_slice(extra);
                if overlap {
                    a.push("--overlap");
                }
                assert_eq!(answer(&run(&m, &a)), answer(&resident), "{a:?}");
                assert!(resident_logits == olmoe_logits(&m, dir.path(), &a), "{a:?}");
            }
        }
    }
}

/// The experts layer 0 routed at the first decode step of a greedy run of `model`.
fn first_decode_experts(model: &Path, dir: &Path) -> Vec<u32> {
    let trace = dir.join("t.csv");
    run(
        model,
        &[
            "--moe-stream",
            "off",
            "--route-trace",
            trace.to_str().unwrap(),
        ],
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("turn,"))
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f[1] == "1" && f[3] == "0")
        .take_while(|f| f[2] == text_step(&text))
        .map(|f| f[5].parse().unwrap())
        .collect()
}

/// The step of the first decode row.
fn text_step(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("turn,"))
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|f| f[1] == "1")
        .map(|f| f[2].to_owned())
        .unwrap()
}

#[test]
fn a_failed_expert_read_stops_the_run_naming_the_expert() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe_l1(dir.path());
    let resident = run(&m, &["--moe-stream", "off"]);
    let routed = first_decode_experts(&m, dir.path());
    assert_eq!(routed.len(), 8);
    let f = gguf::GgufFile::open(&m).unwrap();
    let layout = store::ExpertLayout::from_gguf(&f).unwrap().unwrap();
    let e = routed[3];
    let offsets: Vec<u64> = layout.layers[0]
        .parts
        .iter()
        .map(|p| p.expert_offset(e))
        .collect();
    for kind in ["", ":short"] {
        for extra in [&[][..], &["--overlap"][..], &["--io-threads", "1"][..]] {
            let fault = format!("0:{e}{kind}");
            let mut a = vec![
                "--moe-stream",
                "on",
                "--cache-mb",
                "0",
                "--inject-read-fault",
                &fault,
            ];
            a.extend_from_slice(extra);
            let o = run_output(&m, &a);
            assert!(!o.status.success(), "{fault} {extra:?}");
            let err = String::from_utf8_lossy(&o.stderr);
            let named = offsets.iter().any(|off| {
                err.contains(&format!("layer 0, expert {e}: reading blk.0.ffn_"))
                    && err.contains(&format!("_exps.weight at byte {off} of "))
            });
            assert!(named, "{fault} {extra:?}: {err}");
            assert!(
                err.contains(if kind.is_empty() {
                    "injected read error"
                } else {
                    "short read"
                }),
                "{err}"
            );
            // What was written before the failure is the resident run's text, and no summary.
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(!out.contains("\ngeneration: "), "{out}");
            assert!(answer(&resident).starts_with(out.trim_end()), "{out}");
        }
    }
}

/// Under --load-all every expert is read, also those no token routed: a failed read of one of
/// them stops the run too, serial or overlapped (overlapped, it is collected after its layer
/// and reported by the next).
#[test]
fn a_failed_read_of_an_unrouted_expert_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe_l1(dir.path());
    let trace = dir.path().join("t.csv");
    run(
        &m,
        &[
            "--moe-stream",
            "off",
            "--route-trace",
            trace.to_str().unwrap(),
        ],
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let routed: std::collections::BTreeSet<u32> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("turn,"))
        .map(|l| l.split(',').nth(5).unwrap().parse().unwrap())
        .collect();
    let e = (0..64)
        .rev()
        .find(|e| !routed.contains(e))
        .expect("an unrouted expert");
    let fault = format!("0:{e}");
    for extra in [&[][..], &["--overlap"][..]] {
        let mut a = vec![
            "--moe-stream",
            "on",
            "--load-all",
            "--inject-read-fault",
            &fault,
        ];
        a.extend_from_slice(extra);
        let o = run_output(&m, &a);
        assert!(!o.status.success(), "{extra:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&format!("layer 0, expert {e}: ")), "{err}");
    }
}

#[test]
fn a_file_cut_inside_an_expert_tensor_is_refused_at_load_naming_it() {
    // (A file cut while a run reads it: crates/store/tests/read.rs and lanes.rs.)
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
    for mode in ["on", "auto"] {
        let o = sluice(&[
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "x",
            "-n",
            "1",
            "--moe-stream",
            mode,
            "--cache-mb",
            "0",
        ]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("blk.0.ffn_up_exps.weight"), "{err}");
    }
}

#[test]
fn conflicting_streaming_flags_are_refused() {
    let m = moe_fixture("qwen3moe-q8_0.gguf");
    let m = m.to_str().unwrap();
    for (args, msg) in [
        (
            &["--moe-stream", "off", "--cache-mb", "10"][..],
            "--cache-mb only apply when streaming: they conflict with --moe-stream off",
        ),
        (
            &[
                "--moe-stream",
                "off",
                "--overlap",
                "--dense-weights",
                "anon",
            ][..],
            "--overlap, --dense-weights only apply when streaming",
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
            "--io-threads must be 1 to 256",
        ),
        (
            &["--moe-stream", "on", "--load-all", "--cache-mb", "2000"][..],
            "--load-all reads every expert every time and keeps none",
        ),
        (
            &["--moe-stream", "on", "--dense-weights", "swap"][..],
            "invalid value 'swap' for '--dense-weights <MODE>'",
        ),
    ] {
        let mut a = vec!["run", "-m", m, "-p", "x", "-n", "1"];
        a.extend_from_slice(args);
        let o = sluice(&a);
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(msg), "{err}");
        // One line (clap's parse errors add a hint of their own).
        if !err.contains("try '--help'") {
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        }
    }
}

#[test]
fn auto_streams_only_a_model_that_does_not_fit_and_sizes_the_cache_once() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe_l1(dir.path());
    let m = m.to_str().unwrap();
    let base = ["run", "-m", m, "-p", "Hi", "-n", "2", "--temp", "0"];
    // The default (--moe-stream auto): this small model fits, so it runs resident, saying why.
    let out = ok(sluice(&base));
    let mode = out.lines().find(|l| l.starts_with("mode: ")).unwrap();
    assert!(
        mode.starts_with(
            "mode: resident, experts not streamed (--moe-stream on streams them), dense mmap \
             (auto: model "
        ) && mode.contains(" GiB <= available ")
            && mode.ends_with(" GiB - floor 1.50 GiB)"),
        "{mode}"
    );
    assert!(!out.contains("moe-stream:"), "{out}");
    // A floor larger than the machine: the model does not fit, so it streams.
    let mut a = base.to_vec();
    a.extend_from_slice(&["--cache-floor-mb", "100000000"]);
    let o = sluice(&a);
    let (out, err) = (
        ok(o.clone()),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    let mode = out.lines().find(|l| l.starts_with("mode: ")).unwrap();
    assert!(
        mode.starts_with("mode: expert streaming, cache auto, dense anon (auto: model ")
            && mode.contains(" GiB > available "),
        "{mode}"
    );
    // auto with no room: the cache takes its minimum (1500 MiB), capped at the slots of every
    // expert (their windows padded for aligned reads).
    assert!(
        err.contains(
            "sluice: expert cache 250 MiB (auto, adaptive policy); one token cycle is 31.1 MiB, \
             all experts 249.0 MiB (249.8 MiB in cache slots)"
        ),
        "{err}"
    );
    assert!(!err.contains("warning"), "{err}");
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
    // A capped auto, and a forced budget below one token cycle.
    let mut a = base.to_vec();
    a.extend_from_slice(&["--cache-ceil-mb", "100"]);
    let err = String::from_utf8_lossy(&sluice(&a).stderr).into_owned();
    assert!(
        err.contains("sluice: expert cache 100 MiB (auto, adaptive policy)"),
        "{err}"
    );
    // Below one token cycle an LRU cache hits nothing: warned. (The default policy keeps the
    // experts forecast most likely reused there: no warning.)
    let mut a = base.to_vec();
    a.extend_from_slice(&["--cache-mb", "5", "--force-cache"]);
    let err = String::from_utf8_lossy(&sluice(&a).stderr).into_owned();
    assert!(!err.contains("smaller than one token cycle"), "{err}");
    a.extend_from_slice(&["--cache-policy", "lru"]);
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

/// Peak resident set of `sluice args` (its `ru_maxrss`), in bytes, and its standard output.
#[allow(clippy::zombie_processes)] // reaped by wait4, which also gives its rusage
fn peak_rss(args: &[&str]) -> (u64, String) {
    use std::os::unix::process::ExitStatusExt;
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    let mut status = 0;
    // SAFETY: `rusage` is plain data, written by wait4 for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not yet reaped; both pointers are valid for the call.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid);
    assert!(std::process::ExitStatus::from_raw(status).success());
    (ru.ru_maxrss as u64 * 1024, out)
}

/// The cache's memory stays within its budget: on a model whose experts are 4.6 times the
/// budget, the peak resident set grows, from a run without a cache to one with it, by no more
/// than the budget + 10 %. (The absolute bound, dense + cache + KV + 10 %, on the 17 GiB
/// synthetic model: docs/performance.md.)
#[test]
fn the_cache_stays_within_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe(dir.path(), 4);
    let f = gguf::GgufFile::open(&m).unwrap();
    let layout = store::ExpertLayout::from_gguf(&f).unwrap().unwrap();
    const MIB: u64 = 1 << 20;
    let budget = 200 * MIB;
    assert!(layout.expert_bytes_total() > 4 * budget);
    let run = |mb: &str| {
        peak_rss(&[
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "Once upon a time",
            "-n",
            "16",
            "--temp",
            "0",
            "--ignore-eos",
            "-t",
            "2",
            "-c",
            "256",
            "--moe-stream",
            "on",
            "--overlap",
            "--force-cache",
            "--cache-mb",
            mb,
        ])
    };
    let (none, _) = run("0");
    let (with, out) = run("200");
    let hit: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("moe-cache: "))
        .and_then(|l| l.split('%').next())
        .unwrap()
        .parse()
        .unwrap();
    // The cache was used (and so filled to its budget).
    assert!(hit > 10.0, "{out}");
    let grew = with.saturating_sub(none);
    assert!(
        grew <= budget + budget / 10,
        "peak RSS {:.1} MiB without a cache, {:.1} MiB with a 200 MiB one",
        none as f64 / MIB as f64,
        with as f64 / MIB as f64
    );
}

/// Co-activation prefetch: a pairs table built by `analyze pairs` from a `ROUTE_TRACE` stream of
/// the same model drives reads ahead (`--couple`) that change no output, serial or overlapped,
/// one or two layers ahead, and are reported on the spec's `moe-prefetch:` line.
#[test]
fn reads_ahead_from_a_pairs_table_change_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let m = olmoe(dir.path(), 3);
    let stream = dir.path().join("route.txt");
    let resident = run(
        &m,
        &[
            "--moe-stream",
            "off",
            "--route-trace-stream",
            stream.to_str().unwrap(),
        ],
    );
    let table = dir.path().join("pairs.txt");
    let out = ok(sluice(&[
        "analyze",
        "pairs",
        stream.to_str().unwrap(),
        "--out",
        table.to_str().unwrap(),
    ]));
    assert!(out.contains("recall of each layer's experts"), "{out}");
    for (overlap, d) in [(false, "1"), (true, "1"), (true, "2")] {
        let mut a = vec![
            "--moe-stream",
            "on",
            "--cache-mb",
            "40",
            "--force-cache",
            "--couple",
            table.to_str().unwrap(),
            "--couple-k",
            "4",
            "--couple-d",
            d,
        ];
        if overlap {
            a.push("--overlap");
        }
        let out = run(&m, &a);
        assert_eq!(answer(&out), answer(&resident), "{a:?}");
        let line = out
            .lines()
            .find(|l| l.starts_with("moe-prefetch: "))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(
            line.ends_with("[couple]") && line.contains(" experts useful ("),
            "{line}"
        );
    }
}

/// `--row-prefetch on|off` changes no bit: the same greedy tokens as the default, resident and
/// streamed with overlap (the one-token path that computes a token's experts together), and
/// the same prompt logits, on the repacked-order MXFP4 and Q4_K fixtures.
#[test]
fn the_row_prefetch_knob_changes_no_bit() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["qwen3moe-q4_k_m.gguf", "gptoss-mxfp4.gguf"] {
        let m = moe_fixture(f);
        for mode in [
            &["--moe-stream", "off"][..],
            &["--moe-stream", "on", "--overlap"],
        ] {
            let base = run(&m, mode);
            let base_logits = logits(&m, dir.path(), mode);
            for knob in ["on", "off"] {
                let extra: Vec<&str> = mode
                    .iter()
                    .copied()
                    .chain(["--row-prefetch", knob])
                    .collect();
                assert_eq!(answer(&run(&m, &extra)), answer(&base), "{f} {extra:?}");
                assert!(
                    logits(&m, dir.path(), &extra) == base_logits,
                    "{f} {extra:?}"
                );
            }
        }
    }
}
