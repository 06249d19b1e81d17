//! End-to-end tests of `sluice template` and `sluice tokenize --chatml`, run as a user would run
//! the binary, on vocabulary files fetched by `scripts/fetch_text_fixtures.sh` (the renderings
//! themselves are held to transformers' by the `chat` crate's tests).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gguf::{GgufFile, GgufWriter, Value};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

fn qwen() -> PathBuf {
    testdata::vocab_path("qwen2.5-coder-1.5b.gguf")
}

fn ok_stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

/// A copy of `src`'s metadata (no tensors) with `tokenizer.chat_template` replaced by `template`.
fn with_template(src: &Path, template: &str, out: &Path) {
    let file = GgufFile::open(src).expect("open");
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata().iter() {
        if key != "tokenizer.chat_template" {
            w.add_metadata(key, value.clone()).expect("add");
        }
    }
    w.add_metadata("tokenizer.chat_template", Value::String(template.into()))
        .expect("add template");
    w.write_to_path(out).expect("write");
}

#[test]
fn renders_the_models_own_template() {
    let model = qwen();
    let m = model.to_str().expect("utf-8 path");
    let out = ok_stdout(&sluice(&[
        "template", "-m", m, "-p", "Hi there", "--system", "Be brief",
    ]));
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let done = ok_stdout(&sluice(&[
        "template",
        "-m",
        m,
        "-p",
        "Hi there",
        "--system",
        "Be brief",
        "--no-generation-prompt",
    ]));
    assert_eq!(
        out.strip_prefix(done.as_str()),
        Some("<|im_start|>assistant\n")
    );
}

#[test]
fn chatml_tokens_are_the_rendered_prompt_with_special_tokens_parsed() {
    let model = qwen();
    let m = model.to_str().expect("utf-8 path");
    let rendered = ok_stdout(&sluice(&["template", "-m", m, "-p", "Hi there"]));
    let via_template: Vec<u32> = serde_json::from_str(&ok_stdout(&sluice(&[
        "tokenize",
        "-m",
        m,
        "--special",
        &rendered,
    ])))
    .expect("ids");
    let via_chatml: Vec<u32> = serde_json::from_str(&ok_stdout(&sluice(&[
        "tokenize", "-m", m, "--chatml", "Hi there",
    ])))
    .expect("ids");
    assert_eq!(via_chatml, via_template);
    // <|im_start|> is one token, not its characters.
    let im_start = 151644;
    assert_eq!(via_chatml.first(), Some(&im_start));
    assert_eq!(via_chatml.iter().filter(|&&t| t == im_start).count(), 3);
}

#[test]
fn a_model_without_a_template_is_refused_by_name() {
    for args in [
        &["tokenize", "--chatml", "hello"][..],
        &["template", "-p", "hello"][..],
    ] {
        let o = sluice(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("demo model") && err.contains("no chat template"),
            "{args:?}: {err}"
        );
    }
    let o = sluice(&[
        "template",
        "-m",
        qwen().to_str().expect("path"),
        "--name",
        "tool_use",
        "-p",
        "x",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("tool_use"));
}

#[test]
fn think_control_follows_the_template() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gpt_oss = std::fs::read_to_string(testdata::template_path("openai-gpt-oss-120b"))
        .expect("gpt-oss template");
    let model = dir.path().join("harmony.gguf");
    with_template(&qwen(), &gpt_oss, &model);
    let m = model.to_str().expect("utf-8 path");

    let info: serde_json::Value =
        serde_json::from_str(&ok_stdout(&sluice(&["template", "-m", m, "--info"]))).expect("json");
    assert_eq!(info["think_ctl"], "prefill");
    assert_eq!(info["reasoning"]["kind"], "harmony");

    // Asked not to think, the turn starts past an empty, closed analysis section.
    let think = ok_stdout(&sluice(&["template", "-m", m, "-p", "Hi"]));
    let no_think = ok_stdout(&sluice(&["template", "-m", m, "-p", "Hi", "--no-think"]));
    assert!(think.ends_with("<|start|>assistant"), "{think:?}");
    assert_eq!(
        no_think.strip_prefix(think.as_str()),
        Some("<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>")
    );

    let qwen_info: serde_json::Value = serde_json::from_str(&ok_stdout(&sluice(&[
        "template",
        "-m",
        qwen().to_str().expect("path"),
        "--info",
    ])))
    .expect("json");
    assert_eq!(qwen_info["think_ctl"], "template");
    assert_eq!(qwen_info["reasoning"]["kind"], "none");
}
