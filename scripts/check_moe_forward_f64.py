#!/usr/bin/env python3
"""An independent float64 forward pass of the F32 qwen3vlmoe and granitemoe MoE fixtures, written
from the description of llama.cpp v0.4.0's computation in crates/engine/tests/fixtures/moe/README.md
(interleaved M-RoPE with the fourth position stream 0 for text, deepstack adding nothing for
text; Granite's embedding, attention, residual and logit multipliers), compared with the prompt
logits of a reference. It does not emulate ggml's activation quantization, so it is meant for
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

def forward(path, toks):
    W, md = load(path)
    arch = md["general.architecture"]
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
