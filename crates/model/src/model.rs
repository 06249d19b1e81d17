//! A model: architecture, hyperparameters and tensor roles over an opened GGUF file.

use std::fmt::Write as _;

use gguf::{GgufError, GgufFile, TensorInfo};

use crate::arch::{Arch, QkNorm, RopeType, SharedExperts};
use crate::error::ModelError;
use crate::params::{HParams, KEY_ARCH};
use crate::rope::RopeScalingType;
use crate::tensors::{Ffn, ModelTensors};

/// A model over an opened GGUF file. Nothing is copied: every tensor role points into the
/// file's tensor table, and the bytes stay in the file's map.
#[derive(Debug, Clone)]
pub struct Model<'a> {
    file: &'a GgufFile,
    /// `general.name`, when present.
    pub name: Option<String>,
    /// Validated hyperparameters.
    pub hparams: HParams,
    /// Tensor roles.
    pub tensors: ModelTensors<'a>,
}

/// The architecture named by a file's `general.architecture`.
pub fn arch_of(file: &GgufFile) -> Result<Arch, ModelError> {
    match file.metadata().get(KEY_ARCH) {
        None => Err(ModelError::MissingKey(KEY_ARCH.to_owned())),
        Some(v) => match v.as_str() {
            Some(s) => Arch::from_name(s),
            None => Err(ModelError::KeyType {
                key: KEY_ARCH.to_owned(),
                expected: "string",
                found: v.value_type().to_string(),
            }),
        },
    }
}

/// `n` bytes in the largest binary unit (B to TiB) that keeps the number at least 1, with
/// `decimals` decimals (whole bytes have none): `human_bytes(1536, 1)` is `1.5 KiB`.
pub fn human_bytes(n: u64, decimals: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.decimals$} {}", UNITS[u])
    }
}

/// A per-layer value as one number when every layer has it, else the list.
fn per_layer_text(p: &crate::params::PerLayer) -> String {
    match p.uniform() {
        Some(v) => v.to_string(),
        None => format!("{:?}", p.as_slice()),
    }
}

fn bytes_of(t: &TensorInfo) -> u64 {
    t.n_bytes.unwrap_or(0)
}

impl<'a> Model<'a> {
    /// Read the architecture, hyperparameters and tensor table of `file`.
    pub fn from_gguf(file: &'a GgufFile) -> Result<Model<'a>, ModelError> {
        let arch = arch_of(file)?;
        let hparams = HParams::from_metadata(arch, file.metadata())?;
        let tensors = ModelTensors::from_file(file, &hparams)?;
        let name = file.metadata().get_str("general.name").map(str::to_owned);
        Ok(Model {
            file,
            name,
            hparams,
            tensors,
        })
    }

    /// The file the model reads from.
    pub fn file(&self) -> &'a GgufFile {
        self.file
    }

    /// The architecture.
    pub fn arch(&self) -> Arch {
        self.hparams.arch
    }

    /// The bytes of a tensor, borrowed from the file's map.
    pub fn data(&self, t: &TensorInfo) -> Result<&'a [u8], GgufError> {
        self.file.tensor_data(t)
    }

    /// Bytes of routed-expert weights in layer `il` (0 for a dense layer or an unknown size).
    pub fn expert_bytes(&self, il: usize) -> u64 {
        match self.tensors.layers.get(il).map(|l| &l.ffn) {
            Some(Ffn::Moe(m)) => m.expert_bytes().unwrap_or(0),
            _ => 0,
        }
    }

    /// Bytes of every tensor of the file that is neither a routed expert of the trunk nor part
    /// of a NextN layer (the resident set).
    pub fn dense_bytes(&self) -> u64 {
        let total: u64 = self.file.tensors().iter().map(bytes_of).sum();
        let experts: u64 = (0..self.tensors.layers.len())
            .map(|il| self.expert_bytes(il))
            .sum();
        total
            .saturating_sub(experts)
            .saturating_sub(self.nextn_bytes())
    }

    /// Bytes of the NextN layers (never run by decoding, so never loaded).
    pub fn nextn_bytes(&self) -> u64 {
        self.tensors
            .nextn
            .iter()
            .flat_map(|l| l.tensors())
            .map(bytes_of)
            .sum()
    }

    /// A multi-line human-readable description (for `sluice inspect`).
    pub fn summary(&self) -> String {
        let mut s = String::new();
        self.describe_head(&mut s);
        self.describe_attention(&mut s);
        self.describe_mla(&mut s);
        self.hparams.arch.def().describe(self, &mut s);
        self.describe_ssm(&mut s);
        self.describe_rope(&mut s);
        self.describe_ffn(&mut s);
        self.describe_weights(&mut s);
        s
    }

    /// The architecture, name and sizes.
    fn describe_head(&self, s: &mut String) {
        let hp = &self.hparams;
        let _ = writeln!(
            *s,
            "arch: {}{}",
            hp.arch,
            self.name
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        );
        let no_ffn = (0..hp.n_layer as usize)
            .filter(|&il| hp.has_no_ffn(il))
            .count() as u32;
        let _ = writeln!(
            *s,
            "layers: {} ({} MoE, {} dense{}), n_embd {}, vocab {}, context {}",
            hp.n_layer,
            hp.n_moe_layers(),
            hp.n_layer - hp.n_moe_layers() - no_ffn,
            if no_ffn > 0 {
                format!(", {no_ffn} without an FFN")
            } else {
                String::new()
            },
            hp.n_embd,
            hp.n_vocab,
            hp.n_ctx_train
        );
    }

    /// The attention heads and norms.
    fn describe_attention(&self, s: &mut String) {
        let hp = &self.hparams;
        let _ = writeln!(
            *s,
            "attention: {} heads, {} kv heads, head dim {}{}, qk-norm {}, rms eps {:e}",
            per_layer_text(&hp.n_head),
            per_layer_text(&hp.n_head_kv),
            hp.head_dim_k,
            if (self.tensors.layers.iter().filter_map(|l| l.mha())).any(|m| m.fused_qkv) {
                ", q/k/v fused (attn_qkv)"
            } else {
                ""
            },
            match hp.features.qk_norm {
                QkNorm::None => "none".to_owned(),
                QkNorm::PerHead if hp.features.qk_norm_optional => {
                    let with = self
                        .tensors
                        .layers
                        .iter()
                        .filter_map(|l| l.mha())
                        .filter(|m| m.q_norm.is_some() || m.k_norm.is_some())
                        .count();
                    format!("per head in {with} of {} layers", hp.n_layer)
                }
                QkNorm::PerHead => "per head".to_owned(),
                QkNorm::Whole => "whole projection".to_owned(),
            },
            hp.rms_eps
        );
    }

    /// Multi-head latent attention's sizes, where the model has it.
    fn describe_mla(&self, s: &mut String) {
        let hp = &self.hparams;
        if let Some(m) = &hp.mla {
            let n_rot = hp.rope.n_rot;
            let n_head = hp.n_head.max();
            let cached = hp.kv_values_per_token(0);
            let _ = writeln!(
                s,
                "latent attention (MLA, {}): query {}, kv rank {}, head {} = {} plain + {} rotated, value {}; cache per token and layer {} values ({}; as plain multi-head attention {} x ({} + {}))",
                if m.absorbed {
                    "absorbed: attn_k_b/attn_v_b, one shared key/value head"
                } else {
                    "legacy attn_kv_b: expanded per head"
                },
                if m.q_lora_rank > 0 {
                    format!("rank {}", m.q_lora_rank)
                } else {
                    "direct (attn_q)".to_owned()
                },
                m.kv_lora_rank,
                m.head_dim_k,
                m.head_dim_nope(n_rot),
                n_rot,
                m.head_dim_v,
                cached,
                if m.absorbed {
                    format!(
                        "one key of {}, whose first {} are the value",
                        hp.head_dim_k, hp.head_dim_v
                    )
                } else {
                    format!(
                        "{n_head} heads x (key {} + value {})",
                        hp.head_dim_k, hp.head_dim_v
                    )
                },
                n_head,
                m.head_dim_k,
                m.head_dim_v
            );
        }
    }

    /// The linear-attention layers of a hybrid stack.
    fn describe_ssm(&self, s: &mut String) {
        let hp = &self.hparams;
        if let Some(ssm) = &hp.ssm {
            let n_rec = (0..hp.n_layer as usize)
                .filter(|&il| hp.is_recurrent(il))
                .count();
            let state = ssm.conv_state_len() + ssm.state_len();
            let order = if hp.features.gdn_grouped_heads {
                "grouped by key head"
            } else {
                "tiled over the key heads"
            };
            let rope = if hp.features.imrope {
                format!(", IMRoPE sections {:?}", hp.rope.sections)
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "layer types: {n_rec} linear attention (Gated DeltaNet: {} key heads, {} value heads of {} {order}, convolution over {} of {} channels; state per sequence and layer {} floats = convolution {} + recurrent {}, {} in all), {} full attention (sigmoid-gated output{rope})",
                ssm.n_k_heads,
                ssm.n_v_heads,
                ssm.d_state,
                ssm.d_conv,
                ssm.conv_channels(),
                state,
                ssm.conv_state_len(),
                ssm.state_len(),
                human_bytes((state * n_rec * 4) as u64, 1),
                hp.n_layer as usize - n_rec,
            );
        }
    }

    /// The rotary embedding.
    fn describe_rope(&self, s: &mut String) {
        let hp = &self.hparams;
        if (0..hp.n_layer as usize).all(|il| !hp.has_rope(il)) {
            let _ = writeln!(*s, "rope: none (no layer rotates its queries and keys)");
            return;
        }
        let scaling = if hp.rope.freq_scale == 1.0 && hp.rope.yarn_ext_factor == 0.0 {
            "off".to_owned()
        } else {
            format!(
                "{} x{} (original context {})",
                match hp.rope.scaling {
                    RopeScalingType::None => "none",
                    RopeScalingType::Linear => "linear",
                    RopeScalingType::Yarn => "yarn",
                },
                hp.rope.scaling_factor,
                hp.rope.n_ctx_orig
            )
        };
        let _ = writeln!(
            *s,
            "rope: {} over {} dims{}, base {}, scaling {scaling}",
            match hp.features.rope_type {
                RopeType::Norm => "norm",
                RopeType::Neox => "neox",
            },
            hp.rope.n_rot,
            if hp.mla.is_none() && hp.rope.n_rot < hp.head_dim_k {
                format!(" of {} (partial)", hp.head_dim_k)
            } else {
                String::new()
            },
            hp.rope.freq_base,
        );
    }

    /// The experts (or the dense FFN).
    fn describe_ffn(&self, s: &mut String) {
        let hp = &self.hparams;
        if hp.n_expert > 0 {
            let _ = writeln!(
                s,
                "experts: {} per layer, {} used per token, width {}, router {}{}{} -> top-k{}{}{}",
                hp.n_expert,
                per_layer_text(&hp.n_expert_used),
                hp.n_ff_exp.max(),
                hp.expert_gating.name(),
                {
                    let biased = self
                        .tensors
                        .layers
                        .iter()
                        .any(|l| matches!(&l.ffn, Ffn::Moe(m) if m.selection_bias.is_some()));
                    if biased { " (+ selection bias)" } else { "" }
                },
                if hp.n_expert_groups > 1 {
                    format!(
                        " -> best {} of {} expert groups",
                        hp.n_group_used, hp.n_expert_groups
                    )
                } else {
                    String::new()
                },
                if hp.expert_weights_norm {
                    " -> renormalise"
                } else {
                    ""
                },
                if hp.expert_weights_scale != 0.0 && hp.expert_weights_scale != 1.0 {
                    format!(" -> x{}", hp.expert_weights_scale)
                } else {
                    String::new()
                },
                match hp.features.shared_experts {
                    _ if hp.n_expert_shared == 0 => String::new(),
                    SharedExperts::Gated =>
                        format!(", shared expert width {} (sigmoid gate)", hp.n_ff_shexp),
                    _ => format!(
                        ", {} shared expert(s) of width {} (ungated)",
                        hp.n_expert_shared, hp.n_ff_shexp
                    ),
                }
            );
            if hp.n_layer_dense_lead > 0 {
                let _ = writeln!(*s, "leading dense layers: {}", hp.n_layer_dense_lead);
            }
        } else {
            let _ = writeln!(*s, "ffn: dense, width {}", per_layer_text(&hp.n_ff));
        }
    }

    /// The output, the weight bytes, NextN layers and each layer's experts.
    fn describe_weights(&self, s: &mut String) {
        let hp = &self.hparams;
        let _ = writeln!(
            *s,
            "output: {}",
            if self.tensors.output_tied {
                "tied to token_embd"
            } else {
                "separate output.weight"
            }
        );
        let expert_total: u64 = (0..self.tensors.layers.len())
            .map(|il| self.expert_bytes(il))
            .sum();
        let _ = writeln!(
            *s,
            "weights: {} resident (non-expert), {} routed experts",
            human_bytes(self.dense_bytes(), 2),
            human_bytes(expert_total, 2)
        );
        if hp.n_layer_nextn > 0 {
            let _ = writeln!(
                s,
                "nextn (multi-token prediction) layers: {} ({}), {}; not run by decoding, not loaded",
                hp.n_layer_nextn,
                self.tensors
                    .nextn
                    .iter()
                    .map(|l| format!("blk.{}", l.layer))
                    .collect::<Vec<_>>()
                    .join(", "),
                if self.tensors.nextn.is_empty() {
                    "absent from this file (trunk only)".to_owned()
                } else {
                    human_bytes(self.nextn_bytes(), 2)
                }
            );
        }
        for (il, l) in self.tensors.layers.iter().enumerate() {
            if let Ffn::Moe(m) = &l.ffn {
                let _ = writeln!(
                    s,
                    "  layer {il}: experts {} ({} bytes; {} per expert; gate {}, up {}{}, down {})",
                    human_bytes(m.expert_bytes().unwrap_or(0), 2),
                    m.expert_bytes().unwrap_or(0),
                    human_bytes(m.bytes_per_expert().unwrap_or(0), 2),
                    m.gate_exps.map_or("none".to_owned(), |g| g.ty.to_string()),
                    m.up_exps.ty,
                    if m.fused_gate_up {
                        " (fused: ffn_gate_up_exps)"
                    } else {
                        ""
                    },
                    m.down_exps.ty
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn byte_counts_take_the_largest_unit_that_keeps_them_above_one() {
        assert_eq!(human_bytes(0, 2), "0 B");
        assert_eq!(human_bytes(1023, 2), "1023 B");
        assert_eq!(human_bytes(1024, 2), "1.00 KiB");
        assert_eq!(human_bytes(1536, 1), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30, 1), "3.0 GiB");
        assert_eq!(human_bytes(5 << 40, 2), "5.00 TiB");
        assert_eq!(human_bytes(u64::MAX, 0), "16777216 TiB");
    }
}
