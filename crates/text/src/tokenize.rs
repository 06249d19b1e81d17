//! Text to ids: special-token partitioning, then the vocabulary's algorithm per fragment.

use crate::Vocab;

pub(crate) fn encode(
    _vocab: &Vocab,
    _text: &str,
    _add_special: bool,
    _parse_special: bool,
) -> Vec<u32> {
    Vec::new()
}
