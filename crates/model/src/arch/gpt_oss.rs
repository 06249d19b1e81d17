//! gpt-oss (`gpt-oss`, llama.cpp's `LLM_ARCH_OPENAI_MOE`): biases on q/k/v/o, the router and
//! every expert projection; attention sinks; sliding-window attention on alternate layers;
//! softmax over the selected experts' logits; the clamped SwiGLU of gpt-oss; NEOX rope (YaRN in
//! the released files).

use crate::error::ModelError;
use crate::kv::Kv;
use crate::params::HParams;

use super::blocks::{LayerRules, MoeRules, Presence};
use super::keys::{self, ExpertRules};
use super::{ArchDef, ExpertGating, Features, FfnAct};

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "gpt-oss"
    }

    fn features(&self) -> Features {
        Features {
            ffn_act: FfnAct::SwigluOai,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            gating: ExpertGating::SoftmaxSelected,
            ..ExpertRules::MOE
        }
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        // llama.cpp's default pattern: every second layer attends fully
        keys::sliding_window(kv, hp, Some(2))?;
        let k = |s: &str| kv.key(s);
        let freq_base = hp.rope.freq_base;
        if hp.n_swa > 0
            && let Some(base_swa) = kv.f32(&k("rope.freq_base_swa"))?
            && base_swa != freq_base
        {
            return Err(ModelError::Unsupported(format!(
                "a separate rope base for the sliding-window layers ({} = {base_swa}, {} = {freq_base})",
                k("rope.freq_base_swa"),
                k("rope.freq_base")
            )));
        }
        Ok(())
    }

    fn layer_rules(&self) -> LayerRules {
        LayerRules {
            ffn_norm: "post_attention_norm.weight",
            out_bias: Presence::Required,
            sinks: true,
            moe: MoeRules {
                biases: true,
                ..LayerRules::BASE.moe
            },
            ..LayerRules::BASE
        }
    }
}
