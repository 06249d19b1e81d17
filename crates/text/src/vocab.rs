//! The vocabulary as read from `tokenizer.*` metadata.

use std::collections::{BTreeSet, HashMap};

use crate::TextError;

/// Which tokenizer algorithm a vocabulary uses (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE (`gpt2`, and Gemma 4's `gemma4`, which is BPE over SentencePiece-style text).
    Bpe,
    /// SentencePiece-style (`llama`): score-driven merges, `▁` for spaces, byte fallback.
    Spm,
}

/// The pre-tokenizer (`tokenizer.ggml.pre`): how text is split before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreType {
    Default,
}

/// Token attributes, as llama.cpp's `llama_token_attr` bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct TokenAttr(pub u32);

impl TokenAttr {
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    pub const NORMALIZED: TokenAttr = TokenAttr(1 << 6);
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);
    pub const SINGLE_WORD: TokenAttr = TokenAttr(1 << 9);

    /// Whether every bit of `other` is set.
    pub fn has(self, other: TokenAttr) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }
}

/// One vocabulary entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenData {
    pub text: String,
    pub score: f32,
    pub attr: TokenAttr,
}

/// Special token ids (None where the vocabulary has none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    /// The id of the newline token (`<0x0A>` for SentencePiece, `Ċ` for byte-level BPE).
    pub nl: Option<u32>,
}

/// A vocabulary with everything the tokenizer and detokenizer need.
#[derive(Debug, Clone)]
pub struct Vocab {
    pub kind: VocabKind,
    pub pre: PreType,
    /// `tokenizer.ggml.model` and `tokenizer.ggml.pre` as written in the file.
    pub model_name: String,
    pub pre_name: String,
    pub tokens: Vec<TokenData>,
    pub token_to_id: HashMap<String, u32>,
    pub special: SpecialIds,
    /// End-of-generation ids.
    pub eog: BTreeSet<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_sep: bool,
    pub add_space_prefix: bool,
    pub remove_extra_whitespaces: bool,
    pub escape_whitespaces: bool,
    pub treat_whitespace_as_suffix: bool,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    /// Ids of control/user-defined tokens, in the order special-text partitioning tries them.
    pub special_tokens_cache: Vec<u32>,
    /// BPE merge ranks (empty for SentencePiece).
    pub bpe_ranks: HashMap<(String, String), u32>,
}

impl Vocab {
    /// Reads the vocabulary from metadata.
    pub fn from_metadata(_meta: &gguf::Metadata) -> Result<Self, TextError> {
        Err(TextError::MissingKey("tokenizer.ggml.model".into()))
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The attributes of a token (UNDEFINED for an out-of-range id).
    pub fn attr(&self, id: u32) -> TokenAttr {
        self.tokens
            .get(id as usize)
            .map_or(TokenAttr::UNDEFINED, |t| t.attr)
    }
}
