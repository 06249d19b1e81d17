//! Tokenizers built from a GGUF file's `tokenizer.*` metadata, producing the same token ids and
//! the same text as llama.cpp.
//!
//! * [`Vocab`] — the vocabulary, token attributes, special ids and flags read from metadata.
//! * [`Tokenizer::encode`] — text to ids (byte-level BPE with the per-`pre` split rules, or
//!   SentencePiece-style), special-token text parsed only when asked.
//! * [`Tokenizer::token_to_piece`], [`Tokenizer::detokenize`] and [`StreamDecoder`] — ids back to
//!   text; the streaming decoder never emits a partial UTF-8 sequence.

mod bpe;
mod detok;
mod error;
mod spm;
mod tokenize;
mod unicode;
mod unicode_data;
mod vocab;

pub use detok::StreamDecoder;
pub use error::TextError;
pub use vocab::{PreType, SpecialIds, TokenAttr, TokenData, Vocab, VocabKind};

/// A tokenizer over one vocabulary.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    vocab: Vocab,
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata (the `tokenizer.*` keys).
    pub fn from_metadata(meta: &gguf::Metadata) -> Result<Self, TextError> {
        Ok(Self {
            vocab: Vocab::from_metadata(meta)?,
        })
    }

    /// Wraps an already loaded vocabulary.
    pub fn from_vocab(vocab: Vocab) -> Self {
        Self { vocab }
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Text to token ids, as llama.cpp's `llama_tokenize(text, add_special, parse_special)`:
    /// `add_special` adds BOS/EOS (and SEP) as the metadata asks; `parse_special` turns
    /// special-token text (such as `<|im_start|>`) into its id instead of tokenizing the characters.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        tokenize::encode(&self.vocab, text, add_special, parse_special)
    }

    /// The bytes one token stands for, as llama.cpp's `llama_token_to_piece(.., lstrip 0, special)`:
    /// control tokens give their text only when `special` is set. May be a partial UTF-8 sequence.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        detok::token_to_piece(&self.vocab, id, special)
    }

    /// Ids to bytes, as llama.cpp's `llama_detokenize(ids, remove_special, unparse_special)`.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        detok::detokenize(&self.vocab, ids, remove_special, unparse_special)
    }
}
