//! Llama (`llama`): dense, or Mixtral-style MoE when `llama.expert_count` > 0; NORM rope;
//! optional biases and per-frequency rope divisors (`rope_freqs`, as in Llama 3).

use crate::error::ModelError;
use crate::params::HParams;
use crate::tensors::Loader;

use super::blocks::{LayerRules, Presence};
use super::keys::{ExpertRules, ExpertWidth, Experts};
use super::{ArchDef, Features, Globals, RopeType};

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "llama"
    }

    fn features(&self) -> Features {
        Features {
            rope_type: RopeType::Norm,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            experts: Experts::Optional,
            width: ExpertWidth::Ffn,
            weights_norm: true,
            ..ExpertRules::MOE
        }
    }

    fn globals<'a>(&self, ld: &mut Loader<'a>, hp: &HParams) -> Result<Globals<'a>, ModelError> {
        Globals::rope_freqs_optional(ld, hp)
    }

    fn layer_rules(&self) -> LayerRules {
        LayerRules {
            out_bias: Presence::Optional,
            dense_biases: true,
            ..LayerRules::BASE
        }
    }
}
