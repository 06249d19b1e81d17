//! Locating the third-party test data fetched by `scripts/fetch_text_fixtures.sh`.

#![allow(dead_code, unused_imports)]

pub use testdata::{text_dir as fixtures_dir, vocab_path};

/// The (input, expected ids) pairs of a llama.cpp `test-tokenizer-0` `.inp`/`.out` pair: inputs
/// are separated by a line `__ggml_vocab_test__`, outputs are one line of ids per input.
pub fn read_cases(vocab_file: &str) -> Vec<(String, Vec<u32>)> {
    let base = vocab_path(vocab_file);
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            Some(n) => {
                inputs.push(inp[pos..pos + n].to_owned());
                pos += n + sep.len();
            }
            None => {
                inputs.push(inp[pos..].to_owned());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{vocab_file}: .inp/.out case counts differ"
    );
    inputs.into_iter().zip(outputs).collect()
}
