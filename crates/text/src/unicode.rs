//! Code point classes and the pre-tokenizer split, as llama.cpp computes them.
//!
//! How the split reproduces llama.cpp:
//!
//! * The code point classes (letter, number, punctuation, accent mark, symbol, whitespace) come
//!   from llama.cpp's own tables (generated into `unicode_data.rs` by
//!   `scripts/gen_text_unicode.py`), not from Rust's Unicode tables, whose version may differ.
//! * llama.cpp has hand-written splitters for the GPT-2, LLaMA-3, Qwen2, Qwen3.5 and Kimi-K2
//!   patterns and for the newline-run split; they are ported here as hand-written splitters,
//!   including their small deviations from the regular expressions they stand for.
//! * Every other pattern llama.cpp runs through `std::regex` on a transformed text: when the
//!   pattern uses `\p{..}` classes, each non-ASCII code point is replaced by one stand-in
//!   character for its class (and `\p{..}` in the pattern by that stand-in plus the ASCII members
//!   of the class); otherwise the pattern runs on the code points with non-ASCII whitespace
//!   replaced by U+000B. The same transformation is done here and the transformed pattern is run
//!   with `fancy-regex` (backtracking, leftmost-first like ECMAScript, with look-ahead), with
//!   `\s`, `\S` and `\d` rewritten to their ASCII meaning as in `std::regex`'s "C" locale. The
//!   match boundaries found on the transformed text are the split points of the real text.

use std::ops::Range;

use crate::unicode_data::{RANGES, WHITESPACE};

pub(crate) const UNDEFINED: u16 = 0x0001;
pub(crate) const NUMBER: u16 = 0x0002;
pub(crate) const LETTER: u16 = 0x0004;
pub(crate) const ACCENT_MARK: u16 = 0x0010;
pub(crate) const PUNCTUATION: u16 = 0x0020;
pub(crate) const SYMBOL: u16 = 0x0040;
pub(crate) const WHITESPACE_FLAG: u16 = 0x0100;
const MASK_CATEGORIES: u16 = 0x00FF;

/// The class flags of a code point (UNDEFINED beyond U+10FFFF).
pub(crate) fn cpt_flags(cp: u32) -> u16 {
    if cp >= 0x110000 {
        return UNDEFINED;
    }
    let i = RANGES.partition_point(|&(start, _)| start <= cp);
    let mut f = RANGES[i.saturating_sub(1)].1;
    if WHITESPACE.binary_search(&cp).is_ok() {
        f |= WHITESPACE_FLAG;
    }
    f
}

/// Whether a code point is a Han character (the ranges llama.cpp's Kimi-K2 splitter uses).
fn is_han(cp: u32) -> bool {
    matches!(cp,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B820..=0x2CEAF
        | 0x2CEB0..=0x2EBEF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// The GPT-2 byte-to-character map: printable bytes map to themselves, the rest to U+0100 on.
pub(crate) fn byte_to_char(b: u8) -> char {
    static MAP: std::sync::OnceLock<[char; 256]> = std::sync::OnceLock::new();
    let map = MAP.get_or_init(|| {
        let mut m = ['\0'; 256];
        let mut n = 0u32;
        for (i, slot) in m.iter_mut().enumerate() {
            let keep = (0x21..=0x7E).contains(&i) || (0xA1..=0xAC).contains(&i) || i >= 0xAE;
            let cp = if keep {
                i as u32
            } else {
                n += 1;
                255 + n
            };
            *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
        }
        m
    });
    map[b as usize]
}

/// The hand-written splitters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Custom {
    Gpt2,
    Llama3,
    Qwen2,
    Qwen35,
    KimiK2,
    Newlines,
    /// Digit runs cut into a leading group of `len % 3` and groups of three (llama.cpp uses it
    /// for AFMoE's digit rule and Tiny Aya's `\d{1,3}(?=(?:\d{3})*\b)`).
    Digits3,
}

/// One split step.
#[derive(Debug)]
pub(crate) enum Split {
    Custom(Custom),
    Regex {
        re: fancy_regex::Regex,
        /// Whether the pattern runs on the class-collapsed text.
        collapsed: bool,
    },
}

const OUT: u32 = u32::MAX;

/// A view of one chunk of code points, with llama.cpp's out-of-range conventions.
struct Chunk<'a> {
    cpts: &'a [u32],
    ini: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl Chunk<'_> {
    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.cpts[pos]
        } else {
            OUT
        }
    }

    fn flags(&self, pos: usize) -> u16 {
        if self.ini <= pos && pos < self.end {
            cpt_flags(self.cpts[pos])
        } else {
            0
        }
    }

    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }

    fn lower(&self, pos: usize) -> u32 {
        let c = self.cpt(pos);
        // Only ASCII letters map onto the ASCII letters the contractions compare with.
        if (u32::from(b'A')..=u32::from(b'Z')).contains(&c) {
            c + 32
        } else {
            c
        }
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d` at `pos` (case-insensitive when `fold`): the match length.
    fn contraction(&self, pos: usize, fold: bool) -> usize {
        if self.cpt(pos) != u32::from(b'\'') || pos + 1 >= self.end {
            return 0;
        }
        let get = |p: usize| if fold { self.lower(p) } else { self.cpt(p) };
        let n1 = get(pos + 1);
        if b"stmd".iter().any(|&c| n1 == u32::from(c)) {
            return 2;
        }
        if pos + 2 < self.end {
            let n2 = get(pos + 2);
            let pair = |a: u8, b: u8| n1 == u32::from(a) && n2 == u32::from(b);
            if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
                return 3;
            }
        }
        0
    }

    /// Counts whitespace from `pos`; returns (count, end of the last `\r`/`\n` + 1 or 0).
    fn whitespace_run(&self, pos: usize) -> (usize, usize) {
        let mut n = 0;
        let mut last_rn = 0;
        while self.flags(pos + n) & WHITESPACE_FLAG != 0 {
            let c = self.cpt(pos + n);
            if c == u32::from(b'\r') || c == u32::from(b'\n') {
                last_rn = pos + n + 1;
            }
            n += 1;
        }
        (n, last_rn)
    }

    /// The common tail: `\s*[\r\n]+` (when `newlines`), `\s+(?!\S)`, `\s+`, else one code point.
    fn whitespace_tail(&mut self, pos: &mut usize, newlines: bool) {
        let (n, last_rn) = self.whitespace_run(*pos);
        if newlines && last_rn > 0 {
            *pos = last_rn;
            self.add(*pos);
            return;
        }
        if n > 1 && self.cpt(*pos + n) != OUT {
            *pos += n - 1;
            self.add(*pos);
            return;
        }
        if n > 0 {
            *pos += n;
            self.add(*pos);
            return;
        }
        *pos += 1;
        self.add(*pos);
    }
}

fn is_rn(c: u32) -> bool {
    c == u32::from(b'\r') || c == u32::from(b'\n')
}

const SPACE: u32 = b' ' as u32;

fn split_gpt2(c: &mut Chunk<'_>) {
    let mut pos = c.ini;
    while pos < c.end {
        let cpt = c.cpt(pos);
        let flags = c.flags(pos);
        let m = c.contraction(pos, false);
        if m > 0 {
            pos += c.add(pos + m);
            continue;
        }
        let mut f2 = if cpt == SPACE {
            c.flags(pos + 1)
        } else {
            flags
        };
        let sp = usize::from(cpt == SPACE);
        if f2 & LETTER != 0 {
            pos += sp;
            while f2 & LETTER != 0 {
                pos += 1;
                f2 = c.flags(pos);
            }
            c.add(pos);
            continue;
        }
        if f2 & NUMBER != 0 {
            pos += sp;
            while f2 & NUMBER != 0 {
                pos += 1;
                f2 = c.flags(pos);
            }
            c.add(pos);
            continue;
        }
        let other = |f: u16| f & (WHITESPACE_FLAG | LETTER | NUMBER) == 0 && f != 0;
        if other(f2) {
            pos += sp;
            while other(f2) {
                pos += 1;
                f2 = c.flags(pos);
            }
            c.add(pos);
            continue;
        }
        c.whitespace_tail(&mut pos, false);
    }
}

/// LLaMA-3 (`digits3`: `\p{N}{1,3}`), Qwen2 (`\p{N}`) and Qwen3.5 (`marks`: letters runs take
/// accent marks too).
fn split_llama3_like(c: &mut Chunk<'_>, digits3: bool, marks: bool) {
    let word = if marks { LETTER | ACCENT_MARK } else { LETTER };
    let mut pos = c.ini;
    while pos < c.end {
        let cpt = c.cpt(pos);
        let flags = c.flags(pos);
        let m = c.contraction(pos, true);
        if m > 0 {
            pos += c.add(pos + m);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(is_rn(cpt) || flags & NUMBER != 0)
            && (flags & word != 0 || c.flags(pos + 1) & word != 0)
        {
            pos += 1;
            while c.flags(pos) & word != 0 {
                pos += 1;
            }
            c.add(pos);
            continue;
        }
        if flags & NUMBER != 0 {
            if digits3 {
                let mut ini = pos;
                while c.flags(pos) & NUMBER != 0 {
                    pos += 1;
                    if pos - ini >= 3 {
                        c.add(pos);
                        ini = pos;
                    }
                }
            } else {
                pos += 1;
            }
            c.add(pos);
            continue;
        }
        // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (the first test looks at the unshifted flags)
        let excluded = WHITESPACE_FLAG | word | NUMBER;
        let mut f2 = if cpt == SPACE {
            c.flags(pos + 1)
        } else {
            flags
        };
        if f2 & excluded == 0 && flags != 0 {
            pos += usize::from(cpt == SPACE);
            while f2 & excluded == 0 && f2 != 0 {
                pos += 1;
                f2 = c.flags(pos);
            }
            while is_rn(c.cpt(pos)) {
                pos += 1;
            }
            c.add(pos);
            continue;
        }
        c.whitespace_tail(&mut pos, true);
    }
}

fn split_kimi_k2(c: &mut Chunk<'_>) {
    let mut pos = c.ini;
    while pos < c.end {
        let cpt = c.cpt(pos);
        let flags = c.flags(pos);
        if is_han(cpt) {
            while is_han(c.cpt(pos)) {
                pos += 1;
            }
            c.add(pos);
            continue;
        }
        let letter_not_han =
            |c: &Chunk<'_>, p: usize| c.flags(p) & LETTER != 0 && !is_han(c.cpt(p));
        let leading_ok = !(is_rn(cpt) || flags & (LETTER | NUMBER) != 0);
        let is_letter_pattern =
            (flags & LETTER != 0 && !is_han(cpt)) || (leading_ok && letter_not_han(c, pos + 1));
        if is_letter_pattern {
            let mut has_leading = false;
            if leading_ok {
                has_leading = true;
                pos += 1;
            }
            let mut has_letters = false;
            while letter_not_han(c, pos) {
                has_letters = true;
                pos += 1;
            }
            if has_letters || (!has_leading && letter_not_han(c, pos)) {
                if !has_letters {
                    pos += 1;
                }
                while letter_not_han(c, pos) {
                    pos += 1;
                }
                if c.cpt(pos) == u32::from(b'\'') && pos + 1 < c.end {
                    let n1 = c.lower(pos + 1);
                    if b"stmd".iter().any(|&x| n1 == u32::from(x)) {
                        pos += 2;
                    } else if pos + 2 < c.end {
                        let n2 = c.lower(pos + 2);
                        let pair = |a: u8, b: u8| n1 == u32::from(a) && n2 == u32::from(b);
                        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
                            pos += 3;
                        }
                    }
                }
                c.add(pos);
                continue;
            } else if has_leading {
                pos -= 1;
            }
        }
        if flags & NUMBER != 0 {
            let mut ini = pos;
            while c.flags(pos) & NUMBER != 0 {
                pos += 1;
                if pos - ini >= 3 {
                    c.add(pos);
                    ini = pos;
                }
            }
            c.add(pos);
            continue;
        }
        let excluded = WHITESPACE_FLAG | LETTER | NUMBER;
        let mut f2 = if cpt == SPACE {
            c.flags(pos + 1)
        } else {
            flags
        };
        if f2 & excluded == 0 && f2 != 0 {
            pos += usize::from(cpt == SPACE);
            while f2 & excluded == 0 && f2 != 0 {
                pos += 1;
                f2 = c.flags(pos);
            }
            while is_rn(c.cpt(pos)) {
                pos += 1;
            }
            c.add(pos);
            continue;
        }
        c.whitespace_tail(&mut pos, true);
    }
}

fn split_newlines(c: &mut Chunk<'_>) {
    let mut pos = c.ini;
    while pos < c.end {
        let nl = c.cpts[pos] == u32::from(b'\n');
        while pos < c.end && (c.cpts[pos] == u32::from(b'\n')) == nl {
            pos += 1;
        }
        c.add(pos);
    }
}

fn split_digits3(c: &mut Chunk<'_>) {
    let mut pos = c.ini;
    while pos < c.end {
        if c.flags(pos) & NUMBER != 0 {
            let first = pos;
            while pos < c.end && c.flags(pos) & NUMBER != 0 {
                pos += 1;
            }
            let count = pos - first;
            let mut cur = first;
            let rem = count % 3;
            // The leading group also takes any text since the previous cut.
            if rem > 0 {
                cur += rem;
                c.add(cur);
            }
            while cur < first + count {
                cur += 3;
                c.add(cur);
            }
            continue;
        }
        pos += 1;
    }
    if c.prev_end < c.end {
        c.add(c.end);
    }
}

fn run_custom(kind: Custom, cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let mut c = Chunk {
            cpts,
            ini: start,
            end: start + len,
            prev_end: start,
            out: &mut out,
        };
        match kind {
            Custom::Gpt2 => split_gpt2(&mut c),
            Custom::Llama3 => split_llama3_like(&mut c, true, false),
            Custom::Qwen2 => split_llama3_like(&mut c, false, false),
            Custom::Qwen35 => split_llama3_like(&mut c, false, true),
            Custom::KimiK2 => split_kimi_k2(&mut c),
            Custom::Newlines => split_newlines(&mut c),
            Custom::Digits3 => split_digits3(&mut c),
        }
        start += len;
    }
    out
}

/// Stand-in characters of the collapsed text.
const COLLAPSED_WS: char = '\u{0B}';
const COLLAPSED_OTHER: char = '\u{D0}';

fn collapsed_char(cat: u16) -> Option<char> {
    Some(match cat {
        NUMBER => '\u{D1}',
        LETTER => '\u{D2}',
        PUNCTUATION => '\u{D3}',
        ACCENT_MARK => '\u{D4}',
        SYMBOL => '\u{D5}',
        _ => return None,
    })
}

/// The ASCII members of each class, as (first, last) ranges.
fn ascii_members(cat: u16) -> &'static [(u8, u8)] {
    match cat {
        NUMBER => &[(b'0', b'9')],
        LETTER => &[(b'A', b'Z'), (b'a', b'z')],
        PUNCTUATION => &[
            (b'!', b'#'),
            (b'%', b'*'),
            (b',', b'/'),
            (b':', b';'),
            (b'?', b'@'),
            (b'[', b']'),
            (b'_', b'_'),
            (b'{', b'{'),
            (b'}', b'}'),
        ],
        SYMBOL => &[
            (b'$', b'$'),
            (b'+', b'+'),
            (b'<', b'>'),
            (b'^', b'^'),
            (b'`', b'`'),
            (b'|', b'|'),
            (b'~', b'~'),
        ],
        _ => &[],
    }
}

/// The class a `\p{..}` name stands for in the collapsed text.
fn class_of(name: &str) -> Option<u16> {
    Some(match name {
        "N" => NUMBER,
        "L" | "Lu" | "Ll" | "Lt" | "Lm" | "Lo" => LETTER,
        "P" => PUNCTUATION,
        "M" => ACCENT_MARK,
        "S" => SYMBOL,
        _ => return None,
    })
}

const ASCII_SPACE_CLASS: &str = r"\t\n\x0B\x0C\r ";

/// Rewrites a llama.cpp pattern for fancy-regex: `\p{..}` classes become stand-in + ASCII
/// members (bracketed when outside a class), `\s`/`\S`/`\d` get their ASCII meaning. Returns the
/// pattern and whether it needs the collapsed text.
pub(crate) fn translate(expr: &str) -> (String, bool) {
    let collapsed = ["N", "L", "P", "M", "S", "Lu", "Ll", "Lt", "Lm", "Lo"]
        .iter()
        .any(|n| expr.contains(&format!("\\p{{{n}}}")));
    let chars: Vec<char> = expr.chars().collect();
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < chars.len() {
        let ch = chars[i];
        if ch == '[' && (i == 0 || chars[i - 1] != '\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && ch == ']' && chars[i - 1] != '\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if ch == '\\' && i + 1 < chars.len() {
            let next = chars[i + 1];
            if next == 'p'
                && chars.get(i + 2) == Some(&'{')
                && let Some(close) = chars[i + 3..].iter().position(|&c| c == '}')
                && let Some(cat) = class_of(&chars[i + 3..i + 3 + close].iter().collect::<String>())
            {
                if !inside {
                    out.push('[');
                }
                if let Some(sc) = collapsed_char(cat) {
                    out.push_str(&format!("\\x{{{:X}}}", u32::from(sc)));
                }
                for &(a, b) in ascii_members(cat) {
                    out.push_str(&format!("\\x{{{a:X}}}"));
                    if b != a {
                        out.push_str(&format!("-\\x{{{b:X}}}"));
                    }
                }
                if !inside {
                    out.push(']');
                }
                i += 3 + close + 1;
                continue;
            }
            match next {
                's' => {
                    if inside {
                        out.push_str(ASCII_SPACE_CLASS);
                    } else {
                        out.push('[');
                        out.push_str(ASCII_SPACE_CLASS);
                        out.push(']');
                    }
                    i += 2;
                    continue;
                }
                'S' if !inside => {
                    out.push_str("[^");
                    out.push_str(ASCII_SPACE_CLASS);
                    out.push(']');
                    i += 2;
                    continue;
                }
                'd' => {
                    out.push_str(if inside { "0-9" } else { "[0-9]" });
                    i += 2;
                    continue;
                }
                _ => {
                    out.push(ch);
                    out.push(next);
                    i += 2;
                    continue;
                }
            }
        }
        out.push(ch);
        i += 1;
    }
    (out, collapsed)
}

/// Compiles one llama.cpp pattern, using the hand-written splitter where llama.cpp has one.
pub(crate) fn compile(expr: &str) -> Result<Split, String> {
    let custom = match expr {
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)" => {
            Some(Custom::Gpt2)
        }
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        | r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+" => {
            Some(Custom::Llama3)
        }
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+" => {
            Some(Custom::Qwen2)
        }
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+" => {
            Some(Custom::Qwen35)
        }
        r"\p{Han}+" => Some(Custom::KimiK2),
        r"[^\n]+|[\n]+" => Some(Custom::Newlines),
        r"\p{AFMoE_digits}" | r"\d{1,3}(?=(?:\d{3})*\b)" => Some(Custom::Digits3),
        _ => None,
    };
    if let Some(c) = custom {
        return Ok(Split::Custom(c));
    }
    let (pattern, collapsed) = translate(expr);
    let re = fancy_regex::RegexBuilder::new(&pattern)
        .backtrack_limit(100_000_000)
        .build()
        .map_err(|e| format!("pattern {expr:?} (as {pattern:?}): {e}"))?;
    Ok(Split::Regex { re, collapsed })
}

fn run_regex(re: &fancy_regex::Regex, text: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let chunk: String = text[start..start + len].iter().collect();
        // Byte offset -> code point index within the chunk.
        let mut cp_at = vec![0usize; chunk.len() + 1];
        for (n, (b, _)) in chunk.char_indices().enumerate() {
            cp_at[b] = n;
        }
        cp_at[chunk.len()] = len;
        let mut last = 0usize;
        for m in re.find_iter(&chunk) {
            let Ok(m) = m else { break };
            let (s, e) = (cp_at[m.start()], cp_at[m.end()]);
            if s > last {
                out.push(s - last);
            }
            if e > s {
                out.push(e - s);
            }
            last = e;
        }
        if last < len {
            out.push(len - last);
        }
        start += len;
    }
    out
}

/// Splits `text` with the steps in order, as llama.cpp's `unicode_regex_split` (without the byte
/// encoding); returns the byte ranges of the words.
pub(crate) fn split(text: &str, steps: &[Split]) -> Vec<Range<usize>> {
    let cpts: Vec<u32> = text.chars().map(u32::from).collect();
    let mut offsets = vec![cpts.len()];
    let mut collapsed_text: Option<Vec<char>> = None;
    let mut plain_text: Option<Vec<char>> = None;
    for step in steps {
        offsets = match step {
            Split::Custom(kind) => {
                let r = run_custom(*kind, &cpts, &offsets);
                if r.is_empty() {
                    // llama.cpp falls back to the regex engine when a custom splitter yields
                    // nothing, which only happens for empty text; nothing to split then.
                    offsets
                } else {
                    r
                }
            }
            Split::Regex { re, collapsed } => {
                let t = if *collapsed {
                    collapsed_text.get_or_insert_with(|| {
                        text.chars()
                            .map(|ch| {
                                let cp = u32::from(ch);
                                if cp < 128 {
                                    return ch;
                                }
                                let f = cpt_flags(cp);
                                if f & WHITESPACE_FLAG != 0 {
                                    COLLAPSED_WS
                                } else {
                                    collapsed_char(f & MASK_CATEGORIES).unwrap_or(COLLAPSED_OTHER)
                                }
                            })
                            .collect()
                    })
                } else {
                    plain_text.get_or_insert_with(|| {
                        text.chars()
                            .map(|ch| {
                                if u32::from(ch) > 0x7F
                                    && cpt_flags(u32::from(ch)) & WHITESPACE_FLAG != 0
                                {
                                    COLLAPSED_WS
                                } else {
                                    ch
                                }
                            })
                            .collect()
                    })
                };
                run_regex(re, t, &offsets)
            }
        };
    }
    // Code point counts -> byte ranges.
    let mut bounds: Vec<usize> = text.char_indices().map(|(b, _)| b).collect();
    bounds.push(text.len());
    let mut words = Vec::with_capacity(offsets.len());
    let mut cp = 0;
    for len in offsets {
        if len == 0 {
            continue;
        }
        words.push(bounds[cp]..bounds[cp + len]);
        cp += len;
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PreType;
    use proptest::prelude::*;

    #[test]
    fn byte_map_is_a_bijection_onto_printable_characters() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(!c.is_whitespace() && !c.is_control(), "{b:#x} -> {c:?}");
            assert!(seen.insert(c));
        }
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(b' '), '\u{120}');
        assert_eq!(byte_to_char(b'\n'), '\u{10A}');
    }

    #[test]
    fn classes_follow_the_tables() {
        assert_eq!(cpt_flags(u32::from('a')) & LETTER, LETTER);
        assert_eq!(cpt_flags(u32::from('7')) & NUMBER, NUMBER);
        assert_eq!(cpt_flags(u32::from('!')) & PUNCTUATION, PUNCTUATION);
        assert_eq!(cpt_flags(u32::from('+')) & SYMBOL, SYMBOL);
        assert_eq!(cpt_flags(0x301) & ACCENT_MARK, ACCENT_MARK);
        assert_ne!(cpt_flags(0x3000) & WHITESPACE_FLAG, 0);
        assert_ne!(cpt_flags(u32::from(' ')) & WHITESPACE_FLAG, 0);
        assert_eq!(cpt_flags(0x110000), UNDEFINED);
    }

    #[test]
    fn translation_of_classes() {
        let (p, collapsed) = translate(r"\p{N}+");
        assert!(collapsed);
        assert_eq!(p, r"[\x{D1}\x{30}-\x{39}]+");
        let (p, _) = translate(r"[^\s\p{L}]");
        assert_eq!(p, r"[^\t\n\x0B\x0C\r \x{D2}\x{41}-\x{5A}\x{61}-\x{7A}]");
        let (p, collapsed) = translate(r"\s+(?!\S)");
        assert!(!collapsed);
        assert_eq!(p, r"[\t\n\x0B\x0C\r ]+(?![^\t\n\x0B\x0C\r ])");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every pre-tokenizer cuts the text into non-empty pieces that cover it in order.
        #[test]
        fn split_tiles_the_text(text in "\\PC{0,40}|[ \\t\\n\\r a-zA-Z0-9'!.,中ü\u{301}]{0,40}") {
            for pre in PreType::ALL {
                let pt = crate::bpe::pre_tokenizer(pre).unwrap();
                let words = pt.split(&text);
                let mut at = 0;
                for w in &words {
                    prop_assert_eq!(w.start, at, "{:?}", pre);
                    prop_assert!(w.end > w.start);
                    at = w.end;
                }
                prop_assert_eq!(at, text.len(), "{:?}", pre);
            }
        }
    }
}
