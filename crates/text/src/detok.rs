//! Ids back to text.

use crate::Vocab;

pub(crate) fn token_to_piece(_vocab: &Vocab, _id: u32, _special: bool) -> Vec<u8> {
    Vec::new()
}

pub(crate) fn detokenize(
    _vocab: &Vocab,
    _ids: &[u32],
    _remove_special: bool,
    _unparse_special: bool,
) -> Vec<u8> {
    Vec::new()
}

/// Streams the text of generated tokens, never splitting a UTF-8 sequence.
#[derive(Debug, Default)]
pub struct StreamDecoder {}
