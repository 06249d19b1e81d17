//! Vocabulary loading and tokenization checked against llama.cpp's own vocabulary test files
//! (`models/ggml-vocab-*.gguf` with the `.inp`/`.out` pairs its `test-tokenizer-0` uses, from the
//! llama-cpp-python 0.3.36 source distribution) and real vocab-only GGUF files; all fetched by
//! `scripts/fetch_text_fixtures.sh`.

mod common;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use gguf::{ArrayValue, GgufFile, GgufWriter, Value};
use text::{PreType, TextError, TokenAttr, Tokenizer, VocabKind};

/// Loads each fixture vocabulary once per test binary.
fn load(name: &str) -> &'static Tokenizer {
    static CACHE: OnceLock<Mutex<HashMap<String, &'static Tokenizer>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(t) = cache.lock().unwrap().get(name) {
        return t;
    }
    let file = GgufFile::open(common::vocab_path(name)).unwrap();
    let tok = Tokenizer::from_metadata(file.metadata()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let tok: &'static Tokenizer = Box::leak(Box::new(tok));
    cache.lock().unwrap().insert(name.to_owned(), tok);
    tok
}

/// Every case of a llama.cpp vocabulary test encodes to the expected ids; as in
/// `test-tokenizer-0`, without BOS/EOS and without parsing special-token text.
fn check_reference(name: &str) {
    let tok = load(name);
    let cases = common::read_cases(name);
    assert!(!cases.is_empty());
    let mut failures = Vec::new();
    for (input, expected) in &cases {
        let got = tok.encode(input, false, false);
        if &got != expected {
            failures.push(format!(
                "  {input:?}\n    expected {expected:?}\n    got      {got:?}"
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
fn reference_gpt2() {
    check_reference("ggml-vocab-gpt-2.gguf");
}

#[test]
fn reference_llama_bpe() {
    check_reference("ggml-vocab-llama-bpe.gguf");
}

#[test]
fn reference_qwen2() {
    check_reference("ggml-vocab-qwen2.gguf");
}

#[test]
fn reference_qwen35() {
    check_reference("ggml-vocab-qwen35.gguf");
}

#[test]
fn reference_deepseek_llm() {
    check_reference("ggml-vocab-deepseek-llm.gguf");
}

#[test]
fn reference_deepseek_coder() {
    check_reference("ggml-vocab-deepseek-coder.gguf");
}

#[test]
fn reference_falcon() {
    check_reference("ggml-vocab-falcon.gguf");
}

#[test]
fn reference_mpt() {
    check_reference("ggml-vocab-mpt.gguf");
}

#[test]
fn reference_starcoder() {
    check_reference("ggml-vocab-starcoder.gguf");
}

#[test]
fn reference_refact() {
    check_reference("ggml-vocab-refact.gguf");
}

#[test]
fn reference_command_r() {
    check_reference("ggml-vocab-command-r.gguf");
}

#[test]
fn reference_gemma4() {
    check_reference("ggml-vocab-gemma-4.gguf");
}

/// SentencePiece vocabularies (the merge session lives in the `spm` module).
#[test]
fn reference_spm() {
    check_reference("ggml-vocab-llama-spm.gguf");
    check_reference("ggml-vocab-phi-3.gguf");
}

#[test]
fn bert_vocab_is_refused_as_unsupported() {
    let file = GgufFile::open(common::vocab_path("ggml-vocab-bert-bge.gguf")).unwrap();
    match Tokenizer::from_metadata(file.metadata()) {
        Err(TextError::UnsupportedModel(m)) => assert_eq!(m, "bert"),
        other => panic!("expected UnsupportedModel, got {other:?}"),
    }
}

/// The real vocab-only GGUFs and the qwen2 vocabulary relabelled with each pre-tokenizer load,
/// get the pre type their string names, and tokenize text into ids of the vocabulary.
#[test]
fn real_and_relabelled_vocabs_load() {
    let cases: &[(&str, PreType)] = &[
        ("smollm2-135m.gguf", PreType::Smollm),
        ("qwen2.5-coder-1.5b.gguf", PreType::Qwen2),
        ("synth-pre-default.gguf", PreType::Default),
        ("synth-pre-llama3.gguf", PreType::Llama3),
        ("synth-pre-deepseek-v3.gguf", PreType::Deepseek3Llm),
        ("synth-pre-gpt-4o.gguf", PreType::Gpt4o),
        ("synth-pre-smollm.gguf", PreType::Smollm),
        ("synth-pre-glm4.gguf", PreType::ChatGlm4),
        ("synth-pre-kimi-k2.gguf", PreType::KimiK2),
        ("synth-pre-tekken.gguf", PreType::Tekken),
        ("synth-pre-deepseek-llm.gguf", PreType::DeepseekLlm),
        ("synth-pre-gpt-2.gguf", PreType::Gpt2),
        ("synth-pre-starcoder.gguf", PreType::Starcoder),
        ("synth-pre-qwen35.gguf", PreType::Qwen35),
    ];
    let text = "Hello world! 12345 can't  Ünïcödé 你好世界 \n\n\tend";
    for &(name, pre) in cases {
        let tok = load(name);
        let v = tok.vocab();
        assert_eq!(v.kind, VocabKind::Bpe, "{name}");
        assert_eq!(v.pre, pre, "{name}");
        let ids = tok.encode(text, false, false);
        assert!(!ids.is_empty(), "{name}");
        assert!(ids.iter().all(|&id| (id as usize) < v.len()), "{name}");
        // Byte-level BPE loses nothing: the pieces' texts concatenate to the byte-encoded input.
        let joined: String = ids
            .iter()
            .map(|&id| v.tokens[id as usize].text.as_str())
            .collect();
        assert_eq!(joined.chars().count(), text.len(), "{name}: {ids:?}");
        assert_eq!(v.special.nl, v.token_to_id.get("Ċ").copied(), "{name}");
    }
}

#[test]
fn qwen_special_ids_and_flags() {
    let tok = load("qwen2.5-coder-1.5b.gguf");
    let v = tok.vocab();
    let id = |t: &str| v.token_to_id[t];
    assert_eq!(v.special.eos, Some(id("<|im_end|>")));
    assert_eq!(v.special.bos, Some(id("<|endoftext|>")));
    assert_eq!(v.special.eot, Some(id("<|im_end|>")));
    assert_eq!(v.special.fim_pre, Some(id("<|fim_prefix|>")));
    assert_eq!(v.special.fim_sep, Some(id("<|file_sep|>")));
    for t in [
        "<|im_end|>",
        "<|endoftext|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ] {
        assert!(v.eog.contains(&id(t)), "{t} should end generation");
    }
    assert!(!v.eog.contains(&id("<|im_start|>")));
    assert!(
        !v.add_bos,
        "tokenizer.ggml.add_bos_token is false in the file"
    );
    assert!(!v.clean_spaces, "qwen2 turns clean_spaces off");
    // The cache holds control tokens, longest text first.
    let cache = &v.special_tokens_cache;
    assert!(cache.contains(&id("<|im_start|>")));
    assert!(
        cache
            .windows(2)
            .all(|w| v.tokens[w[0] as usize].text.len() >= v.tokens[w[1] as usize].text.len())
    );
    assert!(v.attr(id("<|im_start|>")).has(TokenAttr::CONTROL));
}

#[test]
fn special_text_is_parsed_only_when_asked() {
    let tok = load("qwen2.5-coder-1.5b.gguf");
    let v = tok.vocab();
    let start = v.token_to_id["<|im_start|>"];
    let end = v.token_to_id["<|im_end|>"];
    let text = "<|im_start|>user\nhi<|im_end|>";
    let parsed = tok.encode(text, false, true);
    assert_eq!(parsed.first(), Some(&start));
    assert_eq!(parsed.last(), Some(&end));
    assert_eq!(
        parsed.iter().filter(|&&t| t == start || t == end).count(),
        2
    );
    let raw = tok.encode(text, false, false);
    assert!(!raw.contains(&start) && !raw.contains(&end));
    // The text between the special tokens is tokenized as on its own.
    let inner = tok.encode("user\nhi", false, false);
    assert_eq!(&parsed[1..parsed.len() - 1], inner.as_slice());
}

#[test]
fn bos_and_eos_follow_the_flags() {
    // llama-bpe: the llama3 pre-tokenizer turns add_bos on; its BOS is the file's.
    let tok = load("ggml-vocab-llama-bpe.gguf");
    let v = tok.vocab();
    assert!(v.add_bos && !v.add_eos);
    let plain = tok.encode("Hello", false, false);
    let with = tok.encode("Hello", true, false);
    assert_eq!(with[0], v.special.bos.unwrap());
    assert_eq!(&with[1..], plain.as_slice());
    assert_eq!(tok.encode("", true, false), vec![v.special.bos.unwrap()]);
    assert!(tok.encode("", false, false).is_empty());
}

/// Metadata of a small GGUF written in memory.
fn metadata(entries: Vec<(&str, Value)>) -> gguf::Metadata {
    let mut w = GgufWriter::new();
    for (k, v) in entries {
        w.add_metadata(k, v).unwrap();
    }
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    gguf::Gguf::parse(&bytes).unwrap().metadata().clone()
}

fn tiny_bpe(model: &str, pre: Option<&str>) -> gguf::Metadata {
    let mut entries = vec![
        ("tokenizer.ggml.model", Value::String(model.into())),
        (
            "tokenizer.ggml.tokens",
            Value::Array(ArrayValue::String(vec![
                "a".into(),
                "b".into(),
                "ab".into(),
            ])),
        ),
        (
            "tokenizer.ggml.merges",
            Value::Array(ArrayValue::String(vec!["a b".into()])),
        ),
    ];
    if let Some(p) = pre {
        entries.push(("tokenizer.ggml.pre", Value::String(p.into())));
    }
    metadata(entries)
}

#[test]
fn unknown_pre_is_refused_by_name() {
    match Tokenizer::from_metadata(&tiny_bpe("gpt2", Some("no-such-pre"))) {
        Err(e @ TextError::UnknownPre(_)) => assert!(e.to_string().contains("no-such-pre")),
        other => panic!("expected UnknownPre, got {other:?}"),
    }
}

#[test]
fn unsupported_models_are_refused_by_name() {
    for model in ["bert", "t5", "rwkv", "plamo2", "no_vocab", "whatever"] {
        match Tokenizer::from_metadata(&tiny_bpe(model, None)) {
            Err(e @ TextError::UnsupportedModel(_)) => assert!(e.to_string().contains(model)),
            other => panic!("{model}: expected UnsupportedModel, got {other:?}"),
        }
    }
}

#[test]
fn missing_and_mistyped_keys_name_the_key() {
    let e = Tokenizer::from_metadata(&metadata(vec![])).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.model"), "{e}");
    let e = Tokenizer::from_metadata(&metadata(vec![(
        "tokenizer.ggml.model",
        Value::String("gpt2".into()),
    )]))
    .unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.merges"), "{e}");
    let e = Tokenizer::from_metadata(&metadata(vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", Value::U32(3)),
    ]))
    .unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.tokens"), "{e}");
}

#[test]
fn missing_pre_is_default_and_merges_apply() {
    let tok = Tokenizer::from_metadata(&tiny_bpe("gpt2", None)).unwrap();
    assert_eq!(tok.vocab().pre, PreType::Default);
    assert_eq!(tok.encode("ab", false, false), vec![2]);
    assert_eq!(tok.encode("ba", false, false), vec![1, 0]);
}

#[test]
fn kimi_k2_needs_no_merges() {
    let meta = metadata(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("kimi-k2".into())),
        (
            "tokenizer.ggml.tokens",
            Value::Array(ArrayValue::String(vec![
                "a".into(),
                "b".into(),
                "ab".into(),
            ])),
        ),
    ]);
    let tok = Tokenizer::from_metadata(&meta).unwrap();
    assert_eq!(tok.vocab().pre, PreType::KimiK2);
    assert!(tok.vocab().bpe_ranks.is_empty());
    // Without merges every character stays its own piece.
    assert_eq!(tok.encode("ab", false, false), vec![0, 1]);
}

/// Gemma 4: BPE over `▁`-escaped text, BOS always added, and its `</s>` is an ordinary token
/// because the vocabulary has `<|tool_response>`.
#[test]
fn gemma4_flags_and_end_tokens() {
    let tok = load("ggml-vocab-gemma-4.gguf");
    let v = tok.vocab();
    assert_eq!(v.kind, VocabKind::Bpe);
    assert_eq!(v.pre, PreType::Gemma4);
    assert!(v.escape_whitespaces && v.add_bos);
    let id = |t: &str| v.token_to_id[t];
    assert!(v.eog.contains(&id("<turn|>")));
    assert!(v.eog.contains(&id("<|tool_response>")));
    assert!(!v.eog.contains(&id("</s>")));
    assert_eq!(v.attr(id("</s>")), TokenAttr::NORMAL);
    assert_eq!(v.special.nl, v.token_to_id.get("\n").copied());
}
