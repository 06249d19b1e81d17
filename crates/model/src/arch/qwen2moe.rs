//! Qwen2 MoE (`qwen2moe`, Qwen1.5-MoE): q/k/v biases, NEOX rope, no renormalisation, one
//! shared expert with a sigmoid gate.

use crate::error::ModelError;
use crate::kv::Kv;
use crate::params::HParams;
use crate::tensors::{LayerTensors, Loader};

use super::blocks::{self, LayerRules};
use super::keys::{self, ExpertRules, ExpertWidth, Experts};
use super::{ExpertGating, QDim, SharedExperts, ArchDef, Features};

/// The architecture.
pub(super) struct Def;
/// Its registration.
pub(super) const ARCH: Def = Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "qwen2moe"
    }

    fn features(&self) -> Features {
        Features {
            q_dim: QDim::Embd,
            shared_experts: SharedExperts::Gated,
            ..Features::BASE
        }
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        keys::experts(
            kv,
            hp,
            &ExpertRules {
                experts: Experts::Required,
                width: ExpertWidth::KeyOrFfnPerUsed,
                weights_norm: false,
                gating: ExpertGating::Softmax,
                reads_gating_func: false,
            },
        )
    }

    fn output_required(&self) -> bool {
        true
    }

    fn layer<'a>(
        &self,
        ld: &mut Loader<'a>,
        hp: &HParams,
        il: usize,
    ) -> Result<LayerTensors<'a>, ModelError> {
        blocks::mha_layer(ld, hp, il, &LayerRules::BASE)
    }
}
