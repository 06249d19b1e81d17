//! Qwen2 dense (`qwen2`): q/k/v biases, NEOX rope, an optional output bias.

use crate::error::ModelError;
use crate::kv::Kv;
use crate::params::HParams;
use crate::tensors::{LayerTensors, Loader};

use super::blocks::{self, LayerRules};
use super::keys::{self, ExpertRules};
use super::{Globals, QDim, ArchDef, Features};

/// The architecture.
pub(super) struct Def;
/// Its registration.
pub(super) const ARCH: Def = Def;

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

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        keys::experts(kv, hp, &ExpertRules::DENSE)
    }

    fn globals<'a>(&self, ld: &mut Loader<'a>, hp: &HParams) -> Result<Globals<'a>, ModelError> {
        Ok(Globals {
            output_bias: ld.opt("output.bias", &[u64::from(hp.n_vocab)])?,
            ..Globals::default()
        })
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
