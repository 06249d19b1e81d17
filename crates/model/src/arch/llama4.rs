//! Llama 4 (`llama4`: Llama-4-Scout-17B-16E, Llama-4-Maverick-17B-128E): llama's NORM rope
//! (with optional `rope_freqs` divisors) in three of every four layers, which attend through
//! chunks of 8192 positions and RMS-normalise their rotated queries and keys without weights
//! (not with 128 experts: llama.cpp leaves that norm to Scout); every fourth layer has no rope,
//! attends fully and scales its queries by the attention temperature. MoE layers every
//! `interleave_moe_layer_step` layers (the others dense, `feed_forward_length` wide): the top-k
//! experts of the raw router logits, each one's input multiplied by its sigmoid weight before
//! the expert, and one ungated shared expert as wide as the routed ones.
//!
//! As llama.cpp v0.4.0 reads it: the chunk is 8192 positions whatever
//! `attention.sliding_window` says, the temperature is fixed (a step of 8192 positions, a
//! scale of 0.1, an offset of 1), every fourth layer from layer 3 has no rope, and the
//! router's weights are neither renormalised nor scaled.

use std::fmt::Write as _;

use crate::error::ModelError;
use crate::kv::Kv;
use crate::model::Model;
use crate::params::{AttnTemp, HParams};
use crate::tensors::Loader;

use super::keys::ExpertRules;
use super::{ArchDef, ExpertGating, Features, Globals, RopeType, SharedExperts};

/// The architecture.
pub(super) struct Def;

/// The chunk of the chunked-attention layers, in place of the file's window.
const CHUNK: u32 = 8192;
/// Every this many layers one has no rope (layers `step - 1`, `2 step - 1`, …).
const NOPE_STEP: usize = 4;
/// llama.cpp's fixed attention temperature of the NoPE layers.
const TEMP: AttnTemp = AttnTemp {
    floor_scale: 8192,
    scale: 0.1,
    offset: 1.0,
};
/// The expert count of Maverick, the one model whose rope layers llama.cpp does not QK-norm.
const MAVERICK_EXPERTS: u32 = 128;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "llama4"
    }

    fn features(&self) -> Features {
        Features {
            rope_type: RopeType::Norm,
            shared_experts: SharedExperts::One,
            swa_chunked: true,
            expert_weights_before_ffn: true,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            gating: ExpertGating::SigmoidRankLogits,
            interleaved: true,
            ..ExpertRules::MOE
        }
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        let k = |s: &str| kv.key(s);
        // llama.cpp's graph neither renormalises nor scales the routing weights, whatever the
        // file says (its loader does not read these keys)
        hp.expert_weights_norm = false;
        hp.expert_weights_scale = 0.0;
        let window_key = k("attention.sliding_window");
        if kv.u32(&window_key)? == Some(0) {
            // llama.cpp then runs its last layer without rope and asserts on the temperature
            // it did not set
            return Err(ModelError::Unsupported(format!(
                "{window_key} = 0 (attention without chunks)"
            )));
        }
        let period = kv
            .u32(&k("attention.sliding_window_pattern"))?
            .unwrap_or(4) as usize;
        let base_key = k("rope.freq_base_swa");
        if let Some(b) = kv.f32(&base_key)?
            && b != hp.rope.freq_base
        {
            return Err(ModelError::Unsupported(format!(
                "{base_key} = {b}: a rope base of the chunked layers of their own"
            )));
        }
        let (nl, n_trunk) = (hp.n_layer_all() as usize, hp.n_layer as usize);
        hp.n_swa = CHUNK;
        hp.swa_layers = (0..nl)
            .map(|il| il < n_trunk && (period == 0 || il % period < period - 1))
            .collect();
        hp.nope_layers = (0..nl).map(|il| (il + 1).is_multiple_of(NOPE_STEP)).collect();
        hp.attn_temp = Some(TEMP);
        hp.qk_norm_plain_rope = hp.n_expert != MAVERICK_EXPERTS;
        Ok(())
    }

    fn globals<'a>(&self, ld: &mut Loader<'a>, hp: &HParams) -> Result<Globals<'a>, ModelError> {
        Globals::rope_freqs_optional(ld, hp)
    }

    fn describe(&self, m: &Model<'_>, s: &mut String) {
        let hp = &m.hparams;
        let n = hp.n_layer as usize;
        let list = |f: &dyn Fn(usize) -> bool| {
            (0..n)
                .filter(|&il| f(il))
                .map(|il| il.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let _ = writeln!(
            s,
            "chunked attention ({} positions, rope{}): layers {}",
            hp.n_swa,
            if hp.qk_norm_plain_rope {
                ", q/k RMS-normed"
            } else {
                ""
            },
            list(&|il| hp.is_swa_layer(il)),
        );
        let _ = writeln!(
            s,
            "full attention without rope (temperature tuned): layers {}",
            list(&|il| !hp.has_rope(il)),
        );
        let _ = writeln!(
            s,
            "MoE layers (every {}): {}",
            hp.moe_layer_step,
            list(&|il| hp.is_moe_layer(il)),
        );
    }
}
