//! Qwen2 dense (`qwen2`): q/k/v biases, NEOX rope, an optional output bias.

use crate::error::ModelError;
use crate::params::HParams;
use crate::tensors::Loader;

use super::keys::ExpertRules;
use super::{ArchDef, Features, Globals, QDim};

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "qwen2"
    }

    fn features(&self) -> Features {
        Features {
            q_dim: QDim::Embd,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules::DENSE
    }

    fn globals<'a>(&self, ld: &mut Loader<'a>, hp: &HParams) -> Result<Globals<'a>, ModelError> {
        Ok(Globals {
            output_bias: ld.opt("output.bias", &[u64::from(hp.n_vocab)])?,
            ..Globals::default()
        })
    }
}
