//! The per-chunk scratch buffers every stage works in, sized once for `ubatch` tokens when
//! the engine is built.

use model::HParams;

use super::attn::MLA_PART;
use super::cache_aware::CacheAwareScratch;
use crate::ops;

/// Per-chunk scratch buffers, sized for `ubatch` tokens.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) x: Vec<f32>,
    /// The last layer's rows after its attention, aside while the rows that do not go on run
    /// their FFN for the draft head.
    pub(super) aside: Vec<f32>,
    pub(super) cur: Vec<f32>,
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) att: Vec<f32>,
    pub(super) proj: Vec<f32>,
    pub(super) gate: Vec<f32>,
    pub(super) up: Vec<f32>,
    pub(super) act: Vec<f32>,
    pub(super) router: Vec<f32>,
    pub(super) probs: Vec<f32>,
    pub(super) ids: Vec<usize>,
    pub(super) wts: Vec<f32>,
    pub(super) gath: Vec<f32>,
    pub(super) eout: Vec<f32>,
    pub(super) slots: Vec<f32>,
    pub(super) moe: Vec<f32>,
    pub(super) shg: Vec<f32>,
    pub(super) by_expert: Vec<Vec<(usize, usize)>>,
    /// Cache-aware dropping: per routing of the batch, whether it was dropped (sized and
    /// written only when the policy acts), and the experts the source loads instead of all.
    pub(super) dropped: Vec<bool>,
    pub(super) load_ids: Vec<usize>,
    pub(super) cache_aware: CacheAwareScratch,
    pub(super) pending: Vec<usize>,
    /// The experts computed together in one step of a one-token pass.
    pub(super) ready: Vec<usize>,
    /// A one-token pass's expert group: gate, up and activation outputs (expert after
    /// expert), the quantized FFN input (for gate and for up) and activations.
    pub(super) grp_gate: Vec<f32>,
    pub(super) grp_up: Vec<f32>,
    pub(super) grp_act: Vec<f32>,
    pub(super) grp_qx: Vec<u8>,
    pub(super) grp_qx_up: Vec<u8>,
    pub(super) grp_qa: Vec<u8>,
    pub(super) route: ops::RouteScratch,
    pub(super) rope: Vec<f32>,
    pub(super) qbuf: Vec<u8>,
    /// Multi-head latent attention: the query projection's output, the compressed rows with
    /// the rotated key part, a head's gathered inputs and outputs of the per-head products, and
    /// the value heads of the absorbed form.
    pub(super) qraw: Vec<f32>,
    pub(super) kva: Vec<f32>,
    pub(super) hx: Vec<f32>,
    pub(super) hy: Vec<f32>,
    pub(super) heads: Vec<f32>,
    /// Gemma 4: the sliding-window layers' rope table, the router's input, the dense MLP's
    /// output while the experts run.
    pub(super) rope_swa: Vec<f32>,
    pub(super) rin: Vec<f32>,
    pub(super) mlp: Vec<f32>,
    /// Gated DeltaNet: the qkv projection (then the convolved, activated channels), the
    /// convolution's output, the contiguous queries, keys and values, the output gate (z, then
    /// silu(z)), beta and the decay gate.
    pub(super) gdn_qkv: Vec<f32>,
    pub(super) gdn_conv: Vec<f32>,
    /// LFM2's short convolution's input `B · x`.
    pub(super) gdn_bx: Vec<f32>,
    pub(super) gdn_q: Vec<f32>,
    pub(super) gdn_k: Vec<f32>,
    pub(super) gdn_v: Vec<f32>,
    pub(super) gdn_z: Vec<f32>,
    pub(super) gdn_b: Vec<f32>,
    pub(super) gdn_g: Vec<f32>,
    /// The product of a projection stored grouped by key head (`ssm_in`, `ssm_ba`), before its
    /// rows are put in order; grown on first use.
    pub(super) gdn_in: Vec<f32>,
    /// A Mamba-2 mixer's input projection (z, x·B·C, dt per token), its convolution's
    /// output, the scan's output and its time steps (empty without Mamba-2 layers).
    pub(super) mb_in: Vec<f32>,
    pub(super) mb_xbc: Vec<f32>,
    pub(super) mb_raw: Vec<f32>,
    pub(super) mb_y: Vec<f32>,
    pub(super) mb_dt: Vec<f32>,
    /// The routed experts' input in their latent space (empty without one).
    pub(super) lat: Vec<f32>,
}

impl Scratch {
    /// Every buffer of a chunk of `ub` tokens of the model `hp`.
    pub(super) fn new(hp: &HParams, ub: usize) -> Scratch {
        let e = hp.n_embd as usize;
        let (q_max, kv_max, att_max) = attn_widths(hp);
        // the linear-attention layers' buffers (empty without them)
        let (g_ch, g_kd, g_vd, g_hv) = gdn_widths(hp);
        // LFM2's short convolution: its B, C, x rows in gdn_qkv, B·x then the convolution's
        // output in gdn_conv
        let sc = if hp.shortconv_l_cache > 0 { e } else { 0 };
        let (mb_in, mb_ch, mb_di, mb_nh) = hp.mamba2.map_or((0, 0, 0, 0), |m| {
            (
                m.in_proj_rows() as usize,
                m.conv_channels() as usize,
                m.d_inner as usize,
                m.n_head as usize,
            )
        });
        let att_max = att_max.max(g_vd);
        // the absorbed form's queries and attention outputs are made a part at a time
        let att_rows = if hp.mla.as_ref().is_some_and(|m| m.absorbed) {
            ub.min(MLA_PART + 1)
        } else {
            ub
        };
        let (mla_q, mla_kva, mla_hx, mla_hy, mla_heads) = mla_widths(hp);
        let f_max = ffn_width(hp, att_max);
        let k_max = hp.n_expert_used.max() as usize;
        // the routed experts' rows: n_embd wide, or as wide as their latent space
        let em = e.max(hp.moe_latent as usize);
        let x_n = hp.n_expert as usize;
        // the router input and the dense MLP's output of a layer with both (Gemma 4); the
        // router input alone where the router reads the layer's input (SmallThinker)
        let beside = if hp.features.mlp_beside_experts {
            ub * e
        } else {
            0
        };
        let router_in = if hp.features.router_reads_layer_input {
            ub * e
        } else {
            beside
        };
        Scratch {
            x: vec![0.0; ub * e],
            aside: Vec::new(),
            cur: vec![0.0; ub * e],
            q: vec![0.0; att_rows * q_max],
            k: vec![0.0; ub * kv_max],
            v: vec![0.0; ub * kv_max],
            att: vec![0.0; att_rows * att_max],
            proj: vec![0.0; ub * e],
            gate: vec![0.0; ub * f_max],
            up: vec![0.0; ub * f_max],
            act: vec![0.0; ub * f_max],
            router: vec![0.0; ub * x_n],
            probs: vec![0.0; ub * x_n],
            ids: vec![0; ub * k_max],
            wts: vec![0.0; ub * k_max],
            gath: vec![0.0; if x_n > 0 { ub * em } else { 0 }],
            eout: vec![0.0; if x_n > 0 { ub * em } else { 0 }],
            slots: vec![0.0; ub * k_max * em],
            moe: vec![0.0; ub * em],
            shg: vec![0.0; ub],
            by_expert: (0..x_n).map(|_| Vec::with_capacity(ub)).collect(),
            dropped: Vec::new(),
            load_ids: Vec::new(),
            cache_aware: CacheAwareScratch::default(),
            pending: Vec::with_capacity(x_n),
            ready: Vec::with_capacity(x_n),
            grp_gate: Vec::new(),
            grp_up: Vec::new(),
            grp_act: Vec::new(),
            grp_qx: Vec::new(),
            grp_qx_up: Vec::new(),
            grp_qa: Vec::new(),
            route: ops::RouteScratch::default(),
            rope: vec![0.0; ub * hp.rope.n_rot as usize],
            qbuf: Vec::new(),
            qraw: vec![0.0; ub * mla_q as usize],
            kva: vec![0.0; ub * mla_kva as usize],
            hx: vec![0.0; ub * mla_hx as usize],
            hy: vec![0.0; ub * mla_hy as usize],
            heads: vec![0.0; ub * mla_heads as usize],
            rope_swa: vec![0.0; ub * hp.rope.n_rot_swa as usize],
            rin: vec![0.0; router_in],
            mlp: vec![0.0; beside],
            gdn_qkv: vec![0.0; ub * g_ch.max(3 * sc)],
            gdn_conv: vec![0.0; ub * g_ch.max(sc)],
            gdn_bx: vec![0.0; ub * sc],
            gdn_q: vec![0.0; ub * g_kd],
            gdn_k: vec![0.0; ub * g_kd],
            gdn_v: vec![0.0; ub * g_vd],
            gdn_z: vec![0.0; ub * g_vd],
            gdn_b: vec![0.0; ub * g_hv],
            gdn_g: vec![0.0; ub * g_hv],
            gdn_in: Vec::new(),
            mb_in: vec![0.0; ub * mb_in],
            mb_xbc: vec![0.0; ub * mb_ch],
            mb_raw: vec![0.0; ub * mb_ch],
            mb_y: vec![0.0; ub * mb_di],
            mb_dt: vec![0.0; ub * mb_nh],
            lat: vec![0.0; ub * hp.moe_latent as usize],
        }
    }
}

/// The widest rows of the queries, of the keys and values, and of the attention output over
/// the layers (the NextN layers too, which a draft head runs).
fn attn_widths(hp: &HParams) -> (usize, usize, usize) {
    let nl_all = hp.n_layer_all() as usize;
    let q_max = (0..nl_all)
        .map(|il| hp.n_embd_q(il) as usize)
        .max()
        .unwrap_or(0);
    let q_max = q_max.max(
        (0..nl_all)
            .map(|il| hp.n_head.at(il) as usize * hp.head_dim_k_at(il) as usize)
            .max()
            .unwrap_or(0),
    );
    let kv_max = (0..nl_all)
        .map(|il| hp.n_embd_k_gqa(il).max(hp.n_embd_v_gqa(il)) as usize)
        .max()
        .unwrap_or(0);
    let att_max = (0..nl_all)
        .map(|il| (hp.n_head.at(il) * hp.head_dim_v_at(il)) as usize)
        .max()
        .unwrap_or(0)
        .max(q_max);
    (q_max, kv_max, att_max)
}

/// The Gated DeltaNet layers' widths: convolution channels, key and value dims, value heads
/// (zeros without them).
fn gdn_widths(hp: &HParams) -> (usize, usize, usize, usize) {
    match &hp.ssm {
        Some(m) => (
            m.conv_channels() as usize,
            m.key_dim() as usize,
            m.value_dim() as usize,
            m.n_v_heads as usize,
        ),
        None => (0, 0, 0, 0),
    }
}

/// Multi-head latent attention's widths (zeros without MLA): the queries, the compressed row
/// with its rotated key part, a head's product input and output, the value heads.
fn mla_widths(hp: &HParams) -> (u32, u32, u32, u32, u32) {
    match &hp.mla {
        None => (0, 0, 0, 0, 0),
        Some(m) => {
            let nr = hp.rope.n_rot;
            let nope = m.head_dim_nope(nr);
            let h = hp.n_head.max();
            let hx = m.q_lora_rank.max(m.kv_lora_rank).max(nope);
            // a head's k_b / v_b output, or the legacy form's whole kv_b output
            let hy = if m.absorbed {
                m.kv_lora_rank.max(m.head_dim_v)
            } else {
                h * (nope + m.head_dim_v)
            };
            (
                h * m.head_dim_k,
                m.kv_lora_rank + nr,
                hx,
                hy,
                h * m.head_dim_v,
            )
        }
    }
}

/// The widest FFN row: dense, routed expert, shared expert, or the gated attention's gate
/// (`att_max` wide), which uses the FFN's `gate` and `up` buffers.
fn ffn_width(hp: &HParams, att_max: usize) -> usize {
    [
        hp.n_ff.max() as usize,
        hp.n_ff_exp.max() as usize,
        hp.n_ff_shexp as usize,
        // the gated attention's gate and its sigmoid use `gate` and `up`
        if hp.features.gated_q { att_max } else { 0 },
    ]
    .into_iter()
    .max()
    .unwrap_or(0)
}
