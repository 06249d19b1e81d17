//! Qwen2 MoE (`qwen2moe`, Qwen1.5-MoE): q/k/v biases, NEOX rope, no renormalisation, one
//! shared expert with a sigmoid gate.

use crate::params::HParams;

use super::keys::{ExpertRules, ExpertWidth};
use super::{ArchDef, Features, QDim, SharedExperts};

/// The architecture.
pub(super) struct Def;

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

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            width: ExpertWidth::KeyOrFfnPerUsed,
            ..ExpertRules::MOE
        }
    }

    fn output_required(&self) -> bool {
        true
    }
}
