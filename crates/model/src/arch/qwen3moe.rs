//! Qwen3 MoE (`qwen3moe`): per-head QK-norm, NEOX rope, renormalised top-k.

use crate::error::ModelError;
use crate::kv::Kv;
use crate::params::HParams;
use crate::tensors::{LayerTensors, Loader};

use super::blocks::{self, LayerRules};
use super::keys::{self, ExpertRules, ExpertWidth, Experts};
use super::{ExpertGating, QkNorm, ArchDef, Features};

/// The architecture.
pub(super) struct Def;
/// Its registration.
pub(super) const ARCH: Def = Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "qwen3moe"
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: QkNorm::PerHead,
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
                weights_norm: true,
                gating: ExpertGating::Softmax,
                reads_gating_func: false,
            },
        )
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
