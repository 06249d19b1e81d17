//! GLM-4.5 (`glm4moe`, llama.cpp's `LLM_ARCH_GLM4_MOE`): leading dense layers, then MoE layers
//! with sigmoid routing and a per-expert selection bias (`exp_probs_b`), an ungated shared
//! expert, q/k/v biases, optional per-head QK-norm, NEOX rope over part of each head, and NextN
//! (multi-token prediction) layers after the trunk.

use crate::params::HParams;

use super::blocks::{LayerRules, MoeRules, Presence};
use super::keys::ExpertRules;
use super::{ArchDef, ExpertGating, Features, QkNorm, SharedExperts};

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "glm4moe"
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: QkNorm::PerHead,
            qk_norm_optional: true,
            partial_rope: true,
            nextn: true,
            shared_experts: SharedExperts::Counted,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            gating: ExpertGating::Sigmoid,
            reads_gating_func: true,
            ..ExpertRules::MOE
        }
    }

    fn layer_rules(&self) -> LayerRules {
        LayerRules {
            ffn_norm: "post_attention_norm.weight",
            moe: MoeRules {
                selection_bias: Presence::Required,
                ..LayerRules::BASE.moe
            },
            ..LayerRules::BASE
        }
    }
}
