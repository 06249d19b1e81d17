//! Qwen3-Next (`qwen3next`: Qwen3-Next-80B-A3B, Qwen3-Coder-Next): qwen35moe's hybrid stack
//! with what its files and graph do otherwise. The full-attention layers rotate with plain
//! NEOX rope over part of each head (no IMRoPE sections); the linear-attention layers store
//! beta and alpha in one `ssm_ba`, may store their input projections in the first converter's
//! `ssm_in`, and keep each key head's value heads together, so that value head `h` reads key
//! head `h / (n_v_heads / n_k_heads)`.

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
        "qwen3next"
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: QkNorm::PerHead,
            partial_rope: true,
            gated_q: true,
            nextn: true,
            shared_experts: SharedExperts::Gated,
            shared_gate_sigmoid_op: true,
            late_row_pick: true,
            gdn_grouped_heads: true,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules::QWEN3
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
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
        let layout = GdnLayout {
            grouped_input: true,
            grouped_beta_alpha: true,
        };
        blocks::gdn_or_mha_layer(ld, hp, il, layout)
    }
}
