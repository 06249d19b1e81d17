//! LFM2 MoE (`lfm2moe`: LFM2-8B-A1B, LFM2-24B-A2B): a hybrid stack of LFM2 short-convolution
//! layers and attention layers, told apart by `attention.head_count_kv` (0: short
//! convolution), leading dense layers, then experts routed by the file's gating function
//! (sigmoid in the published models) with a per-expert selection bias (`exp_probs_b`), the
//! top-k weights always renormalised and never scaled.
//!
//! A short-convolution layer projects its normed input into B, C and x (`shortconv.in_proj`),
//! convolves `B · x` causally over the last `shortconv.l_cache` positions of each channel
//! (its state per sequence: the last `l_cache - 1` of them), multiplies by C and projects the
//! result (`shortconv.out_proj`). The attention layers normalise each query and key head
//! (RMS) and rotate them NEOX-style. The final norm is stored as `token_embd_norm`.
//! llama.cpp's loader reads neither `expert_weights_norm` nor `expert_weights_scale` for this
//! architecture (its graph always renormalises and never scales), so neither is read here.

use crate::error::ModelError;
use crate::kv::{Kv, invalid};
use crate::model::Model;
use crate::params::HParams;
use crate::tensors::{Attn, LayerTensors, Loader, ShortConvTensors};

use super::blocks::{self, LayerRules, MoeRules, Presence};
use super::keys::ExpertRules;
use super::{ArchDef, Features, QDim, QkNorm};

use std::fmt::Write as _;

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "lfm2moe"
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: QkNorm::PerHead,
            q_dim: QDim::Embd,
            shortconv: true,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            weights_norm: true,
            gating_func_required: true,
            ..ExpertRules::MOE
        }
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        let k = |s: &str| kv.key(s);
        // the graph's own routing rules, whatever the file says
        hp.expert_weights_norm = true;
        hp.expert_weights_scale = 0.0;
        let l_cache_key = k("shortconv.l_cache");
        let l_cache = kv.u32_req(&l_cache_key)?;
        if l_cache < 2 {
            return Err(invalid(
                l_cache_key,
                format!("{l_cache}; the short convolution needs a width of at least 2"),
            ));
        }
        hp.shortconv_l_cache = l_cache;
        let nl = hp.n_layer as usize;
        hp.recurrent = (0..hp.n_layer_all() as usize)
            .map(|il| il < nl && hp.n_head_kv.at(il) == 0)
            .collect();
        for il in 0..nl {
            if !hp.is_recurrent(il) && hp.n_head.at(il) * hp.head_dim_k != hp.n_embd {
                return Err(invalid(
                    k("attention.head_count"),
                    format!(
                        "layer {il}: {} heads of {} are not n_embd ({}) wide",
                        hp.n_head.at(il),
                        hp.head_dim_k,
                        hp.n_embd
                    ),
                ));
            }
        }
        Ok(())
    }

    fn output_norm_name(&self) -> &'static str {
        "token_embd_norm.weight"
    }

    fn layer_rules(&self) -> LayerRules {
        LayerRules {
            moe: MoeRules {
                selection_bias: Presence::Required,
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
        blocks::layer(ld, hp, il, &self.layer_rules(), |ld| {
            if hp.is_recurrent(il) {
                let n = |s: &str| format!("blk.{il}.{s}");
                let e = u64::from(hp.n_embd);
                Ok(Attn::ShortConv(ShortConvTensors {
                    in_proj: ld.req(&n("shortconv.in_proj.weight"), &[e, 3 * e])?,
                    conv: ld.req(
                        &n("shortconv.conv.weight"),
                        &[u64::from(hp.shortconv_l_cache), e],
                    )?,
                }))
            } else {
                Ok(Attn::Mha(blocks::mha(ld, hp, il, false)?))
            }
        })
    }

    fn describe(&self, m: &Model<'_>, out: &mut String) {
        let hp = &m.hparams;
        let n_rec = (0..hp.n_layer as usize)
            .filter(|&il| hp.is_recurrent(il))
            .count();
        let state = (hp.shortconv_l_cache as usize).saturating_sub(1) * hp.n_embd as usize;
        let _ = writeln!(
            out,
            "layer types: {n_rec} short convolution (over {} positions of {} channels; state per \
             sequence and layer {state} floats, {} in all), {} attention",
            hp.shortconv_l_cache,
            hp.n_embd,
            crate::human_bytes((state * n_rec * 4) as u64, 1),
            hp.n_layer as usize - n_rec,
        );
    }
}
