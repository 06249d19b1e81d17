//! Nemotron-H MoE (`nemotron_h_moe`: NVIDIA Nemotron-3-Nano-30B-A3B, Nemotron-3-Super): a
//! hybrid stack whose every layer is one block — a norm (`attn_norm`), one part, the residual
//! add — and the part is one of three, told apart per layer by `attention.head_count_kv` and
//! `feed_forward_length` as llama.cpp's loader tells them:
//!
//! - both 0: a Mamba-2 mixer (`ssm_in` into the gate z, the convolution's input x·B·C and the
//!   heads' time steps; a causal convolution with bias and SiLU continuing from the layer's
//!   state; the selective scan over one `d_state` state per channel of x, with each head's
//!   decay `A` and skip `D`; `silu(z)` times the result; an RMS norm per group of heads;
//!   `ssm_out`);
//! - kv heads, no FFN width: attention alone, with no rotary embedding at all;
//! - no kv heads, an FFN width: routed experts alone — sigmoid routing with a selection bias
//!   (`exp_probs_b`), ReLU² experts without a gate (`down(relu(up · x)²)`), a ReLU² shared
//!   expert beside them; Nemotron 3 Super's experts work in a latent space (`moe_latent_size`,
//!   `ffn_latent_down` before them, `ffn_latent_up` after).
//!
//! The MTP head a converter appends to Super (`nextn_predict_layers`) is not read: such a file
//! is refused by name (a file converted without it opens).

use crate::error::ModelError;
use crate::kv::{Kv, invalid};
use crate::model::Model;
use crate::params::{HParams, Mamba2};
use crate::tensors::{Attn, Ffn, LayerTensors, Loader, Mamba2Tensors};

use super::blocks::{self, LayerRules, MoeRules, Presence};
use super::keys::{ExpertRules, ExpertWidth};
use super::{ArchDef, ExpertGating, Features, FfnAct, SharedExperts};

use std::fmt::Write as _;

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "nemotron_h_moe"
    }

    fn features(&self) -> Features {
        Features {
            ffn_act: FfnAct::ReluSqr,
            shared_experts: SharedExperts::Keyed,
            mamba2: true,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            width: ExpertWidth::KeyOrFfnPerUsed,
            gating: ExpertGating::Sigmoid,
            ..ExpertRules::MOE
        }
    }

    fn read_layer_types(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        let k = |s: &str| kv.key(s);
        let nextn_key = k("nextn_predict_layers");
        if let Some(n) = kv.u32(&nextn_key)?
            && n > 0
        {
            return Err(ModelError::Unsupported(format!(
                "{nextn_key} = {n}: Nemotron-H's MTP head is not supported (a file converted \
                 without it opens)"
            )));
        }
        let m = mamba2(kv)?;
        let nl = hp.n_layer as usize;
        let (mut recurrent, mut no_mixer, mut no_ffn) =
            (vec![false; nl], vec![false; nl], vec![false; nl]);
        for il in 0..nl {
            let (kv_heads, ff) = (hp.n_head_kv.at(il), hp.n_ff.at(il));
            match (kv_heads, ff) {
                (0, 0) => {
                    recurrent[il] = true;
                    no_ffn[il] = true;
                }
                (_, 0) => no_ffn[il] = true,
                (0, _) => no_mixer[il] = true,
                (h, w) => {
                    return Err(invalid(
                        k("feed_forward_length"),
                        format!(
                            "layer {il} has {h} kv heads and an FFN of width {w}; a \
                             Nemotron-H layer is attention, Mamba-2 or an FFN, one of them"
                        ),
                    ));
                }
            }
        }
        hp.recurrent = recurrent;
        hp.no_mixer = no_mixer;
        hp.no_ffn = no_ffn;
        hp.mamba2 = Some(m);
        hp.moe_latent = kv.u32(&k("moe_latent_size"))?.unwrap_or(0);
        Ok(())
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        // no layer rotates its queries and keys (llama.cpp's rope type for it is none)
        hp.nope_layers = vec![true; hp.n_layer_all() as usize];
        hp.rope.n_rot = hp.head_dim_k;
        if hp.n_expert_used.as_slice().windows(2).any(|w| w[0] != w[1]) {
            return Err(ModelError::Unsupported(format!(
                "{}: a top-k that differs between layers (Nemotron-H's Puzzle models) is not \
                 supported",
                kv.key("expert_used_count")
            )));
        }
        Ok(())
    }

    fn layer_rules(&self) -> LayerRules {
        LayerRules {
            out_bias: Presence::Optional,
            moe: MoeRules {
                selection_bias: Presence::Required,
                ungated: true,
                ..LayerRules::BASE.moe
            },
            ..LayerRules::BASE
        }
    }

    fn layer<'a>(
        &self,
        ld: &mut Loader<'a>,
        hp: &HParams,
        il: usize,
    ) -> Result<LayerTensors<'a>, ModelError> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let e = u64::from(hp.n_embd);
        let r = self.layer_rules();
        if hp.has_no_mixer(il) {
            // the block's one norm is the FFN's
            let norm = ld.req(&n("attn_norm.weight"), &[e])?;
            return Ok(LayerTensors {
                attn_norm: None,
                attn: Attn::None,
                wo: None,
                bo: None,
                attn_sinks: None,
                ffn_norm: Some(norm),
                ffn: Ffn::Moe(blocks::moe_ffn(ld, hp, il, &r.moe)?),
                gemma: None,
            });
        }
        let attn_norm = ld.req(&n("attn_norm.weight"), &[e])?;
        let (attn, wo, bo) = match hp.mamba2.filter(|_| hp.is_recurrent(il)) {
            Some(m) => {
                let ch = u64::from(m.conv_channels());
                let heads = u64::from(m.n_head);
                let attn = Attn::Mamba2(Mamba2Tensors {
                    in_proj: ld.req(&n("ssm_in.weight"), &[e, u64::from(m.in_proj_rows())])?,
                    conv1d: ld.req(&n("ssm_conv1d.weight"), &[u64::from(m.d_conv), ch])?,
                    conv1d_b: ld.opt(&n("ssm_conv1d.bias"), &[ch])?,
                    dt_bias: ld.req(&n("ssm_dt.bias"), &[heads])?,
                    a: ld.req(&n("ssm_a"), &[1, heads])?,
                    d: ld.req(&n("ssm_d"), &[1, heads])?,
                    norm: ld.req(
                        &n("ssm_norm.weight"),
                        &[
                            u64::from(m.d_inner / m.n_group),
                            u64::from(m.n_group),
                        ],
                    )?,
                });
                let wo = ld.req(&n("ssm_out.weight"), &[u64::from(m.d_inner), e])?;
                (attn, wo, None)
            }
            None => {
                let attn = Attn::Mha(blocks::mha(ld, hp, il, false)?);
                let wo = ld.req(
                    &n("attn_output.weight"),
                    &[u64::from(hp.n_embd_out(il)), e],
                )?;
                let bo = r.out_bias.find(ld, &n("attn_output.bias"), &[e])?;
                (attn, wo, bo)
            }
        };
        Ok(LayerTensors {
            attn_norm: Some(attn_norm),
            attn,
            wo: Some(wo),
            bo,
            attn_sinks: None,
            ffn_norm: None,
            ffn: Ffn::None,
            gemma: None,
        })
    }

    fn describe(&self, m: &Model<'_>, out: &mut String) {
        let hp = &m.hparams;
        let nl = hp.n_layer as usize;
        let kinds: String = (0..nl)
            .map(|il| {
                if hp.is_recurrent(il) {
                    'M'
                } else if hp.has_no_mixer(il) {
                    'E'
                } else {
                    '*'
                }
            })
            .collect();
        let count = |c: char| kinds.chars().filter(|&k| k == c).count();
        let _ = writeln!(
            out,
            "layer types: {kinds} ({} Mamba-2, {} attention, {} MoE)",
            count('M'),
            count('*'),
            count('E'),
        );
        if let Some(s) = &hp.mamba2 {
            let floats = s.conv_state_len() + s.state_len();
            let _ = writeln!(
                out,
                "mamba-2: {} heads of {} in {} groups, state {} per channel, convolution over {} \
                 positions; state per sequence and layer {floats} floats, {} in all",
                s.n_head,
                s.head_dim(),
                s.n_group,
                s.d_state,
                s.d_conv,
                crate::human_bytes((floats * count('M') * 4) as u64, 1),
            );
        }
        if hp.moe_latent > 0 {
            let _ = writeln!(
                out,
                "experts in a latent space of {} (from n_embd {})",
                hp.moe_latent, hp.n_embd
            );
        }
    }
}

/// The Mamba-2 keys, required and checked as the scan needs them.
fn mamba2(kv: &Kv<'_>) -> Result<Mamba2, ModelError> {
    let k = |s: &str| kv.key(s);
    let req = |s: &str| -> Result<u32, ModelError> {
        let key = k(s);
        let v = kv.u32_req(&key)?;
        if v == 0 {
            return Err(invalid(key, "must be > 0"));
        }
        Ok(v)
    };
    let m = Mamba2 {
        d_conv: req("ssm.conv_kernel")?,
        d_inner: req("ssm.inner_size")?,
        d_state: req("ssm.state_size")?,
        n_head: req("ssm.time_step_rank")?,
        n_group: req("ssm.group_count")?,
    };
    if m.d_conv < 2 {
        return Err(invalid(
            k("ssm.conv_kernel"),
            format!("{}; the convolution needs a width of at least 2", m.d_conv),
        ));
    }
    if !m.d_inner.is_multiple_of(m.n_head) {
        return Err(invalid(
            k("ssm.time_step_rank"),
            format!("{} heads do not split d_inner {}", m.n_head, m.d_inner),
        ));
    }
    if !m.n_head.is_multiple_of(m.n_group) {
        return Err(invalid(
            k("ssm.group_count"),
            format!("{} groups do not split the {} heads", m.n_group, m.n_head),
        ));
    }
    Ok(m)
}
