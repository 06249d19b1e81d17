//! Ling 2.0 and Ring 2.0 (`bailingmoe2`, llama.cpp's `LLM_ARCH_BAILINGMOE2`: Ling-mini-2.0,
//! Ling-flash-2.0, Ring-mini-2.0…): the q, k and v projections in one `attn_qkv` tensor (queries
//! as wide as `n_embd`), per-head QK-norm, NEOX rope over part of each head, leading dense
//! layers, then MoE layers routed by the function `expert_gating_func` names (sigmoid in the
//! released models) with an optional selection bias (`exp_probs_b`), expert groups, the top-k
//! weights renormalised and scaled as the keys say, and ungated shared experts; NextN layers
//! after the trunk, each with an output norm of its own (`layer_output_norm`), which llama.cpp
//! keeps without running.

use crate::error::ModelError;
use crate::kv::{Kv, invalid};
use crate::params::HParams;

use super::blocks::{LayerRules, MoeRules, Presence};
use super::keys::ExpertRules;
use super::{ArchDef, ExpertGating, Features, NextnRules, QDim, QkNorm, SharedExperts};

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "bailingmoe2"
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: QkNorm::PerHead,
            partial_rope: true,
            q_dim: QDim::Embd,
            nextn: true,
            shared_experts: SharedExperts::CountedKeyed,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            gating: ExpertGating::Sigmoid,
            gating_func_required: true,
            ..ExpertRules::MOE
        }
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        let k = |s: &str| kv.key(s);
        // llama.cpp shapes every MoE layer's experts (and the shared experts' default width)
        // by the first layer's value of expert_feed_forward_length
        let width_key = k("expert_feed_forward_length");
        let first = kv
            .per_layer(&width_key, hp.n_layer_all())?
            .map_or(0, |p| p.at(0));
        for il in hp.n_layer_dense_lead as usize..hp.n_layer_all() as usize {
            let w = hp.n_ff_exp.at(il);
            if w != first {
                return Err(invalid(
                    width_key,
                    format!(
                        "layer {il} has experts of width {w}; {} takes every layer's as wide as layer 0's ({first})",
                        hp.arch
                    ),
                ));
            }
        }
        if hp.n_expert_shared == 0 {
            return Err(invalid(
                k("expert_shared_count"),
                format!("{} has shared experts in every MoE layer; 0 given", hp.arch),
            ));
        }
        Ok(())
    }

    fn layer_rules(&self) -> LayerRules {
        LayerRules {
            fused_qkv: true,
            moe: MoeRules {
                selection_bias: Presence::Optional,
                ..LayerRules::BASE.moe
            },
            ..LayerRules::BASE
        }
    }

    fn output_required(&self) -> bool {
        true
    }

    fn nextn_rules(&self) -> NextnRules {
        NextnRules {
            trunk_only: false,
            out_norm: true,
        }
    }
}
