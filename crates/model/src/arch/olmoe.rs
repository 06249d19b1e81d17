//! OLMoE (`olmoe`): QK-norm over the whole projection, NEOX rope, no renormalisation.

use crate::params::HParams;

use super::keys::{ExpertRules, ExpertWidth};
use super::{ArchDef, Features, QDim, QkNorm};

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "olmoe"
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: QkNorm::Whole,
            q_dim: QDim::Embd,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            width: ExpertWidth::Ffn,
            ..ExpertRules::MOE
        }
    }

    fn output_required(&self) -> bool {
        true
    }
}
