//! Ids back to text: pieces, one-shot detokenization and the streaming decoder, on real
//! vocabularies (llama.cpp's vocab test files and the model vocabularies fetched by
//! `scripts/fetch_text_fixtures.sh`).
//!
//! The round-trip checks are the ones llama.cpp's `test-tokenizer-1-spm` makes for the
//! llama SentencePiece vocabulary (the only vocabulary its round-trip tests run on): every
//! token's text and every code point (surrogates, U+40000..U+E0000 and `▁` excepted) tokenize
//! back to the same text.

mod common;

use std::sync::OnceLock;

use common::vocab_path;

use proptest::prelude::*;
use text::{StreamDecoder, TokenAttr, Tokenizer, VocabKind};

fn load(name: &str) -> Tokenizer {
    let path = vocab_path(name);
    let file = gguf::GgufFile::open(&path).expect("open vocab file");
    Tokenizer::from_metadata(file.metadata()).expect("build tokenizer")
}

macro_rules! vocab {
    ($fn:ident, $file:expr) => {
        fn $fn() -> &'static Tokenizer {
            static T: OnceLock<Tokenizer> = OnceLock::new();
            T.get_or_init(|| load($file))
        }
    };
}

vocab!(llama_spm, "ggml-vocab-llama-spm.gguf");
vocab!(qwen2, "ggml-vocab-qwen2.gguf");
vocab!(gemma4, "ggml-vocab-gemma-4.gguf");
vocab!(smollm2, "smollm2-135m.gguf");
vocab!(gpt2, "ggml-vocab-gpt-2.gguf");

fn id_of(tok: &Tokenizer, text: &str) -> u32 {
    *tok.vocab()
        .token_to_id
        .get(text)
        .unwrap_or_else(|| panic!("no token {text:?}"))
}

#[test]
fn spm_pieces() {
    let tok = llama_spm();
    let v = tok.vocab();
    assert_eq!(v.kind, VocabKind::Spm);
    // Byte tokens give their byte, also when it is not UTF-8 on its own.
    assert_eq!(tok.token_to_piece(id_of(tok, "<0x0A>"), false), b"\n");
    assert_eq!(tok.token_to_piece(id_of(tok, "<0xE2>"), false), [0xE2]);
    assert_eq!(tok.token_to_piece(id_of(tok, "<0xFF>"), true), [0xFF]);
    // ▁ is a space.
    assert_eq!(tok.token_to_piece(id_of(tok, "▁Hello"), false), b" Hello");
    // Control and unknown tokens only with `special`.
    let bos = v.special.bos.expect("bos");
    let unk = v.special.unk.expect("unk");
    assert_eq!(tok.token_to_piece(bos, false), b"");
    assert_eq!(tok.token_to_piece(bos, true), b"<s>");
    assert_eq!(tok.token_to_piece(unk, false), b"");
    assert_eq!(tok.token_to_piece(unk, true), b"<unk>");
    // Ids outside the vocabulary have no text.
    assert_eq!(tok.token_to_piece(v.len() as u32, true), b"");
    assert_eq!(tok.token_to_piece(u32::MAX, true), b"");
}

#[test]
fn byte_level_bpe_pieces() {
    let tok = qwen2();
    assert_eq!(tok.vocab().kind, VocabKind::Bpe);
    // Ġ stands for a space, Ċ for a newline; the lone bytes of a UTF-8 sequence come out raw.
    assert_eq!(tok.token_to_piece(id_of(tok, "Ġworld"), false), b" world");
    assert_eq!(tok.token_to_piece(id_of(tok, "Ċ"), false), b"\n");
    assert_eq!(tok.token_to_piece(id_of(tok, "Ã"), false), [0xC3]);
    let im_start = id_of(tok, "<|im_start|>");
    assert_eq!(tok.token_to_piece(im_start, false), b"");
    assert_eq!(tok.token_to_piece(im_start, true), b"<|im_start|>");
}

#[test]
fn gemma4_pieces_unescape_spaces() {
    let tok = gemma4();
    assert_eq!(tok.vocab().kind, VocabKind::Bpe);
    assert!(tok.vocab().escape_whitespaces);
    assert_eq!(tok.token_to_piece(id_of(tok, "▁the"), false), b" the");
    assert_eq!(tok.token_to_piece(id_of(tok, "<0x0A>"), false), b"\n");
}

#[test]
fn detokenize_strips_only_the_first_prefix_space() {
    let tok = llama_spm();
    let v = tok.vocab();
    assert!(v.add_space_prefix && v.add_bos);
    let ids = tok.encode("Hello world", true, false);
    let bos = v.special.bos.expect("bos");
    assert_eq!(ids[0], bos);
    // The BOS piece (empty without `special`) takes the one strip the first piece gets.
    assert_eq!(tok.detokenize(&ids, false, false), b" Hello world");
    assert_eq!(tok.detokenize(&ids, false, true), b"<s> Hello world");
    // Removing the BOS keeps the space of the piece after it.
    assert_eq!(tok.detokenize(&ids, true, true), b" Hello world");
    // Without a BOS the first piece's space goes.
    assert_eq!(tok.detokenize(&ids[1..], false, false), b"Hello world");
    assert_eq!(tok.detokenize(&ids[1..], true, false), b"Hello world");
}

#[test]
fn detokenize_keeps_eos_unless_removing_specials_the_vocab_adds() {
    let tok = llama_spm();
    let v = tok.vocab();
    let eos = v.special.eos.expect("eos");
    let mut ids = tok.encode("Hi", false, false);
    ids.push(eos);
    assert_eq!(tok.detokenize(&ids, false, true), b"Hi</s>");
    // llama does not add EOS, so remove_special leaves it.
    assert!(!v.add_eos);
    assert_eq!(tok.detokenize(&ids, true, true), b"Hi</s>");
    let mut adds_eos = v.clone();
    adds_eos.add_eos = true;
    let adds_eos = Tokenizer::from_vocab(adds_eos);
    assert_eq!(adds_eos.detokenize(&ids, true, true), b"Hi");
}

/// llama.cpp's test-tokenizer-1-spm, first half: the text of every token, tokenized with
/// special-token parsing, detokenizes back to that text.
#[test]
fn llama_spm_every_token_round_trips() {
    let tok = llama_spm();
    for id in 0..tok.vocab().len() as u32 {
        let text = tok.detokenize(&[id], false, true);
        let s = String::from_utf8_lossy(&text);
        if std::str::from_utf8(&text).is_err() {
            // A lone byte token: its text cannot be given as a string.
            assert!(tok.vocab().attr(id).has(TokenAttr::BYTE), "{id}");
            continue;
        }
        let ids = tok.encode(&s, false, true);
        let back = tok.detokenize(&ids, false, true);
        assert_eq!(back, text, "token {id} {s:?} -> {ids:?}");
    }
}

/// llama.cpp's test-tokenizer-1-spm, second half: every code point (surrogates,
/// U+40000..=U+E0000 and U+2581 `▁` excepted) round-trips.
#[test]
fn llama_spm_every_code_point_round_trips() {
    let tok = llama_spm();
    for cp in 0..0x11_0000u32 {
        if (0x4_0000..=0xE_0000).contains(&cp) || cp == 0x2581 {
            continue;
        }
        let Some(c) = char::from_u32(cp) else {
            continue;
        };
        let s = c.to_string();
        let ids = tok.encode(&s, false, true);
        let back = tok.detokenize(&ids, false, true);
        assert_eq!(back, s.as_bytes(), "U+{cp:04X} -> {ids:?}");
    }
}

/// Feeds `ids` through a decoder, checking that what it has returned so far is always a prefix
/// of the one-shot text of the ids so far and never lags far behind it; returns the whole
/// streamed text.
fn stream(tok: &Tokenizer, ids: &[u32], special: bool) -> Result<String, TestCaseError> {
    let mut dec = StreamDecoder::new(special);
    let mut got = String::new();
    for (k, &id) in ids.iter().enumerate() {
        got.push_str(&dec.push(tok, id));
        let so_far =
            String::from_utf8_lossy(&tok.detokenize(&ids[..=k], false, special)).into_owned();
        prop_assert!(
            so_far.starts_with(&got),
            "after {:?}: streamed {got:?}, one-shot {so_far:?}",
            &ids[..=k]
        );
        // Held back at most a partial character and a few bytes of clean-up look-ahead.
        prop_assert!(so_far.len() - got.len() <= 12, "{so_far:?} vs {got:?}");
    }
    got.push_str(&dec.finish());
    Ok(got)
}

/// Ids from across the vocabulary, with extra weight on the ones that make decoding hard:
/// lone bytes, special tokens, the punctuation the clean-up rules look at, ids past the end.
fn ids_strategy(tok: &'static Tokenizer) -> impl Strategy<Value = Vec<u32>> {
    let v = tok.vocab();
    let n = v.len() as u32;
    let mut tricky: Vec<u32> = (0..n)
        .filter(|&id| {
            let a = v.attr(id);
            a.has(TokenAttr::BYTE)
                || a.has(TokenAttr::CONTROL)
                || a.has(TokenAttr::USER_DEFINED)
                || {
                    let piece = tok.token_to_piece(id, true);
                    !piece.is_empty()
                        && piece.len() <= 3
                        && (std::str::from_utf8(&piece).is_err()
                            || piece.iter().all(|b| b" '?!.,smrevtdl".contains(b)))
                }
        })
        .collect();
    tricky.extend([n, n + 1]);
    let tricky = prop::sample::select(tricky);
    let any = 0..n;
    prop::collection::vec(prop_oneof![any, tricky], 0..24)
}

fn check_stream(tok: &'static Tokenizer, cases: u32) {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(cases));
    runner
        .run(&(ids_strategy(tok), any::<bool>()), |(ids, special)| {
            let got = stream(tok, &ids, special)?;
            let want = String::from_utf8_lossy(&tok.detokenize(&ids, false, special)).into_owned();
            prop_assert_eq!(got, want, "ids {:?} special {}", ids, special);
            Ok(())
        })
        .unwrap();
}

#[test]
fn stream_equals_one_shot_llama_spm() {
    check_stream(llama_spm(), 128);
}

#[test]
fn stream_equals_one_shot_qwen2() {
    check_stream(qwen2(), 128);
}

#[test]
fn stream_equals_one_shot_gemma4() {
    assert!(gemma4().vocab().clean_spaces);
    check_stream(gemma4(), 128);
}

#[test]
fn stream_equals_one_shot_smollm2() {
    check_stream(smollm2(), 128);
}

#[test]
fn stream_equals_one_shot_gpt2_clean_spaces() {
    assert!(gpt2().vocab().clean_spaces);
    check_stream(gpt2(), 128);
}

/// A continuation decoder keeps the first piece's space: its text is the pieces joined.
#[test]
fn continuation_keeps_the_first_space() {
    let tok = llama_spm();
    assert!(!tok.vocab().clean_spaces);
    let ids = tok.encode("Hello wörld 🦙", false, false);
    let mut dec = StreamDecoder::continuation(false);
    let mut got = String::new();
    for &id in &ids {
        got.push_str(&dec.push(tok, id));
    }
    got.push_str(&dec.finish());
    assert_eq!(got, " Hello wörld 🦙");
    // The same ids through `new` lose that space, as the one-shot detokenizer does.
    let mut dec = StreamDecoder::new(false);
    let mut got = String::new();
    for &id in &ids {
        got.push_str(&dec.push(tok.vocab(), id));
    }
    got.push_str(&dec.finish());
    assert_eq!(got, "Hello wörld 🦙");
}

/// An emoji split into byte tokens is returned whole once its last byte arrives; a sequence
/// cut short becomes U+FFFD at `finish`.
#[test]
fn stream_holds_partial_characters() {
    let tok = llama_spm();
    let bytes = "🦙".as_bytes();
    let ids: Vec<u32> = bytes
        .iter()
        .map(|b| id_of(tok, &format!("<0x{b:02X}>")))
        .collect();
    let mut dec = StreamDecoder::new(false);
    for &id in &ids[..3] {
        assert_eq!(dec.push(tok, id), "");
    }
    assert_eq!(dec.push(tok, ids[3]), "🦙");
    assert_eq!(dec.finish(), "");

    let mut dec = StreamDecoder::new(false);
    assert_eq!(dec.push(tok, ids[0]), "");
    assert_eq!(dec.push(tok, ids[1]), "");
    assert_eq!(dec.finish(), "\u{FFFD}");
    // An invalid sequence is replaced as soon as it is known to be invalid.
    let a = id_of(tok, "▁a");
    let mut dec = StreamDecoder::continuation(false);
    assert_eq!(dec.push(tok, ids[0]), "");
    assert_eq!(dec.push(tok, a), "\u{FFFD} a");
}

/// The texts of llama.cpp's SentencePiece test cases (`.inp`) come back unchanged from
/// detokenize(encode(text)), as the round-trip guarantee above implies for SentencePiece
/// vocabularies (no clean-up rules apply to them).
#[test]
fn spm_test_texts_round_trip() {
    for name in ["ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"] {
        let tok = load(name);
        assert!(!tok.vocab().clean_spaces);
        let path = vocab_path(name).with_extension("gguf.inp");
        let inp = std::fs::read_to_string(path).expect("read .inp");
        let texts: Vec<&str> = inp
            .strip_suffix("\n__ggml_vocab_test__\n")
            .unwrap_or(&inp)
            .split("\n__ggml_vocab_test__\n")
            .collect();
        assert!(texts.len() > 10);
        for text in texts {
            let ids = tok.encode(text, false, false);
            let back = tok.detokenize(&ids, false, false);
            assert_eq!(back, text.as_bytes(), "{name}: {text:?} {ids:?}");
        }
    }
}
