//! SentencePiece-style tokenization (score-driven merges, byte fallback).

use crate::Vocab;

/// Tokenizes one fragment whose spaces are already escaped (`▁`) and prefixed as the vocabulary
/// asks, appending the ids to `out`.
pub(crate) fn tokenize(_vocab: &Vocab, _text: &str, _out: &mut Vec<u32>) {}
