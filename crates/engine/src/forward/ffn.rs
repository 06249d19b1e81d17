//! The feed-forward stage of a layer: its input and its residual ([`ffn_input`],
//! [`ffn_residual`], with Gemma 4's dense MLP beside the experts), a dense gated FFN
//! ([`swiglu_ffn`]), the MoE block ([`moe_ffn`]: routing through [`super::source`], the routed
//! experts a row group at a time or a one-token pass's experts together, their weighted sum)
//! and the shared expert.

use model::FfnAct;
use quant::{MatvecJob, ThreadPool};

use super::ahead::Ahead;
use super::attn::scale_residual;
use super::source::{Routing, cache_aware_routing, group_routings, route, take_pending};
use super::weights::{LayerW, Mat, MoeW, SharedW};
use super::{
    ExpertProj, ExpertSource, ForwardError, RouteTap, Routed, Scratch, Stage, add_bias,
    add_bias_slice, cache_aware, mm,
};
use crate::ops;

/// gpt-oss's SwiGLU constants (llama.cpp's `build_moe_ffn`, `LLM_FFN_SWIGLU_OAI_MOE`).
const SWIGLU_OAI_ALPHA: f32 = 1.702;
const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// The routed experts' gated activation `act(gate) * up` into `out`; ReLU² (experts without
/// a gate, whose `gate` is empty) `relu(up)²`.
fn activate(act: FfnAct, gate: &[f32], up: &[f32], out: &mut [f32]) {
    match act {
        FfnAct::ReluSqr => ops::relu_sqr(up, out),
        FfnAct::Swiglu => ops::swiglu(gate, up, out),
        FfnAct::SwigluOai => ops::swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, out),
        FfnAct::Geglu => ops::geglu(gate, up, out),
        FfnAct::Reglu => ops::reglu(gate, up, out),
    }
}

/// The FFN block's input: `s.cur = rmsnorm(s.x) · ffn_norm` for the chunk's rows; on Gemma 4's
/// MoE layers first the dense MLP on those, normed, aside in `s.mlp`, then the experts' input
/// (`s.cur`, with its own norm) and the router's (`s.rin`).
pub(super) fn ffn_input(
    st: Stage<'_, '_>,
    lw: &LayerW<'_>,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (hp, n, e) = (st.hp, st.n, st.e());
    st.emit("ffn_inp", &s.x[..n * e]);
    ops::rms_norm(&s.x[..n * e], &lw.ffn_norm, hp.rms_eps, &mut s.cur[..n * e]);
    st.emit("ffn_norm", &s.cur[..n * e]);
    if let Some(g) = &lw.gemma
        && let Some(gm) = &g.moe
    {
        // the dense MLP, normed, aside; then the experts' input and the router's
        let d = &gm.mlp;
        swiglu_ffn(st, [&d.gate, &d.up, &d.down], [None, None, None], s)?;
        let f = d.gate.rows;
        st.emit("ffn_gate", &s.gate[..n * f]);
        st.emit("ffn_up", &s.up[..n * f]);
        st.emit("ffn_geglu", &s.act[..n * f]);
        ops::rms_norm(
            &s.proj[..n * e],
            &gm.post_norm_1,
            hp.rms_eps,
            &mut s.mlp[..n * e],
        );
        st.emit("ffn_mlp", &s.mlp[..n * e]);
        ops::rms_norm(
            &s.x[..n * e],
            &gm.pre_norm_2,
            hp.rms_eps,
            &mut s.cur[..n * e],
        );
        s.rin[..n * e].copy_from_slice(&s.x[..n * e]);
        let inv = 1.0 / (e as f32).sqrt();
        for row in s.rin[..n * e].chunks_exact_mut(e) {
            ops::rms_norm_plain_inplace(row, e, hp.rms_eps);
            for (v, &w) in row.iter_mut().zip(&gm.router_scale) {
                *v = *v * inv * w;
            }
        }
    }
    Ok(())
}

/// The FFN block's output `s.proj` (on Gemma 4 normed, after the experts' output is normed and
/// added to the dense MLP's), shown and added into the residual stream `s.x`, which the
/// layer's output scale then scales where it has one.
pub(super) fn ffn_residual(st: Stage<'_, '_>, lw: &LayerW<'_>, s: &mut Scratch) {
    let (hp, n, e) = (st.hp, st.n, st.e());
    if let Some(g) = &lw.gemma {
        if let Some(gm) = &g.moe {
            // the experts' output normed, added to the MLP's (mlp + moe)
            ops::rms_norm_inplace(&mut s.proj[..n * e], &gm.post_norm_2, hp.rms_eps);
            for (p, &m) in s.proj[..n * e].iter_mut().zip(&s.mlp[..n * e]) {
                *p += m;
            }
        }
        ops::rms_norm_inplace(&mut s.proj[..n * e], &g.post_ffn_norm, hp.rms_eps);
    }
    st.emit("ffn_out", &s.proj[..n * e]);
    scale_residual(hp, &mut s.proj[..n * e]);
    for (xv, &a) in s.x[..n * e].iter_mut().zip(&s.proj[..n * e]) {
        *xv += a;
    }
    if let Some(k) = lw.gemma.as_ref().and_then(|g| g.out_scale) {
        for v in &mut s.x[..n * e] {
            *v *= k;
        }
    }
    st.emit("l_out", &s.x[..n * e]);
}

/// A SwiGLU FFN (a dense layer's, or the shared expert's without biases) on the normed rows
/// `s.cur`, into `s.proj`: `down · (silu(gate · x + gate_b) * (up · x + up_b)) + down_b`.
pub(super) fn swiglu_ffn(
    st: Stage<'_, '_>,
    [gate, up, down]: [&Mat<'_>; 3],
    [gate_b, up_b, down_b]: [Option<&Vec<f32>>; 3],
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (n, pool, e) = (st.n, st.pool, st.e());
    let f = gate.rows;
    mm(pool, gate, gate.data, &s.cur, n, &mut s.gate, &mut s.qbuf)?;
    add_bias(&mut s.gate[..n * f], gate_b);
    mm(pool, up, up.data, &s.cur, n, &mut s.up, &mut s.qbuf)?;
    add_bias(&mut s.up[..n * f], up_b);
    if st.hp.features.ffn_act == FfnAct::Geglu {
        ops::geglu(&s.gate[..n * f], &s.up[..n * f], &mut s.act[..n * f]);
    } else {
        ops::swiglu(&s.gate[..n * f], &s.up[..n * f], &mut s.act[..n * f]);
    }
    mm(pool, down, down.data, &s.act, n, &mut s.proj, &mut s.qbuf)?;
    add_bias(&mut s.proj[..n * e], down_b);
    Ok(())
}

/// A ReLU² FFN without a gate (nemotron_h_moe's shared expert) on the normed rows `s.cur`,
/// into `s.proj`: `down · relu(up · x)²`.
fn relu_sqr_ffn(
    st: Stage<'_, '_>,
    [up, down]: [&Mat<'_>; 2],
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (n, pool) = (st.n, st.pool);
    let f = up.rows;
    mm(pool, up, up.data, &s.cur, n, &mut s.up, &mut s.qbuf)?;
    ops::relu_sqr(&s.up[..n * f], &mut s.act[..n * f]);
    mm(pool, down, down.data, &s.act, n, &mut s.proj, &mut s.qbuf)?;
    Ok(())
}

/// The MoE FFN on the normed rows `s.cur`, into `s.proj`: routing (route-ahead's committed
/// selection routes like a replayed one), the source's load and the route tap, what is ranked
/// ahead, the routed experts, their weighted sum, and the shared expert.
pub(super) fn moe_ffn<'a>(
    st: Stage<'_, 'a>,
    m: &MoeW<'a>,
    routing: Routing<'_>,
    source: &mut Option<Box<dyn ExpertSource + 'a>>,
    route_tap: &mut Option<RouteTap<'a>>,
    ahead: &mut Ahead<'_, 'a>,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (il, n, e) = (st.il, st.n, st.e());
    let Routing {
        replayed,
        first_pos,
        policy,
        counts,
        decode,
        loaded_early,
    } = routing;
    // A one-token pass ranks ahead; a replay wins over route-ahead's committed selection.
    let ranking = n == 1 && ahead.state.one_token && ahead.cfg.any();
    let committed = if ranking && replayed.is_none() {
        ahead.state.take_committed(il)
    } else {
        Vec::new()
    };
    let fixed = replayed.or((!committed.is_empty()).then_some(committed.as_slice()));
    let k_used = route(st, m, fixed, s)?;
    // the cache-aware policies rewrite the router's own routing only
    let dropping = fixed.is_none()
        && policy.any()
        && cache_aware_routing(
            st,
            m,
            k_used,
            (policy, counts, decode),
            source.as_deref(),
            s,
        );
    group_routings(s, n, k_used, dropping);
    if let Some(src) = source.as_mut().filter(|_| !loaded_early) {
        let ids = if dropping {
            &s.load_ids[..]
        } else {
            &s.ids[..n * k_used]
        };
        src.load(il, ids).map_err(ForwardError::Experts)?;
    }
    // (after the load, so that a tap can ask the source what each routing found)
    if let Some(tap) = route_tap {
        tap(&Routed {
            layer: il,
            first_pos,
            k: k_used,
            ids: &s.ids[..n * k_used],
            weights: &s.wts[..n * k_used],
            replayed: replayed.is_some(),
            dropped: if dropping {
                &s.dropped[..n * k_used]
            } else {
                &[]
            },
        });
    }
    if dropping {
        let spans = s.wts[..n * k_used].chunks_exact_mut(k_used);
        for (w, d) in spans.zip(s.dropped.chunks_exact(k_used)) {
            cache_aware::apply_drops(w, d, policy.drop_renorm);
        }
    }
    if ranking {
        ahead.after_load(
            st,
            m,
            &s.cur,
            &s.router,
            &s.ids[..k_used],
            !committed.is_empty(),
            replayed.is_some(),
            source,
        )?;
        ahead.state.return_committed(il, committed);
    }
    // the experts' input: the normed rows, or their projection into the latent space (which
    // the experts then read as `s.cur` until their sum is made)
    let em = m.up.cols;
    if let Some((down, _)) = &m.latent {
        mm(st.pool, down, down.data, &s.cur, n, &mut s.lat, &mut s.qbuf)?;
        std::mem::swap(&mut s.cur, &mut s.lat);
    }
    let experts = routed_experts(st, m, k_used, source, s);
    if m.latent.is_some() {
        std::mem::swap(&mut s.cur, &mut s.lat);
    }
    experts?;
    if let Some(src) = source {
        src.release(il);
    }
    let before = st.hp.features.expert_weights_before_ffn;
    weighted_sum(m, (n, em, k_used), dropping, before, s);
    st.emit("ffn_moe_out", &s.moe[..n * em]);
    if let Some((_, up)) = &m.latent {
        mm(st.pool, up, up.data, &s.moe, n, &mut s.proj, &mut s.qbuf)?;
        s.moe[..n * e].copy_from_slice(&s.proj[..n * e]);
        st.emit("ffn_moe_latent_up", &s.moe[..n * e]);
    }
    if let Some(sh) = &m.shared {
        shared_expert(st, sh, s)?;
    }
    s.proj[..n * e].copy_from_slice(&s.moe[..n * e]);
    Ok(())
}

/// The routed experts' outputs (`s.slots`) of each of the `n` rows, weighted by their routing
/// weights and summed into `s.moe` in selection order (each product rounded, then added); a
/// dropped routing (when `dropping`) has no product. Gemma 4 scales each expert's output
/// first. Where the weights went into the experts' inputs (`before`), the outputs are summed
/// as they are.
fn weighted_sum(
    m: &MoeW<'_>,
    (n, e, k_used): (usize, usize, usize),
    dropping: bool,
    before: bool,
    s: &mut Scratch,
) {
    for t in 0..n {
        let out = &mut s.moe[t * e..(t + 1) * e];
        let mut first = true;
        for slot in 0..k_used {
            if dropping && s.dropped[t * k_used + slot] {
                continue;
            }
            let wt = s.wts[t * k_used + slot];
            let src = &mut s.slots[(t * k_used + slot) * e..(t * k_used + slot + 1) * e];
            if before {
                if first {
                    first = false;
                    out.copy_from_slice(src);
                } else {
                    for (o, &v) in out.iter_mut().zip(src.iter()) {
                        *o += v;
                    }
                }
                continue;
            }
            // Gemma 4: each expert's output times its scale first (ggml_mul, then the weight)
            if let Some(ds) = &m.down_scale {
                let x = s.ids[t * k_used + slot];
                let f = ds.get(x).copied().unwrap_or(1.0);
                for v in src.iter_mut() {
                    *v *= f;
                }
            }
            if first {
                first = false;
                for (o, &v) in out.iter_mut().zip(src.iter()) {
                    *o = v * wt;
                }
            } else {
                for (o, &v) in out.iter_mut().zip(src.iter()) {
                    *o += v * wt;
                }
            }
        }
    }
}

/// Each routed expert on the rows that chose it, in the order the source has them ready (each
/// writes its own slots of `s.slots`, so the order changes no bit).
fn routed_experts<'a>(
    st: Stage<'_, 'a>,
    m: &MoeW<'a>,
    k_used: usize,
    source: &mut Option<Box<dyn ExpertSource + 'a>>,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (hp, il, n) = (st.hp, st.il, st.n);
    // the experts' own width (the latent one where they work in it)
    let e = m.up.cols;
    s.pending.clear();
    s.pending
        .extend((0..m.n_expert).filter(|&ex| !s.by_expert[ex].is_empty()));
    // Llama 4 weights each expert's input: a one-token pass's experts then read inputs of
    // their own, which the row path below makes (the same kernels, so the same bits)
    let before = hp.features.expert_weights_before_ffn;
    while !s.pending.is_empty() {
        if n == 1 && !before {
            // One token: every expert that is ready now, in two pool runs.
            s.ready.clear();
            match source {
                Some(src) => {
                    src.ready_now(il, &s.pending, &mut s.ready)
                        .map_err(ForwardError::Experts)?;
                    if s.ready.is_empty() {
                        let ex = src
                            .next_ready(il, &s.pending)
                            .map_err(ForwardError::Experts)?;
                        s.ready.push(ex);
                    }
                }
                None => s.ready.extend_from_slice(&s.pending),
            }
            for i in 0..s.ready.len() {
                take_pending(s, il, s.ready[i])?;
            }
            let act = hp.features.ffn_act;
            experts_one_token(st.pool, m, act, il, e, k_used, source.as_deref(), s)?;
            continue;
        }
        let ex = match source {
            Some(src) => src
                .next_ready(il, &s.pending)
                .map_err(ForwardError::Experts)?,
            None => s.pending[0],
        };
        take_pending(s, il, ex)?;
        expert_rows(st, m, ex, k_used, source.as_deref(), s)?;
    }
    Ok(())
}

/// The routed experts `s.ready` of a one-token pass (each chosen once, at its slot of
/// `s.by_expert`), computed as llama.cpp's `MUL_MAT_ID` does them — every gate and up
/// projection in one pool run, the activations, then every down projection in a second run —
/// into their slots of `s.slots`. Each output element comes from the same kernel call on the
/// same bytes as the expert-by-expert path, so the bits are the same.
#[allow(clippy::too_many_arguments)]
fn experts_one_token<'a>(
    pool: &ThreadPool,
    m: &MoeW<'a>,
    act: FfnAct,
    il: usize,
    e: usize,
    k_used: usize,
    source: Option<&(dyn ExpertSource + 'a)>,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let g = s.ready.len();
    let fe = m.up.rows;
    for v in [&mut s.grp_gate, &mut s.grp_up, &mut s.grp_act] {
        if v.len() < g * fe {
            v.resize(g * fe, 0.0);
        }
    }
    group_gate_up(pool, m, il, e, source, s)?;
    let arb = group_activations(m, act, il, s)?;
    group_down(pool, m, (il, e, k_used), arb, source, s)
}

/// The bytes of expert `ex`'s `proj` (`mat` in the model) in layer `il`: the source's, else
/// the model's.
fn expert_bytes<'x, 'a>(
    source: Option<&'x (dyn ExpertSource + 'a)>,
    mat: &'x Mat<'a>,
    il: usize,
    ex: usize,
    proj: ExpertProj,
) -> &'x [u8] {
    match source {
        Some(src) => src.part(il, ex, proj),
        None => mat.expert(ex),
    }
}

/// The first pool run of [`experts_one_token`]: the quantized FFN input (`s.cur`'s row) times
/// every ready expert's gate and up projections, into `s.grp_gate` and `s.grp_up`.
fn group_gate_up<'a>(
    pool: &ThreadPool,
    m: &MoeW<'a>,
    il: usize,
    e: usize,
    source: Option<&(dyn ExpertSource + 'a)>,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (g, fe) = (s.ready.len(), m.up.rows);
    let x = &s.cur[..e];
    let ku = &m.up.kernel_one;
    // (experts without a gate: the up projection's quantized input only)
    let kg = m.gate.as_ref().map_or(ku, |g| &g.kernel_one);
    quant::quantize_activation(kg, e, x, &mut s.grp_qx)?;
    let same_act = (ku.order, ku.act_type) == (kg.order, kg.act_type);
    if !same_act {
        quant::quantize_activation(ku, e, x, &mut s.grp_qx_up)?;
    }
    let qx_up: &[u8] = if same_act { &s.grp_qx } else { &s.grp_qx_up };
    let mut jobs: Vec<MatvecJob<'_>> = Vec::with_capacity(2 * g);
    for ((&ex, go), uo) in s
        .ready
        .iter()
        .zip(s.grp_gate.chunks_exact_mut(fe))
        .zip(s.grp_up.chunks_exact_mut(fe))
    {
        if let Some(gm) = &m.gate {
            jobs.push(MatvecJob {
                kernel: kg,
                w: expert_bytes(source, gm, il, ex, ExpertProj::Gate),
                rows: fe,
                cols: e,
                xq: &s.grp_qx,
                out: go,
            });
        }
        jobs.push(MatvecJob {
            kernel: ku,
            w: expert_bytes(source, &m.up, il, ex, ExpertProj::Up),
            rows: fe,
            cols: e,
            xq: qx_up,
            out: uo,
        });
    }
    quant::matvec_many(pool, &mut jobs)?;
    Ok(())
}

/// Each ready expert's gate and up biases and activation (`s.grp_act`), quantized for its down
/// projection into `s.grp_qa`. Returns the bytes of one quantized activation row.
fn group_activations(
    m: &MoeW<'_>,
    act: FfnAct,
    il: usize,
    s: &mut Scratch,
) -> Result<usize, ForwardError> {
    let (g, fe, kd) = (s.ready.len(), m.up.rows, &m.down.kernel_one);
    let gated = m.gate.is_some();
    let arb = kd
        .act_type
        .row_bytes(fe as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| {
            ForwardError::Experts(format!("layer {il}: expert width {fe} cannot be quantized"))
        })?;
    s.grp_qa.clear();
    s.grp_qa.resize(g * arb, 0);
    for (i, &ex) in s.ready.iter().enumerate() {
        let r = i * fe..(i + 1) * fe;
        if let Some(b) = &m.biases {
            let eb = ex * fe..(ex + 1) * fe;
            add_bias_slice(&mut s.grp_gate[r.clone()], &b.gate[eb.clone()]);
            add_bias_slice(&mut s.grp_up[r.clone()], &b.up[eb]);
        }
        let gate: &[f32] = if gated { &s.grp_gate[r.clone()] } else { &[] };
        activate(act, gate, &s.grp_up[r.clone()], &mut s.grp_act[r.clone()]);
        (kd.quantize)(&s.grp_act[r], &mut s.grp_qa[i * arb..(i + 1) * arb]);
    }
    Ok(arb)
}

/// The second pool run of [`experts_one_token`]: every ready expert's down projection of its
/// quantized activation (`arb` bytes each) straight into its slot, then the down biases.
fn group_down<'a>(
    pool: &ThreadPool,
    m: &MoeW<'a>,
    (il, e, k_used): (usize, usize, usize),
    arb: usize,
    source: Option<&(dyn ExpertSource + 'a)>,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (g, fe, kd) = (s.ready.len(), m.up.rows, &m.down.kernel_one);
    // Each expert's down projection straight into its slot (one token: slot `k` at `k · e`).
    let mut outs: Vec<Option<&mut [f32]>> = s.slots[..k_used * e]
        .chunks_exact_mut(e)
        .map(Some)
        .collect();
    let mut jobs: Vec<MatvecJob<'_>> = Vec::with_capacity(g);
    for (i, &ex) in s.ready.iter().enumerate() {
        let [(_, slot)] = s.by_expert[ex][..] else {
            return Err(ForwardError::Experts(format!(
                "layer {il}: expert {ex} is routed {} times for one token",
                s.by_expert[ex].len()
            )));
        };
        let Some(out) = outs.get_mut(slot).and_then(Option::take) else {
            return Err(ForwardError::Experts(format!(
                "layer {il}: slot {slot} of expert {ex} is taken or out of range"
            )));
        };
        jobs.push(MatvecJob {
            kernel: kd,
            w: expert_bytes(source, &m.down, il, ex, ExpertProj::Down),
            rows: e,
            cols: fe,
            xq: &s.grp_qa[i * arb..(i + 1) * arb],
            out,
        });
    }
    quant::matvec_many(pool, &mut jobs)?;
    drop(jobs);
    if let Some(b) = &m.biases {
        for &ex in &s.ready {
            let slot = s.by_expert[ex][0].1;
            add_bias_slice(
                &mut s.slots[slot * e..(slot + 1) * e],
                &b.down[ex * e..(ex + 1) * e],
            );
        }
    }
    Ok(())
}

/// Expert `ex` on the rows that chose it (gathered from `s.cur`), into their slots.
fn expert_rows<'a>(
    st: Stage<'_, '_>,
    m: &MoeW<'a>,
    ex: usize,
    k_used: usize,
    source: Option<&(dyn ExpertSource + 'a)>,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (hp, il, pool) = (st.hp, st.il, st.pool);
    // the experts' own width (the latent one where they work in it)
    let (e, fe) = (m.up.cols, m.up.rows);
    let list = &s.by_expert[ex];
    let cnt = list.len();
    for (j, &(t, slot)) in list.iter().enumerate() {
        let row = &mut s.gath[j * e..(j + 1) * e];
        row.copy_from_slice(&s.cur[t * e..(t + 1) * e]);
        if hp.features.expert_weights_before_ffn {
            // Llama 4: the expert's input times its routing weight (ggml_mul)
            ops::scale_inplace(row, s.wts[t * k_used + slot]);
        }
    }
    if let Some(gm) = &m.gate {
        mm(
            pool,
            gm,
            expert_bytes(source, gm, il, ex, ExpertProj::Gate),
            &s.gath,
            cnt,
            &mut s.gate,
            &mut s.qbuf,
        )?;
    }
    mm(
        pool,
        &m.up,
        expert_bytes(source, &m.up, il, ex, ExpertProj::Up),
        &s.gath,
        cnt,
        &mut s.up,
        &mut s.qbuf,
    )?;
    if let Some(b) = &m.biases {
        let eb = ex * fe..(ex + 1) * fe;
        add_bias_slice(&mut s.gate[..cnt * fe], &b.gate[eb.clone()]);
        add_bias_slice(&mut s.up[..cnt * fe], &b.up[eb]);
    }
    let gate: &[f32] = if m.gate.is_some() {
        &s.gate[..cnt * fe]
    } else {
        &[]
    };
    activate(
        hp.features.ffn_act,
        gate,
        &s.up[..cnt * fe],
        &mut s.act[..cnt * fe],
    );
    mm(
        pool,
        &m.down,
        expert_bytes(source, &m.down, il, ex, ExpertProj::Down),
        &s.act,
        cnt,
        &mut s.eout,
        &mut s.qbuf,
    )?;
    if let Some(b) = &m.biases {
        add_bias_slice(&mut s.eout[..cnt * e], &b.down[ex * e..(ex + 1) * e]);
    }
    for (j, &(t, slot)) in list.iter().enumerate() {
        let dst = (t * k_used + slot) * e;
        s.slots[dst..dst + e].copy_from_slice(&s.eout[j * e..(j + 1) * e]);
    }
    Ok(())
}

/// The shared expert on `s.cur` (gated by its sigmoid where the model has one), added into
/// `s.moe`.
fn shared_expert(st: Stage<'_, '_>, sh: &SharedW<'_>, s: &mut Scratch) -> Result<(), ForwardError> {
    let (n, pool, e) = (st.n, st.pool, st.e());
    match &sh.gate {
        Some(g) => swiglu_ffn(st, [g, &sh.up, &sh.down], [None; 3], s)?,
        None => relu_sqr_ffn(st, [&sh.up, &sh.down], s)?,
    }
    if let Some(g) = &sh.gate_inp {
        mm(pool, g, g.data, &s.cur, n, &mut s.shg, &mut s.qbuf)?;
        let plain = st.hp.features.shared_gate_sigmoid_op;
        for t in 0..n {
            let gx = s.shg[t];
            let gate = if plain {
                let mut sg = [0f32];
                ops::sigmoid(&[gx], &mut sg);
                sg[0]
            } else {
                // llama.cpp builds qwen2moe's sigmoid as silu(x) / x
                let mut si = [0f32];
                ops::silu(&[gx], &mut si);
                si[0] / gx
            };
            for v in &mut s.proj[t * e..(t + 1) * e] {
                *v *= gate;
            }
        }
    }
    st.emit("ffn_shexp_out", &s.proj[..n * e]);
    for (o, &v) in s.moe[..n * e].iter_mut().zip(&s.proj[..n * e]) {
        *o += v;
    }
    Ok(())
}
