#!/usr/bin/env python3
"""An independent float64 forward pass of the F32 qwen3vlmoe, granitemoe and nemotron_h_moe MoE
fixtures, written from the description of llama.cpp v0.4.0's computation in
crates/engine/tests/fixtures/moe/README.md (interleaved M-RoPE with the fourth position stream 0
for text, deepstack adding nothing for text; Granite's embedding, attention, residual and logit
multipliers; Nemotron 3's Mamba-2, ReLU² MoE with latent experts and rope-less attention
blocks), compared with the prompt logits of a reference. It does not emulate ggml's activation quantization, so it is meant for
the F32 files only: a difference of a few 1e-6 is f32 rounding, anything larger a description
that does not match what llama.cpp computes.

    python3 scripts/check_moe_forward_f64.py MODEL-f32.gguf REF.gguf
(python with gguf and numpy, e.g. the fixture cache's venv-moe)
"""
import sys
import numpy as np
import gguf

def load(path):
    r = gguf.GGUFReader(path)
    W = {t.name: np.array(t.data, dtype=np.float64) for t in r.tensors}
    md = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer")}
    return W, md

def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

def silu(x):
    return x / (1 + np.exp(-x))

def rope(x, pos, base, mode, sections=None):
    # x: (T, H, D)
    T, H, D = x.shape
    half = D // 2
    out = x.copy()
    for t in range(T):
        for i in range(half):
            theta = base ** (-2.0 * i / D)
            p = pos[t]
            if mode == "imrope":
                # stream h, w or t (all the token's position for text), else the fourth (0)
                s = i % sum(sections)
                thw = (
                    (s % 3 == 1 and s < 3 * sections[1])
                    or (s % 3 == 2 and s < 3 * sections[2])
                    or (s % 3 == 0 and s < 3 * sections[0])
                )
                pp = p if thw else 0
                a, b = i, i + half  # NEOX pairs
            else:  # NORM: consecutive pairs
                pp = p
                a, b = 2 * i, 2 * i + 1
            c, sn = np.cos(pp * theta), np.sin(pp * theta)
            x0, x1 = x[t, :, a], x[t, :, b]
            out[t, :, a] = x0 * c - x1 * sn
            out[t, :, b] = x0 * sn + x1 * c
    return out

def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))

def forward_nemotron_h_moe(W, md, toks):
    g = lambda k: md[f"nemotron_h_moe.{k}"]
    eps = g("attention.layer_norm_rms_epsilon")
    hkv, nff = g("attention.head_count_kv"), g("feed_forward_length")
    nh_att, hd = g("attention.head_count"), g("attention.key_length")
    d_conv, d_inner, d_state = g("ssm.conv_kernel"), g("ssm.inner_size"), g("ssm.state_size")
    nh, ng = g("ssm.time_step_rank"), g("ssm.group_count")
    k, w_scale, w_norm = g("expert_used_count"), g("expert_weights_scale"), g("expert_weights_norm")
    conv_dim = d_inner + 2 * ng * d_state
    hdim = d_inner // nh
    T = len(toks)
    x = W["token_embd.weight"][toks]
    for il in range(g("block_count")):
        p = f"blk.{il}."
        h = rms(x, W[p + "attn_norm.weight"], eps)
        if hkv[il] == 0 and nff[il] == 0:
            # Mamba-2: z, xBC and dt from ssm_in; causal convolution with bias, SiLU; the scan
            zx = h @ W[p + "ssm_in.weight"].T
            z, xbc, dt = zx[:, :d_inner], zx[:, d_inner:d_inner + conv_dim], zx[:, d_inner + conv_dim:]
            cw = W[p + "ssm_conv1d.weight"]
            pad = np.concatenate([np.zeros((d_conv - 1, conv_dim)), xbc])
            conv = np.stack([sum(pad[t + j] * cw[:, j] for j in range(d_conv)) for t in range(T)])
            conv = silu(conv + W[p + "ssm_conv1d.bias"])
            xs = conv[:, :d_inner].reshape(T, nh, hdim)
            B = conv[:, d_inner:d_inner + ng * d_state].reshape(T, ng, d_state)
            C = conv[:, d_inner + ng * d_state:].reshape(T, ng, d_state)
            dt = softplus(dt + W[p + "ssm_dt.bias"])
            A, D = W[p + "ssm_a"].reshape(nh), W[p + "ssm_d"].reshape(nh)
            S = np.zeros((nh, hdim, d_state))
            y = np.zeros((T, nh, hdim))
            for t in range(T):
                for hh in range(nh):
                    gg = hh // (nh // ng)
                    S[hh] = S[hh] * np.exp(dt[t, hh] * A[hh]) + dt[t, hh] * np.outer(xs[t, hh], B[t, gg])
                    y[t, hh] = S[hh] @ C[t, gg] + D[hh] * xs[t, hh]
            y = (y.reshape(T, d_inner) * silu(z)).reshape(T, ng, d_inner // ng)
            y = rms(y, W[p + "ssm_norm.weight"].reshape(ng, -1), eps).reshape(T, d_inner)
            cur = y @ W[p + "ssm_out.weight"].T
        elif nff[il] == 0:
            # attention without rope
            nkv = hkv[il]
            q = (h @ W[p + "attn_q.weight"].T).reshape(T, nh_att, hd)
            kk = (h @ W[p + "attn_k.weight"].T).reshape(T, nkv, hd)
            v = (h @ W[p + "attn_v.weight"].T).reshape(T, nkv, hd)
            o = np.zeros((T, nh_att, hd))
            r = nh_att // nkv
            for hh in range(nh_att):
                s = q[:, hh] @ kk[:, hh // r].T / np.sqrt(hd)
                s = s + np.triu(np.full((T, T), -np.inf), 1)
                s = np.exp(s - s.max(axis=1, keepdims=True)); s /= s.sum(axis=1, keepdims=True)
                o[:, hh] = s @ v[:, hh // r]
            cur = o.reshape(T, nh_att * hd) @ W[p + "attn_output.weight"].T
        else:
            # MoE: sigmoid routing with the selection bias, ReLU² experts (in the latent space
            # when there is one) and shared expert
            pr = 1 / (1 + np.exp(-(h @ W[p + "ffn_gate_inp.weight"].T)))
            sel = pr + W[p + "exp_probs_b.bias"]
            latent = p + "ffn_latent_down.weight" in W
            inp = h @ W[p + "ffn_latent_down.weight"].T if latent else h
            up, down = W[p + "ffn_up_exps.weight"], W[p + "ffn_down_exps.weight"]
            moe = np.zeros((T, down.shape[1]))
            for t in range(T):
                top = np.argsort(-sel[t], kind="stable")[:k]
                w = pr[t, top] / pr[t, top].sum() if w_norm else pr[t, top]
                for e, we in zip(top, w * w_scale):
                    moe[t] += we * (down[e] @ (np.maximum(up[e] @ inp[t], 0) ** 2))
            if latent:
                moe = moe @ W[p + "ffn_latent_up.weight"].T
            sh = np.maximum(h @ W[p + "ffn_up_shexp.weight"].T, 0) ** 2
            cur = moe + sh @ W[p + "ffn_down_shexp.weight"].T
        x = x + cur
    return rms(x, W["output_norm.weight"], eps) @ W["output.weight"].T

def forward(path, toks):
    W, md = load(path)
    arch = md["general.architecture"]
    if arch == "nemotron_h_moe":
        return forward_nemotron_h_moe(W, md, toks)
    g = lambda k, d=None: md.get(f"{arch}.{k}", d)
    E = g("embedding_length"); nh = g("attention.head_count"); nkv = g("attention.head_count_kv")
    hd = g("attention.key_length", E // nh); eps = g("attention.layer_norm_rms_epsilon")
    base = g("rope.freq_base"); k = g("expert_used_count"); L = g("block_count")
    emb_s = g("embedding_scale", 0.0); att_s = g("attention.scale", 0.0)
    res_s = g("residual_scale", 0.0); log_s = g("logit_scale", 0.0)
    sections = g("rope.dimension_sections")
    nds = g("n_deepstack_layers", 0)
    x = W["token_embd.weight"][toks]
    if emb_s:
        x = x * emb_s
    T = len(toks); pos = np.arange(T)
    for il in range(L):
        p = f"blk.{il}."
        h = rms(x, W[p + "attn_norm.weight"], eps)
        q = (h @ W[p + "attn_q.weight"].T).reshape(T, nh, hd)
        kk = (h @ W[p + "attn_k.weight"].T).reshape(T, nkv, hd)
        v = (h @ W[p + "attn_v.weight"].T).reshape(T, nkv, hd)
        if p + "attn_q_norm.weight" in W:
            q = rms(q, W[p + "attn_q_norm.weight"], eps)
            kk = rms(kk, W[p + "attn_k_norm.weight"], eps)
        mode = "imrope" if arch == "qwen3vlmoe" else "norm"
        q = rope(q, pos, base, mode, sections); kk = rope(kk, pos, base, mode, sections)
        scale = att_s if att_s else 1 / np.sqrt(hd)
        o = np.zeros((T, nh, hd))
        r = nh // nkv
        for hh in range(nh):
            s = q[:, hh, :] @ kk[:, hh // r, :].T * scale
            s = s + np.triu(np.full((T, T), -np.inf), 1)
            s = np.exp(s - s.max(axis=1, keepdims=True)); s /= s.sum(axis=1, keepdims=True)
            o[:, hh, :] = s @ v[:, hh // r, :]
        a = o.reshape(T, nh * hd) @ W[p + "attn_output.weight"].T
        if res_s:
            a = a * res_s
        x = x + a
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        lg = h @ W[p + "ffn_gate_inp.weight"].T
        pr = np.exp(lg - lg.max(axis=1, keepdims=True)); pr /= pr.sum(axis=1, keepdims=True)
        moe = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-pr[t])[:k]
            w = pr[t, top] / pr[t, top].sum()
            for e, we in zip(top, w):
                gt = W[p + "ffn_gate_exps.weight"][e] @ h[t]
                up = W[p + "ffn_up_exps.weight"][e] @ h[t]
                moe[t] += we * (W[p + "ffn_down_exps.weight"][e] @ (silu(gt) * up))
        if res_s:
            moe = moe * res_s
        x = x + moe
        # deepstack for text: adds zeros (nothing to do)
    x = rms(x, W["output_norm.weight"], eps)
    out = x @ W["output.weight"].T
    if log_s:
        out = out / log_s
    return out

model, ref = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(ref)
rt = {t.name: np.array(t.data) for t in r.tensors}
n = r.fields["sluice.ref.n_prompts"].contents()
for i in range(n):
    toks = rt[f"p{i}.tokens"].astype(int)
    got = forward(model, toks)
    want = rt[f"p{i}.logits"].reshape(len(toks), -1)
    print(model.split("/")[-1], f"p{i}", "max|diff|", np.abs(got - want).max(), "max|logit|", np.abs(want).max())
