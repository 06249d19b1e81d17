#!/usr/bin/env python3
"""Write crates/quant/tests/fixtures/quant_gguf_py.gguf: reference (de)quantization data
produced by the `gguf` Python package (gguf-py).

Produced with gguf 0.19.0 and numpy 2.4.6 (Python 3.11). Regenerate from the repository root:

    pip install gguf==0.19.0 numpy==2.4.6
    python3 scripts/gen_quant_fixtures.py crates/quant/tests/fixtures/quant_gguf_py.gguf

The output is deterministic (fixed seed, numpy's PCG64 stream).

Contents (tensor names use ggml's type names, e.g. `q4_K`, `iq2_xxs`, `bf16`):

* `<type>.q`: random *valid* blocks of that type (raw bytes, tensor type = <type>), and
  `<type>.f32`: `gguf.quants.dequantize` of them, for every type gguf-py can dequantize
  except NVFP4. For the integer and f64 types, which gguf-py stores but does not dequantize,
  `<type>.f32` is numpy's `astype(float32)`.
* `quant.input`: deterministic f32 inputs (several distributions and edge cases, a whole
  number of 256-element super-blocks), and `<type>.quant`: `gguf.quants.quantize` of them for
  every type gguf-py can quantize that the project quantizes too.

"Valid" blocks: random bytes everywhere except the scale fields, which are patched to finite
values of moderate size (random sign, f16 exponent 2^-10 .. 2^5, a few zero and subnormal
scales; MXFP4 exponent bytes near 127 plus the extremes 0, 1, 2, 254). Grid and sign indices
of the i-quants are full-range by construction, so any bits are valid there. F16 data avoids
signaling NaNs (numpy keeps them signaling where ggml and the hardware conversion quiet
them); quiet NaNs, infinities and subnormals are included.
"""

import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, quants

SEED = 0x5EED_0D0E

# Byte offsets of the f16 scale fields within one block of each type.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0],
    T.IQ1_S: [0], T.IQ4_NL: [0], T.IQ4_XS: [0], T.TQ1_0: [52], T.TQ2_0: [64],
}

# Types whose quantizer the project implements and gguf-py provides.
QUANTIZE_TYPES = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4]


def ggml_name(qt: T) -> str:
    """ggml's name of a type: lower case, but the k-quants keep their capital K."""
    name = qt.name.lower()
    return name[:-1] + "K" if name.endswith("_k") else name


def f16_scale_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite f16 bit patterns of moderate size, with a few zeros and subnormals."""
    sign = rng.integers(0, 2, n, dtype=np.uint16) << 15
    exp = rng.integers(5, 21, n, dtype=np.uint16)
    man = rng.integers(0, 1024, n, dtype=np.uint16)
    bits = sign | (exp << 10) | man
    kind = rng.integers(0, 16, n)
    bits = np.where(kind == 0, sign, bits)  # +-0
    bits = np.where(kind == 1, sign | man, bits)  # subnormal (or zero)
    return bits.astype(np.uint16)


def random_blocks(rng: np.random.Generator, qt: T, n_blocks: int) -> np.ndarray:
    """Random valid blocks of `qt` as a (n_blocks, type_size) uint8 array."""
    _, ts = GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, (n_blocks, ts), dtype=np.uint8)
    if qt in F16_FIELDS:
        for off in F16_FIELDS[qt]:
            raw[:, off:off + 2] = f16_scale_bits(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    elif qt == T.IQ1_M:
        # The f16 scale is spread over the top nibbles of the four u16 at bytes 48..56.
        d = f16_scale_bits(rng, n_blocks)
        sc = raw[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            nib = (d >> np.uint16(4 * k)) & np.uint16(0xF)
            sc[:, k] = (sc[:, k] & np.uint16(0x0FFF)) | (nib << np.uint16(12))
        raw[:, 48:56] = sc.view(np.uint8)
    elif qt == T.MXFP4:
        e = rng.integers(117, 138, n_blocks).astype(np.uint8)
        e[:4] = [0, 1, 2, 254][: min(4, n_blocks)]
        raw[:, 0] = e
    elif qt == T.F16:
        bits = raw.view(np.uint16)
        is_snan = ((bits & 0x7C00) == 0x7C00) & ((bits & 0x03FF) != 0) & ((bits & 0x0200) == 0)
        raw = np.where(is_snan, bits | np.uint16(0x0200), bits).astype(np.uint16).view(np.uint8)
    elif qt in (T.F32, T.BF16):
        pass  # every bit pattern decodes by a plain shift or copy
    else:
        raise ValueError(f"no block recipe for {qt.name}")
    return raw


def quant_inputs(rng: np.random.Generator) -> np.ndarray:
    """f32 inputs for the quantizers: 16 super-blocks of 256 with varied distributions."""
    blocks = []
    blocks.append(np.zeros(256, np.float32))
    blocks.append(np.full(256, 0.5, np.float32))
    b = rng.standard_normal(256).astype(np.float32) * np.float32(1e-3)
    b[77] = np.float32(3.0)
    blocks.append(b)  # one outlier
    blocks.append(rng.uniform(0.1, 2.0, 256).astype(np.float32))  # all positive
    blocks.append(-rng.uniform(0.1, 2.0, 256).astype(np.float32))  # all negative
    blocks.append((rng.standard_normal(256) * 1e-6).astype(np.float32))  # tiny
    blocks.append((rng.standard_normal(256) * 1e3).astype(np.float32))  # large
    blocks.append(rng.integers(-8, 8, 256).astype(np.float32))  # on the Q4_0 grid
    for _ in range(8):
        # Gaussian with a different spread in every 32-block, as real weights have.
        spread = np.exp2(rng.uniform(-6, 2, 8)).repeat(32)
        blocks.append((rng.standard_normal(256) * spread).astype(np.float32))
    return np.concatenate(blocks)


def main() -> None:
    np.seterr(over="ignore")  # MXFP4 exponent 254 and the f64 cases overflow f32 on purpose
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT.gguf")
    out = sys.argv[1]
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(out, arch="quant-fixture")
    w.add_string("fixture.generator", "scripts/gen_quant_fixtures.py")
    w.add_string("fixture.reference", "gguf 0.19.0 gguf.quants (numpy 2.4.6)")

    # Dequantization of random blocks.
    deq_types = [qt for qt in T if qt in F16_FIELDS or qt in (T.F32, T.F16, T.BF16, T.IQ1_M, T.MXFP4)]
    for qt in deq_types:
        bs, ts = GGML_QUANT_SIZES[qt]
        n_blocks = 16 if bs <= 32 else 8
        if bs == 1:
            n_blocks = 256
        raw = random_blocks(rng, qt, n_blocks)
        flat = raw.reshape(-1)
        ref = quants.dequantize(flat, qt).astype(np.float32, copy=False)
        assert ref.shape == (n_blocks * bs,), qt.name
        w.add_tensor(f"{ggml_name(qt)}.q", flat, raw_dtype=qt)
        w.add_tensor(f"{ggml_name(qt)}.f32", np.ascontiguousarray(ref))

    # Plain integer and f64 element types: numpy's conversion is the reference.
    for qt, dt in [(T.I8, np.int8), (T.I16, np.int16), (T.I32, np.int32), (T.I64, np.int64), (T.F64, np.float64)]:
        n = 256
        raw = rng.integers(0, 256, n * np.dtype(dt).itemsize, dtype=np.uint8)
        vals = raw.view(dt).copy()
        if dt == np.float64:
            vals = rng.standard_normal(n) * np.exp2(rng.integers(-140, 140, n))
        w.add_tensor(f"{ggml_name(qt)}.q", vals)
        w.add_tensor(f"{ggml_name(qt)}.f32", vals.astype(np.float32))

    # Quantization of deterministic inputs.
    x = quant_inputs(rng)
    w.add_tensor("quant.input", x)
    for qt in QUANTIZE_TYPES:
        q = quants.quantize(x, qt)
        if qt == T.F16:
            w.add_tensor(f"{ggml_name(qt)}.quant", q)
        else:
            w.add_tensor(f"{ggml_name(qt)}.quant", q.reshape(-1).view(np.uint8), raw_dtype=qt)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
