//! Qwen3 MoE (`qwen3moe`): per-head QK-norm, NEOX rope, renormalised top-k.

use crate::params::HParams;

use super::keys::ExpertRules;
use super::{ArchDef, Features, QkNorm};

/// The architecture.
pub(super) struct Def;

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

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules::QWEN3
    }
}
