//! Byte-level BPE and its pre-tokenizers.
//!
//! The split patterns per pre-tokenizer are llama.cpp's (its adapted forms, without `(?i:..)`);
//! how they are applied is described in the `unicode` module: llama.cpp's hand-written splitters
//! are ported, every other pattern runs with `fancy-regex` on the same class-collapsed text that
//! llama.cpp feeds to `std::regex`. After the split, each word is byte-encoded (GPT-2 byte to
//! character map; Gemma 4 keeps raw UTF-8), merged by rank (lowest rank first, leftmost first on
//! ties) and looked up; a piece without a token falls back to per-byte tokens.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::OnceLock;

use crate::unicode::{self, Split};
use crate::{PreType, Vocab};

const DEFAULT: &[&str] = &[
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
];
const LLAMA3: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const DEEPSEEK_LLM: &[&str] = &[
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
];
const DEEPSEEK3: &[&str] = &[
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];
const DEEPSEEK_CODER: &[&str] = &[
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}",
];
const FALCON: &[&str] = &[
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "[0-9][0-9][0-9]",
];
const STARCODER: &[&str] = &[
    "\\p{N}",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
];
const GPT2: &[&str] =
    &["'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"];
const QWEN2: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const QWEN35: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const TEKKEN: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const GPT4O: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const KIMI_K2: &[&str] = &["\\p{Han}+"];
const GEMMA4: &[&str] = &["[^\\n]+|[\\n]+"];

const JAIS2: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
];
const SPARK2_5: &[&str] = &[
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
    "\\p{N}",
];
const YOUTU: &[&str] = &[
    "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const PORO: &[&str] = &[" ?[^(\\s|.,!?…。，、।۔،)]+"];
const VIKING: &[&str] = &[" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"];
const CHAMELEON: &[&str] = &[
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
];
const GRANITE_EMB_MULTI: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const TINY_AYA: &[&str] = &[
    "\\d{1,3}(?=(?:\\d{3})*\\b)",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const SUPERBPE: &[&str] = &["\\p{N}+", "(?=(\\d{3})+(?!\\d))"];
const BAILINGMOE: &[&str] = &[
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
];
const SEED_CODER: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const UFAKZEKA: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const AFMOE: &[&str] = &[
    "\\p{AFMoE_digits}",
    "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const LAGUNA: &[&str] = &[
    "[^\\n]+|[\\n]+",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const EXAONE_MOE: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
];
const MINICPM5: &[&str] = &[
    "\\p{N}{1,3}",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];

/// The split patterns of a pre-tokenizer, the index of that pattern list (for the compiled
/// cache) and whether words are byte-encoded.
fn patterns(pre: PreType) -> (usize, &'static [&'static str], bool) {
    use PreType as P;
    match pre {
        P::Default => (0, DEFAULT, true),
        P::Llama3 | P::Dbrx | P::Smaug | P::ChatGlm4 => (1, LLAMA3, true),
        P::DeepseekLlm => (2, DEEPSEEK_LLM, true),
        P::Deepseek3Llm | P::HunyuanDense => (3, DEEPSEEK3, true),
        P::DeepseekCoder => (4, DEEPSEEK_CODER, true),
        P::Falcon => (5, FALCON, true),
        P::Starcoder
        | P::Refact
        | P::CommandR
        | P::Smollm
        | P::Codeshell
        | P::Exaone
        | P::Minerva
        | P::Mellum2 => (6, STARCODER, true),
        P::Gpt2 | P::Mpt | P::Olmo | P::Jais | P::Trillion | P::GraniteDocling => (7, GPT2, true),
        P::Qwen2 | P::Stablelm2 | P::Hunyuan | P::SolarOpen | P::Grok2 => (8, QWEN2, true),
        P::Qwen35 => (9, QWEN35, true),
        P::Tekken => (10, TEKKEN, true),
        P::Gpt4o | P::MinimaxM2 => (11, GPT4O, true),
        P::KimiK2 => (12, KIMI_K2, true),
        P::Gemma4 | P::SarvamMoe => (13, GEMMA4, false),
        P::Jais2 => (14, JAIS2, true),
        P::Spark25 => (15, SPARK2_5, true),
        P::Youtu => (16, YOUTU, true),
        P::MiniCpm5 => (17, MINICPM5, true),
        P::Poro | P::Bloom | P::Gpt3Finnish => (18, PORO, true),
        P::Viking => (19, VIKING, true),
        P::Chameleon => (20, CHAMELEON, true),
        P::GraniteEmbMulti => (21, GRANITE_EMB_MULTI, true),
        P::TinyAya => (22, TINY_AYA, true),
        P::SuperBpe => (23, SUPERBPE, true),
        P::BailingMoe => (24, BAILINGMOE, true),
        P::SeedCoder => (25, SEED_CODER, true),
        P::Ufakzeka => (26, UFAKZEKA, true),
        P::Afmoe => (27, AFMOE, true),
        P::Laguna => (28, LAGUNA, true),
        P::ExaoneMoe => (29, EXAONE_MOE, true),
    }
}

const N_PATTERN_LISTS: usize = 30;

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    steps: Vec<Split>,
    byte_encode: bool,
}

impl PreTokenizer {
    /// The byte ranges of the words of `text`.
    pub(crate) fn split(&self, text: &str) -> Vec<std::ops::Range<usize>> {
        unicode::split(text, &self.steps)
    }
}

/// The compiled pre-tokenizer of a type (compiled once per process). Fails only if a pattern
/// does not compile, which the vocabulary loader reports.
pub(crate) fn pre_tokenizer(pre: PreType) -> Result<&'static PreTokenizer, String> {
    type Cached = Result<PreTokenizer, String>;
    static CACHE: [OnceLock<Cached>; N_PATTERN_LISTS] =
        [const { OnceLock::new() }; N_PATTERN_LISTS];
    let (idx, pats, byte_encode) = patterns(pre);
    let cell = CACHE.get(idx).ok_or("pattern list index out of range")?;
    cell.get_or_init(|| {
        let steps = pats
            .iter()
            .map(|p| unicode::compile(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PreTokenizer { steps, byte_encode })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// One symbol of a word being merged: a byte range of the word and its neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge; the heap pops the lowest rank, then the leftmost.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Bigram {
    rank: Reverse<u32>,
    left: Reverse<usize>,
    right: usize,
    left_len: usize,
    right_len: usize,
}

/// The merge rank of a pair; `key` is a reused buffer so that lookups do not allocate.
fn rank(vocab: &Vocab, a: &str, b: &str, key: &mut (String, String)) -> Option<u32> {
    key.0.clear();
    key.0.push_str(a);
    key.1.clear();
    key.1.push_str(b);
    vocab.bpe_ranks.get(key).copied()
}

fn push_bigram(
    vocab: &Vocab,
    word: &str,
    symbols: &[Symbol],
    left: Option<usize>,
    right: Option<usize>,
    heap: &mut BinaryHeap<Bigram>,
    key: &mut (String, String),
) {
    let (Some(l), Some(r)) = (left, right) else {
        return;
    };
    let (ls, rs) = (symbols[l], symbols[r]);
    let a = &word[ls.start..ls.start + ls.len];
    let b = &word[rs.start..rs.start + rs.len];
    if let Some(rk) = rank(vocab, a, b, key) {
        heap.push(Bigram {
            rank: Reverse(rk),
            left: Reverse(l),
            right: r,
            left_len: ls.len,
            right_len: rs.len,
        });
    }
}

/// Merges one (byte-encoded) word and appends the pieces' ids.
fn merge_word(vocab: &Vocab, word: &str, byte_encode: bool, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::new();
    let whole_token = vocab.token_to_id.contains_key(word);
    if (vocab.ignore_merges && whole_token)
        || (vocab.pre == PreType::Gemma4 && word.bytes().all(|b| b == b'\n') && whole_token)
    {
        symbols.push(Symbol {
            start: 0,
            len: word.len(),
            prev: None,
            next: None,
        });
    } else {
        let n = word.chars().count();
        for (i, (b, ch)) in word.char_indices().enumerate() {
            symbols.push(Symbol {
                start: b,
                len: ch.len_utf8(),
                prev: i.checked_sub(1),
                next: (i + 1 < n).then_some(i + 1),
            });
        }
    }

    let mut heap = BinaryHeap::new();
    let mut key = (String::new(), String::new());
    for i in 1..symbols.len() {
        push_bigram(
            vocab,
            word,
            &symbols,
            Some(i - 1),
            Some(i),
            &mut heap,
            &mut key,
        );
    }
    while let Some(bg) = heap.pop() {
        let (l, r) = (bg.left.0, bg.right);
        let (ls, rs) = (symbols[l], symbols[r]);
        if ls.len == 0 || rs.len == 0 || ls.len != bg.left_len || rs.len != bg.right_len {
            continue;
        }
        symbols[l].len += rs.len;
        symbols[r].len = 0;
        symbols[l].next = rs.next;
        if let Some(nx) = rs.next {
            symbols[nx].prev = Some(l);
        }
        let prev = symbols[l].prev;
        let next = symbols[l].next;
        push_bigram(vocab, word, &symbols, prev, Some(l), &mut heap, &mut key);
        push_bigram(vocab, word, &symbols, Some(l), next, &mut heap, &mut key);
    }

    for sym in symbols.iter().filter(|s| s.len > 0) {
        let piece = &word[sym.start..sym.start + sym.len];
        if let Some(&id) = vocab.token_to_id.get(piece) {
            out.push(id);
            continue;
        }
        // No token for the piece: one token per byte where the vocabulary has it.
        for &b in piece.as_bytes() {
            let id = if byte_encode {
                if b.is_ascii() {
                    let mut buf = [0u8; 4];
                    vocab
                        .token_to_id
                        .get(char::from(b).encode_utf8(&mut buf) as &str)
                        .copied()
                } else {
                    None
                }
            } else {
                vocab.token_to_id.get(&format!("<0x{b:02X}>")).copied()
            };
            if let Some(id) = id {
                out.push(id);
            }
        }
    }
}

/// Tokenizes one text fragment (already whitespace-escaped when the vocabulary asks for it) and
/// appends the ids to `out`.
pub(crate) fn tokenize_fragment(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let (words, byte_encode) = match pre_tokenizer(vocab.pre) {
        Ok(pt) => (pt.split(text), pt.byte_encode),
        // Not reached for a loaded vocabulary (loading checks the patterns compile).
        Err(_) => (
            std::iter::once(0..text.len()).collect(),
            vocab.pre != PreType::Gemma4,
        ),
    };
    let mut encoded = String::new();
    for range in words {
        let raw = &text[range];
        if byte_encode {
            encoded.clear();
            encoded.extend(raw.bytes().map(unicode::byte_to_char));
            merge_word(vocab, &encoded, true, out);
        } else {
            merge_word(vocab, raw, false, out);
        }
    }
}
