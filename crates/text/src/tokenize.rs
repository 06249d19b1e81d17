//! Text to ids: special-token partitioning, then the vocabulary's algorithm per fragment.

use crate::{TokenAttr, Vocab, VocabKind};

/// A piece of the input after special-token partitioning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fragment {
    /// A byte range of the input still to tokenize.
    Text(usize, usize),
    /// A special token found in the text.
    Token(u32),
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Splits the text at every occurrence of the cached special tokens, as llama.cpp's
/// `tokenizer_st_partition`: tokens are tried longest first, each over every text fragment left
/// so far, left to right. Without `parse_special` only user-defined tokens are split out.
/// LSTRIP/RSTRIP tokens eat the ASCII whitespace to their left/right.
fn partition(vocab: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
    let mut frags = vec![Fragment::Text(0, text.len())];
    let bytes = text.as_bytes();
    for &id in &vocab.special_tokens_cache {
        let Some(tok) = vocab.tokens.get(id as usize) else {
            continue;
        };
        let attr = tok.attr;
        if !parse_special && attr.any(TokenAttr(TokenAttr::CONTROL.0 | TokenAttr::UNKNOWN.0)) {
            continue;
        }
        let needle = tok.text.as_str();
        if needle.is_empty() {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len());
        for frag in frags {
            let Fragment::Text(mut off, mut len) = frag else {
                next.push(frag);
                continue;
            };
            loop {
                let hay = &text[off..off + len];
                let Some(rel) = hay.find(needle) else {
                    if len > 0 {
                        next.push(Fragment::Text(off, len));
                    }
                    break;
                };
                let at = off + rel;
                if at > off {
                    let mut left_len = at - off;
                    if attr.has(TokenAttr::LSTRIP) {
                        while left_len > 0 && is_c_space(bytes[off + left_len - 1]) {
                            left_len -= 1;
                        }
                    }
                    if left_len > 0 {
                        next.push(Fragment::Text(off, left_len));
                    }
                }
                next.push(Fragment::Token(id));
                let end = at + needle.len();
                if end < off + len {
                    let mut r_off = end;
                    let mut r_len = off + len - end;
                    if attr.has(TokenAttr::RSTRIP) {
                        while r_len > 0 && is_c_space(bytes[r_off]) {
                            r_off += 1;
                            r_len -= 1;
                        }
                    }
                    off = r_off;
                    len = r_len;
                    if len == 0 {
                        break;
                    }
                } else {
                    break;
                }
            }
        }
        frags = next;
    }
    frags
}

pub(crate) fn encode(
    vocab: &Vocab,
    text: &str,
    add_special: bool,
    parse_special: bool,
) -> Vec<u32> {
    let frags = if text.is_empty() {
        Vec::new()
    } else {
        partition(vocab, text, parse_special)
    };
    let mut out = Vec::new();
    match vocab.kind {
        VocabKind::Spm => {
            let mut prev_special = true;
            if add_special
                && vocab.add_bos
                && let Some(bos) = vocab.special.bos
            {
                out.push(bos);
            }
            for frag in frags {
                match frag {
                    Fragment::Text(off, len) => {
                        let mut s = String::with_capacity(len + 4);
                        if vocab.add_space_prefix && prev_special {
                            s.push(' ');
                        }
                        s.push_str(&text[off..off + len]);
                        let escaped = s.replace(' ', "\u{2581}");
                        crate::spm::tokenize(vocab, &escaped, &mut out);
                        prev_special = false;
                    }
                    Fragment::Token(id) => {
                        out.push(id);
                        prev_special = true;
                    }
                }
            }
            if add_special
                && vocab.add_eos
                && let Some(eos) = vocab.special.eos
            {
                out.push(eos);
            }
        }
        VocabKind::Bpe => {
            if add_special
                && vocab.add_bos
                && let Some(bos) = vocab.special.bos
            {
                out.push(bos);
            }
            for frag in frags {
                match frag {
                    Fragment::Text(off, len) => {
                        let raw = &text[off..off + len];
                        if vocab.escape_whitespaces {
                            let escaped = raw.replace(' ', "\u{2581}");
                            crate::bpe::tokenize_fragment(vocab, &escaped, &mut out);
                        } else {
                            crate::bpe::tokenize_fragment(vocab, raw, &mut out);
                        }
                    }
                    Fragment::Token(id) => out.push(id),
                }
            }
            if add_special
                && vocab.add_eos
                && let Some(eos) = vocab.special.eos
            {
                out.push(eos);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use super::*;
    use crate::{PreType, SpecialIds, TokenData};

    fn vocab() -> Vocab {
        let toks = [
            ("a", TokenAttr::NORMAL),
            ("<x>", TokenAttr(TokenAttr::CONTROL.0 | TokenAttr::LSTRIP.0)),
            (
                "<y>",
                TokenAttr(TokenAttr::USER_DEFINED.0 | TokenAttr::RSTRIP.0),
            ),
            ("<long>", TokenAttr::CONTROL),
        ];
        let tokens: Vec<TokenData> = toks
            .iter()
            .map(|&(t, attr)| TokenData {
                text: t.into(),
                score: 0.0,
                attr,
            })
            .collect();
        let token_to_id = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.text.clone(), i as u32))
            .collect();
        Vocab {
            kind: VocabKind::Bpe,
            pre: PreType::Gpt2,
            model_name: "gpt2".into(),
            pre_name: "gpt-2".into(),
            tokens,
            token_to_id,
            special: SpecialIds::default(),
            eog: BTreeSet::new(),
            add_bos: false,
            add_eos: false,
            add_sep: false,
            add_space_prefix: false,
            remove_extra_whitespaces: false,
            escape_whitespaces: false,
            treat_whitespace_as_suffix: false,
            clean_spaces: false,
            ignore_merges: false,
            special_tokens_cache: vec![3, 1, 2],
            bpe_ranks: HashMap::new(),
        }
    }

    fn texts(text: &str, frags: &[Fragment]) -> Vec<String> {
        frags
            .iter()
            .map(|f| match *f {
                Fragment::Text(o, l) => text[o..o + l].to_owned(),
                Fragment::Token(id) => format!("#{id}"),
            })
            .collect()
    }

    #[test]
    fn partition_strips_around_lstrip_and_rstrip_tokens() {
        let v = vocab();
        let text = "a  <x>  b<y>  c<y>";
        assert_eq!(
            texts(text, &partition(&v, text, true)),
            ["a", "#1", "  b", "#2", "c", "#2"]
        );
    }

    #[test]
    fn without_parse_special_only_user_defined_tokens_split() {
        let v = vocab();
        let text = "<long>a  <x>  b<y>  c";
        assert_eq!(
            texts(text, &partition(&v, text, false)),
            ["<long>a  <x>  b", "#2", "c"]
        );
        assert_eq!(
            texts(text, &partition(&v, text, true)),
            ["#3", "a", "#1", "  b", "#2", "c"]
        );
    }

    #[test]
    fn a_token_eating_all_space_leaves_no_empty_fragment() {
        let v = vocab();
        let text = "  <x><y>   ";
        assert_eq!(texts(text, &partition(&v, text, true)), ["#1", "#2"]);
    }
}
