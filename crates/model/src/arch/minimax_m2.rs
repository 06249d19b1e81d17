//! MiniMax-M2 (`minimax-m2`, llama.cpp's `LLM_ARCH_MINIMAX_M2`): full attention with an RMS
//! QK-norm over each whole projection (all query heads at once, all key heads at once), NEOX
//! rope over the first `rope.dimension_count` elements of each head, and every layer routed:
//! a sigmoid router with a per-expert selection bias (`exp_probs_b`), the top-k weights
//! renormalised, no shared expert.
//!
//! llama.cpp shapes the experts by `feed_forward_length` and requires
//! `expert_feed_forward_length` as well; the two must agree. It always renormalises the top-k
//! weights and never scales them, whatever `expert_weights_norm` / `expert_weights_scale` say;
//! those keys are held to the values it uses. The routing is sigmoid when
//! `expert_gating_func` is absent (the model's router; llama.cpp has no default and stops).

use crate::error::ModelError;
use crate::kv::{Kv, invalid};
use crate::params::HParams;

use super::blocks::{LayerRules, MoeRules, Presence};
use super::keys::{self, ExpertRules};
use super::{ArchDef, ExpertGating, Features, QkNorm};

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "minimax-m2"
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: QkNorm::Whole,
            partial_rope: true,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            weights_norm: true,
            gating: ExpertGating::Sigmoid,
            reads_gating_func: true,
            ..ExpertRules::MOE
        }
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        let k = |s: &str| kv.key(s);
        if hp.n_layer_dense_lead > 0 {
            return Err(invalid(
                k("leading_dense_block_count"),
                format!(
                    "{} dense layers, but every layer of this architecture is routed",
                    hp.n_layer_dense_lead
                ),
            ));
        }
        for il in 0..hp.n_layer_all() as usize {
            let (exp, ffn) = (hp.n_ff_exp.at(il), hp.n_ff.at(il));
            if exp != ffn {
                return Err(invalid(
                    k("expert_feed_forward_length"),
                    format!(
                        "layer {il}: {exp} differs from feed_forward_length {ffn}, by which \
                         llama.cpp shapes the experts"
                    ),
                ));
            }
        }
        keys::renormalised_unscaled(kv, hp)?;
        Ok(())
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

    fn output_required(&self) -> bool {
        true
    }
}
