//! SentencePiece-style tokenization (score-driven merges, byte fallback), as llama.cpp's SPM
//! tokenizer session does it.
//!
//! The fragment is split into characters; every adjacent pair whose concatenation is a vocabulary
//! token is a merge candidate, ranked by that token's score (highest first, the left-most pair on
//! a tie). Merging repeats until no candidate is left. Each remaining symbol is then emitted as
//! its token, or — a character with no token of its own — as one `<0xXX>` byte token per UTF-8
//! byte.
//!
//! llama.cpp also keeps a table to split a non-token symbol back into the pair it was merged
//! from. Every merged symbol is a token by construction and a single character can never equal
//! the concatenation of two characters, so that table is never consulted; it is left out here.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::Vocab;

/// A symbol of the fragment: a byte range of the text, linked to its neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A merge candidate: symbols `left` and `right` (adjacent when queued) whose joined text is a
/// token with score `score` and `size` bytes.
#[derive(Debug, Clone, Copy)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl Bigram {
    /// The score with -0.0 folded into 0.0, so that the total order below agrees with `<`
    /// for every non-NaN score.
    fn key(&self) -> f32 {
        if self.score == 0.0 { 0.0 } else { self.score }
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    /// Greater = popped first: the higher score, then the smaller left index.
    fn cmp(&self, other: &Self) -> Ordering {
        self.key()
            .total_cmp(&other.key())
            .then_with(|| other.left.cmp(&self.left))
    }
}

struct Session<'a> {
    vocab: &'a Vocab,
    text: &'a str,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

impl Session<'_> {
    fn try_add_bigram(&mut self, left: Option<usize>, right: Option<usize>) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let l = self.symbols[left];
        let r = self.symbols[right];
        let size = l.len + r.len;
        let joined = &self.text[l.start..l.start + size];
        let Some(&id) = self.vocab.token_to_id.get(joined) else {
            return;
        };
        let Some(token) = self.vocab.tokens.get(id as usize) else {
            return;
        };
        self.queue.push(Bigram {
            left,
            right,
            score: token.score,
            size,
        });
    }

    fn run(&mut self, out: &mut Vec<u32>) {
        for i in 1..self.symbols.len() {
            self.try_add_bigram(Some(i - 1), Some(i));
        }

        while let Some(bigram) = self.queue.pop() {
            let l = self.symbols[bigram.left];
            let r = self.symbols[bigram.right];
            // Stale candidate: one side was merged away or has grown since it was queued.
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                continue;
            }
            self.symbols[bigram.left].len = l.len + r.len;
            self.symbols[bigram.right].len = 0;
            self.symbols[bigram.left].next = r.next;
            if let Some(n) = r.next {
                self.symbols[n].prev = Some(bigram.left);
            }
            self.try_add_bigram(l.prev, Some(bigram.left));
            self.try_add_bigram(Some(bigram.left), r.next);
        }

        let mut cur = if self.symbols.is_empty() {
            None
        } else {
            Some(0)
        };
        while let Some(i) = cur {
            let s = self.symbols[i];
            let piece = &self.text[s.start..s.start + s.len];
            match self.vocab.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        if let Some(id) = byte_to_token(self.vocab, b) {
                            out.push(id);
                        }
                    }
                }
            }
            cur = s.next;
        }
    }
}

/// The token of one raw byte in a SentencePiece vocabulary: `<0xXX>` (upper-case hex), else the
/// one-character token of that byte when it is ASCII.
///
/// Where neither exists llama.cpp fails (an out-of-range lookup); here the unknown token stands
/// in, and with no unknown token the byte is dropped.
pub(crate) fn byte_to_token(vocab: &Vocab, byte: u8) -> Option<u32> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let name = [
        b'<',
        b'0',
        b'x',
        HEX[usize::from(byte >> 4)],
        HEX[usize::from(byte & 15)],
        b'>',
    ];
    // The name is ASCII, hence valid UTF-8.
    let name = std::str::from_utf8(&name).unwrap_or_default();
    if let Some(&id) = vocab.token_to_id.get(name) {
        return Some(id);
    }
    if byte.is_ascii() {
        let one = [byte];
        let one = std::str::from_utf8(&one).unwrap_or_default();
        if let Some(&id) = vocab.token_to_id.get(one) {
            return Some(id);
        }
    }
    vocab.special.unk
}

/// Tokenizes one fragment whose spaces are already escaped (`▁`) and prefixed as the vocabulary
/// asks, appending the ids to `out`.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols = Vec::with_capacity(text.len());
    let n_chars = text.chars().count();
    for (index, (start, ch)) in text.char_indices().enumerate() {
        symbols.push(Symbol {
            start,
            len: ch.len_utf8(),
            prev: index.checked_sub(1),
            next: (index + 1 < n_chars).then_some(index + 1),
        });
    }
    let mut session = Session {
        vocab,
        text,
        symbols,
        queue: BinaryHeap::new(),
    };
    session.run(out);
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use super::*;
    use crate::{PreType, SpecialIds, TokenAttr, TokenData, VocabKind};

    /// A small SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then
    /// `pieces` with their scores.
    fn vocab(pieces: &[(&str, f32)]) -> Vocab {
        let mut tokens = vec![
            TokenData {
                text: "<unk>".into(),
                score: 0.0,
                attr: TokenAttr::UNKNOWN,
            },
            TokenData {
                text: "<s>".into(),
                score: 0.0,
                attr: TokenAttr::CONTROL,
            },
            TokenData {
                text: "</s>".into(),
                score: 0.0,
                attr: TokenAttr::CONTROL,
            },
        ];
        for b in 0..=255u8 {
            tokens.push(TokenData {
                text: format!("<0x{b:02X}>"),
                score: 0.0,
                attr: TokenAttr::BYTE,
            });
        }
        for (text, score) in pieces {
            tokens.push(TokenData {
                text: (*text).into(),
                score: *score,
                attr: TokenAttr::NORMAL,
            });
        }
        let token_to_id: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.text.clone(), i as u32))
            .collect();
        Vocab {
            kind: VocabKind::Spm,
            pre: PreType::Default,
            model_name: "llama".into(),
            pre_name: String::new(),
            tokens,
            token_to_id,
            special: SpecialIds {
                bos: Some(1),
                eos: Some(2),
                unk: Some(0),
                ..SpecialIds::default()
            },
            eog: BTreeSet::from([2]),
            add_bos: true,
            add_eos: false,
            add_sep: false,
            add_space_prefix: true,
            remove_extra_whitespaces: false,
            escape_whitespaces: true,
            treat_whitespace_as_suffix: false,
            clean_spaces: false,
            ignore_merges: false,
            special_tokens_cache: vec![],
            bpe_ranks: HashMap::new(),
        }
    }

    fn ids(v: &Vocab, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        tokenize(v, text, &mut out);
        out
    }

    fn id(v: &Vocab, text: &str) -> u32 {
        v.token_to_id[text]
    }

    #[test]
    fn higher_score_merges_first() {
        let v = vocab(&[
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -5.0),
            ("bc", -2.0),
        ]);
        assert_eq!(ids(&v, "abc"), vec![id(&v, "a"), id(&v, "bc")]);
        let v = vocab(&[
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -2.0),
            ("bc", -5.0),
        ]);
        assert_eq!(ids(&v, "abc"), vec![id(&v, "ab"), id(&v, "c")]);
    }

    #[test]
    fn equal_scores_merge_leftmost_first() {
        let v = vocab(&[("a", -1.0), ("ab", -3.0), ("ba", -3.0)]);
        // "aba": ab (left 0) and ba (left 1) tie; the left-most wins.
        assert_eq!(ids(&v, "aba"), vec![id(&v, "ab"), id(&v, "a")]);
        let v = vocab(&[("a", -1.0), ("aa", -3.0)]);
        assert_eq!(ids(&v, "aaa"), vec![id(&v, "aa"), id(&v, "a")]);
        assert_eq!(ids(&v, "aaaa"), vec![id(&v, "aa"), id(&v, "aa")]);
    }

    #[test]
    fn merges_continue_on_merged_symbols() {
        let v = vocab(&[
            ("▁", -1.0),
            ("h", -1.0),
            ("i", -1.0),
            ("hi", -2.0),
            ("▁hi", -3.0),
        ]);
        assert_eq!(ids(&v, "▁hi"), vec![id(&v, "▁hi")]);
        // A zero-score merge ties with -0.0 and falls back to position.
        let v = vocab(&[("x", -1.0), ("y", -1.0), ("xy", -0.0), ("yx", 0.0)]);
        assert_eq!(ids(&v, "xyx"), vec![id(&v, "xy"), id(&v, "x")]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let v = vocab(&[("a", -1.0)]);
        // é is C3 A9; the byte tokens are ids 3 + byte.
        assert_eq!(ids(&v, "aé"), vec![id(&v, "a"), 3 + 0xC3, 3 + 0xA9]);
        assert_eq!(ids(&v, ""), Vec::<u32>::new());
    }

    #[test]
    fn missing_byte_tokens_use_unk() {
        let mut v = vocab(&[("a", -1.0)]);
        v.token_to_id.remove("<0xC3>");
        assert_eq!(ids(&v, "é"), vec![0, 3 + 0xA9]);
        // An ASCII byte may be found as its own one-character token.
        v.token_to_id.remove("<0x7A>");
        v.token_to_id.insert("z".into(), 5);
        assert_eq!(byte_to_token(&v, b'z'), Some(5));
    }
}
