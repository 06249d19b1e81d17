//! End-to-end tests of `sluice tokenize`, run as a user would run the binary, on llama.cpp's
//! vocabulary test files (fetched by `scripts/fetch_text_fixtures.sh`); the expected ids are
//! the `text` library's, which its own tests hold to llama.cpp's.

use std::path::PathBuf;
use std::process::{Command, Output};

use text::Tokenizer;

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice")
}

/// A vocabulary fetched by `scripts/fetch_text_fixtures.sh`.
fn vocab_path(name: &str) -> PathBuf {
    testdata::vocab_path(name)
}

fn library(path: &PathBuf) -> Tokenizer {
    let file = gguf::GgufFile::open(path).expect("open vocab file");
    Tokenizer::from_metadata(file.metadata()).expect("build tokenizer")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `sluice tokenize ARGS` and parses its one-line JSON array.
fn ids(args: &[&str]) -> Vec<u32> {
    let mut full = vec!["tokenize"];
    full.extend_from_slice(args);
    let o = sluice(&full);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 1, "{out:?}");
    serde_json::from_str(&out).expect("a JSON array of ids")
}

const TEXT: &str = "Hello world! 🦙 llamas' \"quotes\"\n\tand 3.14";

#[test]
fn ids_equal_the_library_encoding() {
    for name in [
        "ggml-vocab-llama-spm.gguf",
        "ggml-vocab-qwen2.gguf",
        "ggml-vocab-phi-3.gguf",
    ] {
        let path = vocab_path(name);
        let tok = library(&path);
        let m = path.to_str().expect("utf-8 path");
        assert_eq!(
            ids(&["-m", m, TEXT]),
            tok.encode(TEXT, true, false),
            "{name}"
        );
        assert_eq!(
            ids(&["-m", m, "--no-bos", TEXT]),
            tok.encode(TEXT, false, false),
            "{name}"
        );
    }
}

#[test]
fn no_bos_drops_the_bos_of_llama_spm() {
    let path = vocab_path("ggml-vocab-llama-spm.gguf");
    let bos = library(&path).vocab().special.bos.expect("bos");
    let m = path.to_str().expect("utf-8 path");
    let with = ids(&["-m", m, "Hello"]);
    let without = ids(&["-m", m, "--no-bos", "Hello"]);
    assert_eq!(with[0], bos);
    assert!(!without.is_empty());
    assert_eq!(&with[1..], &without[..]);
}

#[test]
fn special_turns_special_text_into_one_token() {
    let path = vocab_path("ggml-vocab-llama-spm.gguf");
    let bos = library(&path).vocab().special.bos.expect("bos");
    let m = path.to_str().expect("utf-8 path");
    assert_eq!(ids(&["-m", m, "--no-bos", "--special", "<s>"]), vec![bos]);
    assert!(ids(&["-m", m, "--no-bos", "<s>"]).len() > 1);

    let path = vocab_path("ggml-vocab-qwen2.gguf");
    let tok = library(&path);
    let im_start = tok.vocab().token_to_id["<|im_start|>"];
    let m = path.to_str().expect("utf-8 path");
    let got = ids(&["-m", m, "--special", "<|im_start|>user"]);
    assert_eq!(got[0], im_start);
    assert_eq!(got, tok.encode("<|im_start|>user", true, true));
    assert!(!ids(&["-m", m, "<|im_start|>user"]).contains(&im_start));
}

#[test]
fn pieces_are_one_id_and_json_string_per_line() {
    let path = vocab_path("ggml-vocab-llama-spm.gguf");
    let tok = library(&path);
    let m = path.to_str().expect("utf-8 path");
    let o = sluice(&["tokenize", "-m", m, "--pieces", TEXT]);
    assert!(o.status.success(), "{}", stderr(&o));
    let expected = tok.encode(TEXT, true, false);
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), expected.len(), "{out}");
    for (line, &id) in lines.iter().zip(&expected) {
        let (num, piece) = line.split_once('\t').expect("id<TAB>piece");
        assert_eq!(num.parse::<u32>().expect("id"), id);
        let piece: String = serde_json::from_str(piece).expect("JSON string");
        assert_eq!(
            piece,
            String::from_utf8_lossy(&tok.token_to_piece(id, true)),
            "{line}"
        );
    }
    // The BOS is shown as its text.
    assert_eq!(lines[0], format!("{}\t\"<s>\"", expected[0]));
}

#[test]
fn file_input_keeps_newlines() {
    let path = vocab_path("ggml-vocab-llama-spm.gguf");
    let m = path.to_str().expect("utf-8 path");
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.txt");
    std::fs::write(&input, TEXT).expect("write input");
    let from_file = ids(&["-m", m, "--file", input.to_str().expect("utf-8 path")]);
    assert_eq!(from_file, ids(&["-m", m, TEXT]));
    assert_eq!(from_file, library(&path).encode(TEXT, true, false));
}

#[test]
fn file_dash_reads_standard_input() {
    use std::io::Write;
    use std::process::Stdio;
    let path = vocab_path("ggml-vocab-llama-spm.gguf");
    let m = path.to_str().expect("utf-8 path");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["tokenize", "-m", m, "--file", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sluice");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(TEXT.as_bytes())
        .expect("write stdin");
    let o = child.wait_with_output().expect("wait");
    assert!(o.status.success(), "{}", stderr(&o));
    let got: Vec<u32> = serde_json::from_str(&stdout(&o)).expect("JSON ids");
    assert_eq!(got, library(&path).encode(TEXT, true, false));
}

/// Without -m the built-in demo model's tokenizer is used: the same ids as the library gets
/// from it, or the library's error when its metadata cannot make a tokenizer.
#[test]
fn without_a_model_the_demo_model_is_used() {
    let demo = gguf::Gguf::parse(include_bytes!("../assets/demo-qwen3moe.gguf")).expect("demo");
    match Tokenizer::from_metadata(demo.metadata()) {
        Ok(tok) => assert_eq!(ids(&["hi there"]), tok.encode("hi there", true, false)),
        Err(e) => {
            let o = sluice(&["tokenize", "hi there"]);
            assert_eq!(o.status.code(), Some(2));
            let err = stderr(&o);
            assert!(
                err.starts_with("sluice: error: the built-in demo model"),
                "{err}"
            );
            assert!(err.contains(&e.to_string()), "{err}");
        }
    }
}

#[test]
fn missing_file_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-model.gguf");
    let o = sluice(&[
        "tokenize",
        "-m",
        missing.to_str().expect("utf-8 path"),
        "hi",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.starts_with("sluice: error: "), "{err}");
    assert!(err.contains("no-such-model.gguf"), "{err}");
    assert!(o.stdout.is_empty());
}

#[test]
fn text_is_required() {
    let o = sluice(&["tokenize"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("TEXT"), "{}", stderr(&o));
}
