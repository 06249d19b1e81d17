//! Ids back to text, as llama.cpp's `token_to_piece` and `detokenize`, and a streaming decoder
//! that yields the same text piece by piece without ever splitting a UTF-8 sequence.

use crate::{TokenAttr, Tokenizer, Vocab, VocabKind};

const ESCAPED_SPACE: &str = "\u{2581}";

/// The attributes whose tokens are shown only on request (`special`).
const HIDDEN: u32 = TokenAttr::UNKNOWN.0 | TokenAttr::CONTROL.0;

/// `▁` back to a space.
fn unescape_whitespace(text: &str) -> Vec<u8> {
    text.replace(ESCAPED_SPACE, " ").into_bytes()
}

/// The byte a `<0xXX>` token stands for: the hex digits at offsets 3..5 (as `strtol` reads
/// them: leading hex digits only, 0 when there are none).
fn byte_token_value(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..).unwrap_or_default();
    let mut value = 0u8;
    for &c in digits.iter().take(2) {
        let Some(d) = char::from(c).to_digit(16) else {
            break;
        };
        value = (value << 4) | d as u8;
    }
    value
}

/// Whether byte-level BPE writes byte `b` as the character of the same code point.
const fn byte_is_printable(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

/// Code points U+0100.. that stand for the non-printable bytes, in increasing byte order.
const SHIFTED_BYTES: [u8; 68] = {
    let mut table = [0u8; 68];
    let mut n = 0;
    let mut b = 0u32;
    while b < 256 {
        if !byte_is_printable(b) {
            table[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    table
};

/// The byte a character of byte-level BPE text stands for (GPT-2's byte-to-unicode table,
/// inverted): printable Latin-1 characters stand for themselves, U+0100..U+0143 for the other
/// 68 byte values in increasing order.
fn unicode_to_byte(c: char) -> Option<u8> {
    let cp = u32::from(c);
    if cp < 0x100 {
        return byte_is_printable(cp).then_some(cp as u8);
    }
    SHIFTED_BYTES.get((cp - 0x100) as usize).copied()
}

/// Byte-level BPE token text to the bytes it stands for. A character outside the table is
/// written as `[UNK_BYTE_0x<its UTF-8 in hex><the whole token text>]`, as llama.cpp does.
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match unicode_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// The bytes of one token, as llama.cpp's `token_to_piece(id, lstrip = 0, special)`.
pub(crate) fn token_to_piece(vocab: &Vocab, id: u32, special: bool) -> Vec<u8> {
    let Some(token) = vocab.tokens.get(id as usize) else {
        return Vec::new();
    };
    let attr = token.attr.0;
    if !special && attr & HIDDEN != 0 {
        return Vec::new();
    }
    // Control, unknown and user-defined tokens are their text verbatim.
    if attr & (HIDDEN | TokenAttr::USER_DEFINED.0) != 0 {
        return token.text.as_bytes().to_vec();
    }
    if attr & TokenAttr::NORMAL.0 != 0 {
        return match vocab.kind {
            VocabKind::Spm => unescape_whitespace(&token.text),
            VocabKind::Bpe if vocab.escape_whitespaces => unescape_whitespace(&token.text),
            VocabKind::Bpe => decode_byte_level(&token.text),
        };
    }
    if attr & TokenAttr::BYTE.0 != 0 {
        return vec![byte_token_value(&token.text)];
    }
    // Unused and undefined tokens have no text.
    Vec::new()
}

/// Ids to bytes, as llama.cpp's `detokenize(ids, remove_special, unparse_special)`.
///
/// With `remove_special`, a leading BOS and a trailing EOS are dropped when the vocabulary adds
/// them. A vocabulary that prefixes text with a space (`add_space_prefix`) has one leading space
/// removed from the first piece, unless a BOS was dropped. Then, for vocabularies with
/// `clean_spaces`, the spaces before `?!.,`, around a lone `'` and before `'s 'm 're 've` go.
pub(crate) fn detokenize(
    vocab: &Vocab,
    ids: &[u32],
    remove_special: bool,
    unparse_special: bool,
) -> Vec<u8> {
    let mut ids = ids;
    let mut remove_space = vocab.add_space_prefix;
    if remove_special
        && vocab.add_bos
        && vocab.special.bos.is_some()
        && ids.first().copied() == vocab.special.bos
    {
        remove_space = false;
        ids = &ids[1..];
    }
    if remove_special
        && vocab.add_eos
        && vocab.special.eos.is_some()
        && ids.last().copied() == vocab.special.eos
    {
        ids = &ids[..ids.len() - 1];
    }

    let mut text = Vec::new();
    for &id in ids {
        let piece = token_to_piece(vocab, id, unparse_special);
        let piece = if remove_space {
            piece.strip_prefix(b" ").unwrap_or(&piece)
        } else {
            &piece[..]
        };
        text.extend_from_slice(piece);
        remove_space = false;
    }

    if vocab.clean_spaces {
        clean_spaces(&mut text);
    }
    text
}

/// The three clean-up passes of llama.cpp's detokenizer, done in place over the bytes exactly
/// as it does them (the second pass blanks the space it consumes, which matters when a `'`
/// follows right after).
fn clean_spaces(text: &mut Vec<u8>) {
    // Pass 1: drop a space before ? ! . ,
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);

    // Pass 2: " ' " becomes "'".
    let n = text.len();
    let mut total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);

    // Pass 3: drop the space before 's 'm 're 've (not before 't 'd 'll).
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            let x2 = text.get(i + 2).copied();
            let drop = matches!(x1, b's' | b'm')
                || matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e')));
            if drop {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Anything that can lend its vocabulary to a [`StreamDecoder`]: a [`Vocab`] or a
/// [`Tokenizer`].
impl AsRef<Vocab> for Vocab {
    fn as_ref(&self) -> &Vocab {
        self
    }
}

impl AsRef<Vocab> for Tokenizer {
    fn as_ref(&self) -> &Vocab {
        self.vocab()
    }
}

/// Streams the text of tokens as they are generated, never splitting a UTF-8 sequence.
///
/// Fed ids one at a time with [`push`](Self::push) and closed with [`finish`](Self::finish),
/// the pieces returned concatenate to exactly
/// `String::from_utf8_lossy(&tokenizer.detokenize(ids, false, special))` for the whole id
/// sequence — including the removal of the first piece's leading space on vocabularies that
/// prefix text with one ([`new`](Self::new)), and the `clean_spaces` rules. To stream a
/// continuation of text already shown (generated tokens after a prompt), use
/// [`continuation`](Self::continuation), which keeps the first piece's space.
///
/// Text is held back only as long as it can still change: the bytes of an incomplete UTF-8
/// sequence, and on `clean_spaces` vocabularies a trailing space or `'` (up to three bytes)
/// whose fate depends on the next characters. Invalid UTF-8 becomes U+FFFD per invalid
/// sequence, as `from_utf8_lossy` does; an incomplete sequence still pending at `finish` becomes
/// one U+FFFD.
///
/// ```
/// fn show(tok: &text::Tokenizer, generated: &[u32]) -> String {
///     let mut dec = text::StreamDecoder::continuation(false);
///     let mut shown = String::new();
///     for &id in generated {
///         shown.push_str(&dec.push(tok, id)); // print it as it comes
///     }
///     shown.push_str(&dec.finish());
///     shown
/// }
/// ```
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    special: bool,
    /// Whether the next piece is the first (its leading space may be removed).
    first: bool,
    strip_first_space: bool,
    /// Vocabulary flag, captured on the first push.
    clean: Option<bool>,
    pass1: Pass1,
    pass2: Pass2,
    pass3: Pass3,
    /// Output bytes not yet returned (an incomplete UTF-8 sequence).
    utf8: Vec<u8>,
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self::new(false)
    }
}

impl StreamDecoder {
    /// A decoder whose output equals `detokenize(ids, false, special)` of all ids pushed:
    /// `special` shows control tokens (such as `<|im_end|>`) as their text.
    pub fn new(special: bool) -> Self {
        Self {
            special,
            first: true,
            strip_first_space: true,
            clean: None,
            pass1: Pass1::default(),
            pass2: Pass2::default(),
            pass3: Pass3::default(),
            utf8: Vec::new(),
        }
    }

    /// A decoder for tokens that continue earlier text: like [`new`](Self::new), except that
    /// the first piece keeps its leading space.
    pub fn continuation(special: bool) -> Self {
        Self {
            strip_first_space: false,
            ..Self::new(special)
        }
    }

    /// Adds one token and returns the text that is now final (possibly empty).
    pub fn push(&mut self, vocab: &impl AsRef<Vocab>, id: u32) -> String {
        let vocab = vocab.as_ref();
        let mut piece = token_to_piece(vocab, id, self.special);
        if self.first {
            self.first = false;
            if self.strip_first_space && vocab.add_space_prefix && piece.first() == Some(&b' ') {
                piece.remove(0);
            }
        }
        let clean = *self.clean.get_or_insert(vocab.clean_spaces);
        if clean {
            let mut a = Vec::with_capacity(piece.len() + 2);
            for &b in &piece {
                self.pass1.feed(b, &mut a);
            }
            let mut c = Vec::with_capacity(a.len() + 2);
            for b in a {
                self.pass2.feed(b, &mut c);
            }
            for b in c {
                self.pass3.feed(b, &mut self.utf8);
            }
        } else {
            self.utf8.extend_from_slice(&piece);
        }
        self.take_complete(false)
    }

    /// Ends the stream and returns the text still held back. The decoder is then ready for a
    /// new stream (its first piece treated as the first again).
    pub fn finish(&mut self) -> String {
        let mut a = Vec::new();
        self.pass1.flush(&mut a);
        let mut c = Vec::new();
        for b in a {
            self.pass2.feed(b, &mut c);
        }
        self.pass2.flush(&mut c);
        for b in c {
            self.pass3.feed(b, &mut self.utf8);
        }
        self.pass3.flush(&mut self.utf8);
        let out = self.take_complete(true);
        *self = Self {
            special: self.special,
            strip_first_space: self.strip_first_space,
            ..Self::new(self.special)
        };
        out
    }

    /// Decodes the pending bytes up to the last point that cannot change; with `all`, to the
    /// end (an incomplete trailing sequence becomes U+FFFD).
    fn take_complete(&mut self, all: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.utf8;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, tail) = rest.split_at(e.valid_up_to());
                    // The prefix was just validated.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &tail[n..];
                        }
                        None => {
                            if all {
                                out.push(char::REPLACEMENT_CHARACTER);
                                rest = &[];
                            } else {
                                rest = tail;
                            }
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.utf8.len() - keep;
        self.utf8.drain(..drop);
        out
    }
}

/// Streaming form of clean-up pass 1: a space is dropped when `?!.,` follows it.
#[derive(Debug, Clone, Default)]
struct Pass1 {
    space: bool,
}

impl Pass1 {
    fn feed(&mut self, b: u8, out: &mut Vec<u8>) {
        if self.space {
            self.space = false;
            if !matches!(b, b'?' | b'!' | b'.' | b',') {
                out.push(b' ');
            }
        }
        if b == b' ' {
            self.space = true;
        } else {
            out.push(b);
        }
    }

    fn flush(&mut self, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.space) {
            out.push(b' ');
        }
    }
}

/// Streaming form of clean-up pass 2: " ' " becomes "'"; the space it consumes cannot start
/// another match.
#[derive(Debug, Clone, Default)]
struct Pass2 {
    /// Pending bytes: nothing, " " or " '".
    held: Held2,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Held2 {
    #[default]
    None,
    Space,
    SpaceQuote,
}

impl Pass2 {
    fn feed(&mut self, b: u8, out: &mut Vec<u8>) {
        match self.held {
            Held2::None => self.start(b, out),
            Held2::Space => {
                if b == b'\'' {
                    self.held = Held2::SpaceQuote;
                } else {
                    out.push(b' ');
                    self.start(b, out);
                }
            }
            Held2::SpaceQuote => {
                if b == b' ' {
                    // The consumed space leaves no space behind for the next byte.
                    out.push(b'\'');
                    self.held = Held2::None;
                } else {
                    out.extend_from_slice(b" '");
                    self.held = Held2::None;
                    // The byte before `b` is the quote, not a space.
                    out.push(b);
                }
            }
        }
    }

    /// `b` after a byte that is not a pending space.
    fn start(&mut self, b: u8, out: &mut Vec<u8>) {
        if b == b' ' {
            self.held = Held2::Space;
        } else {
            self.held = Held2::None;
            out.push(b);
        }
    }

    fn flush(&mut self, out: &mut Vec<u8>) {
        match std::mem::take(&mut self.held) {
            Held2::None => {}
            Held2::Space => out.push(b' '),
            Held2::SpaceQuote => out.extend_from_slice(b" '"),
        }
    }
}

/// Streaming form of clean-up pass 3: the space before `'s 'm 're 've` is dropped.
#[derive(Debug, Clone, Default)]
struct Pass3 {
    /// Pending bytes: "", " ", " '" or " 'r" / " 'v".
    held: Vec<u8>,
}

impl Pass3 {
    fn feed(&mut self, b: u8, out: &mut Vec<u8>) {
        match self.held.len() {
            0 => self.start(b, out),
            1 => {
                if b == b'\'' {
                    self.held.push(b);
                } else {
                    out.push(b' ');
                    self.held.clear();
                    self.start(b, out);
                }
            }
            2 => match b {
                b's' | b'm' => {
                    out.push(b'\'');
                    out.push(b);
                    self.held.clear();
                }
                b'r' | b'v' => self.held.push(b),
                _ => {
                    out.extend_from_slice(b" '");
                    self.held.clear();
                    self.start(b, out);
                }
            },
            _ => {
                if b == b'e' {
                    out.extend_from_slice(&self.held[1..]);
                } else {
                    out.extend_from_slice(&self.held);
                }
                self.held.clear();
                self.start(b, out);
            }
        }
    }

    /// `b` with nothing pending.
    fn start(&mut self, b: u8, out: &mut Vec<u8>) {
        if b == b' ' {
            self.held.push(b);
        } else {
            out.push(b);
        }
    }

    fn flush(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_inverts_gpt2_mapping() {
        assert_eq!(unicode_to_byte('!'), Some(b'!'));
        assert_eq!(unicode_to_byte('Ġ'), Some(b' '));
        assert_eq!(unicode_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(unicode_to_byte('\u{100}'), Some(0));
        assert_eq!(unicode_to_byte('\u{143}'), Some(0xAD));
        assert_eq!(unicode_to_byte('\u{144}'), None);
        assert_eq!(unicode_to_byte(' '), None);
        let mut seen = [false; 256];
        for cp in 0..0x200u32 {
            if let Some(b) = char::from_u32(cp).and_then(unicode_to_byte) {
                assert!(!seen[usize::from(b)], "byte {b} twice");
                seen[usize::from(b)] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn unknown_byte_level_characters_are_marked() {
        assert_eq!(decode_byte_level("aĠ"), b"a ".to_vec());
        assert_eq!(decode_byte_level("a b"), b"a[UNK_BYTE_0x20a b]b".to_vec(),);
    }

    #[test]
    fn byte_token_values() {
        assert_eq!(byte_token_value("<0x0A>"), 0x0A);
        assert_eq!(byte_token_value("<0xff>"), 0xFF);
        assert_eq!(byte_token_value("<0xE>"), 0x0E);
        assert_eq!(byte_token_value("<0x"), 0);
        assert_eq!(byte_token_value(""), 0);
    }

    #[test]
    fn clean_spaces_passes() {
        let clean = |s: &str| {
            let mut v = s.as_bytes().to_vec();
            clean_spaces(&mut v);
            String::from_utf8(v).unwrap()
        };
        assert_eq!(clean("a , b . c ? d !"), "a, b. c? d!");
        assert_eq!(clean(" ."), ".");
        assert_eq!(clean("x ' y"), "x'y");
        assert_eq!(clean(" ' ' "), "'' ");
        assert_eq!(
            clean("it 's we 're I 'm they 've"),
            "it's we're I'm they've"
        );
        assert_eq!(clean("don 't I 'd we 'll"), "don 't I 'd we 'll");
        assert_eq!(clean(" 'r"), " 'r");
        assert_eq!(clean(""), "");
    }

    /// Feeds `bytes` through the streaming passes in the given chunk sizes.
    fn stream_clean(bytes: &[u8], chunks: &[usize]) -> Vec<u8> {
        let (mut p1, mut p2, mut p3) = (Pass1::default(), Pass2::default(), Pass3::default());
        let mut out = Vec::new();
        let mut rest = bytes;
        let mut k = 0;
        while !rest.is_empty() {
            let n = chunks
                .get(k)
                .copied()
                .unwrap_or(rest.len())
                .clamp(1, rest.len());
            k += 1;
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            let mut a = Vec::new();
            for &b in chunk {
                p1.feed(b, &mut a);
            }
            let mut c = Vec::new();
            for b in a {
                p2.feed(b, &mut c);
            }
            for b in c {
                p3.feed(b, &mut out);
            }
        }
        let mut a = Vec::new();
        p1.flush(&mut a);
        let mut c = Vec::new();
        for b in a {
            p2.feed(b, &mut c);
        }
        p2.flush(&mut c);
        for b in c {
            p3.feed(b, &mut out);
        }
        p3.flush(&mut out);
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        #[test]
        fn streaming_clean_matches_in_place(
            bytes in proptest::collection::vec(
                proptest::sample::select(b" '?!.,smrevtdlxa".to_vec()), 0..40),
            chunks in proptest::collection::vec(1usize..5, 0..40),
        ) {
            let mut expected = bytes.clone();
            clean_spaces(&mut expected);
            proptest::prop_assert_eq!(stream_clean(&bytes, &chunks), expected);
        }
    }
}
