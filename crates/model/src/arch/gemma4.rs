//! Gemma 4 (`gemma4`, llama.cpp's `LLM_ARCH_GEMMA4`): sliding-window and full-attention layers
//! with their own head sizes and rope (per-frequency divisors on the full ones), q/k RMSNorm
//! per head and a weightless RMSNorm of v (v is k where `attn_v` is absent), attention scale 1,
//! norms after the attention and the FFN, a dense GEGLU MLP in every layer and, with experts, a
//! MoE block beside it with its own norms and router input; embeddings scaled by
//! sqrt(n_embd), soft-capped logits.

use std::fmt::Write as _;

use crate::error::ModelError;
use crate::kv::{Kv, invalid};
use crate::model::Model;
use crate::params::HParams;
use crate::tensors::{Attn, GemmaLayer, GemmaMoe, LayerTensors, Loader};

use super::blocks::{self, LayerRules, MoeRules};
use super::keys::{self, ExpertRules, Experts};
use super::{ArchDef, Features, FfnAct, Globals, QkNorm};

/// The architecture.
pub(super) struct Def;

impl ArchDef for Def {
    fn name(&self) -> &'static str {
        "gemma4"
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: QkNorm::PerHead,
            partial_rope: true,
            ffn_act: FfnAct::Geglu,
            v_norm: true,
            swa_rope: true,
            mlp_beside_experts: true,
            late_row_pick: true,
            ..Features::BASE
        }
    }

    fn experts(&self, _: &HParams) -> ExpertRules {
        ExpertRules {
            experts: Experts::Optional,
            weights_norm: true,
            ..ExpertRules::MOE
        }
    }

    fn read(&self, kv: &Kv<'_>, hp: &mut HParams) -> Result<(), ModelError> {
        let k = |s: &str| kv.key(s);
        let ks = kv
            .u32(&k("attention.key_length_swa"))?
            .unwrap_or(hp.head_dim_k);
        let vs = kv
            .u32(&k("attention.value_length_swa"))?
            .unwrap_or(hp.head_dim_v);
        if ks == 0 || ks != vs {
            return Err(invalid(
                k("attention.value_length_swa"),
                format!(
                    "sliding-window heads of key {ks} and value {vs}; gemma4 needs them equal and > 0"
                ),
            ));
        }
        (hp.head_dim_k_swa, hp.head_dim_v_swa) = (ks, vs);
        // llama.cpp requires the pattern for gemma4
        keys::sliding_window(kv, hp, None)?;
        let r = kv
            .u32(&k("rope.dimension_count_swa"))?
            .unwrap_or(hp.rope.n_rot);
        if r == 0 || !r.is_multiple_of(2) || r > ks {
            return Err(invalid(
                k("rope.dimension_count_swa"),
                format!("{r} rotated dimensions; must be even and in 2..={ks}"),
            ));
        }
        hp.rope.n_rot_swa = r;
        hp.rope.freq_base_swa = kv.f32(&k("rope.freq_base_swa"))?.unwrap_or(10000.0);
        refuse_small_models(kv)?;
        hp.logit_softcap = kv.f32(&k("final_logit_softcapping"))?.unwrap_or(0.0);
        // llama.cpp's f_attention_scale for Gemma 4 (the q/k norms take its place)
        hp.attn_scale_fixed = Some(1.0);
        // ggml_scale by sqrt(n_embd)
        hp.embd_scale = Some((hp.n_embd as f32).sqrt());
        Ok(())
    }

    fn globals<'a>(&self, ld: &mut Loader<'a>, hp: &HParams) -> Result<Globals<'a>, ModelError> {
        let rope_freqs = if (0..hp.n_layer as usize).any(|il| !hp.is_swa_layer(il)) {
            // the full-attention layers' proportional rope (one tensor for all of them)
            Some(ld.req("rope_freqs.weight", &[u64::from(hp.head_dim_k / 2)])?)
        } else {
            None
        };
        Ok(Globals {
            rope_freqs,
            ..Globals::default()
        })
    }

    fn layer_rules(&self) -> LayerRules {
        LayerRules {
            moe: MoeRules {
                fused_gate_up: true,
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
        let mut l = blocks::layer(ld, hp, il, &self.layer_rules(), |ld| {
            Ok(Attn::Mha(blocks::mha(ld, hp, il, true)?))
        })?;
        let n = |s: &str| format!("blk.{il}.{s}");
        let n_embd = u64::from(hp.n_embd);
        let moe = if hp.stored_layer_has_experts(il) {
            Some(GemmaMoe {
                mlp: blocks::dense_ffn(ld, hp, il, false)?,
                post_norm_1: ld.req(&n("post_ffw_norm_1.weight"), &[n_embd])?,
                pre_norm_2: ld.req(&n("pre_ffw_norm_2.weight"), &[n_embd])?,
                post_norm_2: ld.req(&n("post_ffw_norm_2.weight"), &[n_embd])?,
                router_scale: ld.req(&n("ffn_gate_inp.scale"), &[n_embd])?,
                down_scale: ld.opt(&n("ffn_down_exps.scale"), &[u64::from(hp.n_expert)])?,
            })
        } else {
            None
        };
        l.gemma = Some(GemmaLayer {
            post_attn_norm: ld.req(&n("post_attention_norm.weight"), &[n_embd])?,
            post_ffn_norm: ld.req(&n("post_ffw_norm.weight"), &[n_embd])?,
            out_scale: ld.opt(&n("layer_output_scale.weight"), &[1])?,
            moe,
        });
        Ok(l)
    }

    fn describe(&self, m: &Model<'_>, s: &mut String) {
        let hp = &m.hparams;
        let n_swa_layers = (0..hp.n_layer as usize)
            .filter(|&il| hp.is_swa_layer(il))
            .count();
        let v_is_k = m
            .tensors
            .layers
            .iter()
            .filter_map(|l| l.mha())
            .any(|a| a.wv.is_none());
        let _ = writeln!(
            s,
            "layer types: {} sliding-window (window {}, heads of {}, rope over {} base {}), {} full (heads of {}, rope over {} base {}{}); attention scale 1, V = rms_norm(V){}; a dense GEGLU MLP in every layer{}{}",
            n_swa_layers,
            hp.n_swa,
            hp.head_dim_k_swa,
            hp.rope.n_rot_swa,
            hp.rope.freq_base_swa,
            hp.n_layer as usize - n_swa_layers,
            hp.head_dim_k,
            hp.rope.n_rot,
            hp.rope.freq_base,
            if m.tensors.rope_freqs.is_some() {
                ", divided per frequency by rope_freqs"
            } else {
                ""
            },
            if v_is_k {
                ", V = K where attn_v is absent"
            } else {
                ""
            },
            if hp.n_expert > 0 {
                ", experts beside it"
            } else {
                ""
            },
            if hp.logit_softcap != 0.0 {
                format!("; logits soft-capped at {}", hp.logit_softcap)
            } else {
                String::new()
            }
        );
    }
}

/// Gemma 4 E2B/E4B's per-layer token embeddings and shared-KV layers are not supported.
fn refuse_small_models(kv: &Kv<'_>) -> Result<(), ModelError> {
    let k = |s: &str| kv.key(s);
    let per_layer_key = k("embedding_length_per_layer_input");
    let per_layer = kv.u32_req(&per_layer_key)?;
    if per_layer > 0 {
        return Err(ModelError::Unsupported(format!(
            "per-layer token embeddings (Gemma 4 E2B/E4B) ({per_layer_key} = {per_layer})"
        )));
    }
    let shared_key = k("attention.shared_kv_layers");
    let shared = kv.u32(&shared_key)?.unwrap_or(0);
    if shared > 0 {
        return Err(ModelError::Unsupported(format!(
            "layers that reuse other layers' KV (Gemma 4 E2B/E4B) ({shared_key} = {shared})"
        )));
    }
    Ok(())
}
