//! The tokenizer against llama.cpp itself: ids, detokenized bytes and token pieces that
//! llama.cpp's own library computed for the strings of `fixtures/corpus.json` over every BPE and
//! SentencePiece fixture vocabulary (`fixtures/tokens/<vocab>.json`, written by
//! `scripts/gen_token_refs.sh`; see `fixtures/README.md`).
//!
//! The vocabularies themselves are not in the repository: `scripts/fetch_text_fixtures.sh` puts
//! them in the fixture cache, and each reference file records the SHA-256 of the vocabulary it was
//! made from. Every mismatch of a vocabulary is collected and printed before the test fails, so one
//! run shows them all.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use serde_json::Value;
use text::Tokenizer;

mod common;

/// The (add_special, parse_special) order of the `encode` records and the
/// (remove_special, unparse_special) order of the `detokenize` records.
const FLAG_PAIRS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// The corpus and the reference files: `tests/fixtures`, or `$SLUICE_TOKEN_REFS` (a directory
/// laid out the same way, written by `scripts/gen_token_refs.sh DIR` from a bigger corpus, for
/// exploring).
fn refs_dir() -> PathBuf {
    match std::env::var_os("SLUICE_TOKEN_REFS") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"),
    }
}

fn hex_bytes(s: &str) -> Vec<u8> {
    assert!(
        s.len().is_multiple_of(2),
        "odd-length hex in a reference file"
    );
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex in a reference file"))
        .collect()
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id")).expect("id fits u32"))
        .collect()
}

fn str_of(v: &Value) -> &str {
    v.as_str().expect("string in a reference file")
}

/// Bytes for a message: the escaped string when they are UTF-8, else escaped bytes.
fn show(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => format!("{s:?}"),
        Err(_) => format!("b\"{}\"", bytes.escape_ascii()),
    }
}

/// Runs `f`, turning a panic into an error message so one panic does not hide other mismatches.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|e| {
        let msg = e
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| e.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        format!("panicked: {msg}")
    })
}

/// Expected vs got ids, with the first differing position and the pieces there.
fn ids_diff(tok: &Tokenizer, want: &[u32], got: &[u32]) -> String {
    let k = want
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    let piece = |ids: &[u32]| match ids.get(k) {
        Some(&id) => guarded(|| show(&tok.token_to_piece(id, true)))
            .unwrap_or_else(|e| e)
            .to_string(),
        None => "(end)".to_string(),
    };
    format!(
        "\n    expected {want:?}\n    got      {got:?}\n    first difference at {k}: expected piece {}, got piece {}",
        piece(want),
        piece(got)
    )
}

struct Checker<'a> {
    vocab: &'a str,
    tok: &'a Tokenizer,
    failures: Vec<String>,
    checks: usize,
}

impl Checker<'_> {
    fn fail(&mut self, what: String) {
        self.failures.push(format!("[{}] {what}", self.vocab));
    }

    fn encode(&mut self, what: &str, text: &str, add: bool, parse: bool, want: &[u32]) {
        self.checks += 1;
        let tok = self.tok;
        match guarded(|| tok.encode(text, add, parse)) {
            Ok(got) if got == want => {}
            Ok(got) => self.fail(format!(
                "{what}: encode({text:?}, add_special={add}, parse_special={parse}){}",
                ids_diff(tok, want, &got)
            )),
            Err(e) => self.fail(format!(
                "{what}: encode({text:?}, add_special={add}, parse_special={parse}) {e}"
            )),
        }
    }

    fn detokenize(&mut self, what: &str, ids: &[u32], rs: bool, us: bool, want: &[u8]) {
        self.checks += 1;
        let tok = self.tok;
        match guarded(|| tok.detokenize(ids, rs, us)) {
            Ok(got) if got == want => {}
            Ok(got) => self.fail(format!(
                "{what}: detokenize({ids:?}, remove_special={rs}, unparse_special={us})\n    expected {}\n    got      {}",
                show(want),
                show(&got)
            )),
            Err(e) => self.fail(format!(
                "{what}: detokenize({ids:?}, remove_special={rs}, unparse_special={us}) {e}"
            )),
        }
    }

    fn piece(&mut self, id: u32, special: bool, want: &[u8]) {
        self.checks += 1;
        let tok = self.tok;
        match guarded(|| tok.token_to_piece(id, special)) {
            Ok(got) if got == want => {}
            Ok(got) => self.fail(format!(
                "token_to_piece({id}, special={special})\n    expected {}\n    got      {}",
                show(want),
                show(&got)
            )),
            Err(e) => self.fail(format!("token_to_piece({id}, special={special}) {e}")),
        }
    }
}

/// Checks one vocabulary against `fixtures/tokens/<name>.json`.
fn check_vocab(name: &str) {
    let refs_path = refs_dir().join("tokens").join(format!("{name}.json"));
    let refs: Value = serde_json::from_str(
        &std::fs::read_to_string(&refs_path)
            .unwrap_or_else(|e| panic!("read {}: {e}", refs_path.display())),
    )
    .expect("reference file is JSON");

    let corpus_bytes = std::fs::read(refs_dir().join("corpus.json")).expect("read corpus.json");
    assert_eq!(
        testdata::sha256_hex(&corpus_bytes),
        str_of(&refs["corpus_sha256"]),
        "fixtures/corpus.json changed since {name}.json was made: run `bash scripts/gen_token_refs.sh`"
    );
    let corpus: Vec<String> = serde_json::from_slice(&corpus_bytes).expect("corpus.json");

    let vocab_file = str_of(&refs["vocab"]);
    let vocab_path = common::vocab_path(vocab_file);
    let bytes =
        std::fs::read(&vocab_path).unwrap_or_else(|e| panic!("read {}: {e}", vocab_path.display()));
    assert_eq!(
        testdata::sha256_hex(&bytes),
        str_of(&refs["vocab_sha256"]),
        "{} is not the file the references were made from: delete the fixture cache's STAMP and \
         re-fetch with `bash scripts/fetch_text_fixtures.sh`",
        vocab_path.display()
    );
    let parsed = gguf::Gguf::parse(&bytes).expect("parse vocab GGUF");
    let tok = Tokenizer::from_metadata(parsed.metadata())
        .unwrap_or_else(|e| panic!("[{name}] Tokenizer::from_metadata failed: {e}"));
    let n_vocab = refs["n_vocab"].as_u64().expect("n_vocab") as usize;
    assert_eq!(
        tok.vocab().tokens.len(),
        n_vocab,
        "[{name}] vocabulary size"
    );

    let mut c = Checker {
        vocab: name,
        tok: &tok,
        failures: Vec::new(),
        checks: 0,
    };

    let encode = refs["encode"].as_array().expect("encode records");
    let detok = refs["detokenize"].as_array().expect("detokenize records");
    assert_eq!(encode.len(), corpus.len(), "one encode record per string");
    assert_eq!(
        detok.len(),
        corpus.len(),
        "one detokenize record per string"
    );
    for (i, text) in corpus.iter().enumerate() {
        let what = format!("corpus[{i}]");
        let per_flags = encode[i].as_array().expect("four id lists");
        for (&(add, parse), want) in FLAG_PAIRS.iter().zip(per_flags) {
            c.encode(&what, text, add, parse, &ids_of(want));
        }
        // Detokenization starts from llama.cpp's ids, not ours, so it is checked on its own.
        let ids = ids_of(&per_flags[3]);
        let per_flags = detok[i].as_array().expect("four byte strings");
        for (&(rs, us), want) in FLAG_PAIRS.iter().zip(per_flags) {
            c.detokenize(&what, &ids, rs, us, &hex_bytes(str_of(want)));
        }
    }

    for (k, r) in refs["random"]
        .as_array()
        .expect("random records")
        .iter()
        .enumerate()
    {
        let what = format!("random[{k}]");
        let ids = ids_of(&r["ids"]);
        let per_flags = r["detok"].as_array().expect("four byte strings");
        for (&(rs, us), want) in FLAG_PAIRS.iter().zip(per_flags) {
            c.detokenize(&what, &ids, rs, us, &hex_bytes(str_of(want)));
        }
        // llama.cpp re-tokenized the (0, 1) text only where it is valid UTF-8 (`encode` takes a
        // str).
        if !r["retok"].is_null() {
            let text =
                String::from_utf8(hex_bytes(str_of(&per_flags[1]))).expect("retok text is UTF-8");
            c.encode(
                &format!("{what} re-tokenized"),
                &text,
                false,
                true,
                &ids_of(&r["retok"]),
            );
        }
    }

    for p in refs["pieces"].as_array().expect("piece records") {
        let id = u32::try_from(p[0].as_u64().expect("piece id")).expect("id fits u32");
        c.piece(id, false, &hex_bytes(str_of(&p[1])));
        c.piece(id, true, &hex_bytes(str_of(&p[2])));
    }

    for f in &c.failures {
        eprintln!("{f}");
    }
    assert!(
        c.failures.is_empty(),
        "[{name}] {} of {} checks differ from llama.cpp (listed above)",
        c.failures.len(),
        c.checks
    );
}

macro_rules! vocab_tests {
    ($($test:ident => $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                check_vocab($name);
            }
        )*

        /// Every reference file has a test above.
        const TESTED: &[&str] = &[$($name),*];
    };
}

vocab_tests! {
    ggml_vocab_aquila => "ggml-vocab-aquila",
    ggml_vocab_baichuan => "ggml-vocab-baichuan",
    ggml_vocab_command_r => "ggml-vocab-command-r",
    ggml_vocab_deepseek_coder => "ggml-vocab-deepseek-coder",
    ggml_vocab_deepseek_llm => "ggml-vocab-deepseek-llm",
    ggml_vocab_falcon => "ggml-vocab-falcon",
    ggml_vocab_gemma_4 => "ggml-vocab-gemma-4",
    ggml_vocab_gpt_2 => "ggml-vocab-gpt-2",
    ggml_vocab_gpt_neox => "ggml-vocab-gpt-neox",
    ggml_vocab_llama_bpe => "ggml-vocab-llama-bpe",
    ggml_vocab_llama_spm => "ggml-vocab-llama-spm",
    ggml_vocab_mpt => "ggml-vocab-mpt",
    ggml_vocab_phi_3 => "ggml-vocab-phi-3",
    ggml_vocab_qwen2 => "ggml-vocab-qwen2",
    ggml_vocab_qwen35 => "ggml-vocab-qwen35",
    ggml_vocab_refact => "ggml-vocab-refact",
    ggml_vocab_starcoder => "ggml-vocab-starcoder",
    qwen2_5_coder_1_5b => "qwen2.5-coder-1.5b",
    smollm2_135m => "smollm2-135m",
    synth_pre_deepseek_llm => "synth-pre-deepseek-llm",
    synth_pre_deepseek_v3 => "synth-pre-deepseek-v3",
    synth_pre_default => "synth-pre-default",
    synth_pre_glm4 => "synth-pre-glm4",
    synth_pre_gpt_2 => "synth-pre-gpt-2",
    synth_pre_gpt_4o => "synth-pre-gpt-4o",
    synth_pre_kimi_k2 => "synth-pre-kimi-k2",
    synth_pre_llama3 => "synth-pre-llama3",
    synth_pre_qwen35 => "synth-pre-qwen35",
    synth_pre_smollm => "synth-pre-smollm",
    synth_pre_starcoder => "synth-pre-starcoder",
    synth_pre_tekken => "synth-pre-tekken",
}

#[test]
fn every_reference_file_is_tested() {
    let mut files: Vec<String> = std::fs::read_dir(refs_dir().join("tokens"))
        .expect("fixtures/tokens")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter_map(|f| f.strip_suffix(".json").map(str::to_owned))
        .collect();
    files.sort();
    let mut tested: Vec<String> = TESTED.iter().map(|s| s.to_string()).collect();
    tested.sort();
    assert_eq!(files, tested);
}

/// Every reference file of the directory, whatever its name: for exploring with
/// `SLUICE_TOKEN_REFS=DIR cargo test -p text --test llamacpp_refs -- --ignored`, where DIR may
/// hold references for vocabularies beyond the fixtures (run with `SLUICE_FIXTURES` pointing at
/// where they are).
#[test]
#[ignore = "exploration over a generated SLUICE_TOKEN_REFS directory"]
fn all_reference_files() {
    let mut names: Vec<String> = std::fs::read_dir(refs_dir().join("tokens"))
        .expect("tokens directory")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter_map(|f| f.strip_suffix(".json").map(str::to_owned))
        .collect();
    names.sort();
    let failed: Vec<String> = names
        .iter()
        .filter(|name| guarded(|| check_vocab(name)).is_err())
        .cloned()
        .collect();
    assert!(failed.is_empty(), "vocabularies that differ: {failed:?}");
}
