#!/usr/bin/env python3
"""Write the small demo model that `sluice` embeds as its default.

The demo model is a random-weight Mixture-of-Experts GGUF with the qwen3moe tensor layout
(2 layers, 8 experts, top-2, n_embd 64) and a byte-level vocabulary. It is not a language
model; it exists so that `sluice inspect` (and later `sluice run`) has something to work on
when no model is given, on a machine where real weights cannot be downloaded.

Tool: the `gguf` PyPI package 0.19.0 with numpy 2.x (written with gguf.GGUFWriter and
gguf.quants.quantize, independently of our own writer).

Regenerate (deterministic, seed 0), together with the reference .npy that the `inspect`
test compares against (gguf.quants.dequantize of one Q8_0 tensor, saved with numpy.save):
    pip install gguf==0.19.0 numpy
    python3 scripts/gen_demo_model.py crates/cli/assets/demo-qwen3moe.gguf \
        crates/cli/tests/fixtures/demo.blk.1.ffn_down_exps.npy
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

ARCH = "qwen3moe"
N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM = 2, 64, 4, 2, 16
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 8, 2, 64
# (left, right) in merge priority order; "Ġ" is GPT-2's printable stand-in for the space byte.
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("a", "n"), ("Ġ", "a"),
          ("o", "n"), ("r", "e"), ("Ġ", "s"), ("Ġ", "w"), ("o", "r"), ("e", "n"), ("Ġ", "c"),
          ("i", "s"), ("Ġ", "i")]


def byte_vocab():
    # 256 byte tokens in GPT-2's printable mapping, the merged pieces, then three specials.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    tokens = [chr(table[b]) for b in range(256)]
    types = [gguf.TokenType.NORMAL] * 256
    # A few merges of frequent English pairs, so that the vocabulary is a complete byte-level BPE
    # one (llama.cpp refuses a gpt2 vocabulary without tokenizer.ggml.merges).
    merges = []
    for left, right in MERGES:
        merges.append(f"{left} {right}")
        tokens.append(left + right)
        types.append(gguf.TokenType.NORMAL)
    for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        tokens.append(s)
        types.append(gguf.TokenType.CONTROL)
    return tokens, types, merges


def main(out):
    rng = np.random.default_rng(0)
    tokens, types, merges = byte_vocab()
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(out, ARCH)
    w.add_name("sluice demo qwen3moe (random weights)")
    w.add_type("model")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(2)
    w.add_vocab_size(n_vocab)
    w.add_context_length(512)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF_EXP)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(n_vocab - 3)
    w.add_bos_token_id(n_vocab - 3)
    w.add_add_bos_token(False)

    def rnd(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def q8(name, arr):
        w.add_tensor(name, gguf.quants.quantize(arr, QT.Q8_0), raw_dtype=QT.Q8_0)

    w.add_tensor("token_embd.weight", rnd(n_vocab, N_EMBD))
    w.add_tensor("output_norm.weight", norm(N_EMBD))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        q8(p + "attn_q.weight", rnd(N_HEAD * HEAD_DIM, N_EMBD))
        q8(p + "attn_k.weight", rnd(N_HEAD_KV * HEAD_DIM, N_EMBD))
        q8(p + "attn_v.weight", rnd(N_HEAD_KV * HEAD_DIM, N_EMBD))
        q8(p + "attn_output.weight", rnd(N_EMBD, N_HEAD * HEAD_DIM))
        w.add_tensor(p + "attn_q_norm.weight", norm(HEAD_DIM))
        w.add_tensor(p + "attn_k_norm.weight", norm(HEAD_DIM))
        w.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "ffn_gate_inp.weight", 4.0 * rnd(N_EXPERT, N_EMBD))
        q8(p + "ffn_gate_exps.weight", rnd(N_EXPERT, N_FF_EXP, N_EMBD))
        q8(p + "ffn_up_exps.weight", rnd(N_EXPERT, N_FF_EXP, N_EMBD))
        q8(p + "ffn_down_exps.weight", rnd(N_EXPERT, N_EMBD, N_FF_EXP))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_npy_reference(model, out, name="blk.1.ffn_down_exps.weight"):
    reader = gguf.GGUFReader(model)
    for t in reader.tensors:
        if t.name == name:
            values = gguf.quants.dequantize(t.data, t.tensor_type)
            shape = tuple(int(d) for d in reversed(list(t.shape)))
            np.save(out, values.reshape(shape).astype(np.float32))
            return
    sys.exit(f"tensor {name} not found")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1])
    if len(sys.argv) == 3:
        write_npy_reference(sys.argv[1], sys.argv[2])
