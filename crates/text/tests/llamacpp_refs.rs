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

/// SHA-256 (FIPS 180-4), to check that a vocabulary is the one the references were made from.
fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let bit_len = (data.len() as u64).wrapping_mul(8);
    let mut tail = data[data.len() / 64 * 64..].to_vec();
    tail.push(0x80);
    while tail.len() % 64 != 56 {
        tail.push(0);
    }
    tail.extend_from_slice(&bit_len.to_be_bytes());
    let blocks = data[..data.len() / 64 * 64]
        .chunks_exact(64)
        .chain(tail.chunks_exact(64));
    for block in blocks {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[test]
fn sha256_known_answers() {
    // FIPS 180-4 examples and a two-block message.
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
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
        sha256_hex(&corpus_bytes),
        str_of(&refs["corpus_sha256"]),
        "fixtures/corpus.json changed since {name}.json was made: run `bash scripts/gen_token_refs.sh`"
    );
    let corpus: Vec<String> = serde_json::from_slice(&corpus_bytes).expect("corpus.json");

    let vocab_file = str_of(&refs["vocab"]);
    let vocab_path = common::vocab_path(vocab_file);
    let bytes =
        std::fs::read(&vocab_path).unwrap_or_else(|e| panic!("read {}: {e}", vocab_path.display()));
    assert_eq!(
        sha256_hex(&bytes),
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
