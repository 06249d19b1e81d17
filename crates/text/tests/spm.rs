//! SentencePiece vocabularies against llama.cpp's own tokenizer test cases.
//!
//! The `.inp`/`.out` pairs are llama.cpp's `test-tokenizer-0` data for its SentencePiece vocab
//! files (`models/ggml-vocab-{llama-spm,phi-3}.gguf*`; the expected ids were produced by the
//! Hugging Face tokenizers, see llama.cpp's `convert_hf_to_gguf_update.py`), fetched by
//! `scripts/fetch_text_fixtures.sh`. Like `test-tokenizer-0`, the text is encoded without
//! BOS/EOS and without parsing special-token text.

mod common;

use common::{read_cases, vocab_path};
use text::{Tokenizer, VocabKind};

fn load(name: &str) -> Tokenizer {
    let file = gguf::GgufFile::open(vocab_path(name)).expect("open vocab file");
    Tokenizer::from_metadata(file.metadata()).expect("build tokenizer")
}

fn check_cases(name: &str) {
    let tok = load(name);
    assert_eq!(tok.vocab().kind, VocabKind::Spm, "{name}");
    let cases = read_cases(name);
    assert!(cases.len() > 10, "{name}: only {} cases", cases.len());
    let mut failures = Vec::new();
    for (text, expected) in &cases {
        let got = tok.encode(text, false, false);
        if &got != expected {
            failures.push(format!(
                "{text:?}\n  expected {expected:?}\n  got      {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn llama_spm_matches_reference_ids() {
    check_cases("ggml-vocab-llama-spm.gguf");
}

#[test]
fn phi_3_matches_reference_ids() {
    check_cases("ggml-vocab-phi-3.gguf");
}

/// Characters without a token of their own come out as their UTF-8 bytes' `<0xXX>` tokens,
/// whose pieces are those bytes.
#[test]
fn byte_fallback_tokens_carry_the_bytes() {
    let tok = load("ggml-vocab-llama-spm.gguf");
    // U+10348 (4 bytes) and U+E000 (private use) are not tokens of the llama vocabulary.
    for text in ["\u{10348}", "\u{E000}", "a\u{10348}b"] {
        let ids = tok.encode(text, false, false);
        let mut bytes = Vec::new();
        for &id in &ids {
            bytes.extend(tok.token_to_piece(id, false));
        }
        // Every byte of the character is its own token.
        let byte_tokens = ids
            .iter()
            .filter(|&&id| tok.vocab().attr(id).has(text::TokenAttr::BYTE))
            .count();
        let multibyte: usize = text
            .chars()
            .filter(|c| !c.is_ascii())
            .map(char::len_utf8)
            .sum();
        assert_eq!(byte_tokens, multibyte, "{text:?}: {ids:?}");
        // The pieces give back the text with the prefix space the vocabulary adds.
        assert_eq!(bytes, format!(" {text}").into_bytes(), "{text:?}: {ids:?}");
    }
}

/// baichuan has no reference cases; its vocabulary still loads as SentencePiece and text
/// tokenizes without unknown tokens.
#[test]
fn baichuan_loads_and_tokenizes() {
    let tok = load("ggml-vocab-baichuan.gguf");
    assert_eq!(tok.vocab().kind, VocabKind::Spm);
    let ids = tok.encode("Hello world, 你好 \u{10348}", false, false);
    assert!(!ids.is_empty());
    assert!(
        ids.iter().all(|&id| Some(id) != tok.vocab().special.unk),
        "{ids:?}"
    );
}
