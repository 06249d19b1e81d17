//! Builders of the tensor roles several architectures share: attention projections (MHA,
//! MLA, Gated DeltaNet), dense and routed-expert FFNs, and the common layer around them.

use crate::arch::QkNorm;
use crate::arch::SharedExperts;
use crate::error::ModelError;
use crate::params::{HParams, Mla, Ssm};
use crate::tensors::{
    Attn, DenseFfn, Ffn, GdnBetaAlpha, GdnInput, GdnTensors, LayerTensors, Loader, MhaTensors,
    MlaKvB, MlaQuery, MlaTensors, MoeBiases, MoeFfn, MoeLatent, SharedExpert, Tensor,
};

/// Whether a tensor is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Presence {
    /// Not part of the architecture (a file that has it fails as unused).
    Never,
    /// Taken when present.
    Optional,
    /// Required.
    Required,
}

impl Presence {
    /// Looks `name` up as the presence says.
    pub(crate) fn find<'a>(
        self,
        ld: &mut Loader<'a>,
        name: &str,
        dims: &[u64],
    ) -> Result<Option<Tensor<'a>>, ModelError> {
        match self {
            Presence::Never => Ok(None),
            Presence::Optional => ld.opt(name, dims),
            Presence::Required => ld.req(name, dims).map(Some),
        }
    }
}

/// The tensors an architecture's layer has around its attention projections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerRules {
    /// The norm before the FFN: `ffn_norm.weight`, or `post_attention_norm.weight` where the
    /// architecture names it so (the same part: after the attention's residual).
    pub(crate) ffn_norm: &'static str,
    /// `attn_output.bias` `{n_embd}`.
    pub(crate) out_bias: Presence,
    /// `attn_sinks.weight` `{n_head}`.
    pub(crate) sinks: bool,
    /// `ffn_gate/up/down.bias` of the dense FFN (optional where true).
    pub(crate) dense_biases: bool,
    /// The q, k and v projections are one `attn_qkv.weight` (required), whose rows are the
    /// queries', then the keys', then the values'; where false such a tensor is refused as a
    /// fused layout.
    pub(crate) fused_qkv: bool,
    /// The routed-expert FFN's rules.
    pub(crate) moe: MoeRules,
}

/// The tensors of an architecture's routed-expert FFN.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MoeRules {
    /// `ffn_gate_up_exps` (gate and up in one tensor) is taken instead of the two; where
    /// false such a tensor is refused as a fused layout.
    pub(crate) fused_gate_up: bool,
    /// `exp_probs_b.bias` `{n_expert}`: the selection bias.
    pub(crate) selection_bias: Presence,
    /// gpt-oss's biases on the router and every expert projection (required where true).
    pub(crate) biases: bool,
    /// The routed experts and the shared expert have no gate projection (nemotron_h_moe's
    /// ReLU² experts); where false the gate is required.
    pub(crate) ungated: bool,
}

impl LayerRules {
    /// The plain layer: `ffn_norm`, no biases, no sinks, separate gate and up experts.
    pub(crate) const BASE: LayerRules = LayerRules {
        ffn_norm: "ffn_norm.weight",
        out_bias: Presence::Never,
        sinks: false,
        dense_biases: false,
        fused_qkv: false,
        moe: MoeRules {
            fused_gate_up: false,
            selection_bias: Presence::Never,
            biases: false,
            ungated: false,
        },
    };
}

/// A layer: `attn_norm`, the attention projections `attn` makes, the output projection, the
/// norm before the FFN, and a dense or routed-expert FFN (experts where
/// [`HParams::stored_layer_has_experts`]).
pub(crate) fn layer<'a>(
    ld: &mut Loader<'a>,
    hp: &HParams,
    il: usize,
    r: &LayerRules,
    attn: impl FnOnce(&mut Loader<'a>) -> Result<Attn<'a>, ModelError>,
) -> Result<LayerTensors<'a>, ModelError> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let n_embd = u64::from(hp.n_embd);
    let attn_norm = ld.req(&n("attn_norm.weight"), &[n_embd])?;
    let attn = attn(ld)?;
    let wo_name = match attn {
        Attn::Gdn(_) | Attn::Mamba2(_) => "ssm_out.weight",
        Attn::ShortConv(_) => "shortconv.out_proj.weight",
        Attn::Mha(_) | Attn::Mla(_) | Attn::None => "attn_output.weight",
    };
    let wo = ld.req(&n(wo_name), &[u64::from(hp.n_embd_out(il)), n_embd])?;
    let bo = r.out_bias.find(ld, &n("attn_output.bias"), &[n_embd])?;
    let attn_sinks = if r.sinks {
        Some(ld.req(&n("attn_sinks.weight"), &[u64::from(hp.n_head.at(il))])?)
    } else {
        None
    };
    let ffn_norm = ld.req(&n(r.ffn_norm), &[n_embd])?;
    let ffn = if hp.stored_layer_has_experts(il) {
        Ffn::Moe(moe_ffn(ld, hp, il, &r.moe)?)
    } else {
        Ffn::Dense(dense_ffn(ld, hp, il, r.dense_biases)?)
    };
    Ok(LayerTensors {
        attn_norm: Some(attn_norm),
        attn,
        wo: Some(wo),
        bo,
        attn_sinks,
        ffn_norm: Some(ffn_norm),
        ffn,
        gemma: None,
    })
}

/// A dense FFN `ffn_gate`/`ffn_up`/`ffn_down` of width `feed_forward_length`, with optional
/// biases where `biases`.
pub(crate) fn dense_ffn<'a>(
    ld: &mut Loader<'a>,
    hp: &HParams,
    il: usize,
    biases: bool,
) -> Result<DenseFfn<'a>, ModelError> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let n_embd = u64::from(hp.n_embd);
    let n_ff = u64::from(hp.n_ff.at(il));
    let gate = ld.req(&n("ffn_gate.weight"), &[n_embd, n_ff])?;
    let down = ld.req(&n("ffn_down.weight"), &[n_ff, n_embd])?;
    let up = ld.req(&n("ffn_up.weight"), &[n_embd, n_ff])?;
    let (gate_b, down_b, up_b) = if biases {
        (
            ld.opt(&n("ffn_gate.bias"), &[n_ff])?,
            ld.opt(&n("ffn_down.bias"), &[n_embd])?,
            ld.opt(&n("ffn_up.bias"), &[n_ff])?,
        )
    } else {
        (None, None, None)
    };
    Ok(DenseFfn {
        gate,
        up,
        down,
        gate_b,
        up_b,
        down_b,
    })
}

/// A routed-expert FFN: the router, the stacked experts, the shared expert the
/// architecture's features name, the selection bias and the biases its rules name.
pub(crate) fn moe_ffn<'a>(
    ld: &mut Loader<'a>,
    hp: &HParams,
    il: usize,
    r: &MoeRules,
) -> Result<MoeFfn<'a>, ModelError> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let n_embd = u64::from(hp.n_embd);
    // the experts' own width: the latent one where the model projects into it
    let e_moe = u64::from(hp.n_embd_moe());
    let n_expert = u64::from(hp.n_expert);
    let n_ff_exp = u64::from(hp.n_ff_exp.at(il));
    let gate_up = n("ffn_gate_up_exps.weight");
    let fused_gate_up = ld.exists(&gate_up);
    if fused_gate_up && !r.fused_gate_up {
        return Err(ModelError::FusedLayout {
            name: gate_up,
            layout: "ffn_gate_up_exps",
        });
    }
    let router = ld.req(&n("ffn_gate_inp.weight"), &[n_embd, n_expert])?;
    // as llama.cpp: a fused tensor, when present, is taken instead of gate and up
    let (gate_exps, up_exps) = if fused_gate_up {
        let t = ld.req(&gate_up, &[e_moe, 2 * n_ff_exp, n_expert])?;
        (Some(t), t)
    } else {
        let gate = if r.ungated {
            None
        } else {
            Some(ld.req(&n("ffn_gate_exps.weight"), &[e_moe, n_ff_exp, n_expert])?)
        };
        (
            gate,
            ld.req(&n("ffn_up_exps.weight"), &[e_moe, n_ff_exp, n_expert])?,
        )
    };
    let down_exps = ld.req(&n("ffn_down_exps.weight"), &[n_ff_exp, e_moe, n_expert])?;
    // as llama.cpp: the latent projections are taken when present, and the experts' shapes
    // say whether they must be
    let latent = if hp.moe_latent > 0 {
        Some(MoeLatent {
            down: ld.req(&n("ffn_latent_down.weight"), &[n_embd, e_moe])?,
            up: ld.req(&n("ffn_latent_up.weight"), &[e_moe, n_embd])?,
        })
    } else {
        None
    };
    let shared = shared_expert(ld, hp, il, r.ungated)?;
    let selection_bias = r
        .selection_bias
        .find(ld, &n("exp_probs_b.bias"), &[n_expert])?;
    let biases = if r.biases {
        Some(MoeBiases {
            router: ld.req(&n("ffn_gate_inp.bias"), &[n_expert])?,
            gate: ld.req(&n("ffn_gate_exps.bias"), &[n_ff_exp, n_expert])?,
            up: ld.req(&n("ffn_up_exps.bias"), &[n_ff_exp, n_expert])?,
            down: ld.req(&n("ffn_down_exps.bias"), &[n_embd, n_expert])?,
        })
    } else {
        None
    };
    Ok(MoeFfn {
        router,
        gate_exps,
        up_exps,
        fused_gate_up,
        down_exps,
        latent,
        n_expert: hp.n_expert,
        shared,
        selection_bias,
        biases,
    })
}

/// Layer `il`'s shared expert, as the architecture's features say.
fn shared_expert<'a>(
    ld: &mut Loader<'a>,
    hp: &HParams,
    il: usize,
    ungated: bool,
) -> Result<Option<SharedExpert<'a>>, ModelError> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let n_embd = u64::from(hp.n_embd);
    let w = u64::from(hp.n_ff_shexp_at(il));
    let kind = hp.features.shared_experts;
    if kind == SharedExperts::None || (kind == SharedExperts::Counted && w == 0) {
        return Ok(None);
    }
    Ok(Some(SharedExpert {
        gate_inp: match kind {
            SharedExperts::Gated => Some(ld.req(&n("ffn_gate_inp_shexp.weight"), &[n_embd])?),
            _ => None,
        },
        gate: if ungated {
            None
        } else {
            Some(ld.req(&n("ffn_gate_shexp.weight"), &[n_embd, w])?)
        },
        down: ld.req(&n("ffn_down_shexp.weight"), &[w, n_embd])?,
        up: ld.req(&n("ffn_up_shexp.weight"), &[n_embd, w])?,
    }))
}

/// The q/k/v projections of multi-head attention in layer `il`.
///
/// `v_optional`: `attn_v` may be absent (Gemma 4's full-attention layers, whose values are
/// their keys).
pub(crate) fn mha<'a>(
    ld: &mut Loader<'a>,
    hp: &HParams,
    il: usize,
    v_optional: bool,
) -> Result<MhaTensors<'a>, ModelError> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let n_embd = u64::from(hp.n_embd);
    let n_q = u64::from(hp.n_embd_q(il));
    let n_k = u64::from(hp.n_embd_k_gqa(il));
    let n_v = u64::from(hp.n_embd_v_gqa(il));

    let qkv = n("attn_qkv.weight");
    if ld.exists(&qkv) && !ld.exists(&n("attn_q.weight")) {
        return Err(ModelError::FusedLayout {
            name: qkv,
            layout: "attn_qkv",
        });
    }
    let wq = ld.req(&n("attn_q.weight"), &[n_embd, n_q])?;
    let wk = ld.req(&n("attn_k.weight"), &[n_embd, n_k])?;
    let wv = if v_optional {
        ld.opt(&n("attn_v.weight"), &[n_embd, n_v])?
    } else {
        Some(ld.req(&n("attn_v.weight"), &[n_embd, n_v])?)
    };
    let bq = ld.opt(&n("attn_q.bias"), &[n_q])?;
    let bk = ld.opt(&n("attn_k.bias"), &[n_k])?;
    let bv = ld.opt(&n("attn_v.bias"), &[n_v])?;
    let (q_norm, k_norm) = qk_norm(ld, hp, il)?;
    Ok(MhaTensors {
        wq,
        wk,
        wv,
        fused_qkv: false,
        bq,
        bk,
        bv,
        q_norm,
        k_norm,
    })
}

/// Layer `il`'s QK-norm weights, as the architecture's features say.
#[allow(clippy::type_complexity)]
fn qk_norm<'a>(
    ld: &mut Loader<'a>,
    hp: &HParams,
    il: usize,
) -> Result<(Option<Tensor<'a>>, Option<Tensor<'a>>), ModelError> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let n_q = u64::from(hp.n_embd_q(il));
    let n_k = u64::from(hp.n_embd_k_gqa(il));
    Ok(match hp.features.qk_norm {
        QkNorm::None => (None, None),
        QkNorm::PerHead if hp.features.qk_norm_optional => {
            let d = u64::from(hp.head_dim_k_at(il));
            (
                ld.opt(&n("attn_q_norm.weight"), &[d])?,
                ld.opt(&n("attn_k_norm.weight"), &[d])?,
            )
        }
        QkNorm::PerHead => {
            let d = u64::from(hp.head_dim_k_at(il));
            (
                Some(ld.req(&n("attn_q_norm.weight"), &[d])?),
                Some(ld.req(&n("attn_k_norm.weight"), &[d])?),
            )
        }
        // over the whole projection: every query head, every key head
        QkNorm::Whole => (
            Some(ld.req(&n("attn_q_norm.weight"), &[n_q])?),
            Some(ld.req(&n("attn_k_norm.weight"), &[n_k])?),
        ),
    })
}

/// The q/k/v projections of multi-head attention in layer `il` as one fused `attn_qkv.weight`
/// `{n_embd, n_q + n_k + n_v}` (rows: the queries, then the keys, then the values) and the
/// QK-norm weights; no biases.
pub(crate) fn mha_fused<'a>(
    ld: &mut Loader<'a>,
    hp: &HParams,
    il: usize,
) -> Result<MhaTensors<'a>, ModelError> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let n_embd = u64::from(hp.n_embd);
    let rows = u64::from(hp.n_embd_q(il))
        + u64::from(hp.n_embd_k_gqa(il))
        + u64::from(hp.n_embd_v_gqa(il));
    let qkv = ld.req(&n("attn_qkv.weight"), &[n_embd, rows])?;
    let (q_norm, k_norm) = qk_norm(ld, hp, il)?;
    Ok(MhaTensors {
        wq: qkv,
        wk: qkv,
        wv: Some(qkv),
        fused_qkv: true,
        bq: None,
        bk: None,
        bv: None,
        q_norm,
        k_norm,
    })
}

/// The projections of multi-head latent attention in layer `il`, as llama.cpp's deepseek2
/// loader shapes them.
pub(crate) fn mla<'a>(
    ld: &mut Loader<'a>,
    hp: &HParams,
    m: &Mla,
    il: usize,
) -> Result<MlaTensors<'a>, ModelError> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let n_embd = u64::from(hp.n_embd);
    let n_head = u64::from(hp.n_head.at(il));
    let n_rot = u64::from(hp.rope.n_rot);
    let (k, v, r) = (
        u64::from(m.head_dim_k),
        u64::from(m.head_dim_v),
        u64::from(m.kv_lora_rank),
    );
    let nope = k - n_rot;
    let q = if m.q_lora_rank > 0 {
        let ql = u64::from(m.q_lora_rank);
        MlaQuery::LowRank {
            a_norm: ld.req(&n("attn_q_a_norm.weight"), &[ql])?,
            a: ld.req(&n("attn_q_a.weight"), &[n_embd, ql])?,
            b: ld.req(&n("attn_q_b.weight"), &[ql, n_head * k])?,
        }
    } else {
        MlaQuery::Direct(ld.req(&n("attn_q.weight"), &[n_embd, n_head * k])?)
    };
    let kv_a_norm = ld.req(&n("attn_kv_a_norm.weight"), &[r])?;
    let kv_a_mqa = ld.req(&n("attn_kv_a_mqa.weight"), &[n_embd, r + n_rot])?;
    let kv_b = if m.absorbed {
        MlaKvB::Absorbed {
            k_b: ld.req(&n("attn_k_b.weight"), &[nope, r, n_head])?,
            v_b: ld.req(&n("attn_v_b.weight"), &[r, v, n_head])?,
        }
    } else {
        MlaKvB::Legacy(ld.req(&n("attn_kv_b.weight"), &[r, n_head * (nope + v)])?)
    };
    Ok(MlaTensors {
        q,
        kv_a_mqa,
        kv_a_norm,
        kv_b,
    })
}

/// Where a Gated DeltaNet layer's projections may be stored besides `attn_qkv`, `attn_gate`,
/// `ssm_beta` and `ssm_alpha`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GdnLayout {
    /// `ssm_in` (queries, keys, values and gates grouped by key head) is taken where the file
    /// has no `attn_qkv`.
    pub(crate) grouped_input: bool,
    /// Beta and alpha are one `ssm_ba` (grouped by key head), required.
    pub(crate) grouped_beta_alpha: bool,
}

impl GdnLayout {
    /// Qwen3.5's: the split projections only.
    pub(crate) const SPLIT: GdnLayout = GdnLayout {
        grouped_input: false,
        grouped_beta_alpha: false,
    };
}

/// The tensors of linear-attention layer `il`, stored as `layout` allows.
pub(crate) fn gdn<'a>(
    ld: &mut Loader<'a>,
    ssm: &Ssm,
    n_embd: u64,
    il: usize,
    layout: GdnLayout,
) -> Result<GdnTensors<'a>, ModelError> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let hv = u64::from(ssm.n_v_heads);
    let (ch, vd) = (u64::from(ssm.conv_channels()), u64::from(ssm.value_dim()));
    // as llama.cpp: attn_qkv, when present, is taken (and ssm_in is then left unused); with
    // neither, the current converter's attn_qkv is the one named missing
    let grouped =
        layout.grouped_input && !ld.exists(&n("attn_qkv.weight")) && ld.exists(&n("ssm_in.weight"));
    let input = if grouped {
        GdnInput::Grouped(ld.req(&n("ssm_in.weight"), &[n_embd, ch + vd])?)
    } else {
        GdnInput::Split {
            qkv: ld.req(&n("attn_qkv.weight"), &[n_embd, ch])?,
            gate: ld.req(&n("attn_gate.weight"), &[n_embd, vd])?,
        }
    };
    let conv1d = ld.req(&n("ssm_conv1d.weight"), &[u64::from(ssm.d_conv), ch])?;
    let dt_bias = ld.req(&n("ssm_dt.bias"), &[hv])?;
    let a = ld.req(&n("ssm_a"), &[hv])?;
    let beta_alpha = if layout.grouped_beta_alpha {
        GdnBetaAlpha::Grouped(ld.req(&n("ssm_ba.weight"), &[n_embd, 2 * hv])?)
    } else {
        GdnBetaAlpha::Split {
            beta: ld.req(&n("ssm_beta.weight"), &[n_embd, hv])?,
            alpha: ld.req(&n("ssm_alpha.weight"), &[n_embd, hv])?,
        }
    };
    Ok(GdnTensors {
        input,
        conv1d,
        dt_bias,
        a,
        beta_alpha,
        norm: ld.req(&n("ssm_norm.weight"), &[u64::from(ssm.d_state)])?,
    })
}

/// The Qwen hybrid stacks' layer rules (qwen35moe, qwen3next): the FFN's norm is
/// `post_attention_norm`, the experts' gate and up may be one fused tensor.
pub(crate) const QWEN_HYBRID: LayerRules = LayerRules {
    ffn_norm: "post_attention_norm.weight",
    moe: MoeRules {
        fused_gate_up: true,
        ..LayerRules::BASE.moe
    },
    ..LayerRules::BASE
};

/// A layer of a Qwen hybrid stack: Gated DeltaNet linear attention where the layer is
/// recurrent (its projections stored as `layout` allows), multi-head attention elsewhere.
pub(crate) fn gdn_or_mha_layer<'a>(
    ld: &mut Loader<'a>,
    hp: &HParams,
    il: usize,
    layout: GdnLayout,
) -> Result<LayerTensors<'a>, ModelError> {
    layer(ld, hp, il, &QWEN_HYBRID, |ld| match &hp.ssm {
        Some(ssm) if hp.is_recurrent(il) => {
            Ok(Attn::Gdn(gdn(ld, ssm, u64::from(hp.n_embd), il, layout)?))
        }
        _ => Ok(Attn::Mha(mha(ld, hp, il, false)?)),
    })
}

/// A layer whose attention is multi-head attention with every projection required.
pub(crate) fn mha_layer<'a>(
    ld: &mut Loader<'a>,
    hp: &HParams,
    il: usize,
    r: &LayerRules,
) -> Result<LayerTensors<'a>, ModelError> {
    layer(ld, hp, il, r, |ld| {
        Ok(Attn::Mha(if r.fused_qkv {
            mha_fused(ld, hp, il)?
        } else {
            mha(ld, hp, il, false)?
        }))
    })
}
