//! DeepSeek V2/V3/R1 and Kimi K2 (`deepseek2`, llama.cpp's `LLM_ARCH_DEEPSEEK2`): multi-head
//! latent attention (a low-rank query, one compressed key/value row per token shared by every
//! head, stored in its absorbed or its legacy `attn_kv_b` form), NORM rope over a separate part
//! of each head, leading dense layers, then MoE layers with softmax or sigmoid routing, an
//! optional selection bias, group-limited top-k and ungated shared experts; NextN layers after
//! the trunk.

use crate::error::ModelError;
use crate::kv::{Kv, invalid};
use crate::params::HParams;
use crate::tensors::{Attn, LayerTensors, Loader};

use super::blocks::{self, LayerRules, MoeRules, Presence};
use super::keys::{self, ExpertRules};
use super::{ArchDef, ExpertGating, Features, RopeType, SharedExperts};

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "deepseek2"
    }

    fn features(&self) -> Features {
        Features {
            rope_type: RopeType::Norm,
            nextn: true,
            shared_experts: SharedExperts::Counted,
            ..Features::BASE
        }
    }

    fn experts(&self, hp: &HParams) -> ExpertRules {
        // files written before `expert_gating_func` existed: GLM-4.7-Lite's shape (47 or 48
        // layers, a vocabulary of 154880) routes by sigmoid, DeepSeek V2/V2.5 by softmax
        let glm_lite = matches!(hp.n_layer, 47 | 48) && hp.n_vocab == 154_880;
        ExpertRules {
            gating: if glm_lite {
                ExpertGating::Sigmoid
            } else {
                ExpertGating::Softmax
            },
            reads_gating_func: true,
            ..ExpertRules::MOE
        }
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        let k = |s: &str| kv.key(s);
        let m = keys::mla(
            kv,
            hp.n_layer,
            hp.n_vocab,
            hp.head_dim_k,
            hp.head_dim_v,
            &hp.n_head,
            &hp.n_head_kv,
        )?;
        let n_rot = hp.rope.n_rot;
        // llama.cpp's deepseek2 requires at least one plain value per head
        if n_rot == 0 || !n_rot.is_multiple_of(2) || n_rot >= m.head_dim_k {
            return Err(invalid(
                k("rope.dimension_count"),
                format!(
                    "{n_rot} rotated dimensions; must be even and below the key head size {}",
                    m.head_dim_k
                ),
            ));
        }
        if m.absorbed && hp.head_dim_k != m.kv_lora_rank + n_rot {
            return Err(invalid(
                k("attention.key_length"),
                format!(
                    "{}; the absorbed form caches kv_lora_rank + rotated dims = {} + {n_rot}",
                    hp.head_dim_k, m.kv_lora_rank
                ),
            ));
        }
        hp.mla = Some(m);
        hp.rope.yarn_log_mul = kv
            .f32(&k("rope.scaling.yarn_log_multiplier"))?
            .map_or(0.0, |v| v / 0.1);
        if let Some(t) = kv.f32(&k("attention.temperature_scale"))?
            && t != 0.0
        {
            return Err(ModelError::Unsupported(format!(
                "attention temperature tuning ({} = {t})",
                k("attention.temperature_scale")
            )));
        }
        Ok(())
    }

    fn layer_rules(&self) -> LayerRules {
        LayerRules {
            moe: MoeRules {
                fused_gate_up: true,
                selection_bias: Presence::Optional,
                ..LayerRules::BASE.moe
            },
            ..LayerRules::BASE
        }
    }

    fn layer<'a>(
        &self,
        ld: &mut Loader<'a>,
        hp: &HParams,
        il: usize,
    ) -> Result<LayerTensors<'a>, ModelError> {
        blocks::layer(ld, hp, il, &self.layer_rules(), |ld| match &hp.mla {
            Some(m) => Ok(Attn::Mla(blocks::mla(ld, hp, m, il)?)),
            None => Err(ModelError::Unsupported(
                "deepseek2 without multi-head latent attention".to_owned(),
            )),
        })
    }
}
