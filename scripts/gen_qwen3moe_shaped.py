#!/usr/bin/env python3
"""Writes a synthetic qwen3moe GGUF model with Qwen3-30B-A3B's layer shapes, for speed measurements.

Shapes (Qwen3-30B-A3B's): n_embd 2048, 32 query heads and 4 KV heads of 128 dimensions
(key_length = value_length = 128), RMS norm of q and k per head, 128 experts of which 8 are used,
expert FFN width 768, rope base 1e6, RMS eps 1e-6, training context 40960, untied output matrix,
the full Qwen2.5 vocabulary of 151936 tokens (the same tokenizer family Qwen3 uses). Only the layer
count differs: --layers (default 4) instead of 48, so that the model stays resident in RAM.

The weights are random and meaningless (the output is gibberish); only their sizes and types matter
for speed. Every 2-D weight matrix (and every expert of a 3-D one) is made of rows drawn, with a
fixed seed, from a pool of quantized rows of normal noise (std 0.02) with the same row length:
random normal numbers and numpy quantization of the 1.2 billion weights of a 4-layer model would
take minutes, a pool of 32768 rows per row length a few seconds. The rows of a matrix are
independent draws, so no two matrices or experts share their layout in memory. Norm weights are 1,
the router (ffn_gate_inp) is F32 normal noise of std 0.02 independently drawn (so that routing is
spread over the experts as a trained router's roughly is), as llama.cpp's quantizer keeps it F32.

Weight types: q8_0 and q4_0 (gguf-py's quantizers). A 4-layer model is about 3.2 GB at Q8_0 and
1.8 GB at Q4_0 (embedding and output matrices included). Output is deterministic for a given gguf
(0.19.0) and numpy version.

    python3 scripts/gen_qwen3moe_shaped.py VOCAB.gguf OUT_DIR [--layers N] [--types q8_0,q4_0]

VOCAB.gguf: a GGUF holding the Qwen2.5 tokenizer metadata, e.g. the vocabulary-only
text/vocab/qwen2.5-coder-1.5b.gguf of scripts/fetch_text_fixtures.sh. Writes
OUT_DIR/qwen3moe-a3b-shaped-l<N>-<type>.gguf.
"""

import argparse
import os
import sys

import numpy as np
import gguf

QT = gguf.GGMLQuantizationType
FT = gguf.LlamaFileType

WTYPES = {
    "q8_0": (QT.Q8_0, FT.MOSTLY_Q8_0),
    "q4_0": (QT.Q4_0, FT.MOSTLY_Q4_0),
}

# Qwen3-30B-A3B
N_EMBD = 2048
N_HEAD = 32
N_HEAD_KV = 4
HEAD_DIM = 128
N_EXPERT = 128
N_EXPERT_USED = 8
N_FF_EXP = 768
N_FF_DENSE = 6144  # qwen3moe.feed_forward_length of the real model (unused by the MoE layers)
ROPE_BASE = 1_000_000.0
RMS_EPS = 1e-6
CTX_TRAIN = 40960

STD = 0.02
POOL_ROWS = 32768
SEED = 3003


def vocab_fields(path):
    """The tokenizer.* metadata of a GGUF: list of (key, value, type, subtype)."""
    r = gguf.GGUFReader(path)
    out = []
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        out.append((key, field.contents(), vtype, sub))
    n_vocab = len(r.fields["tokenizer.ggml.tokens"].contents())
    return out, n_vocab


def tensor_plan(n_layer, n_vocab):
    """(name, numpy shape) of every tensor in file order; 1-D tensors are norms (all 1)."""
    nq, nkv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    plan = [("token_embd.weight", (n_vocab, N_EMBD))]
    for il in range(n_layer):
        p = f"blk.{il}."
        plan += [
            (p + "attn_norm.weight", (N_EMBD,)),
            (p + "attn_q.weight", (nq, N_EMBD)),
            (p + "attn_k.weight", (nkv, N_EMBD)),
            (p + "attn_v.weight", (nkv, N_EMBD)),
            (p + "attn_output.weight", (N_EMBD, nq)),
            (p + "attn_q_norm.weight", (HEAD_DIM,)),
            (p + "attn_k_norm.weight", (HEAD_DIM,)),
            (p + "ffn_norm.weight", (N_EMBD,)),
            (p + "ffn_gate_inp.weight", (N_EXPERT, N_EMBD)),
            (p + "ffn_gate_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD)),
            (p + "ffn_up_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD)),
            (p + "ffn_down_exps.weight", (N_EXPERT, N_EMBD, N_FF_EXP)),
        ]
    plan += [("output_norm.weight", (N_EMBD,)), ("output.weight", (n_vocab, N_EMBD))]
    return plan


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("vocab")
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--types", default="q8_0,q4_0")
    args = ap.parse_args()
    types = [t for t in args.types.split(",") if t]
    for t in types:
        if t not in WTYPES:
            sys.exit(f"unknown type {t} (known: {', '.join(WTYPES)})")
    os.makedirs(args.out_dir, exist_ok=True)

    fields, n_vocab = vocab_fields(args.vocab)
    plan = tensor_plan(args.layers, n_vocab)
    rng = np.random.default_rng(SEED)

    # Pools of quantized noise rows, one per row length and type.
    widths = sorted({shape[-1] for _, shape in plan if len(shape) > 1})
    pools = {}
    for cols in widths:
        rows = rng.standard_normal((POOL_ROWS, cols), dtype=np.float32) * np.float32(STD)
        for t in types:
            pools[(cols, t)] = gguf.quants.quantize(rows, WTYPES[t][0])
        print(f"# pool of {POOL_ROWS} rows of {cols} columns quantized", file=sys.stderr)

    writers = {}
    for t in types:
        qt, ftype = WTYPES[t]
        path = os.path.join(args.out_dir, f"qwen3moe-a3b-shaped-l{args.layers}-{t}.gguf")
        w = gguf.GGUFWriter(path + ".tmp", "qwen3moe")
        w.add_type("model")
        w.add_name(f"sluice-qwen3moe-a3b-shaped-l{args.layers}-{t}")
        w.add_file_type(int(ftype))
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_vocab_size(n_vocab)
        w.add_context_length(CTX_TRAIN)
        w.add_embedding_length(N_EMBD)
        w.add_block_count(args.layers)
        w.add_feed_forward_length(N_FF_DENSE)
        w.add_head_count(N_HEAD)
        w.add_head_count_kv(N_HEAD_KV)
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
        w.add_layer_norm_rms_eps(RMS_EPS)
        w.add_rope_freq_base(ROPE_BASE)
        w.add_rope_dimension_count(HEAD_DIM)
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_EXPERT_USED)
        w.add_expert_feed_forward_length(N_FF_EXP)
        for key, val, vtype, sub in fields:
            w.add_key_value(key, val, vtype, sub)
        for name, shape in plan:
            if len(shape) == 1 or name.endswith("ffn_gate_inp.weight"):
                w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
            else:
                row_bytes = pools[(shape[-1], t)].shape[1]
                byte_shape = (*shape[:-1], row_bytes)
                w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        writers[t] = (w, path)

    # Tensor data in plan order; every writer gets the same rows (in its own type).
    for name, shape in plan:
        if len(shape) == 1:
            data = {t: np.ones(shape, dtype=np.float32) for t in types}
        elif name.endswith("ffn_gate_inp.weight"):
            router = rng.standard_normal(shape, dtype=np.float32) * np.float32(STD)
            data = {t: router for t in types}
        else:
            n_rows = int(np.prod(shape[:-1]))
            idx = rng.integers(0, POOL_ROWS, size=n_rows)
            data = {}
            for t in types:
                pool = pools[(shape[-1], t)]
                data[t] = pool[idx].reshape(*shape[:-1], pool.shape[1])
        for t in types:
            writers[t][0].write_tensor_data(data[t])
    for t in types:
        w, path = writers[t]
        w.close()
        os.replace(path + ".tmp", path)
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
