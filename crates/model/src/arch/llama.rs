//! Llama (`llama`): dense, or Mixtral-style MoE when `llama.expert_count` > 0; NORM rope;
//! optional biases and per-frequency rope divisors (`rope_freqs`, as in Llama 3).

use crate::error::ModelError;
use crate::kv::Kv;
use crate::params::HParams;
use crate::tensors::{LayerTensors, Loader};

use super::blocks::{self, LayerRules};
use super::keys::{self, ExpertRules, ExpertWidth, Experts};
use super::{ExpertGating, Globals, RopeType, ArchDef, Features};
use super::blocks::Presence;

/// The architecture.
pub(super) struct Def;
/// Its registration.
pub(super) const ARCH: Def = Def;

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

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        keys::experts(
            kv,
            hp,
            &ExpertRules {
                experts: Experts::Optional,
                width: ExpertWidth::Ffn,
                weights_norm: true,
                gating: ExpertGating::Softmax,
                reads_gating_func: false,
            },
        )
    }

    fn globals<'a>(&self, ld: &mut Loader<'a>, hp: &HParams) -> Result<Globals<'a>, ModelError> {
        Ok(Globals {
            rope_freqs: ld.opt("rope_freqs.weight", &[u64::from(hp.rope.n_rot / 2)])?,
            ..Globals::default()
        })
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
                out_bias: Presence::Optional,
                dense_biases: true,
                ..LayerRules::BASE
            },
        )
    }
}
