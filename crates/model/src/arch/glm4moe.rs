//! GLM-4.5 (`glm4moe`, llama.cpp's `LLM_ARCH_GLM4_MOE`): leading dense layers, then MoE layers
//! with sigmoid routing and a per-expert selection bias (`exp_probs_b`), an ungated shared
//! expert, q/k/v biases, optional per-head QK-norm, NEOX rope over part of each head, and NextN
//! (multi-token prediction) layers after the trunk.

use crate::error::ModelError;
use crate::kv::Kv;
use crate::params::HParams;
use crate::tensors::{LayerTensors, Loader};

use super::blocks::{self, LayerRules, MoeRules, Presence};
use super::keys::{self, ExpertRules, ExpertWidth, Experts};
use super::{ArchDef, ExpertGating, Features, QkNorm, SharedExperts};

/// The architecture.
pub(super) struct Def;
/// Its registration.
pub(super) const ARCH: Def = Def;

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

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        keys::experts(
            kv,
            hp,
            &ExpertRules {
                experts: Experts::Required,
                width: ExpertWidth::Key,
                weights_norm: false,
                gating: ExpertGating::Sigmoid,
                reads_gating_func: true,
            },
        )
    }

    fn layer<'a>(
        &self,
        ld: &mut Loader<'a>,
        hp: &HParams,
        il: usize,
    ) -> Result<LayerTensors<'a>, ModelError> {
        blocks::mha_layer(
            ld,
            hp,
            il,
            &LayerRules {
                ffn_norm: "post_attention_norm.weight",
                moe: MoeRules {
                    selection_bias: Presence::Required,
                    ..LayerRules::BASE.moe
                },
                ..LayerRules::BASE
            },
        )
    }
}
