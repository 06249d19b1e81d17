//! End-to-end tests of `sluice run` on the demo model (random weights, qwen3moe layout): the
//! end-of-run lines of the telemetry spec, reproducibility, and one-line errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gguf::{GgufFile, GgufWriter, Value};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo-qwen3moe.gguf")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `sluice run` on the demo model with `extra` arguments; must succeed.
fn run_demo(extra: &[&str]) -> String {
    let m = demo();
    let mut args = vec!["run", "-m", m.to_str().unwrap(), "-p", "Hello there"];
    args.extend_from_slice(extra);
    let o = sluice(&args);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    stdout(&o)
}

/// The parts of a run's standard output (without --progress): (the text streamed, the answer —
/// the streamed text without the newline that ends an open line —, the `generation:` line,
/// the `mode:` line). The summary is `generation:`, `compute:`, `mode:`.
fn summary(out: &str) -> (String, String, String, String) {
    let at = if out.starts_with("generation: ") {
        0
    } else {
        out.rfind("\ngeneration: ").expect("a generation: line") + 1
    };
    let (streamed, perf) = out.split_at(at);
    let lines: Vec<&str> = perf.lines().collect();
    assert_eq!(lines.len(), 3, "{perf}");
    assert!(lines[1].starts_with("compute: "), "{perf}");
    let answer = streamed.strip_suffix('\n').unwrap_or(streamed);
    (
        streamed.to_owned(),
        answer.to_owned(),
        lines[0].to_owned(),
        lines[2].to_owned(),
    )
}

/// Checks `generation: <n> tokens, <s> s/token (<t> tok/s)` and returns n.
fn generation_tokens(line: &str) -> usize {
    let rest = line.strip_prefix("generation: ").expect(line);
    let (n, rest) = rest.split_once(" tokens, ").expect(line);
    let (s, rest) = rest.split_once(" s/token (").expect(line);
    let t = rest.strip_suffix(" tok/s)").expect(line);
    s.parse::<f64>().expect(line);
    t.parse::<f64>().expect(line);
    n.parse().expect(line)
}

#[test]
fn greedy_run_prints_the_spec_lines_and_repeats() {
    let out = run_demo(&["--temp", "0", "-n", "8", "-t", "2"]);
    let (_, answer, generation, mode) = summary(&out);
    assert_eq!(generation_tokens(&generation), 8, "{generation}");
    assert!(mode.starts_with("mode: "), "{mode}");
    assert!(!answer.is_empty());
    assert!(
        !out.contains("=== answer ==="),
        "banners only with --progress: {out}"
    );
    // Greedy: the same answer again, whatever the seed and thread count.
    let again = run_demo(&["--temp", "0", "-n", "8", "-t", "1", "--seed", "7"]);
    assert_eq!(summary(&again).1, answer);
    // With --progress: a progress line per token whose deltas make the answer, then the
    // banner block with the same answer and the same summary lines.
    let p = run_demo(&["--temp", "0", "-n", "8", "-t", "2", "--progress"]);
    let (lines, rest) = p.split_once("=== answer ===\n").expect(&p);
    let (block, perf) = rest.rsplit_once("\n=== perf ===\n").expect(&p);
    assert_eq!(block, answer);
    assert!(perf.starts_with("generation: 8 tokens, "), "{perf}");
    let mut text = String::new();
    let mut steps = 0;
    for l in lines.lines() {
        let json = l.strip_prefix("BMOE_PROGRESS ").expect(l);
        let v: serde_json::Value = serde_json::from_str(json).expect(json);
        steps += 1;
        assert_eq!(v["step"], steps);
        text.push_str(v["delta_text"].as_str().unwrap());
    }
    assert_eq!(steps, 8);
    assert_eq!(text, answer);
}

#[test]
fn same_seed_same_output_when_sampling() {
    let a = run_demo(&["--temp", "1.5", "-n", "12", "--seed", "42", "--ignore-eos"]);
    let b = run_demo(&["--temp", "1.5", "-n", "12", "--seed", "42", "--ignore-eos"]);
    let (_, answer_a, gen_a, _) = summary(&a);
    let (_, answer_b, _, _) = summary(&b);
    assert_eq!(answer_a, answer_b);
    assert_eq!(generation_tokens(&gen_a), 12);
    // Another seed draws another sequence (the seed is really used).
    let differ = (1..4).any(|s| {
        let c = run_demo(&[
            "--temp",
            "1.5",
            "-n",
            "12",
            "--seed",
            &s.to_string(),
            "--ignore-eos",
        ]);
        summary(&c).1 != answer_a
    });
    assert!(differ);
}

#[test]
fn generation_stops_when_the_context_is_full() {
    let m = demo();
    // prompt "Hello there" is a few tokens; a context of prompt + 3 leaves room for 3.
    let tok = sluice(&["tokenize", "-m", m.to_str().unwrap(), "Hello there"]);
    let ids: Vec<u32> = serde_json::from_slice(&tok.stdout).unwrap();
    let ctx = (ids.len() + 3).to_string();
    let out = run_demo(&["--temp", "0", "-n", "50", "--ignore-eos", "-c", &ctx]);
    assert_eq!(generation_tokens(&summary(&out).2), 3);
}

fn assert_one_line_error(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(2), "stderr: {}", stderr(o));
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("sluice: error: "), "{err}");
    assert!(lines[0].contains(needle), "{needle:?} not in {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(o.stdout.is_empty());
}

#[test]
fn prompt_longer_than_the_context_is_an_error() {
    let m = demo();
    let o = sluice(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "a prompt of more than four tokens",
        "-c",
        "4",
    ]);
    assert_one_line_error(&o, "longer than the context of 4 tokens");
}

/// Writes a copy of the demo model with `general.architecture` set to `arch` and without the
/// tensor `drop`.
fn demo_variant(dir: &Path, arch: &str, drop: Option<&str>) -> PathBuf {
    demo_copy(dir, arch, drop, None)
}

/// Writes a copy of the demo model: `general.architecture` set to `arch`, without the tensor
/// `drop`, with `template` as its chat template.
fn demo_copy(dir: &Path, arch: &str, drop: Option<&str>, template: Option<&str>) -> PathBuf {
    let src = GgufFile::open(demo()).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in src.metadata().iter() {
        let value = if key == "general.architecture" {
            Value::String(arch.to_owned())
        } else {
            value.clone()
        };
        w.add_metadata(key, value).unwrap();
    }
    if let Some(t) = template {
        w.add_metadata("tokenizer.chat_template", Value::String(t.to_owned()))
            .unwrap();
    }
    for t in src.tensors() {
        if Some(t.name.as_str()) == drop {
            continue;
        }
        let data = src.tensor_data(t).unwrap();
        w.add_tensor_raw(t.name.clone(), &t.dims, t.ty.id(), data)
            .unwrap();
    }
    let path = dir.join(format!(
        "{arch}-{}-{}.gguf",
        drop.unwrap_or("all"),
        template.map_or(0, str::len)
    ));
    w.write_to_path(&path).unwrap();
    path
}

#[test]
fn unknown_architecture_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = demo_variant(dir.path(), "gpt-j", None);
    let o = sluice(&["run", "-m", p.to_str().unwrap(), "-p", "hi", "-n", "2"]);
    assert_one_line_error(&o, "unsupported architecture 'gpt-j'");
}

#[test]
fn missing_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // The unchanged copy runs: the error below comes from the missing tensor alone.
    let ok = demo_variant(dir.path(), "qwen3moe", None);
    let o = sluice(&["run", "-m", ok.to_str().unwrap(), "-p", "hi", "-n", "2"]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let p = demo_variant(dir.path(), "qwen3moe", Some("blk.1.ffn_down_exps.weight"));
    let o = sluice(&["run", "-m", p.to_str().unwrap(), "-p", "hi", "-n", "2"]);
    assert_one_line_error(&o, "missing tensor 'blk.1.ffn_down_exps.weight'");
}

#[test]
fn chatml_without_a_template_is_a_clear_error() {
    let m = demo();
    let o = sluice(&["run", "-m", m.to_str().unwrap(), "-p", "hi", "--chatml"]);
    assert_one_line_error(&o, "no chat template");
}

/// A small chat template of our own: turns between `<|im_start|>` and `<|im_end|>`, an
/// assistant's reasoning inside `<think>`/`</think>` before its answer.
const CHAT_TEMPLATE: &str = "{%- for m in messages -%}\
<|im_start|>{{ m.role }}\n\
{%- if m.role == 'assistant' and m.reasoning_content -%}\
<think>\n{{ m.reasoning_content }}\n</think>\n\n\
{%- endif -%}\
{{ m.content }}<|im_end|>\n\
{%- endfor -%}\
{%- if add_generation_prompt -%}<|im_start|>assistant\n{{ OPEN }}{%- endif -%}";

/// The value of `key N` in a run's standard error (`prompt 12 tokens` gives 12).
fn stderr_count(err: &str, key: &str) -> usize {
    let at = err
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} not in {err}"));
    err[at + key.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count after {key:?} in {err}"))
}

#[test]
fn chatml_runs_the_rendered_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let tmpl = CHAT_TEMPLATE.replace("{{ OPEN }}", "");
    let p = demo_copy(dir.path(), "qwen3moe", None, Some(&tmpl));
    let m = p.to_str().unwrap();
    let o = sluice(&[
        "run",
        "-m",
        m,
        "-p",
        "Hi",
        "--system",
        "Be brief",
        "--chatml",
        "--temp",
        "0",
        "-n",
        "6",
        "--ignore-eos",
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let (_, answer, generation, _) = summary(&stdout(&o));
    assert_eq!(generation_tokens(&generation), 6);
    // The prompt run is the one `tokenize --chatml` gives.
    let t = sluice(&[
        "tokenize", "-m", m, "--chatml", "--system", "Be brief", "Hi",
    ]);
    assert!(t.status.success(), "stderr: {}", stderr(&t));
    let ids: Vec<u32> = serde_json::from_slice(&t.stdout).unwrap();
    assert_eq!(stderr_count(&stderr(&o), "prompt "), ids.len());
    // It differs from the plain prompt's, and so does the answer.
    let plain = sluice(&[
        "run",
        "-m",
        m,
        "-p",
        "Hi",
        "--temp",
        "0",
        "-n",
        "6",
        "--ignore-eos",
    ]);
    assert!(plain.status.success());
    assert_ne!(stderr_count(&stderr(&plain), "prompt "), ids.len());
    assert!(!answer.is_empty());
}

#[test]
fn reasoning_goes_to_standard_error() {
    // The generation prompt opens the reasoning span; the random model never closes it, so
    // everything it writes is reasoning: shown on standard error, and the answer is empty.
    let dir = tempfile::tempdir().unwrap();
    let tmpl = CHAT_TEMPLATE.replace("{{ OPEN }}", "<think>\n");
    let p = demo_copy(dir.path(), "qwen3moe", None, Some(&tmpl));
    let m = p.to_str().unwrap();
    let o = sluice(&[
        "run",
        "-m",
        m,
        "-p",
        "Hi",
        "--chatml",
        "--temp",
        "0",
        "-n",
        "6",
        "--ignore-eos",
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let out = stdout(&o);
    let (streamed, answer, generation, _) = summary(&out);
    assert_eq!(generation_tokens(&generation), 6);
    assert_eq!(streamed, "");
    assert_eq!(answer, "");
    let err = stderr(&o);
    assert!(err.contains("--- reasoning ---"), "{err}");
    assert!(err.contains("--- end of reasoning ---"), "{err}");
}

#[test]
fn greedy_answer_is_the_library_greedy_decoding() {
    use engine::{Engine, EngineConfig, LogitsWanted};
    use model::Model;
    use quant::{Kernels, ThreadPool};
    use sampler::{Sampler, SamplerParams};

    let prompt = "Hello there";
    let n = 10;
    let out = run_demo(&["--temp", "0", "-n", &n.to_string(), "--ignore-eos"]);
    let (_, answer, _, _) = summary(&out);

    // The same run done with the libraries: run's defaults (f16 KV cache, context 4096 capped
    // at the demo's training context of 512), end-of-generation ids never drawn.
    let file = GgufFile::open(demo()).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    let tok = text::Tokenizer::from_metadata(file.metadata()).unwrap();
    let pool = ThreadPool::new(1).unwrap();
    let cfg = EngineConfig {
        n_ctx: 512,
        ..EngineConfig::default()
    };
    let mut eng = Engine::new(&model, Kernels::detect(), &pool, cfg).unwrap();
    let mut s = Sampler::new(SamplerParams {
        temp: 0.0,
        seed: 1,
        ..SamplerParams::default()
    });
    let mut logits = eng
        .forward(&tok.encode(prompt, true, false), LogitsWanted::Last)
        .unwrap();
    let mut dec = text::StreamDecoder::continuation(false);
    let mut want = String::new();
    for _ in 0..n {
        for &e in &tok.vocab().eog {
            logits[e as usize] = f32::NEG_INFINITY;
        }
        let id = s.sample(&logits);
        want.push_str(&dec.push(&tok, id));
        logits = eng.forward(&[id], LogitsWanted::Last).unwrap();
    }
    want.push_str(&dec.finish());
    assert_eq!(answer, want);
}
