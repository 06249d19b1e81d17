//! The attention stage of a layer: multi-head attention over the KV cache (grouped-query or
//! not, with attention sinks, sliding windows and Qwen's output gate; [`mha_qkv`]), multi-head
//! latent attention in its absorbed and legacy forms ([`mla_qkv`],
//! [`mla_absorbed_attention`]), the Gated DeltaNet linear attention ([`gdn_attention`]), and
//! the rotary embedding's configuration.

use model::{HParams, QkNorm, RopeType, Ssm};

use super::state::RecState;
use super::weights::{AttnW, GdnW, LayerW, Mamba2W, Mat, MhaW, MlaKvBW, MlaW, ShortConvW};
use super::{ForwardError, Scratch, Stage, add_bias, mm, mm_part};
use crate::ops::{self, KvCache, Rope, RopeConfig, RopeMode};

pub(super) fn rope_config(hp: &HParams, freq_factors: Option<Vec<f32>>) -> RopeConfig {
    let r = &hp.rope;
    RopeConfig {
        n_dims: r.n_rot as usize,
        mode: match hp.features.rope_type {
            RopeType::Norm => RopeMode::Norm,
            RopeType::Neox => RopeMode::Neox,
        },
        freq_base: r.freq_base,
        freq_scale: r.freq_scale,
        ext_factor: r.yarn_ext_factor,
        attn_factor: r.mscale(),
        beta_fast: r.yarn_beta_fast,
        beta_slow: r.yarn_beta_slow,
        n_ctx_orig: r.n_ctx_orig,
        freq_factors,
        imrope_sections: hp.features.imrope.then_some(r.sections),
    }
}

/// Gemma 4's sliding-window layers' rope: their own rotated dims and base, no divisors
/// (`None` for the other models).
pub(super) fn swa_rope(hp: &HParams) -> Result<Option<Rope>, ForwardError> {
    let rope_swa = if hp.features.swa_rope {
        let mut c = rope_config(hp, None);
        c.n_dims = hp.rope.n_rot_swa as usize;
        c.freq_base = hp.rope.freq_base_swa;
        c.freq_scale = 1.0;
        Some(Rope::new(c)?)
    } else {
        None
    };
    Ok(rope_swa)
}

/// The layer's output projection (`attn_output`, or the recurrent mixer's).
fn out_proj<'x, 'a>(st: Stage<'_, '_>, lw: &'x LayerW<'a>) -> Result<&'x Mat<'a>, ForwardError> {
    lw.wo.as_ref().ok_or_else(|| {
        ForwardError::Unsupported(format!("layer {}: a mixer without its output", st.il))
    })
}

/// The attention block's input: `s.cur = rmsnorm(s.x) · attn_norm` for the chunk's rows.
fn attn_input(st: Stage<'_, '_>, lw: &LayerW<'_>, s: &mut Scratch) {
    let len = st.n * st.e();
    ops::rms_norm(&s.x[..len], &lw.attn_norm, st.hp.rms_eps, &mut s.cur[..len]);
    st.emit("attn_norm", &s.cur[..len]);
}

/// The attention block's output `s.proj`, shown and added into the residual stream `s.x`.
fn attn_residual(st: Stage<'_, '_>, s: &mut Scratch) {
    let len = st.n * st.e();
    st.emit("attn_out", &s.proj[..len]);
    scale_residual(st.hp, &mut s.proj[..len]);
    for (xv, &a) in s.x[..len].iter_mut().zip(&s.proj[..len]) {
        *xv += a;
    }
}

/// A block's output multiplied by the residual scale, where the model has one (ggml_scale).
pub(super) fn scale_residual(hp: &HParams, out: &mut [f32]) {
    if let Some(k) = hp.residual_scale {
        for v in out {
            *v *= k;
        }
    }
}

/// The attention block of layer `st.il` over the chunk's rows at positions `p0..`: norm, the
/// queries, keys and values ([`mha_qkv`] or [`mla_qkv`]), the KV store, attention, the output
/// projection, and the residual added into `s.x`.
pub(super) fn attention(
    st: Stage<'_, '_>,
    lw: &LayerW<'_>,
    cache: &mut KvCache,
    (rope, rope_swa): (&Rope, Option<&Rope>),
    p0: usize,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (hp, il, n, pool) = (st.hp, st.il, st.n, st.pool);
    let e = st.e();
    let n_head = hp.n_head.at(il) as usize;
    let hd = hp.head_dim_k_at(il) as usize;
    let kw = hp.n_embd_k_gqa(il) as usize;
    let vw = hp.n_embd_v_gqa(il) as usize;

    attn_input(st, lw, s);
    let absorbed = match &lw.attn {
        AttnW::Mha(a) => {
            let rope = match rope_swa {
                Some(r) if hp.is_swa_layer(il) => r,
                _ => rope,
            };
            mha_qkv(st, a, rope, p0, s)?;
            None
        }
        AttnW::Mla(a) => mla_qkv(st, a, rope, s)?.then_some(&**a),
        AttnW::Gdn(_) | AttnW::ShortConv(_) | AttnW::Mamba2(_) | AttnW::None => {
            return Err(ForwardError::Unsupported(format!(
                "layer {il}: linear attention (or no mixer) has no KV attention"
            )));
        }
    };
    if absorbed.is_none() {
        st.emit("Qcur", &s.q[..n * n_head * hd]);
    }
    st.emit("Kcur", &s.k[..n * kw]);
    st.emit("Vcur", &s.v[..n * vw]);
    // KV store and attention
    for t in 0..n {
        cache.store(
            0,
            p0 + t,
            &s.k[t * kw..(t + 1) * kw],
            &s.v[t * vw..(t + 1) * vw],
        )?;
    }
    let swa = hp.is_swa_layer(il).then_some(hp.n_swa as usize);
    let chunked = hp.features.swa_chunked;
    let extras = ops::AttnExtras {
        window: swa.filter(|_| !chunked),
        chunk: swa.filter(|_| chunked),
        sinks: lw.sinks.as_deref(),
        batch_end: None,
        batch_tokens: None,
    };
    let heads = if let Some(a) = absorbed {
        mla_absorbed_attention(st, a, cache, p0, s)?;
        &s.heads
    } else {
        mha_attend(st, cache, p0, extras, s)?;
        &s.att
    };
    let wo = out_proj(st, lw)?;
    mm(pool, wo, wo.data, heads, n, &mut s.proj, &mut s.qbuf)?;
    add_bias(&mut s.proj[..n * e], lw.bo.as_ref());
    if let Some(g) = &lw.gemma {
        ops::rms_norm_inplace(&mut s.proj[..n * e], &g.post_attn_norm, hp.rms_eps);
    }
    attn_residual(st, s);
    Ok(())
}

/// Multi-head attention of the queries `s.q` of the chunk's rows at positions `p0..` over the
/// cache (each row alone at its position when `st.single`), into `s.att`; with Qwen's output
/// gate, times `sigmoid(gate)`.
fn mha_attend(
    st: Stage<'_, '_>,
    cache: &KvCache,
    p0: usize,
    extras: ops::AttnExtras<'_>,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (hp, il, n, pool) = (st.hp, st.il, st.n, st.pool);
    let n_head = hp.n_head.at(il) as usize;
    let (hd, hdv) = (hp.head_dim_k_at(il) as usize, hp.head_dim_v_at(il) as usize);
    let aw = n_head * hdv;
    if st.single {
        // each row alone at its position, as its one-token pass attends
        let qw = n_head * hd;
        for t in 0..n {
            ops::attend_batch_with(
                pool,
                &s.q[t * qw..(t + 1) * qw],
                cache,
                0,
                p0 + t,
                1,
                n_head,
                hp.attn_scale(),
                extras,
                &mut s.att[t * aw..(t + 1) * aw],
            )?;
        }
    } else {
        ops::attend_batch_with(
            pool,
            &s.q[..n * n_head * hd],
            cache,
            0,
            p0,
            n,
            n_head,
            hp.attn_scale(),
            extras,
            &mut s.att[..n * aw],
        )?;
    }
    st.emit("kqv_out", &s.att[..n * aw]);
    if hp.features.gated_q {
        // the output gate (made by mha_qkv in s.gate): attention · sigmoid(gate)
        ops::sigmoid(&s.gate[..n * aw], &mut s.up[..n * aw]);
        for (a, &g) in s.att[..n * aw].iter_mut().zip(&s.up[..n * aw]) {
            *a *= g;
        }
        st.emit("attn_gated", &s.att[..n * aw]);
    }
    Ok(())
}

/// The Gated DeltaNet block of linear-attention layer `st.il` over the chunk's rows, as
/// llama.cpp's qwen35moe and qwen3next graphs: norm; the qkv, gate (z), beta and alpha
/// projections; the causal convolution continuing from the layer's state, SiLU; L2 norm of the
/// query and key heads; the gated delta rule (`beta` through a sigmoid, decay gate
/// `softplus(alpha + dt_bias) · a`, each value head reading the key head that
/// `gdn_grouped_heads` of the features names) updating the state; RMSNorm of each output head
/// times `silu(z)`; `ssm_out` (the layer's `wo`) and the residual added into `s.x`.
pub(super) fn gdn_attention(
    st: Stage<'_, '_>,
    lw: &LayerW<'_>,
    g: &GdnW<'_>,
    state: &mut RecState,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (hp, il, n, pool) = (st.hp, st.il, st.n, st.pool);
    let m = hp.ssm.as_ref().ok_or_else(|| {
        ForwardError::Unsupported(format!("layer {il}: linear attention without ssm sizes"))
    })?;
    let d = m.d_state as usize;
    let (hk, hv) = (m.n_k_heads as usize, m.n_v_heads as usize);
    let (kd, vd) = (d * hk, d * hv);
    let ch = 2 * kd + vd;
    let eps = hp.rms_eps;

    attn_input(st, lw, s);
    gdn_projections(st, g, m, s)?;
    st.emit("linear_attn_qkv_mixed", &s.gdn_qkv[..n * ch]);
    ops::causal_conv(
        &s.gdn_qkv[..n * ch],
        &g.conv1d,
        &mut state.conv,
        ch,
        m.d_conv as usize,
        ops::ConvSum::Rounded,
        &mut s.gdn_conv[..n * ch],
    );
    st.emit("conv_output_raw", &s.gdn_conv[..n * ch]);
    // SiLU row by row (ggml's vector kernel runs per row), then the heads apart
    for (x, y) in s.gdn_conv[..n * ch]
        .chunks_exact(ch)
        .zip(s.gdn_qkv[..n * ch].chunks_exact_mut(ch))
    {
        ops::silu(x, y);
    }
    for t in 0..n {
        let row = &s.gdn_qkv[t * ch..(t + 1) * ch];
        s.gdn_q[t * kd..(t + 1) * kd].copy_from_slice(&row[..kd]);
        s.gdn_k[t * kd..(t + 1) * kd].copy_from_slice(&row[kd..2 * kd]);
        s.gdn_v[t * vd..(t + 1) * vd].copy_from_slice(&row[2 * kd..]);
    }
    ops::l2_norm_inplace(&mut s.gdn_q[..n * kd], d, eps);
    ops::l2_norm_inplace(&mut s.gdn_k[..n * kd], d, eps);
    ops::gated_delta_rule(
        &mut state.ssm,
        &s.gdn_q[..n * kd],
        &s.gdn_k[..n * kd],
        &s.gdn_v[..n * vd],
        &s.gdn_g[..n * hv],
        &s.gdn_b[..n * hv],
        (d, hk, hv),
        if hp.features.gdn_grouped_heads {
            ops::KeyHeads::Grouped
        } else {
            ops::KeyHeads::Tiled
        },
        &mut s.att[..n * vd],
    );
    st.emit("attn_output", &s.att[..n * vd]);
    // the gated norm: rms_norm(out) · ssm_norm · silu(z)
    ops::rms_norm_inplace(&mut s.att[..n * vd], &g.norm, eps);
    for (z, y) in s.gdn_z[..n * vd]
        .chunks_exact(vd)
        .zip(s.gdn_v[..n * vd].chunks_exact_mut(vd))
    {
        ops::silu(z, y);
    }
    for (a, &zs) in s.att[..n * vd].iter_mut().zip(&s.gdn_v[..n * vd]) {
        *a *= zs;
    }
    st.emit("final_output", &s.att[..n * vd]);
    let wo = out_proj(st, lw)?;
    mm(pool, wo, wo.data, &s.att, n, &mut s.proj, &mut s.qbuf)?;
    attn_residual(st, s);
    Ok(())
}

/// The Mamba-2 mixer of recurrent layer `st.il` over the chunk's rows, as llama.cpp's
/// `build_mamba2_layer`: norm; `ssm_in` into z, the convolution's channels (x, then every
/// group's B, then every group's C) and the heads' time steps; the causal convolution of the
/// channels continuing from the layer's state, plus its bias, SiLU; the selective scan
/// (`ops::mamba2_scan`, time steps plus `ssm_dt.bias`) updating the state; `y + x · D` per
/// head; `silu(z) · y`; RMSNorm per group of heads times `ssm_norm`; `ssm_out` (the layer's
/// `wo`) and the residual added into `s.x`.
pub(super) fn mamba2(
    st: Stage<'_, '_>,
    lw: &LayerW<'_>,
    w: &Mamba2W<'_>,
    state: &mut RecState,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (hp, il, n, pool) = (st.hp, st.il, st.n, st.pool);
    let m = hp.mamba2.ok_or_else(|| {
        ForwardError::Unsupported(format!("layer {il}: a Mamba-2 mixer without its sizes"))
    })?;
    let (di, ds, nh, ng) = (
        m.d_inner as usize,
        m.d_state as usize,
        m.n_head as usize,
        m.n_group as usize,
    );
    let (ch, rows, hd) = (
        m.conv_channels() as usize,
        m.in_proj_rows() as usize,
        m.head_dim() as usize,
    );
    attn_input(st, lw, s);
    mm(
        pool,
        &w.in_proj,
        w.in_proj.data,
        &s.cur,
        n,
        &mut s.mb_in,
        &mut s.qbuf,
    )?;
    st.emit("mamba_in", &s.mb_in[..n * rows]);
    // the convolution's channels apart, and each head's time step plus its bias
    for (t, zxbcdt) in s.mb_in[..n * rows].chunks_exact(rows).enumerate() {
        s.mb_xbc[t * ch..(t + 1) * ch].copy_from_slice(&zxbcdt[di..di + ch]);
        for ((o, &v), &bias) in s.mb_dt[t * nh..(t + 1) * nh]
            .iter_mut()
            .zip(&zxbcdt[di + ch..])
            .zip(&w.dt_bias)
        {
            *o = v + bias;
        }
    }
    ops::causal_conv(
        &s.mb_xbc[..n * ch],
        &w.conv1d,
        &mut state.conv,
        ch,
        m.d_conv as usize,
        ops::ConvSum::Rounded,
        &mut s.mb_raw[..n * ch],
    );
    // bias, then SiLU row by row (ggml's vector kernel runs per row)
    for (raw, out) in s.mb_raw[..n * ch]
        .chunks_exact_mut(ch)
        .zip(s.mb_xbc[..n * ch].chunks_exact_mut(ch))
    {
        if let Some(b) = &w.conv1d_b {
            add_bias(raw, Some(b));
        }
        ops::silu(raw, out);
    }
    st.emit("mamba_conv", &s.mb_xbc[..n * ch]);
    ops::mamba2_scan(
        &mut state.ssm,
        &s.mb_xbc[..n * ch],
        &s.mb_dt[..n * nh],
        &w.a,
        ops::ScanDims {
            d_state: ds,
            head_dim: hd,
            n_head: nh,
            n_group: ng,
        },
        &mut s.mb_y[..n * di],
    );
    st.emit("mamba_scan", &s.mb_y[..n * di]);
    // y + x · D (each head's skip), then silu(z) · y row by row
    for t in 0..n {
        let y = &mut s.mb_y[t * di..(t + 1) * di];
        for (h, (yh, xh)) in y
            .chunks_exact_mut(hd)
            .zip(s.mb_xbc[t * ch..t * ch + di].chunks_exact(hd))
            .enumerate()
        {
            for (yv, &xv) in yh.iter_mut().zip(xh) {
                *yv += xv * w.d[h];
            }
        }
        let z = &s.mb_in[t * rows..t * rows + di];
        let out = &mut s.mb_raw[t * di..(t + 1) * di];
        ops::swiglu(z, y, out);
    }
    // RMSNorm of each group's channels, with the group's weights
    let gw = di / ng;
    for (row, out) in s.mb_raw[..n * di]
        .chunks_exact(di)
        .zip(s.mb_y[..n * di].chunks_exact_mut(di))
    {
        for ((xg, og), wg) in row
            .chunks_exact(gw)
            .zip(out.chunks_exact_mut(gw))
            .zip(w.norm.chunks_exact(gw))
        {
            ops::rms_norm(xg, wg, hp.rms_eps, og);
        }
    }
    st.emit("mamba_norm", &s.mb_y[..n * di]);
    let wo = out_proj(st, lw)?;
    mm(pool, wo, wo.data, &s.mb_y, n, &mut s.proj, &mut s.qbuf)?;
    attn_residual(st, s);
    Ok(())
}

/// LFM2's short-convolution block of recurrent layer `st.il` over the chunk's rows, as
/// llama.cpp's lfm2 graph: norm; `in_proj` into B, C and x (each `n_embd` wide, in that
/// order); `B · x`; the causal convolution of `B · x` over `l_cache` positions continuing from
/// the layer's state (ggml's `ssm_conv`, each product fused into the sum, no activation); `C ·` the convolution's output;
/// `out_proj` (the layer's `wo`) and the residual added into `s.x`.
pub(super) fn shortconv(
    st: Stage<'_, '_>,
    lw: &LayerW<'_>,
    c: &ShortConvW<'_>,
    state: &mut RecState,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (hp, n, pool) = (st.hp, st.n, st.pool);
    let e = st.e();
    attn_input(st, lw, s);
    mm(
        pool,
        &c.in_proj,
        c.in_proj.data,
        &s.cur,
        n,
        &mut s.gdn_qkv,
        &mut s.qbuf,
    )?;
    st.emit("conv.in_proj", &s.gdn_qkv[..n * 3 * e]);
    for (bcx, bx) in s.gdn_qkv[..n * 3 * e]
        .chunks_exact(3 * e)
        .zip(s.gdn_bx[..n * e].chunks_exact_mut(e))
    {
        let (b, x) = (&bcx[..e], &bcx[2 * e..]);
        for ((o, &bv), &xv) in bx.iter_mut().zip(b).zip(x) {
            *o = bv * xv;
        }
    }
    ops::causal_conv(
        &s.gdn_bx[..n * e],
        &c.conv,
        &mut state.conv,
        e,
        hp.shortconv_l_cache as usize,
        ops::ConvSum::Fused,
        &mut s.gdn_conv[..n * e],
    );
    st.emit("conv.conv", &s.gdn_conv[..n * e]);
    for (bcx, y) in s.gdn_qkv[..n * 3 * e]
        .chunks_exact(3 * e)
        .zip(s.gdn_conv[..n * e].chunks_exact_mut(e))
    {
        for (o, &cv) in y.iter_mut().zip(&bcx[e..2 * e]) {
            *o *= cv;
        }
    }
    let wo = out_proj(st, lw)?;
    mm(pool, wo, wo.data, &s.gdn_conv, n, &mut s.proj, &mut s.qbuf)?;
    attn_residual(st, s);
    Ok(())
}

/// The Gated DeltaNet's projections of the normed rows `s.cur`: qkv (`s.gdn_qkv`), the output
/// gate z (`s.gdn_z`), beta through a sigmoid (`s.gdn_b`) and the decay gate
/// `softplus(alpha + dt_bias) · a` (`s.gdn_g`) of the value heads. Projections stored grouped
/// by key head (`ssm_in`, `ssm_ba`) are multiplied whole, as llama.cpp does, and their rows
/// then put in the split projections' order (copies: the same values).
fn gdn_projections(
    st: Stage<'_, '_>,
    g: &GdnW<'_>,
    m: &Ssm,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (n, pool) = (st.n, st.pool);
    let dims = (
        m.d_state as usize,
        m.n_k_heads as usize,
        m.n_v_heads as usize,
    );
    let (d, hk, hv) = dims;
    let (ch, vd) = (2 * d * hk + d * hv, d * hv);
    match &g.gate {
        Some(gate) => {
            mm(
                pool,
                &g.qkv,
                g.qkv.data,
                &s.cur,
                n,
                &mut s.gdn_qkv,
                &mut s.qbuf,
            )?;
            mm(pool, gate, gate.data, &s.cur, n, &mut s.gdn_z, &mut s.qbuf)?;
        }
        None => {
            // ssm_in: queries, keys, values and gates grouped by key head
            grow(&mut s.gdn_in, n * (ch + vd));
            mm(
                pool,
                &g.qkv,
                g.qkv.data,
                &s.cur,
                n,
                &mut s.gdn_in,
                &mut s.qbuf,
            )?;
            ungroup_qkvz(
                &s.gdn_in[..n * (ch + vd)],
                dims,
                &mut s.gdn_qkv[..n * ch],
                &mut s.gdn_z[..n * vd],
            );
        }
    }
    match &g.alpha {
        Some(alpha) => {
            mm(
                pool,
                &g.beta,
                g.beta.data,
                &s.cur,
                n,
                &mut s.gdn_g,
                &mut s.qbuf,
            )?;
            ops::sigmoid(&s.gdn_g[..n * hv], &mut s.gdn_b[..n * hv]);
            mm(
                pool,
                alpha,
                alpha.data,
                &s.cur,
                n,
                &mut s.gdn_g,
                &mut s.qbuf,
            )?;
        }
        None => {
            // ssm_ba: betas and alphas grouped by key head
            grow(&mut s.gdn_in, n * 2 * hv);
            mm(
                pool,
                &g.beta,
                g.beta.data,
                &s.cur,
                n,
                &mut s.gdn_in,
                &mut s.qbuf,
            )?;
            let ba = &s.gdn_in[..n * 2 * hv];
            ungroup_ba(ba, (hk, hv), false, &mut s.gdn_g[..n * hv]);
            ops::sigmoid(&s.gdn_g[..n * hv], &mut s.gdn_b[..n * hv]);
            ungroup_ba(ba, (hk, hv), true, &mut s.gdn_g[..n * hv]);
        }
    }
    for row in s.gdn_g[..n * hv].chunks_exact_mut(hv) {
        for ((x, &dt), &a) in row.iter_mut().zip(&g.dt_bias).zip(&g.a) {
            *x = ops::softplus(*x + dt) * a;
        }
    }
    Ok(())
}

/// Grows `buf` to at least `len` values (a scratch buffer only some models need).
fn grow(buf: &mut Vec<f32>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
}

/// The rows of `ssm_in`'s product (per token, for each key head: its query, its key, then the
/// values and the gates of its `n_v / n_k` value heads) in the split projections' order: all
/// queries, all keys, all values into `qkv`, all gates into `z`, as llama.cpp's views and
/// concatenations of the legacy layout give them.
fn ungroup_qkvz(x: &[f32], (d, n_k, n_v): (usize, usize, usize), qkv: &mut [f32], z: &mut [f32]) {
    let (kd, vd) = (d * n_k, d * n_v);
    let vg = vd / n_k; // the values (and gates) of one key head
    let group = 2 * d + 2 * vg;
    let ch = 2 * kd + vd;
    for ((xt, qt), zt) in x
        .chunks_exact(n_k * group)
        .zip(qkv.chunks_exact_mut(ch))
        .zip(z.chunks_exact_mut(vd))
    {
        for (gi, xg) in xt.chunks_exact(group).enumerate() {
            qt[gi * d..(gi + 1) * d].copy_from_slice(&xg[..d]);
            qt[kd + gi * d..kd + (gi + 1) * d].copy_from_slice(&xg[d..2 * d]);
            qt[2 * kd + gi * vg..2 * kd + (gi + 1) * vg].copy_from_slice(&xg[2 * d..2 * d + vg]);
            zt[gi * vg..(gi + 1) * vg].copy_from_slice(&xg[2 * d + vg..]);
        }
    }
}

/// The betas (`alphas` false) or the alphas of `ssm_ba`'s product (per token, for each key
/// head: the betas of its value heads, then their alphas) into `out`, one per value head in
/// order.
fn ungroup_ba(x: &[f32], (n_k, n_v): (usize, usize), alphas: bool, out: &mut [f32]) {
    let r = n_v / n_k;
    let off = if alphas { r } else { 0 };
    for (xt, ot) in x.chunks_exact(2 * n_v).zip(out.chunks_exact_mut(n_v)) {
        for (xg, og) in xt.chunks_exact(2 * r).zip(ot.chunks_exact_mut(r)) {
            og.copy_from_slice(&xg[off..off + r]);
        }
    }
}

/// Multi-head attention's queries, keys and values of the normed rows `s.cur` (at positions
/// `p0..`) into `s.q`, `s.k` and `s.v`: the projections, their biases, QK-norm and RoPE; on a
/// NoPE layer the attention temperature instead, where the model has one; after the rope the
/// weightless per-head norm of the queries and keys, where the model has it (Llama 4).
fn mha_qkv(
    st: Stage<'_, '_>,
    a: &MhaW<'_>,
    rope: &Rope,
    p0: usize,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (hp, il, n, pool) = (st.hp, st.il, st.n, st.pool);
    let hd = hp.head_dim_k_at(il) as usize;
    let mut qw = hp.n_embd_q(il) as usize;
    let kw = hp.n_embd_k_gqa(il) as usize;
    let eps = hp.rms_eps;
    mm(pool, &a.wq, a.wq.data, &s.cur, n, &mut s.q, &mut s.qbuf)?;
    if hp.features.gated_q {
        // per head the queries, then the output gate: the gates to s.gate, the queries
        // packed to the front of s.q (each moves to a lower or equal index)
        let heads = qw / (2 * hd);
        for t in 0..n {
            for h in 0..heads {
                let src = (t * heads + h) * 2 * hd;
                let dst = (t * heads + h) * hd;
                s.gate[dst..dst + hd].copy_from_slice(&s.q[src + hd..src + 2 * hd]);
                s.q.copy_within(src..src + hd, dst);
            }
        }
        qw /= 2;
    }
    mm(pool, &a.wk, a.wk.data, &s.cur, n, &mut s.k, &mut s.qbuf)?;
    match &a.wv {
        Some(wv) => mm(pool, wv, wv.data, &s.cur, n, &mut s.v, &mut s.qbuf)?,
        // Gemma 4's full-attention layers: the values are the keys, before the key norm
        None => s.v[..n * kw].copy_from_slice(&s.k[..n * kw]),
    }
    let q = &mut s.q[..n * qw];
    let k = &mut s.k[..n * kw];
    let v = &mut s.v[..n * kw];
    add_bias(q, a.bq.as_ref());
    add_bias(k, a.bk.as_ref());
    add_bias(v, a.bv.as_ref());
    // QK-norm (row length = the weight length: one head, or the whole projection)
    if hp.features.qk_norm != QkNorm::None {
        if let Some(qn) = &a.q_norm {
            ops::rms_norm_inplace(q, qn, eps);
        }
        if let Some(kn) = &a.k_norm {
            ops::rms_norm_inplace(k, kn, eps);
        }
    }
    if hp.features.v_norm {
        // a weightless RMS norm of each value head (Gemma 4)
        ops::rms_norm_plain_inplace(v, hd, eps);
    }
    // RoPE (Gemma 4's sliding-window layers have a rope of their own; NoPE layers none, and
    // Llama 4's scale their queries by the attention temperature of their position instead)
    if !hp.has_rope(il) {
        if let Some(temp) = &hp.attn_temp {
            for (t, row) in q.chunks_exact_mut(qw).enumerate() {
                ops::scale_inplace(row, ops::attn_temp_factor(temp, p0 + t));
            }
        }
        return Ok(());
    }
    let nr = hp.n_rot_at(il) as usize;
    let table = if hp.features.swa_rope && hp.is_swa_layer(il) {
        &s.rope_swa
    } else {
        &s.rope
    };
    for t in 0..n {
        let cache = &table[t * nr..(t + 1) * nr];
        rope.apply_cached(&mut q[t * qw..(t + 1) * qw], hd, cache)?;
        rope.apply_cached(&mut k[t * kw..(t + 1) * kw], hd, cache)?;
    }
    if hp.qk_norm_plain_rope {
        // Llama 4's L2 norm of the rotated heads: a weightless RMS norm of each
        ops::rms_norm_plain_inplace(q, hd, eps);
        ops::rms_norm_plain_inplace(k, hd, eps);
    }
    Ok(())
}

/// Tokens of one part of the absorbed form's attention (see [`mla_absorbed_attention`]).
pub(super) const MLA_PART: usize = 32;

/// The parts of a batch of `n` tokens: `MLA_PART` at a time, a last part of one token joined
/// to the one before, so that no part of a batch of two or more has one token (its products
/// would take the one-token kernels, whose sums llama.cpp does not use for a batch).
pub(super) fn mla_parts(n: usize, part: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let mut t0 = 0;
    std::iter::from_fn(move || {
        if t0 >= n {
            return None;
        }
        let mut t1 = (t0 + part).min(n);
        if n - t1 == 1 {
            t1 = n;
        }
        let r = t0..t1;
        t0 = t1;
        Some(r)
    })
}

/// The absorbed form's attention of the chunk's `n` tokens (their keys and values stored), a
/// part of [`MLA_PART`] tokens at a time, into the value heads `s.heads`: per head the query
/// `[attn_k_b · q_nope; q_pe]` (from `s.qraw`), attention over the one cached head, then
/// `attn_v_b` on its output. The parts share the whole batch's softmax row length and take
/// the batch's kernels (see [`mla_parts`]), so the bits are those of one pass over the batch;
/// the query and attention buffers hold one part (for DeepSeek V3, 128 heads × (576 + 512)
/// values a token: 570 KB, where a micro-batch of 512 would take 285 MB).
fn mla_absorbed_attention(
    st: Stage<'_, '_>,
    a: &MlaW<'_>,
    cache: &KvCache,
    p0: usize,
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    let (hp, il, n, pool) = (st.hp, st.il, st.n, st.pool);
    let (Some(m), MlaKvBW::Absorbed { k_b, v_b }) = (hp.mla.as_ref(), &a.kv_b) else {
        return Err(ForwardError::Unsupported(
            "absorbed MLA without its dimensions or attn_k_b/attn_v_b".into(),
        ));
    };
    let n_head = hp.n_head.at(il) as usize;
    let nr = hp.rope.n_rot as usize;
    let (dk, r, v) = (m.head_dim_k as usize, m.kv_lora_rank as usize, v_b.rows);
    let nope = dk - nr;
    let (qw, kw) = (n_head * dk, r + nr);
    let extras = ops::AttnExtras {
        batch_end: Some(p0 + n),
        batch_tokens: Some(n),
        ..ops::AttnExtras::default()
    };
    for part in mla_parts(n, st.mla_part) {
        let (t0, pn) = (part.start, part.len());
        for h in 0..n_head {
            for t in 0..pn {
                s.hx[t * nope..(t + 1) * nope]
                    .copy_from_slice(&s.qraw[(t0 + t) * qw + h * dk..][..nope]);
            }
            mm_part(
                pool,
                k_b,
                k_b.expert(h),
                &s.hx,
                pn,
                n,
                &mut s.hy,
                &mut s.qbuf,
            )?;
            for t in 0..pn {
                let qh = &mut s.q[(t * n_head + h) * kw..][..kw];
                qh[..r].copy_from_slice(&s.hy[t * r..(t + 1) * r]);
                qh[r..].copy_from_slice(&s.qraw[(t0 + t) * qw + h * dk + nope..][..nr]);
            }
        }
        st.emit("Qcur", &s.q[..pn * n_head * kw]);
        ops::attend_batch_with(
            pool,
            &s.q[..pn * n_head * kw],
            cache,
            0,
            p0 + t0,
            pn,
            n_head,
            hp.attn_scale(),
            extras,
            &mut s.att[..pn * n_head * r],
        )?;
        st.emit("kqv_out", &s.att[..pn * n_head * r]);
        // from the compressed space back to value heads, head by head
        for h in 0..n_head {
            for t in 0..pn {
                s.hx[t * r..(t + 1) * r].copy_from_slice(&s.att[(t * n_head + h) * r..][..r]);
            }
            mm_part(
                pool,
                v_b,
                v_b.expert(h),
                &s.hx,
                pn,
                n,
                &mut s.hy,
                &mut s.qbuf,
            )?;
            for t in 0..pn {
                s.heads[((t0 + t) * n_head + h) * v..][..v]
                    .copy_from_slice(&s.hy[t * v..(t + 1) * v]);
            }
        }
    }
    Ok(())
}

/// Multi-head latent attention's queries, keys and values (llama.cpp's deepseek2 graph) of the
/// normed rows `s.cur` into `s.q`, `s.k` and `s.v`, in the layout the cache and
/// [`ops::attend_batch_with`] take. Returns true for the absorbed form, whose attention output
/// is still in the compressed space.
///
/// The query (`attn_q`, or `attn_q_a`, its norm and `attn_q_b`) has per head `nope` plain
/// values then `n_rot` rotated ones. `attn_kv_a_mqa` gives the compressed row (normed by
/// `attn_kv_a_norm`) and the rotated key part shared by the heads.
/// - Absorbed: per head, `attn_k_b` carries the plain query part into the compressed space;
///   the query is `[that; rotated part]`, the one cached key `[compressed row; rotated part]`
///   and the one cached value the compressed row.
/// - Legacy: `attn_kv_b` expands the compressed row into per-head plain keys and values; the
///   key of each head is `[plain key; shared rotated part]`.
fn mla_qkv(
    st: Stage<'_, '_>,
    a: &MlaW<'_>,
    rope: &Rope,
    s: &mut Scratch,
) -> Result<bool, ForwardError> {
    let (hp, il, n, pool) = (st.hp, st.il, st.n, st.pool);
    let Some(m) = hp.mla.as_ref() else {
        return Err(ForwardError::Unsupported(
            "MLA weights without MLA dimensions".into(),
        ));
    };
    let eps = hp.rms_eps;
    let n_head = hp.n_head.at(il) as usize;
    let nr = hp.rope.n_rot as usize;
    let dk = m.head_dim_k as usize;
    let nope = dk - nr;
    let dv = m.head_dim_v as usize;
    let r = m.kv_lora_rank as usize;
    let qw = n_head * dk;
    // query, into s.qraw
    match &a.q_a {
        Some((q_a, norm)) => {
            mm(pool, q_a, q_a.data, &s.cur, n, &mut s.hx, &mut s.qbuf)?;
            let ql = q_a.rows;
            ops::rms_norm_inplace(&mut s.hx[..n * ql], norm, eps);
            mm(pool, &a.q, a.q.data, &s.hx, n, &mut s.qraw, &mut s.qbuf)?;
        }
        None => mm(pool, &a.q, a.q.data, &s.cur, n, &mut s.qraw, &mut s.qbuf)?,
    }
    // compressed row and shared rotated key part, into s.kva
    let kaw = r + nr;
    mm(
        pool,
        &a.kv_a,
        a.kv_a.data,
        &s.cur,
        n,
        &mut s.kva,
        &mut s.qbuf,
    )?;
    for t in 0..n {
        let cache = &s.rope[t * nr..(t + 1) * nr];
        let row = &mut s.kva[t * kaw..(t + 1) * kaw];
        rope.apply_cached(&mut row[r..], nr, cache)?;
        ops::rms_norm_inplace(&mut row[..r], &a.kv_a_norm, eps);
        // the rotated part of every query head
        for h in 0..n_head {
            let qh = &mut s.qraw[t * qw + h * dk..][..dk];
            rope.apply_cached(&mut qh[nope..], nr, cache)?;
        }
    }
    match &a.kv_b {
        MlaKvBW::Absorbed { .. } => {
            // the queries are made part by part with the attention (mla_absorbed_attention)
            let kw = r + nr;
            for t in 0..n {
                let row = &s.kva[t * kaw..(t + 1) * kaw];
                s.k[t * kw..(t + 1) * kw].copy_from_slice(row);
                s.v[t * r..(t + 1) * r].copy_from_slice(&row[..r]);
            }
            Ok(true)
        }
        MlaKvBW::Legacy(kv_b) => {
            for t in 0..n {
                s.hx[t * r..(t + 1) * r].copy_from_slice(&s.kva[t * kaw..][..r]);
            }
            mm(pool, kv_b, kv_b.data, &s.hx, n, &mut s.hy, &mut s.qbuf)?;
            let bw = nope + dv;
            for t in 0..n {
                for h in 0..n_head {
                    let kv = &s.hy[t * n_head * bw + h * bw..][..bw];
                    let kh = &mut s.k[(t * n_head + h) * dk..][..dk];
                    kh[..nope].copy_from_slice(&kv[..nope]);
                    kh[nope..].copy_from_slice(&s.kva[t * kaw + r..][..nr]);
                    s.v[(t * n_head + h) * dv..][..dv].copy_from_slice(&kv[nope..]);
                }
            }
            s.q[..n * qw].copy_from_slice(&s.qraw[..n * qw]);
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ssm_in`'s rows, grouped by key head, come out as llama.cpp's views and concatenations
    /// of the legacy layout order them.
    #[test]
    fn grouped_qkvz_rows_take_the_split_order() {
        // head size 2, 2 key heads of 2 value heads each, 2 tokens; each value names its
        // token (hundreds), part (tens: q 1, k 2, v 3, z 4), key head and position
        let (d, n_k, n_v) = (2, 2, 4);
        let vg = d * n_v / n_k;
        let mut x = Vec::new();
        for t in 0..2 {
            for g in 0..n_k {
                for (part, len) in [(1, d), (2, d), (3, vg), (4, vg)] {
                    for i in 0..len {
                        x.push((100 * t + 10 * part + 4 * g + i) as f32);
                    }
                }
            }
        }
        let ch = 2 * d * n_k + d * n_v;
        let mut qkv = vec![0f32; 2 * ch];
        let mut z = vec![0f32; 2 * d * n_v];
        ungroup_qkvz(&x, (d, n_k, n_v), &mut qkv, &mut z);
        let row = |t: usize, parts: &[(usize, usize)]| -> Vec<f32> {
            let mut v = Vec::new();
            for &(part, len) in parts {
                for g in 0..n_k {
                    for i in 0..len {
                        v.push((100 * t + 10 * part + 4 * g + i) as f32);
                    }
                }
            }
            v
        };
        for t in 0..2 {
            assert_eq!(
                qkv[t * ch..(t + 1) * ch],
                row(t, &[(1, d), (2, d), (3, vg)])
            );
            assert_eq!(z[t * d * n_v..(t + 1) * d * n_v], row(t, &[(4, vg)]));
        }
    }

    /// `ssm_ba`'s rows: per key head the betas of its value heads, then their alphas.
    #[test]
    fn grouped_beta_alpha_rows_take_the_value_head_order() {
        // 2 key heads of 3 value heads, 2 tokens
        let x = [
            1., 2., 3., -1., -2., -3., 4., 5., 6., -4., -5., -6., //
            11., 12., 13., -11., -12., -13., 14., 15., 16., -14., -15., -16.,
        ];
        let mut out = [0f32; 12];
        ungroup_ba(&x, (2, 6), false, &mut out);
        assert_eq!(out, [1., 2., 3., 4., 5., 6., 11., 12., 13., 14., 15., 16.]);
        ungroup_ba(&x, (2, 6), true, &mut out);
        assert_eq!(
            out,
            [
                -1., -2., -3., -4., -5., -6., -11., -12., -13., -14., -15., -16.
            ]
        );
    }
}
