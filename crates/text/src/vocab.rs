//! The vocabulary as read from `tokenizer.*` metadata.
//!
//! Loading follows llama.cpp's vocabulary loader step by step: the tokenizer type and its
//! defaults, the pre-tokenizer and the flags it implies, tokens/scores/types, merges, special ids
//! from keys, the text-based detection of end-of-turn/FIM/end-of-generation tokens, the special
//! token cache and the per-model token attribute fixes.

use std::collections::{BTreeSet, HashMap};

use gguf::{ArrayValue, Metadata, Value};

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
///
/// Several `tokenizer.ggml.pre` strings map to one variant (for example `llama3`, `llama-v3`
/// and `llama-bpe` are all [`PreType::Llama3`]); [`Vocab::pre_name`] keeps the string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PreType {
    /// `default` (also a missing or empty `tokenizer.ggml.pre`, and every SentencePiece vocab).
    Default,
    /// `llama3`, `llama-v3`, `llama-bpe`, `falcon3`, `falcon-h1`, `pixtral`, `midm-2.0`, `lfm2`,
    /// `jina-v5-nano`.
    Llama3,
    /// `deepseek-llm`.
    DeepseekLlm,
    /// `deepseek-coder`.
    DeepseekCoder,
    /// `deepseek-v3`.
    Deepseek3Llm,
    /// `hunyuan-dense`, `joyai-llm`, `hy_v4` (the DeepSeek-V3 split rules).
    HunyuanDense,
    /// `falcon`.
    Falcon,
    /// `mpt`.
    Mpt,
    /// `starcoder`.
    Starcoder,
    /// `gpt-2`, `phi-2`, `jina-es`, `jina-de`, `gigachat`, `jina-v2-es`, `jina-v2-de`,
    /// `a.x-4.0`, `mellum`, `modern-bert`, `exaone4`, `jina-v1-en`, `jina-v2-code`, `roberta-bpe`.
    Gpt2,
    /// `refact`.
    Refact,
    /// `command-r`.
    CommandR,
    /// `qwen2`, `deepseek-r1-qwen`, `kormo`, `f2llmv2`, `megrez`.
    Qwen2,
    /// `qwen35`.
    Qwen35,
    /// `stablelm2`.
    Stablelm2,
    /// `hunyuan`.
    Hunyuan,
    /// `solar-open`.
    SolarOpen,
    /// `grok-2`.
    Grok2,
    /// `olmo`.
    Olmo,
    /// `dbrx`.
    Dbrx,
    /// `smaug-bpe`.
    Smaug,
    /// `jais`.
    Jais,
    /// `codeshell`.
    Codeshell,
    /// `exaone`.
    Exaone,
    /// `minerva-7b`.
    Minerva,
    /// `smollm`.
    Smollm,
    /// `chatglm-bpe`, `glm4`, `glm5`.
    ChatGlm4,
    /// `kimi-k2`.
    KimiK2,
    /// `gpt-4o`, `llama4`, `kanana2`, `talkie`.
    Gpt4o,
    /// `tekken`.
    Tekken,
    /// `gemma4` (forced for `tokenizer.ggml.model = gemma4`), `granite-embed-multi-311m`.
    Gemma4,
    /// `jais-2`.
    Jais2,
    /// `spark2_5`.
    Spark25,
    /// `youtu`.
    Youtu,
    /// `minicpm5`.
    MiniCpm5,
    /// `poro-chat`.
    Poro,
    /// `viking`.
    Viking,
    /// `bloom`.
    Bloom,
    /// `gpt3-finnish`.
    Gpt3Finnish,
    /// `chameleon`.
    Chameleon,
    /// `granite-embed-multi-97m`.
    GraniteEmbMulti,
    /// `tiny_aya`, `cohere2moe`.
    TinyAya,
    /// `superbpe`.
    SuperBpe,
    /// `bailingmoe`, `bailingmoe2`, `llada-moe`.
    BailingMoe,
    /// `seed-coder`.
    SeedCoder,
    /// `ufakzeka`.
    Ufakzeka,
    /// `afmoe`.
    Afmoe,
    /// `laguna`.
    Laguna,
    /// `exaone-moe`.
    ExaoneMoe,
    /// `minimax-m2`.
    MinimaxM2,
    /// `trillion`.
    Trillion,
    /// `granite-docling`.
    GraniteDocling,
    /// `mellum2`.
    Mellum2,
    /// `sarvam-moe` (SentencePiece-style BPE like Gemma 4).
    SarvamMoe,
}

impl PreType {
    /// Every pre-tokenizer type.
    pub const ALL: [PreType; 54] = [
        PreType::Default,
        PreType::Llama3,
        PreType::DeepseekLlm,
        PreType::DeepseekCoder,
        PreType::Deepseek3Llm,
        PreType::HunyuanDense,
        PreType::Falcon,
        PreType::Mpt,
        PreType::Starcoder,
        PreType::Gpt2,
        PreType::Refact,
        PreType::CommandR,
        PreType::Qwen2,
        PreType::Qwen35,
        PreType::Stablelm2,
        PreType::Hunyuan,
        PreType::SolarOpen,
        PreType::Grok2,
        PreType::Olmo,
        PreType::Dbrx,
        PreType::Smaug,
        PreType::Jais,
        PreType::Codeshell,
        PreType::Exaone,
        PreType::Minerva,
        PreType::Smollm,
        PreType::ChatGlm4,
        PreType::KimiK2,
        PreType::Gpt4o,
        PreType::Tekken,
        PreType::Gemma4,
        PreType::Jais2,
        PreType::Spark25,
        PreType::Youtu,
        PreType::MiniCpm5,
        PreType::Poro,
        PreType::Viking,
        PreType::Bloom,
        PreType::Gpt3Finnish,
        PreType::Chameleon,
        PreType::GraniteEmbMulti,
        PreType::TinyAya,
        PreType::SuperBpe,
        PreType::BailingMoe,
        PreType::SeedCoder,
        PreType::Ufakzeka,
        PreType::Afmoe,
        PreType::Laguna,
        PreType::ExaoneMoe,
        PreType::MinimaxM2,
        PreType::Trillion,
        PreType::GraniteDocling,
        PreType::Mellum2,
        PreType::SarvamMoe,
    ];
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

    /// Whether any bit of `other` is set.
    pub fn any(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
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
    /// Fill-in-the-middle: prefix, suffix, middle, pad, repository and file separator tokens.
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
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

// Metadata keys.
const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const KEY_ADD_SEP: &str = "tokenizer.ggml.add_sep_token";
const KEY_ADD_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const KEY_REMOVE_EXTRA_WS: &str = "tokenizer.ggml.remove_extra_whitespaces";

/// The flags a pre-tokenizer string implies on top of the BPE defaults.
struct PreInfo {
    pre: PreType,
    clean_spaces: bool,
    ignore_merges: bool,
    add_bos: bool,
    add_sep: bool,
    escape_whitespaces: bool,
    no_bos: bool,
}

/// Maps a `tokenizer.ggml.pre` string of a BPE vocabulary to its type and flags, as llama.cpp.
fn pre_info(name: &str) -> Result<PreInfo, TextError> {
    use PreType as P;
    // (type, clean_spaces, ignore_merges, add_bos)
    let base = |pre: PreType, clean_spaces: bool, ignore_merges: bool, add_bos: bool| PreInfo {
        pre,
        clean_spaces,
        ignore_merges,
        add_bos,
        add_sep: false,
        escape_whitespaces: false,
        no_bos: false,
    };
    let info = match name {
        "" | "default" => base(P::Default, true, false, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => base(P::Llama3, true, true, true),
        "deepseek-llm" => base(P::DeepseekLlm, false, false, false),
        "deepseek-coder" => base(P::DeepseekCoder, false, false, false),
        "deepseek-v3" => base(P::Deepseek3Llm, false, false, false),
        "hunyuan-dense" | "joyai-llm" | "hy_v4" => base(P::HunyuanDense, false, false, false),
        "falcon" => base(P::Falcon, true, false, false),
        "mpt" => base(P::Mpt, true, false, false),
        "starcoder" => base(P::Starcoder, true, false, false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" => base(P::Gpt2, true, false, false),
        "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => PreInfo {
            add_sep: true,
            ..base(P::Gpt2, true, false, false)
        },
        "gemma4" | "granite-embed-multi-311m" => PreInfo {
            escape_whitespaces: true,
            ..base(P::Gemma4, true, false, false)
        },
        "refact" => base(P::Refact, true, false, false),
        "command-r" => base(P::CommandR, false, false, false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => base(P::Qwen2, false, false, false),
        "megrez" => base(P::Qwen2, true, false, false),
        "qwen35" => base(P::Qwen35, false, false, false),
        "stablelm2" => base(P::Stablelm2, true, false, false),
        "hunyuan" => base(P::Hunyuan, false, false, false),
        "solar-open" => base(P::SolarOpen, false, false, false),
        "grok-2" => base(P::Grok2, false, false, false),
        "olmo" => base(P::Olmo, true, false, false),
        "dbrx" => base(P::Dbrx, true, false, false),
        "smaug-bpe" => base(P::Smaug, true, false, false),
        "jais" => base(P::Jais, true, false, false),
        "codeshell" => base(P::Codeshell, true, false, false),
        "exaone" => base(P::Exaone, true, false, false),
        "minerva-7b" => base(P::Minerva, true, false, false),
        "chatglm-bpe" => PreInfo {
            no_bos: true,
            ..base(P::ChatGlm4, true, false, false)
        },
        "glm4" | "glm5" => PreInfo {
            no_bos: true,
            ..base(P::ChatGlm4, true, true, false)
        },
        "tekken" => base(P::Tekken, false, true, true),
        "smollm" => base(P::Smollm, false, false, false),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => base(P::Gpt4o, false, false, false),
        "kimi-k2" => base(P::KimiK2, false, false, false),
        "jais-2" => base(P::Jais2, true, false, false),
        "spark2_5" => base(P::Spark25, false, false, false),
        "youtu" => base(P::Youtu, false, true, false),
        "minicpm5" => base(P::MiniCpm5, true, true, false),
        "poro-chat" => base(P::Poro, false, false, false),
        "viking" => base(P::Viking, false, false, false),
        "bloom" => base(P::Bloom, true, false, false),
        "gpt3-finnish" => base(P::Gpt3Finnish, true, false, false),
        "chameleon" => base(P::Chameleon, false, false, true),
        "granite-embed-multi-97m" => base(P::GraniteEmbMulti, false, true, false),
        "tiny_aya" | "cohere2moe" => base(P::TinyAya, false, false, false),
        "superbpe" => base(P::SuperBpe, false, false, false),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => base(P::BailingMoe, false, false, false),
        "seed-coder" => base(P::SeedCoder, false, false, false),
        "ufakzeka" => base(P::Ufakzeka, false, false, false),
        "afmoe" => base(P::Afmoe, false, false, false),
        "laguna" => base(P::Laguna, false, false, false),
        "exaone-moe" => base(P::ExaoneMoe, true, false, false),
        "minimax-m2" => base(P::MinimaxM2, false, false, false),
        "trillion" => base(P::Trillion, false, false, false),
        "granite-docling" => base(P::GraniteDocling, false, false, false),
        "mellum2" => base(P::Mellum2, true, false, false),
        "sarvam-moe" => PreInfo {
            escape_whitespaces: true,
            ..base(P::SarvamMoe, false, false, false)
        },
        other => return Err(TextError::UnknownPre(other.to_owned())),
    };
    Ok(info)
}

fn bad(key: &str, reason: impl Into<String>) -> TextError {
    TextError::BadKey {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

/// An optional string key; present with another type is an error.
fn opt_str<'a>(meta: &'a Metadata, key: &str) -> Result<Option<&'a str>, TextError> {
    match meta.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(bad(
            key,
            format!("expected a string, found {}", v.value_type()),
        )),
    }
}

/// An optional bool key; present with another type is an error.
fn opt_bool(meta: &Metadata, key: &str) -> Result<Option<bool>, TextError> {
    match meta.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(bad(
            key,
            format!("expected a bool, found {}", v.value_type()),
        )),
    }
}

/// An optional token id key (any non-negative integer type that fits in u32).
fn opt_id(meta: &Metadata, key: &str) -> Result<Option<u32>, TextError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => {
            let n = v
                .as_u64()
                .ok_or_else(|| bad(key, format!("expected a non-negative integer, found {v:?}")))?;
            u32::try_from(n)
                .map(Some)
                .map_err(|_| bad(key, format!("token id {n} does not fit in u32")))
        }
    }
}

/// Splits one merge line at the first space after its first byte, as llama.cpp does (so a
/// merge whose left part is a space, as Gemma 4's `"▁ ▁"`-style entries, stays intact). A line
/// without such a space gives the pair of empty strings.
fn split_merge(line: &str) -> (String, String) {
    match line.get(1..).and_then(|rest| rest.find(' ')) {
        Some(p) => {
            let pos = p + 1;
            (line[..pos].to_owned(), line[pos + 1..].to_owned())
        }
        None => {
            // The first byte may start a multi-byte character; search on bytes then.
            let bytes = line.as_bytes();
            match bytes.iter().skip(1).position(|&b| b == b' ') {
                Some(p) => {
                    let pos = p + 1;
                    (
                        String::from_utf8_lossy(&bytes[..pos]).into_owned(),
                        String::from_utf8_lossy(&bytes[pos + 1..]).into_owned(),
                    )
                }
                None => (String::new(), String::new()),
            }
        }
    }
}

/// BPE merge ranks keyed by the (left, right) pair.
type Ranks = HashMap<(String, String), u32>;

fn read_merges(meta: &Metadata) -> Result<Option<Ranks>, TextError> {
    let Some(v) = meta.get(KEY_MERGES) else {
        return Ok(None);
    };
    let lines = v
        .as_array()
        .and_then(ArrayValue::as_strings)
        .ok_or_else(|| bad(KEY_MERGES, "expected an array of strings"))?;
    let mut ranks = HashMap::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let rank = u32::try_from(i).map_err(|_| bad(KEY_MERGES, "too many merges"))?;
        ranks.entry(split_merge(line)).or_insert(rank);
    }
    Ok(Some(ranks))
}

// Special id slots.
const BOS: usize = 0;
const EOS: usize = 1;
const EOT: usize = 2;
const EOM: usize = 3;
const UNK: usize = 4;
const SEP: usize = 5;
const PAD: usize = 6;
const MASK: usize = 7;
const FIM_PRE: usize = 8;
const FIM_SUF: usize = 9;
const FIM_MID: usize = 10;
const FIM_PAD: usize = 11;
const FIM_REP: usize = 12;
const FIM_SEP: usize = 13;
const N_SLOTS: usize = 14;

/// The id keys in the order llama.cpp reads them (the last three are deprecated aliases).
const ID_KEYS: &[(&str, usize)] = &[
    ("tokenizer.ggml.bos_token_id", BOS),
    ("tokenizer.ggml.eos_token_id", EOS),
    ("tokenizer.ggml.eot_token_id", EOT),
    ("tokenizer.ggml.eom_token_id", EOM),
    ("tokenizer.ggml.unknown_token_id", UNK),
    ("tokenizer.ggml.seperator_token_id", SEP),
    ("tokenizer.ggml.padding_token_id", PAD),
    ("tokenizer.ggml.mask_token_id", MASK),
    ("tokenizer.ggml.fim_pre_token_id", FIM_PRE),
    ("tokenizer.ggml.fim_suf_token_id", FIM_SUF),
    ("tokenizer.ggml.fim_mid_token_id", FIM_MID),
    ("tokenizer.ggml.fim_pad_token_id", FIM_PAD),
    ("tokenizer.ggml.fim_rep_token_id", FIM_REP),
    ("tokenizer.ggml.fim_sep_token_id", FIM_SEP),
    ("tokenizer.ggml.prefix_token_id", FIM_PRE),
    ("tokenizer.ggml.suffix_token_id", FIM_SUF),
    ("tokenizer.ggml.middle_token_id", FIM_MID),
];

/// Token text lists that llama.cpp uses to recognise special tokens whose ids the metadata does
/// not give. Where several candidates of one list are present, the earlier one in the list wins.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Vocab {
    /// Reads the vocabulary from metadata.
    pub fn from_metadata(meta: &Metadata) -> Result<Self, TextError> {
        let model_name = opt_str(meta, KEY_MODEL)?
            .ok_or_else(|| TextError::MissingKey(KEY_MODEL.into()))?
            .to_owned();
        let pre_name = opt_str(meta, KEY_PRE)?.unwrap_or("").to_owned();

        // Tokenizer type, its default special ids and merges.
        // Default ids are i64 so that "none" (-1) and out-of-range values can be represented.
        let mut bpe_ranks = HashMap::new();
        let mut effective_pre = pre_name.clone();
        let (kind, mut bos, eos, unk, sep, pad, mask): (VocabKind, i64, i64, i64, i64, i64, i64) =
            match model_name.as_str() {
                "llama" => (VocabKind::Spm, 1, 2, 0, -1, -1, -1),
                "gpt2" => {
                    match read_merges(meta)? {
                        Some(r) => bpe_ranks = r,
                        None if pre_name == "kimi-k2" => {}
                        None => return Err(TextError::MissingKey(KEY_MERGES.into())),
                    }
                    (VocabKind::Bpe, 11, 11, -1, -1, -1, -1)
                }
                "gemma4" => {
                    bpe_ranks = read_merges(meta)?
                        .ok_or_else(|| TextError::MissingKey(KEY_MERGES.into()))?;
                    effective_pre = "gemma4".into();
                    (VocabKind::Bpe, -1, -1, -1, -1, -1, -1)
                }
                other => return Err(TextError::UnsupportedModel(other.to_owned())),
            };

        // Pre-tokenizer and flags (llama.cpp's defaults, then per type).
        let mut add_eos = false;
        let mut remove_extra_whitespaces = false;
        let (
            pre,
            mut add_space_prefix,
            add_bos,
            add_sep,
            ignore_merges,
            clean_spaces,
            escape_whitespaces,
        ) = match kind {
            VocabKind::Bpe => {
                let info = pre_info(&effective_pre)?;
                if info.no_bos {
                    bos = -1;
                }
                crate::bpe::pre_tokenizer(info.pre).map_err(|e| bad(KEY_PRE, e))?;
                (
                    info.pre,
                    false,
                    info.add_bos,
                    info.add_sep,
                    info.ignore_merges,
                    info.clean_spaces,
                    info.escape_whitespaces,
                )
            }
            VocabKind::Spm => {
                add_eos = false;
                (PreType::Default, true, true, false, false, false, true)
            }
        };
        if let Some(b) = opt_bool(meta, KEY_ADD_PREFIX)? {
            add_space_prefix = b;
        }
        if let Some(b) = opt_bool(meta, KEY_REMOVE_EXTRA_WS)? {
            remove_extra_whitespaces = b;
        }

        // Tokens, scores, types.
        let token_list = meta
            .get(KEY_TOKENS)
            .ok_or_else(|| TextError::MissingKey(KEY_TOKENS.into()))?
            .as_array()
            .and_then(ArrayValue::as_strings)
            .ok_or_else(|| bad(KEY_TOKENS, "expected an array of strings"))?;
        let n_tokens = token_list.len();
        if u32::try_from(n_tokens).is_err() {
            return Err(bad(KEY_TOKENS, "too many tokens"));
        }
        let scores: Option<Vec<f32>> = match meta.get(KEY_SCORES) {
            None => None,
            Some(v) => {
                let s: Vec<f32> = match v.as_array() {
                    Some(ArrayValue::F32(s)) => s.clone(),
                    Some(ArrayValue::I32(s)) => s.iter().map(|&x| x as f32).collect(),
                    _ => return Err(bad(KEY_SCORES, "expected an array of f32 or i32")),
                };
                if s.len() < n_tokens {
                    return Err(bad(
                        KEY_SCORES,
                        format!("{} scores for {n_tokens} tokens", s.len()),
                    ));
                }
                Some(s)
            }
        };
        let types: Option<&[i32]> = match meta.get(KEY_TOKEN_TYPE) {
            None => None,
            Some(v) => match v.as_array() {
                Some(ArrayValue::I32(t)) => {
                    if t.len() < n_tokens {
                        return Err(bad(
                            KEY_TOKEN_TYPE,
                            format!("{} token types for {n_tokens} tokens", t.len()),
                        ));
                    }
                    Some(t)
                }
                _ => return Err(bad(KEY_TOKEN_TYPE, "expected an array of i32")),
            },
        };

        let mut tokens = Vec::with_capacity(n_tokens);
        let mut token_to_id = HashMap::with_capacity(n_tokens);
        for (i, word) in token_list.iter().enumerate() {
            let text = if word.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                word.clone()
            };
            if token_to_id.insert(text.clone(), i as u32).is_some() {
                return Err(bad(
                    KEY_TOKENS,
                    format!("token text {text:?} appears more than once (again at id {i})"),
                ));
            }
            let attr = match types.map(|t| t[i]) {
                None => TokenAttr::NORMAL,
                Some(1) => TokenAttr::NORMAL,
                Some(2) => TokenAttr::UNKNOWN,
                Some(3) => TokenAttr::CONTROL,
                Some(4) => TokenAttr::USER_DEFINED,
                Some(5) => TokenAttr::UNUSED,
                Some(6) => TokenAttr::BYTE,
                Some(_) => TokenAttr::UNDEFINED,
            };
            tokens.push(TokenData {
                text,
                score: scores.as_ref().map_or(0.0, |s| s[i]),
                attr,
            });
        }

        let mut vocab = Vocab {
            kind,
            pre,
            model_name,
            pre_name,
            tokens,
            token_to_id,
            special: SpecialIds::default(),
            eog: BTreeSet::new(),
            add_bos,
            add_eos,
            add_sep,
            add_space_prefix,
            remove_extra_whitespaces,
            escape_whitespaces,
            treat_whitespace_as_suffix: false,
            clean_spaces,
            ignore_merges,
            special_tokens_cache: Vec::new(),
            bpe_ranks,
        };

        // Newline token, found before the special ids are read (so a missing one falls back to
        // the type's default padding id).
        let nl = vocab.find_newline().map_or(pad, i64::from);

        // Special ids: defaults out of range are dropped; a key overrides when in range.
        let n = n_tokens as i64;
        let mut ids = [-1i64; N_SLOTS];
        ids[BOS] = bos;
        ids[EOS] = eos;
        ids[UNK] = unk;
        ids[SEP] = sep;
        ids[PAD] = pad;
        ids[MASK] = mask;
        for &(key, slot) in ID_KEYS {
            if ids[slot] >= n {
                ids[slot] = -1;
            }
            if let Some(id) = opt_id(meta, key)?
                && i64::from(id) < n
            {
                ids[slot] = i64::from(id);
            }
        }

        if let Some(b) = opt_bool(meta, KEY_ADD_BOS)? {
            vocab.add_bos = b;
        }
        if let Some(b) = opt_bool(meta, KEY_ADD_EOS)? {
            vocab.add_eos = b;
        }
        if let Some(b) = opt_bool(meta, KEY_ADD_SEP)? {
            vocab.add_sep = b;
        }
        if vocab.pre == PreType::Gemma4 {
            vocab.add_bos = true;
        }

        vocab.detect_specials(&mut ids);

        let opt = |id: i64| u32::try_from(id).ok().filter(|&i| (i as usize) < n_tokens);
        vocab.special = SpecialIds {
            bos: opt(ids[BOS]),
            eos: opt(ids[EOS]),
            eot: opt(ids[EOT]),
            eom: opt(ids[EOM]),
            unk: opt(ids[UNK]),
            sep: opt(ids[SEP]),
            pad: opt(ids[PAD]),
            mask: opt(ids[MASK]),
            nl: opt(nl),
            fim_pre: opt(ids[FIM_PRE]),
            fim_suf: opt(ids[FIM_SUF]),
            fim_mid: opt(ids[FIM_MID]),
            fim_pad: opt(ids[FIM_PAD]),
            fim_rep: opt(ids[FIM_REP]),
            fim_sep: opt(ids[FIM_SEP]),
        };

        // Special token cache: control, user-defined and unknown tokens, longest text first
        // (ties keep id order).
        let mut cache: Vec<u32> = (0..n_tokens as u32)
            .filter(|&id| {
                vocab.tokens[id as usize].attr.any(TokenAttr(
                    TokenAttr::CONTROL.0 | TokenAttr::USER_DEFINED.0 | TokenAttr::UNKNOWN.0,
                ))
            })
            .collect();
        cache.sort_by(|&a, &b| {
            vocab.tokens[b as usize]
                .text
                .len()
                .cmp(&vocab.tokens[a as usize].text.len())
        });
        vocab.special_tokens_cache = cache;

        vocab.apply_model_attrs(meta)?;
        Ok(vocab)
    }

    /// The newline token as llama.cpp's loader finds it: `<0x0A>` (or a literal `\n` token) for
    /// SentencePiece; for BPE the first id of tokenizing `"\n"`, which for a single character is
    /// its (byte-encoded) token or, failing that, its byte-fallback token.
    fn find_newline(&self) -> Option<u32> {
        match self.kind {
            VocabKind::Spm => self
                .token_to_id
                .get("<0x0A>")
                .or_else(|| self.token_to_id.get("\n"))
                .copied(),
            VocabKind::Bpe => {
                let mut out = Vec::new();
                crate::bpe::tokenize_fragment(self, "\n", &mut out);
                out.first().copied()
            }
        }
    }

    fn set_attr(&mut self, id: u32, attr: TokenAttr, on: bool) {
        if let Some(t) = self.tokens.get_mut(id as usize) {
            t.attr = if on {
                TokenAttr(t.attr.0 | attr.0)
            } else {
                TokenAttr(t.attr.0 & !attr.0)
            };
        }
    }

    fn mark_control(&mut self, id: u32) {
        self.set_attr(id, TokenAttr::CONTROL, true);
    }

    /// llama.cpp's detection of special tokens by their text, its unused-token marking and the
    /// end-of-generation set.
    fn detect_specials(&mut self, ids: &mut [i64; N_SLOTS]) {
        let detect: [(usize, &[&str]); 8] = [
            (EOT, EOT_TEXTS),
            (EOM, EOM_TEXTS),
            (FIM_PRE, FIM_PRE_TEXTS),
            (FIM_SUF, FIM_SUF_TEXTS),
            (FIM_MID, FIM_MID_TEXTS),
            (FIM_PAD, FIM_PAD_TEXTS),
            (FIM_REP, FIM_REP_TEXTS),
            (FIM_SEP, FIM_SEP_TEXTS),
        ];
        for (slot, texts) in detect {
            if ids[slot] != -1 {
                continue;
            }
            if let Some(id) = texts.iter().find_map(|t| self.token_to_id.get(*t).copied()) {
                ids[slot] = i64::from(id);
                self.mark_control(id);
            }
        }

        // Control tokens with "unused" in their text are unused.
        for t in &mut self.tokens {
            if t.attr.has(TokenAttr::CONTROL) && t.text.contains("unused") {
                t.attr = TokenAttr(t.attr.0 | TokenAttr::UNUSED.0);
            }
        }

        let mut eog = BTreeSet::new();
        for slot in [FIM_PAD, FIM_REP, FIM_SEP] {
            if let Ok(id) = u32::try_from(ids[slot]) {
                eog.insert(id);
            }
        }
        for text in EOG_TEXTS {
            if let Some(&id) = self.token_to_id.get(*text) {
                eog.insert(id);
                self.mark_control(id);
            }
        }
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = self.token_to_id.get(text) {
                self.tokens[id as usize].attr = TokenAttr::USER_DEFINED;
            }
        }
        for slot in [EOS, EOT, EOM] {
            if let Ok(id) = u32::try_from(ids[slot]) {
                eog.insert(id);
            }
        }

        // "<|end|>" is not an end of generation when "<|return|>" and "<|call|>" (or "<|calls|>"
        // and "<|flush|>") are.
        let n = self.tokens.len();
        let (mut has_return, mut has_call, mut has_flush) = (false, false, false);
        let mut end_id = None;
        for &id in &eog {
            match self.tokens.get(id as usize).map(|t| t.text.as_str()) {
                Some("<|return|>") => has_return = true,
                Some("<|call|>") | Some("<|calls|>") => has_call = true,
                Some("<|flush|>") => has_flush = true,
                Some("<|end|>") => end_id = Some(id),
                _ => {}
            }
        }
        if let Some(end) = end_id
            && has_call
            && (has_return || has_flush)
        {
            eog.remove(&end);
            self.tokens[end as usize].attr = TokenAttr::USER_DEFINED;
        }

        // Gemma 4 and PLaMo have an ordinary "</s>".
        let mut normal_s_marker = false;
        let mut s_id = None;
        for &id in &eog {
            match self.tokens.get(id as usize).map(|t| t.text.as_str()) {
                Some("<|tool_response>") | Some("<|plamo:eos|>") => normal_s_marker = true,
                Some("</s>") => s_id = Some(id),
                _ => {}
            }
        }
        if let (true, Some(s)) = (normal_s_marker, s_id) {
            eog.remove(&s);
            self.tokens[s as usize].attr = TokenAttr::NORMAL;
        }
        eog.retain(|&id| (id as usize) < n);
        self.eog = eog;
    }

    /// Per-model attribute fixes keyed on `general.name`, `general.architecture` and the
    /// pre-tokenizer string, applied after the special token cache is built.
    fn apply_model_attrs(&mut self, meta: &Metadata) -> Result<(), TextError> {
        let name = opt_str(meta, "general.name")?
            .unwrap_or("")
            .to_ascii_lowercase();
        let arch = opt_str(meta, "general.architecture")?.unwrap_or("");
        let pre = opt_str(meta, KEY_PRE)?.unwrap_or("");
        let contains_any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
        let id_of = |v: &Self, t: &str| v.token_to_id.get(t).copied();
        if contains_any(pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
            || contains_any(arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            if let Some(id) = id_of(self, "<mask>") {
                self.set_attr(id, TokenAttr::LSTRIP, true);
            }
        } else if contains_any(&name, &["phi-3", "phi3"]) {
            for id in self.special_tokens_cache.clone() {
                self.set_attr(id, TokenAttr::RSTRIP, true);
            }
            if let Some(id) = id_of(self, "</s>") {
                self.set_attr(id, TokenAttr::RSTRIP, true);
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(id) = id_of(self, t) {
                    self.set_attr(id, TokenAttr::RSTRIP, false);
                }
            }
        } else if contains_any(&name, &["modern-bert"])
            && let Some(id) = id_of(self, "[MASK]")
        {
            self.set_attr(id, TokenAttr::LSTRIP, true);
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_lines_split_at_the_first_space_after_the_first_byte() {
        assert_eq!(split_merge("a b"), ("a".into(), "b".into()));
        assert_eq!(split_merge("Ġ t"), ("Ġ".into(), "t".into()));
        // A leading space belongs to the left part (Gemma 4 merges of spaces).
        assert_eq!(split_merge("  x"), (" ".into(), "x".into()));
        assert_eq!(split_merge("ab c d"), ("ab".into(), "c d".into()));
        assert_eq!(split_merge("abc"), (String::new(), String::new()));
        assert_eq!(split_merge(""), (String::new(), String::new()));
    }

    #[test]
    fn every_pre_type_has_a_string_and_compiles() {
        let names = [
            "default",
            "llama3",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "hunyuan-dense",
            "falcon",
            "mpt",
            "starcoder",
            "gpt-2",
            "refact",
            "command-r",
            "qwen2",
            "qwen35",
            "stablelm2",
            "hunyuan",
            "solar-open",
            "grok-2",
            "olmo",
            "dbrx",
            "smaug-bpe",
            "jais",
            "codeshell",
            "exaone",
            "minerva-7b",
            "smollm",
            "glm4",
            "kimi-k2",
            "gpt-4o",
            "tekken",
            "gemma4",
            "jais-2",
            "spark2_5",
            "youtu",
            "minicpm5",
            "poro-chat",
            "viking",
            "bloom",
            "gpt3-finnish",
            "chameleon",
            "granite-embed-multi-97m",
            "tiny_aya",
            "superbpe",
            "bailingmoe",
            "seed-coder",
            "ufakzeka",
            "afmoe",
            "laguna",
            "exaone-moe",
            "minimax-m2",
            "trillion",
            "granite-docling",
            "mellum2",
            "sarvam-moe",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let info = pre_info(name).unwrap();
            seen.insert(info.pre);
        }
        for pre in PreType::ALL {
            assert!(seen.contains(&pre), "{pre:?} has no pre string");
            crate::bpe::pre_tokenizer(pre).unwrap();
        }
        assert!(
            matches!(pre_info("whitespace"), Err(TextError::UnknownPre(n)) if n == "whitespace")
        );
    }
}
