//! IBM Granite 3 MoE (`granitemoe`, llama.cpp's `LLM_ARCH_GRANITE_MOE`): llama's layer (NORM
//! rope, optional biases and `rope_freqs`) with routed experts as wide as
//! `feed_forward_length`, and four multipliers: the embeddings by `embedding_scale`, the
//! attention scores by `attention.scale` (instead of 1/sqrt(head_dim)), the attention's and
//! the experts' outputs by `residual_scale` before each residual add, the logits by
//! `1 / logit_scale`. A multiplier of 0 (or an absent key) is not applied; `logit_scale` is
//! required, as llama.cpp requires it.

use std::fmt::Write as _;

use crate::error::ModelError;
use crate::kv::{Kv, invalid};
use crate::model::Model;
use crate::params::HParams;
use crate::tensors::Loader;

use super::blocks::{LayerRules, Presence};
use super::keys::{ExpertRules, ExpertWidth};
use super::{ArchDef, Features, Globals, RopeType};

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "granitemoe"
    }

    fn features(&self) -> Features {
        Features {
            rope_type: RopeType::Norm,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            width: ExpertWidth::Ffn,
            weights_norm: true,
            ..ExpertRules::MOE
        }
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        let k = |s: &str| kv.key(s);
        let shared_key = k("expert_shared_feed_forward_length");
        if let Some(w) = kv.u32(&shared_key)?
            && w > 0
        {
            return Err(ModelError::Unsupported(format!(
                "a shared expert beside the routed ones (GraniteMoeShared: {shared_key} = {w})"
            )));
        }
        hp.embd_scale = multiplier(kv, "embedding_scale")?;
        hp.attn_scale_fixed = multiplier(kv, "attention.scale")?;
        hp.residual_scale = multiplier(kv, "residual_scale")?;
        let logit_key = k("logit_scale");
        let logit = kv
            .f32(&logit_key)?
            .ok_or_else(|| ModelError::MissingKey(logit_key.clone()))?;
        if !logit.is_finite() || logit == 0.0 {
            return Err(invalid(
                logit_key,
                format!("{logit}; the logits are divided by it"),
            ));
        }
        // as llama.cpp: a multiplication by the f32 reciprocal, not a division
        hp.logit_scale = Some(1.0 / logit);
        Ok(())
    }

    fn globals<'a>(&self, ld: &mut Loader<'a>, hp: &HParams) -> Result<Globals<'a>, ModelError> {
        Globals::rope_freqs_optional(ld, hp)
    }

    fn describe(&self, m: &Model<'_>, s: &mut String) {
        let hp = &m.hparams;
        let show = |v: Option<f32>| v.map_or("none".to_owned(), |v| format!("x{v}"));
        let _ = writeln!(
            s,
            "multipliers: embeddings {}, attention scale {}, residuals {}, logits {}",
            show(hp.embd_scale),
            hp.attn_scale(),
            show(hp.residual_scale),
            show(hp.logit_scale),
        );
    }

    fn layer_rules(&self) -> LayerRules {
        LayerRules {
            out_bias: Presence::Optional,
            ..LayerRules::BASE
        }
    }
}

/// A multiplier key: `None` when absent or 0 (llama.cpp does not apply it), else its finite
/// value.
fn multiplier(kv: &Kv<'_>, suffix: &str) -> Result<Option<f32>, ModelError> {
    let key = kv.key(suffix);
    match kv.f32(&key)? {
        None => Ok(None),
        Some(0.0) => Ok(None),
        Some(v) if v.is_finite() => Ok(Some(v)),
        Some(v) => Err(invalid(key, format!("{v} is not a finite number"))),
    }
}
