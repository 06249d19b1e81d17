//! SmallThinker (`smallthinker`, llama.cpp's `LLM_ARCH_SMALLTHINKER`): every layer routed, its
//! router reading the layer's input before the attention norm (so a layer's experts are known
//! while its attention runs), ReLU-gated experts (`relu(gate) * up`), the top-k weights always
//! renormalised, NEOX rope over whole heads.
//!
//! With `attention.sliding_window` > 0, llama.cpp attends through a window of 4096 positions
//! (whatever the key's value) on every layer but each `sliding_window_pattern`-th (default 4,
//! the first of each period attends fully), and leaves every fourth layer (0, 4, 8, …) without
//! rotary embedding (except in a model of exactly four layers); without it every layer attends
//! fully with rope. The routing is the file's
//! `expert_gating_func` (llama.cpp has no default and stops without it); the graph always
//! renormalises and never scales, so a file that says otherwise is refused.

use crate::error::ModelError;
use crate::kv::{Kv, invalid};
use crate::params::HParams;

use super::keys::{self, ExpertRules};
use super::{ArchDef, Features, FfnAct};

/// The architecture.
pub(super) struct Def;

/// The window llama.cpp gives the sliding-window layers, in place of the file's value.
const WINDOW: u32 = 4096;
/// Every this many layers (from layer 0) one has no rope when the sliding window is on
/// (llama.cpp's `n_no_rope_layer_step` default), unless the model has exactly this many.
const NOPE_STEP: usize = 4;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "smallthinker"
    }

    fn features(&self) -> Features {
        Features {
            ffn_act: FfnAct::Reglu,
            router_reads_layer_input: true,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            weights_norm: true,
            reads_gating_func: true,
            ..ExpertRules::MOE
        }
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        let k = |s: &str| kv.key(s);
        let gating = k("expert_gating_func");
        if kv.u32(&gating)?.is_none_or(|v| v == 0) {
            return Err(ModelError::MissingKey(gating));
        }
        if hp.n_layer_dense_lead > 0 {
            return Err(invalid(
                k("leading_dense_block_count"),
                "every layer of this architecture is routed",
            ));
        }
        keys::renormalised_unscaled(kv, hp)?;
        if kv.u32(&k("attention.sliding_window"))?.unwrap_or(0) > 0 {
            let period = kv.u32(&k("attention.sliding_window_pattern"))?.unwrap_or(4);
            let base_key = k("rope.freq_base_swa");
            if let Some(b) = kv.f32(&base_key)?
                && b != hp.rope.freq_base
            {
                return Err(ModelError::Unsupported(format!(
                    "{base_key} = {b}: a rope base of the sliding-window layers of their own"
                )));
            }
            let nl = hp.n_layer_all() as usize;
            hp.n_swa = WINDOW;
            hp.swa_layers = (0..nl)
                .map(|il| il < hp.n_layer as usize && (period == 0 || il % period as usize != 0))
                .collect();
            // (llama.cpp's test `step == n_layer || il % step != 0`: a model of exactly
            // NOPE_STEP layers keeps rope everywhere)
            if hp.n_layer as usize != NOPE_STEP {
                hp.nope_layers = (0..nl).map(|il| il % NOPE_STEP == 0).collect();
            }
        }
        Ok(())
    }
}
