//! `sluice quantize`: a float GGUF model quantized to a llama.cpp file type (Q4_K_M, Q8_0, ...),
//! byte for byte what llama.cpp's `llama_model_quantize` (release v0.4.0, default parameters,
//! no importance matrix) writes for the same input.
//!
//! Three things have to agree for the bytes to match, and each follows llama.cpp's rules:
//!
//! * **Which type each tensor gets** ([`Planner`]): only 2-D and 3-D tensors whose name ends in
//!   `weight` are quantized, minus norms, the MoE router (`ffn_gate_inp`), position and
//!   token-type embeddings, conv1d and a few other small tensors. The rest follow the file
//!   type's mix: `output.weight` (or a tied `token_embd.weight`) goes to Q6_K, `attn_v` and
//!   `ffn_down` get more bits in the layers `use_more_bits` picks, 8-expert models get Q8_0
//!   `attn_v`/`attn_k` and Q5_K `attn_output`, and a row length that is not a whole number of
//!   blocks falls back to a 32-block type (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K/Q3_K →
//!   Q4_0, the i-quants → IQ4_NL, then F16).
//! * **The blocks**: without an importance matrix llama.cpp quantizes every one of these types
//!   with ggml's reference quantizer (`quantize_row_*_ref`; for IQ4_NL, IQ4_XS and IQ3_S the
//!   searches of `quantize_iq4_nl`/`quantize_iq4_xs`/`quantize_iq3_s` with every element
//!   weighted by its square), which `quant::quantize_row` reproduces bit for bit. Blocks are independent, so rows may be split among threads.
//! * **The file layout**: the input's metadata in its order, minus `general.quantization_version`,
//!   `general.file_type` and the `split.*` keys, then those two set (2 and the file type); the
//!   tensors sorted by layer number (`blk.N.`, others first) then name; trailing dimensions of
//!   size 1 dropped; GGUF v3 with 32-byte alignment and zero padding.

use std::cell::RefCell;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Context, Error, Result, fail, reject};
use gguf::{GgmlType, GgufFile, GgufWriter, Metadata, TensorInfo, TensorType, Value};

/// `general.quantization_version` written to every output (ggml's `GGML_QNT_VERSION`).
const QUANTIZATION_VERSION: u32 = 2;

/// The alignment llama.cpp writes its output with (`GGUF_DEFAULT_ALIGNMENT`).
const ALIGNMENT: u32 = 32;

/// A llama.cpp file type (`llama_ftype`): a default tensor type plus the rules that give some
/// tensors more (or fewer) bits. The discriminant is the value stored in `general.file_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum FileType {
    /// 4.5 bits per weight, one scale per 32.
    Q4_0 = 2,
    /// 5 bits per weight, a scale and a minimum per 32.
    Q4_1 = 3,
    /// 8.5 bits per weight, one scale per 32.
    Q8_0 = 7,
    /// 5.5 bits per weight, one scale per 32.
    Q5_0 = 8,
    /// 6 bits per weight, a scale and a minimum per 32.
    Q5_1 = 9,
    /// Mostly Q2_K, with Q3_K/Q4_K for attn_v, ffn_down and attn_output.
    Q2_K = 10,
    /// Mostly Q3_K.
    Q3_K_S = 11,
    /// Mostly Q3_K, with Q4_K/Q5_K for attn_v, ffn_down and attn_output.
    Q3_K_M = 12,
    /// Mostly Q3_K, with Q5_K for attn_v, ffn_down and attn_output.
    Q3_K_L = 13,
    /// Mostly Q4_K, with Q5_K for the first four attn_v and the first eighth of ffn_down.
    Q4_K_S = 14,
    /// Mostly Q4_K, with Q6_K for half of attn_v and ffn_down (`use_more_bits`).
    Q4_K_M = 15,
    /// Mostly Q5_K.
    Q5_K_S = 16,
    /// Mostly Q5_K, with Q6_K for half of attn_v and ffn_down (`use_more_bits`).
    Q5_K_M = 17,
    /// Mostly Q6_K.
    Q6_K = 18,
    /// Mostly IQ4_NL (4.5 bits per weight, 16 non-linear levels per 32), with Q5_K for
    /// attn_v (grouped KV heads) and the first eighth of ffn_down.
    IQ4_NL = 25,
    /// Mostly IQ3_S (3.44 bits per weight), with Q4_K for attn_v (grouped KV heads).
    IQ3_S = 26,
    /// Mostly IQ3_S, with Q4_K for attn_v, attn_output and the first eighth of ffn_down.
    IQ3_M = 27,
    /// Mostly IQ4_XS (4.25 bits per weight), with Q5_K for attn_v (grouped KV heads) and the
    /// first eighth of ffn_down.
    IQ4_XS = 30,
    /// Ternary: TQ1_0 (1.69 bits per weight), Q4_K token embeddings, Q6_K output.
    TQ1_0 = 36,
    /// Ternary: TQ2_0 (2.06 bits per weight), Q4_K token embeddings, Q6_K output.
    TQ2_0 = 37,
    /// Expert tensors (3-D stacks) MXFP4, every other quantized tensor Q8_0: the layout of the
    /// released gpt-oss files.
    Mxfp4Moe = 38,
}

impl FileType {
    /// Every file type, in the order `--help` lists them.
    pub const ALL: [FileType; 21] = {
        use FileType as F;
        [
            F::Q4_0,
            F::Q4_1,
            F::Q8_0,
            F::Q5_0,
            F::Q5_1,
            F::Q2_K,
            F::Q3_K_S,
            F::Q3_K_M,
            F::Q3_K_L,
            F::Q4_K_S,
            F::Q4_K_M,
            F::Q5_K_S,
            F::Q5_K_M,
            F::Q6_K,
            F::IQ4_NL,
            F::IQ3_S,
            F::IQ3_M,
            F::IQ4_XS,
            F::TQ1_0,
            F::TQ2_0,
            F::Mxfp4Moe,
        ]
    };

    /// The file type called `name` (a name or an alias, any case).
    pub fn from_name(name: &str) -> Option<FileType> {
        FileType::ALL.into_iter().find(|t| {
            t.name().eq_ignore_ascii_case(name)
                || t.alias().is_some_and(|a| a.eq_ignore_ascii_case(name))
        })
    }

    /// The other name the command line accepts (`Q4_K` for `Q4_K_M`, ...).
    pub fn alias(self) -> Option<&'static str> {
        use FileType as F;
        match self {
            F::Q3_K_M => Some("Q3_K"),
            F::Q4_K_M => Some("Q4_K"),
            F::Q5_K_M => Some("Q5_K"),
            _ => None,
        }
    }

    /// What the mix gives, in a line (the `--help` text).
    pub fn about(self) -> &'static str {
        use FileType as F;
        match self {
            F::Q4_0 => "4.5 bits per weight, one scale per 32",
            F::Q4_1 => "5 bits per weight, a scale and a minimum per 32",
            F::Q8_0 => "8.5 bits per weight, one scale per 32",
            F::Q5_0 => "5.5 bits per weight, one scale per 32",
            F::Q5_1 => "6 bits per weight, a scale and a minimum per 32",
            F::Q2_K => "Mostly Q2_K, with Q3_K/Q4_K for attn_v, ffn_down and attn_output",
            F::Q3_K_S => "Mostly Q3_K",
            F::Q3_K_M => "Mostly Q3_K, with Q4_K/Q5_K for attn_v, ffn_down and attn_output",
            F::Q3_K_L => "Mostly Q3_K, with Q5_K for attn_v, ffn_down and attn_output",
            F::Q4_K_S => {
                "Mostly Q4_K, with Q5_K for the first four attn_v and the first eighth of ffn_down"
            }
            F::Q4_K_M => "Mostly Q4_K, with Q6_K for half of attn_v and ffn_down (`use_more_bits`)",
            F::Q5_K_S => "Mostly Q5_K",
            F::Q5_K_M => "Mostly Q5_K, with Q6_K for half of attn_v and ffn_down (`use_more_bits`)",
            F::Q6_K => "Mostly Q6_K",
            F::IQ4_NL => {
                "Mostly IQ4_NL (4.5 bits per weight, non-linear levels), with Q5_K for attn_v (grouped KV heads) and the first eighth of ffn_down"
            }
            F::IQ3_S => {
                "Mostly IQ3_S (3.44 bits per weight), with Q4_K for attn_v (grouped KV heads)"
            }
            F::IQ3_M => {
                "Mostly IQ3_S, with Q4_K for attn_v, attn_output and the first eighth of ffn_down"
            }
            F::IQ4_XS => {
                "Mostly IQ4_XS (4.25 bits per weight, non-linear levels), with Q5_K for attn_v (grouped KV heads) and the first eighth of ffn_down"
            }
            F::TQ1_0 => "Ternary TQ1_0 (1.69 bits per weight), Q4_K token embeddings, Q6_K output",
            F::TQ2_0 => "Ternary TQ2_0 (2.06 bits per weight), Q4_K token embeddings, Q6_K output",
            F::Mxfp4Moe => {
                "Expert tensors (3-D stacks) MXFP4, every other quantized tensor Q8_0: the layout of the released gpt-oss files"
            }
        }
    }

    /// The `general.file_type` value (llama.cpp's `llama_ftype`).
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        use FileType as F;
        match self {
            F::Q4_0 => "Q4_0",
            F::Q4_1 => "Q4_1",
            F::Q8_0 => "Q8_0",
            F::Q5_0 => "Q5_0",
            F::Q5_1 => "Q5_1",
            F::Q2_K => "Q2_K",
            F::Q3_K_S => "Q3_K_S",
            F::Q3_K_M => "Q3_K_M",
            F::Q3_K_L => "Q3_K_L",
            F::Q4_K_S => "Q4_K_S",
            F::Q4_K_M => "Q4_K_M",
            F::Q5_K_S => "Q5_K_S",
            F::Q5_K_M => "Q5_K_M",
            F::Q6_K => "Q6_K",
            F::IQ4_NL => "IQ4_NL",
            F::IQ3_S => "IQ3_S",
            F::IQ3_M => "IQ3_M",
            F::IQ4_XS => "IQ4_XS",
            F::TQ1_0 => "TQ1_0",
            F::TQ2_0 => "TQ2_0",
            F::Mxfp4Moe => "MXFP4_MOE",
        }
    }

    /// The type of every quantized tensor the mix does not single out.
    pub fn default_type(self) -> GgmlType {
        use FileType as F;
        match self {
            F::Q4_0 => GgmlType::Q4_0,
            F::Q4_1 => GgmlType::Q4_1,
            F::Q8_0 => GgmlType::Q8_0,
            F::Q5_0 => GgmlType::Q5_0,
            F::Q5_1 => GgmlType::Q5_1,
            F::Q2_K => GgmlType::Q2_K,
            F::Q3_K_S | F::Q3_K_M | F::Q3_K_L => GgmlType::Q3_K,
            F::Q4_K_S | F::Q4_K_M => GgmlType::Q4_K,
            F::Q5_K_S | F::Q5_K_M => GgmlType::Q5_K,
            F::Q6_K => GgmlType::Q6_K,
            F::IQ4_NL => GgmlType::IQ4_NL,
            F::IQ3_S | F::IQ3_M => GgmlType::IQ3_S,
            F::IQ4_XS => GgmlType::IQ4_XS,
            F::TQ1_0 => GgmlType::TQ1_0,
            F::TQ2_0 => GgmlType::TQ2_0,
            F::Mxfp4Moe => GgmlType::MXFP4,
        }
    }
}

/// What to quantize, to what, and how.
pub struct Options {
    /// The model to quantize (its first shard, for a split model).
    pub input: PathBuf,
    /// Where to write it (through `OUT.tmp`, renamed when complete and synced).
    pub out: PathBuf,
    pub ftype: FileType,
    /// Convert tensors that are already quantized (dequantized first).
    pub allow_requantize: bool,
    /// Every quantized tensor gets the file type's default type (no mix).
    pub pure: bool,
    /// Threads per tensor [default: the available parallelism].
    pub threads: Option<usize>,
}

/// What [`quantize`] reports while it works.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// The mix's type did not fit a tensor's row length: it got a fallback type.
    Fallback(&'a str),
    /// A tensor is being written (`index` of `count`, from 0): converted, or copied when
    /// `from == to`.
    Tensor {
        index: usize,
        count: usize,
        name: &'a str,
        dims: &'a [u64],
        from: TensorType,
        to: TensorType,
    },
}

/// What [`quantize`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantized {
    pub tensors: usize,
    /// Tensor bytes read and written.
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// What the type rules need to know about the model (llama.cpp reads the same from its
/// hyperparameters).
#[derive(Debug, Clone, Default)]
pub struct ModelFacts {
    /// `general.architecture`.
    pub arch: String,
    /// `<arch>.expert_count` (0 for a dense model).
    pub n_expert: u64,
    /// `<arch>.block_count`, multi-token-prediction layers included.
    pub n_layer_all: u64,
    /// Query heads per KV head of layer 0 (0 without KV heads).
    pub n_gqa: u64,
    /// llama.cpp classifies the model as 70B (its attn_v then gets Q5_K instead of Q3_K/Q4_K).
    pub is_70b: bool,
}

impl ModelFacts {
    /// Read the facts from a model's metadata; `what` names the file in errors.
    pub fn from_metadata(meta: &Metadata, what: &str) -> Result<ModelFacts> {
        let arch = meta
            .get_str("general.architecture")
            .with_context(|| format!("{what}: no general.architecture"))?
            .to_owned();
        let int = |key: &str| -> Option<u64> {
            match meta.get(key)? {
                Value::Array(a) => a.get(0).and_then(|v| v.as_u64()),
                v => v.as_u64(),
            }
        };
        let n_layer_all = int(&format!("{arch}.block_count"))
            .with_context(|| format!("{what}: no {arch}.block_count"))?;
        let n_nextn = int(&format!("{arch}.nextn_predict_layers")).unwrap_or(0);
        let n_expert = int(&format!("{arch}.expert_count")).unwrap_or(0);
        let n_head = int(&format!("{arch}.attention.head_count")).unwrap_or(0);
        let n_head_kv = int(&format!("{arch}.attention.head_count_kv")).unwrap_or(n_head);
        let n_gqa = n_head.checked_div(n_head_kv).unwrap_or(0);
        // llama.cpp's model-size classes that are 70B (only that class matters here).
        let n_layer = n_layer_all.saturating_sub(n_nextn);
        let is_70b = match arch.as_str() {
            "llama" => n_expert != 8 && n_layer == 80 && n_head != n_head_kv,
            "deci" | "olmo" | "qwen2" => n_layer == 80,
            "jais2" => n_layer == 68,
            _ => false,
        };
        Ok(ModelFacts {
            arch,
            n_expert,
            n_layer_all,
            n_gqa,
            is_70b,
        })
    }

    fn falcon(&self) -> bool {
        self.arch == "falcon"
    }
}

/// The broad role of a tensor, from its name (llama.cpp's tensor categories).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

impl Category {
    fn of(name: &str) -> Category {
        use Category as C;
        if name == "output.weight" {
            return C::Output;
        }
        if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            return C::TokenEmbd;
        }
        const BY_PART: [(&str, Category); 10] = [
            ("attn_qkv.weight", C::AttnQkv),
            ("attn_kv_b.weight", C::AttnKvB),
            ("attn_v.weight", C::AttnV),
            ("attn_k.weight", C::AttnK),
            ("attn_q.weight", C::AttnQ),
            ("attn_output.weight", C::AttnOutput),
            ("ffn_up", C::FfnUp),
            ("ffn_gate", C::FfnGate),
            ("ffn_down", C::FfnDown),
            ("", C::Other),
        ];
        BY_PART
            .iter()
            .find(|(part, _)| name.contains(part))
            .map_or(C::Other, |&(_, c)| c)
    }

    /// attn_v and the fused projections that contain it.
    fn is_attn_v(self) -> bool {
        matches!(
            self,
            Category::AttnV | Category::AttnQkv | Category::AttnKvB
        )
    }
}

/// Name parts of 2-D tensors that are never quantized (small, or precision-critical).
const KEEP_PARTS: &[&str] = &[
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// Whether llama.cpp quantizes a tensor at all (`n_dims` after dropping trailing 1s).
fn allows_quantization(name: &str, n_dims: usize) -> bool {
    n_dims >= 2
        && name.ends_with("weight")
        && name != "position_embd.weight"
        && name != "token_types.weight"
        && !KEEP_PARTS.iter().any(|p| name.contains(p))
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third one
/// in between.
fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

/// The layer number of a `blk.N.` tensor name, as C's `sscanf(name, "blk.%d.", &n)` reads it
/// (leading white space and a sign allowed); `None` when no number follows `blk.`.
fn blk_layer(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\u{b}', '\u{c}', '\r']);
    let (negative, digits) = match rest.as_bytes().first() {
        Some(b'-') => (true, &rest[1..]),
        Some(b'+') => (false, &rest[1..]),
        _ => (false, rest),
    };
    let end = digits
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 {
        return None;
    }
    let v = digits[..end].bytes().fold(0i64, |acc, b| {
        acc.saturating_mul(10).saturating_add(i64::from(b - b'0'))
    });
    let v = if negative { -v } else { v };
    Some(v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)))
}

/// llama.cpp's tensor order: by layer number (tensors outside `blk.N.` first), then by name.
pub fn tensor_order(a: &str, b: &str) -> std::cmp::Ordering {
    let la = blk_layer(a).unwrap_or(-1);
    let lb = blk_layer(b).unwrap_or(-1);
    la.cmp(&lb).then_with(|| a.cmp(b))
}

/// ggml's dimensions of a tensor: four, padded with 1s, then trailing 1s dropped (at least one
/// kept). This is what a GGUF writer records.
fn ggml_dims(dims: &[u64]) -> Vec<u64> {
    let n = dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    (0..n).map(|i| dims.get(i).copied().unwrap_or(1)).collect()
}

/// The type decision of one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The type written.
    pub ty: TensorType,
    /// A fallback warning, when the mix's type did not fit the row length.
    pub warning: Option<String>,
}

/// Chooses each tensor's type, in llama.cpp's tensor order (its counters depend on the order).
pub struct Planner<'f> {
    facts: &'f ModelFacts,
    ftype: FileType,
    pure: bool,
    /// No `output.weight`: the token embeddings double as the output matrix.
    tied_embeddings: bool,
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
}

impl<'f> Planner<'f> {
    /// A planner for a model whose tensors are named `names` (all of them, any order).
    pub fn new<'n>(
        facts: &'f ModelFacts,
        ftype: FileType,
        pure: bool,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Planner<'f> {
        let mut tied_embeddings = true;
        let mut n_attention_wv = 0;
        for name in names {
            let c = Category::of(name);
            n_attention_wv += i64::from(c.is_attn_v());
            tied_embeddings &= c != Category::Output;
        }
        Planner {
            facts,
            ftype,
            pure,
            tied_embeddings,
            n_attention_wv,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
        }
    }

    /// The type of the next tensor (call in llama.cpp's order, see [`tensor_order`]).
    pub fn decide(&mut self, name: &str, dims: &[u64], current: TensorType) -> Result<Decision> {
        let dims = ggml_dims(dims);
        if !allows_quantization(name, dims.len()) {
            return Ok(Decision {
                ty: current,
                warning: None,
            });
        }
        let ncols = dims[0];
        let mut ty = self.ftype.default_type();
        if !self.pure {
            ty = if self.ftype == FileType::Mxfp4Moe {
                // llama.cpp: the output (and tied embeddings) and every tensor that is no
                // stack of experts get Q8_0, the stacks MXFP4
                let c = Category::of(name);
                let head =
                    c == Category::Output || (self.tied_embeddings && c == Category::TokenEmbd);
                if !head && dims.get(2).is_some_and(|&n| n > 1) {
                    GgmlType::MXFP4
                } else {
                    GgmlType::Q8_0
                }
            } else {
                self.mix(name, Category::of(name), ncols, ty)?
            };
        }
        let (ty, warning) = fallback(name, ncols, ty)?;
        Ok(Decision {
            ty: TensorType::Known(ty),
            warning,
        })
    }

    /// The layer of an FFN tensor: parsed from the name in MoE models (experts need not be in
    /// order), otherwise the running count of such tensors.
    fn layer_info(&self, counter: i64, name: &str) -> Result<(i64, i64)> {
        let n_layer = self.facts.n_layer_all as i64;
        if self.facts.n_expert > 1 {
            let il = blk_layer(name)
                .with_context(|| format!("cannot determine the layer of tensor {name}"))?;
            if il < 0 || il >= n_layer {
                reject!("tensor {name}: layer {il} is outside [0, {n_layer})");
            }
            return Ok((il, n_layer));
        }
        Ok((counter, n_layer))
    }

    /// llama.cpp's per-tensor mix rules for the file types supported here.
    fn mix(&mut self, name: &str, c: Category, ncols: u64, default: GgmlType) -> Result<GgmlType> {
        use FileType as F;
        use GgmlType as T;
        let ft = self.ftype;
        let m = self.facts;
        let mut ty = default;
        if c == Category::Output || (self.tied_embeddings && c == Category::TokenEmbd) {
            if m.falcon() || !ncols.is_multiple_of(default.block_size() as u64) {
                ty = T::Q8_0;
            } else if ty != T::Q8_0 {
                ty = T::Q6_K;
            }
        } else if c == Category::TokenEmbd {
            // Only the ternary file types here (and llama.cpp's importance-matrix i-quant
            // types) change the token embeddings.
            if matches!(ft, F::TQ1_0 | F::TQ2_0) {
                ty = T::Q4_K;
            }
        } else if c.is_attn_v() {
            let (i, n) = (self.i_attention_wv, self.n_attention_wv);
            match ft {
                F::Q2_K => ty = if m.n_gqa >= 4 { T::Q4_K } else { T::Q3_K },
                F::Q3_K_M => ty = if i < 2 { T::Q5_K } else { T::Q4_K },
                F::Q3_K_L => ty = T::Q5_K,
                F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => ty = T::Q6_K,
                F::Q4_K_S if i < 4 => ty = T::Q5_K,
                F::IQ3_S if m.n_gqa >= 4 => ty = T::Q4_K,
                F::IQ3_M => ty = T::Q4_K,
                F::IQ4_NL | F::IQ4_XS if m.n_gqa >= 4 => ty = T::Q5_K,
                _ => {}
            }
            if m.is_70b && matches!(ty, T::Q3_K | T::Q4_K) {
                ty = T::Q5_K;
            }
            if m.n_expert == 8 {
                ty = T::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if c == Category::AttnK {
            if m.n_expert == 8 {
                ty = T::Q8_0;
            }
        } else if c == Category::FfnDown {
            let (il, nl) = self.layer_info(self.i_ffn_down, name)?;
            let more = use_more_bits(il, nl);
            match ft {
                F::Q2_K => ty = T::Q3_K,
                F::Q3_K_M => {
                    ty = if il < nl / 16 {
                        T::Q5_K
                    } else if !m.falcon() || more {
                        T::Q4_K
                    } else {
                        T::Q3_K
                    }
                }
                F::Q3_K_L => ty = if m.falcon() { T::Q4_K } else { T::Q5_K },
                F::Q4_K_M if m.falcon() => {
                    ty = if il < nl / 16 {
                        T::Q6_K
                    } else if more {
                        T::Q5_K
                    } else {
                        T::Q4_K
                    }
                }
                F::Q4_K_M | F::Q5_K_M if more => ty = T::Q6_K,
                F::Q4_K_S if !m.falcon() && il < nl / 8 => ty = T::Q5_K,
                F::IQ3_M if il < nl / 8 || (m.n_expert == 8 && more) => ty = T::Q4_K,
                // (without an importance matrix, which is always the case here)
                F::IQ4_NL | F::IQ4_XS if il < nl / 8 => ty = T::Q5_K,
                _ => {}
            }
            self.i_ffn_down += 1;
        } else if c == Category::AttnOutput {
            if !m.falcon() {
                if m.n_expert == 8 {
                    if matches!(
                        ft,
                        F::Q2_K
                            | F::Q3_K_S
                            | F::Q3_K_M
                            | F::Q4_K_S
                            | F::Q4_K_M
                            | F::IQ4_NL
                            | F::IQ3_S
                            | F::IQ3_M
                            | F::IQ4_XS
                    ) {
                        ty = T::Q5_K;
                    }
                } else {
                    match ft {
                        F::Q2_K => ty = T::Q3_K,
                        F::Q3_K_M => ty = T::Q4_K,
                        F::Q3_K_L => ty = T::Q5_K,
                        F::IQ3_M => ty = T::Q4_K,
                        _ => {}
                    }
                }
            } else if ft == F::Q3_K_L {
                ty = T::Q4_K;
            }
        } else if c == Category::FfnGate {
            // Only IQ3_XS changes these; the layer is still checked, as llama.cpp does.
            self.layer_info(self.i_ffn_gate, name)?;
            self.i_ffn_gate += 1;
        } else if c == Category::FfnUp {
            self.layer_info(self.i_ffn_up, name)?;
            self.i_ffn_up += 1;
        }
        Ok(ty)
    }
}

/// A type whose block does not divide the row length falls back to a 32-element block type
/// (and F16 when even that does not fit).
fn fallback(name: &str, ncols: u64, ty: GgmlType) -> Result<(GgmlType, Option<String>)> {
    use GgmlType as T;
    let block = ty.block_size() as u64;
    if ncols.is_multiple_of(block) {
        return Ok((ty, None));
    }
    let mut to = match ty {
        T::Q2_K | T::Q3_K | T::TQ1_0 | T::TQ2_0 => T::Q4_0,
        T::IQ1_S
        | T::IQ1_M
        | T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ4_XS => T::IQ4_NL,
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        t if block <= 32 => t,
        t => reject!("tensor {name}: no fallback type for {t} (row length {ncols})"),
    };
    if !ncols.is_multiple_of(to.block_size() as u64) {
        to = T::F16;
    }
    Ok((
        to,
        Some(format!(
            "{name}: row length {ncols} is not a multiple of {block} (needed by {ty}); using {to}"
        )),
    ))
}

/// The input types a tensor can be converted from: floats always, quantized types only with
/// --allow-requantize.
fn source_kind(ty: GgmlType) -> Option<bool> {
    use GgmlType as T;
    match ty {
        T::F32 | T::F16 | T::BF16 => Some(false),
        T::F64 | T::I8 | T::I16 | T::I32 | T::I64 => None,
        t if quant::can_dequantize(t) => Some(true),
        _ => None,
    }
}

/// One output tensor: where its bytes come from and what it becomes.
struct Job<'a> {
    info: &'a TensorInfo,
    dims: Vec<u64>,
    from: TensorType,
    to: TensorType,
}

/// Quantize `opts.input` to `opts.out`, telling `on` of every fallback and of each tensor as it
/// is written. The file is written to `OUT.tmp`, synced and renamed: a failed run leaves no
/// file behind (and `OUT.tmp` is removed).
pub fn quantize(opts: &Options, on: &mut dyn FnMut(Event<'_>)) -> Result<Quantized> {
    let input = opts.input.display().to_string();
    let src = GgufFile::open(&opts.input).with_context(|| format!("cannot read {input}"))?;
    let meta = src.metadata();
    let facts = ModelFacts::from_metadata(meta, &input)?;

    let mut tensors: Vec<&TensorInfo> = src.tensors().iter().collect();
    tensors.sort_by(|a, b| tensor_order(&a.name, &b.name));
    let mut planner = Planner::new(
        &facts,
        opts.ftype,
        opts.pure,
        tensors.iter().map(|t| t.name.as_str()),
    );
    let mut jobs = Vec::with_capacity(tensors.len());
    for t in &tensors {
        let d = planner
            .decide(&t.name, &t.dims, t.ty)
            .with_context(|| format!("{input}: cannot plan the quantization"))?;
        if let Some(w) = &d.warning {
            on(Event::Fallback(w));
        }
        if d.ty != t.ty {
            check_convertible(t, opts.allow_requantize)
                .with_context(|| format!("{input}: tensor {}", t.name))?;
        }
        jobs.push(Job {
            info: t,
            dims: ggml_dims(&t.dims),
            from: t.ty,
            to: d.ty,
        });
    }

    // The first tensor error, kept whole (the writer only passes an io::Error through).
    let failure: RefCell<Option<Error>> = RefCell::new(None);
    // Told of each tensor from inside the writer's callbacks.
    let on = RefCell::new(on);
    let mut w = GgufWriter::new();
    for (key, value) in meta.iter() {
        match key {
            "general.quantization_version" | "general.file_type" => continue,
            "split.no" | "split.count" | "split.tensors.count" => continue,
            // The data is always 32-aligned; another recorded alignment would be wrong.
            "general.alignment" if value != &Value::U32(ALIGNMENT) => continue,
            _ => w.add_metadata(key, value.clone())?,
        }
    }
    w.add_metadata(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    )?;
    w.add_metadata("general.file_type", Value::U32(opts.ftype.id()))?;

    let threads = opts
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let count = jobs.len();
    let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
    for (index, job) in jobs.into_iter().enumerate() {
        let data = src.tensor_data(job.info)?;
        bytes_in += data.len() as u64;
        let name = job.info.name.clone();
        let (from, to) = (job.from, job.to);
        let (on, failure) = (&on, &failure);
        let dims = job.dims.clone();
        let tell = move |name: &str| {
            let mut on = on.borrow_mut();
            on(Event::Tensor {
                index,
                count,
                name,
                dims: &dims,
                from,
                to,
            })
        };
        match (from, to) {
            (from, to) if from == to => {
                bytes_out += data.len() as u64;
                match to {
                    TensorType::Known(ty) => w.add_tensor_with(
                        name.clone(),
                        &job.dims,
                        ty,
                        move |out: &mut dyn Write| {
                            tell(&name);
                            out.write_all(data).map_err(|e| stash(failure, e.into()))
                        },
                    )?,
                    TensorType::Unknown(id) => w.add_tensor_raw(name, &job.dims, id, data)?,
                }
            }
            (TensorType::Known(from), TensorType::Known(to)) => {
                let n_per_row = usize::try_from(job.dims[0])
                    .map_err(|_| Error::failed(format!("tensor {name}: rows too long")))?;
                let n_rows = job.info.n_elements() / job.dims[0].max(1);
                bytes_out += n_rows * to.row_bytes(job.dims[0]).unwrap_or(0);
                w.add_tensor_with(name.clone(), &job.dims, to, move |out: &mut dyn Write| {
                    tell(&name);
                    let q = convert(from, to, data, n_per_row, threads)
                        .with_context(|| format!("tensor {name}"))
                        .map_err(|e| stash(failure, e))?;
                    out.write_all(&q).map_err(|e| stash(failure, e.into()))
                })?;
            }
            (from, to) => reject!(
                "{input}: tensor {name}: cannot convert type id {} to {}",
                from.id(),
                to.id()
            ),
        }
    }

    let tmp = tmp_path(&opts.out);
    let written = write_atomically(w, &tmp, &opts.out);
    if let Err(e) = written {
        if let Some(cause) = failure.take() {
            return Err(Error::Failed {
                msg: format!("{input}: quantization failed"),
                source: Some(Box::new(cause)),
            });
        }
        return Err(e);
    }
    Ok(Quantized {
        tensors: count,
        bytes_in,
        bytes_out,
    })
}

/// Why a tensor cannot be converted, if it cannot.
fn check_convertible(t: &TensorInfo, allow_requantize: bool) -> Result<()> {
    let TensorType::Known(ty) = t.ty else {
        reject!("unknown type id {} cannot be converted", t.ty.id());
    };
    match source_kind(ty) {
        None => reject!("type {ty} cannot be converted to a quantized type"),
        Some(true) if !allow_requantize => reject!(
            "already quantized ({ty}); requantizing loses precision, pass --allow-requantize to \
             do it anyway"
        ),
        Some(_) => Ok(()),
    }
}

/// Keep the first error whole in `slot` (it is what `quantize` returns); the writer only
/// needs an io::Error to stop on.
fn stash(slot: &RefCell<Option<Error>>, e: Error) -> io::Error {
    let msg = e.to_string();
    slot.borrow_mut().get_or_insert(e);
    io::Error::other(msg)
}

/// `OUT.tmp` next to `OUT`.
fn tmp_path(out: &Path) -> PathBuf {
    let mut s = OsString::from(out.as_os_str());
    s.push(".tmp");
    PathBuf::from(s)
}

/// Write to `tmp`, then rename over `out`; `tmp` is removed on any error.
fn write_atomically(w: GgufWriter<'_>, tmp: &Path, out: &Path) -> Result<()> {
    let result = (|| -> Result<()> {
        let file = File::create(tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let mut bw = BufWriter::new(file);
        w.write_to(&mut bw)?;
        let file = bw
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        file.sync_all()
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(tmp, out)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

/// Convert the rows of one tensor (`n_per_row` elements each) from `from` to `to`, splitting
/// the rows among `threads` threads. Every row is decoded to f32 (floats exactly), checked to
/// be finite, quantized with the reference quantizer and checked to decode to finite values
/// (llama.cpp's validation of quantized data).
fn convert(
    from: GgmlType,
    to: GgmlType,
    data: &[u8],
    n_per_row: usize,
    threads: usize,
) -> Result<Vec<u8>> {
    let row_bytes = |t: GgmlType| {
        t.row_bytes(n_per_row as u64)
            .and_then(|n| usize::try_from(n).ok())
            .context("bad row length")
    };
    let (in_row, out_row) = (row_bytes(from)?, row_bytes(to)?);
    if in_row == 0 || !data.len().is_multiple_of(in_row) {
        fail!("{} bytes is not a whole number of rows", data.len());
    }
    let n_rows = data.len() / in_row;
    let mut out = vec![0u8; n_rows * out_row];
    let per_thread = n_rows.div_ceil(threads.min(n_rows).max(1)).max(1);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = data
            .chunks(per_thread * in_row)
            .zip(out.chunks_mut(per_thread * out_row))
            .enumerate()
            .map(|(k, (src, dst))| {
                s.spawn(move || convert_rows(from, to, src, dst, n_per_row, k * per_thread))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::failed("a quantization thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect::<Result<()>>()?;
    Ok(out)
}

fn convert_rows(
    from: GgmlType,
    to: GgmlType,
    src: &[u8],
    dst: &mut [u8],
    n_per_row: usize,
    first_row: usize,
) -> Result<()> {
    let in_row = from.row_bytes(n_per_row as u64).unwrap_or(0) as usize;
    let out_row = to.row_bytes(n_per_row as u64).unwrap_or(0) as usize;
    let mut row = vec![0f32; n_per_row];
    let mut check = vec![0f32; n_per_row];
    for (r, (s, d)) in src
        .chunks_exact(in_row)
        .zip(dst.chunks_exact_mut(out_row))
        .enumerate()
    {
        let r = first_row + r;
        quant::dequantize_row(from, s, &mut row).with_context(|| format!("row {r}"))?;
        if let Some(j) = row.iter().position(|v| !v.is_finite()) {
            fail!("row {r}, column {j}: value {} is not finite", row[j]);
        }
        quant::quantize_row(to, &row, d).with_context(|| format!("row {r}"))?;
        quant::dequantize_row(to, d, &mut check).with_context(|| format!("row {r}"))?;
        if check.iter().any(|v| !v.is_finite()) {
            fail!("row {r}: values too large for {to} (a block scale overflows)");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_types_are_found_by_name_or_alias_in_any_case() {
        for t in FileType::ALL {
            assert_eq!(FileType::from_name(t.name()), Some(t));
            assert_eq!(FileType::from_name(&t.name().to_lowercase()), Some(t));
            assert!(!t.about().is_empty() && !t.about().ends_with('.'));
        }
        assert_eq!(FileType::from_name("q4_k"), Some(FileType::Q4_K_M));
        assert_eq!(FileType::from_name("Q4_K_X"), None);
        // the discriminants are llama.cpp's llama_ftype values
        assert_eq!(FileType::Q4_K_M.id(), 15);
        assert_eq!(FileType::Mxfp4Moe.id(), 38);
    }

    #[test]
    fn blk_layer_reads_like_sscanf() {
        assert_eq!(blk_layer("blk.12.attn_q.weight"), Some(12));
        assert_eq!(blk_layer("blk.3"), Some(3));
        assert_eq!(blk_layer("blk. -2.x"), Some(-2));
        assert_eq!(blk_layer("blk.x.attn"), None);
        assert_eq!(blk_layer("output.weight"), None);
    }

    #[test]
    fn order_puts_global_tensors_first_then_layers_numerically() {
        let mut names = vec![
            "blk.10.ffn_up.weight",
            "token_embd.weight",
            "blk.2.attn_q.weight",
            "blk.2.attn_k.weight",
            "output.weight",
            "blk.0.ffn_down.weight",
        ];
        names.sort_by(|a, b| tensor_order(a, b));
        assert_eq!(
            names,
            [
                "output.weight",
                "token_embd.weight",
                "blk.0.ffn_down.weight",
                "blk.2.attn_k.weight",
                "blk.2.attn_q.weight",
                "blk.10.ffn_up.weight",
            ]
        );
    }

    #[test]
    fn ggml_dims_drop_trailing_ones() {
        assert_eq!(ggml_dims(&[256, 1]), [256]);
        assert_eq!(ggml_dims(&[256, 1, 8]), [256, 1, 8]);
        assert_eq!(ggml_dims(&[1]), [1]);
        assert_eq!(ggml_dims(&[]), [1]);
    }

    #[test]
    fn norms_routers_and_vectors_are_never_quantized() {
        assert!(!allows_quantization("blk.0.attn_norm.weight", 2));
        assert!(!allows_quantization("blk.0.ffn_gate_inp.weight", 2));
        assert!(!allows_quantization("blk.0.attn_q.bias", 2));
        assert!(!allows_quantization("blk.0.attn_q.weight", 1));
        assert!(allows_quantization("blk.0.ffn_gate_inp_shexp.weight", 2));
        assert!(allows_quantization("blk.0.ffn_down_exps.weight", 3));
    }

    #[test]
    fn row_lengths_that_do_not_fit_fall_back() {
        let f = |n, t| fallback("t", n, t).unwrap().0;
        assert_eq!(f(512, GgmlType::Q4_K), GgmlType::Q4_K);
        assert_eq!(f(96, GgmlType::Q4_K), GgmlType::Q5_0);
        assert_eq!(f(96, GgmlType::Q5_K), GgmlType::Q5_1);
        assert_eq!(f(96, GgmlType::Q6_K), GgmlType::Q8_0);
        assert_eq!(f(96, GgmlType::Q3_K), GgmlType::Q4_0);
        assert_eq!(f(100, GgmlType::Q4_K), GgmlType::F16);
        assert_eq!(f(100, GgmlType::Q8_0), GgmlType::F16);
    }
}
