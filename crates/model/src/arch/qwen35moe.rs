//! Qwen3.5/3.6 MoE (`qwen35moe`): Gated DeltaNet linear-attention layers between
//! full-attention layers with a gated output and IMRoPE, experts plus a gated shared expert.

use crate::error::ModelError;
use crate::kv::Kv;
use crate::params::HParams;
use crate::tensors::{LayerTensors, Loader};

use super::blocks::{self, GdnLayout, LayerRules};
use super::keys::{self, ExpertRules};
use super::{ArchDef, Features, QkNorm, SharedExperts};

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "qwen35moe"
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: QkNorm::PerHead,
            partial_rope: true,
            gated_q: true,
            imrope: true,
            nextn: true,
            shared_experts: SharedExperts::Gated,
            shared_gate_sigmoid_op: true,
            late_row_pick: true,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules::QWEN3
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        keys::imrope_sections(kv, hp)?;
        let (ssm, recurrent) = keys::hybrid(kv, hp.n_layer, hp.n_layer_all())?;
        hp.ssm = ssm;
        hp.recurrent = recurrent;
        Ok(())
    }

    fn layer_rules(&self) -> LayerRules {
        blocks::QWEN_HYBRID
    }

    fn layer<'a>(
        &self,
        ld: &mut Loader<'a>,
        hp: &HParams,
        il: usize,
    ) -> Result<LayerTensors<'a>, ModelError> {
        blocks::gdn_or_mha_layer(ld, hp, il, GdnLayout::SPLIT)
    }
}
