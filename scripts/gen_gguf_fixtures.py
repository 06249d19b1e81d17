#!/usr/bin/env python3
"""Generate the GGUF reader fixtures in crates/gguf/tests/fixtures/.

Produced with the `gguf` Python package, version 0.19.0 (and numpy):

    pip install gguf==0.19.0 numpy
    python3 scripts/gen_gguf_fixtures.py

The files are written by gguf's own GGUFWriter. Next to them, `expected.json` records
what the script asked the writer to store (metadata with exact value types, tensor
shapes in ggml order, type ids and the tensor bytes in hex) and, read back with gguf's
GGUFReader, where the data section and each tensor's data start. The Rust tests assert
that our reader sees exactly these values.

The output is deterministic: running the script again reproduces the same bytes.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

OUT = Path(__file__).resolve().parent.parent / "crates" / "gguf" / "tests" / "fixtures"

TYPE_NAMES = {
    VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16",
    VT.UINT32: "u32", VT.INT32: "i32", VT.FLOAT32: "f32", VT.BOOL: "bool",
    VT.STRING: "string", VT.ARRAY: "array", VT.UINT64: "u64", VT.INT64: "i64",
    VT.FLOAT64: "f64",
}


def scalar_json(vt: VT, v):
    """The value as the file stores it (f32 rounded to f32)."""
    if vt == VT.FLOAT32:
        return float(np.float32(v))
    return v


def infer_type(v) -> VT:
    return gguf.GGUFValueType.get_type(v)


def encode(vt: VT, v, sub: VT | None = None):
    """JSON description of a metadata value: {"type", "value"} or {"type":"array", "elem", "items"}."""
    if vt == VT.ARRAY:
        elem = sub if sub is not None else infer_type(v[0])
        return {
            "type": "array",
            "elem": TYPE_NAMES[elem],
            "items": [encode(elem, x) for x in v],
        }
    return {"type": TYPE_NAMES[vt], "value": scalar_json(vt, v)}


class Recorder:
    """Adds metadata to a GGUFWriter and remembers what was added, in order."""

    def __init__(self, writer: gguf.GGUFWriter):
        self.w = writer
        self.meta: list[dict] = [
            {"key": "general.architecture", **encode(VT.STRING, writer.arch)}
        ]
        self.tensors: list[dict] = []

    def kv(self, key: str, vt: VT, v, sub: VT | None = None):
        self.w.add_key_value(key, v, vt, sub_type=sub)
        self.meta.append({"key": key, **encode(vt, v, sub)})

    def alignment(self, a: int):
        self.w.add_custom_alignment(a)
        self.meta.append({"key": "general.alignment", **encode(VT.UINT32, a)})

    def tensor(self, name: str, arr: np.ndarray, qtype: QT | None = None):
        if qtype is None:
            self.w.add_tensor(name, arr)
            data = arr.tobytes()
            ty = {np.float32: QT.F32, np.float16: QT.F16}[arr.dtype.type]
            dims = list(reversed(arr.shape))
        else:
            q = gguf.quants.quantize(arr, qtype)
            self.w.add_tensor(name, q, raw_dtype=qtype)
            data = q.tobytes()
            ty = qtype
            dims = list(reversed(arr.shape))
        self.tensors.append(
            {"name": name, "dims": dims, "type": int(ty), "data_hex": data.hex()}
        )


def ramp(n: int, scale: float, dtype) -> np.ndarray:
    return (np.arange(n, dtype=np.float64) * scale - n * scale / 2).astype(dtype)


def finish(rec: Recorder, path: Path) -> None:
    rec.w.write_header_to_file(path)
    rec.w.write_kv_data_to_file()
    rec.w.write_tensors_to_file()
    rec.w.close()


def reader_view(path: Path) -> dict:
    r = gguf.GGUFReader(path)
    return {
        "data_offset": int(r.data_offset),
        "alignment": int(r.alignment),
        "tensor_file_offsets": {t.name: int(t.data_offset) for t in r.tensors},
    }


def file_entry(rec: Recorder, path: Path, version: int = 3) -> dict:
    return {
        "file": path.name,
        "version": version,
        "metadata": rec.meta,
        "tensors": rec.tensors,
        "reader": reader_view(path),
    }


def all_types(out: Path) -> dict:
    path = out / "all_types.gguf"
    w = gguf.GGUFWriter(path, "fixture")
    rec = Recorder(w)
    rec.kv("t.u8", VT.UINT8, 200)
    rec.kv("t.i8", VT.INT8, -100)
    rec.kv("t.u16", VT.UINT16, 60000)
    rec.kv("t.i16", VT.INT16, -30000)
    rec.kv("t.u32", VT.UINT32, 4000000000)
    rec.kv("t.i32", VT.INT32, -2000000000)
    rec.kv("t.u64", VT.UINT64, 18000000000000000000)
    rec.kv("t.i64", VT.INT64, -9000000000000000000)
    rec.kv("t.f32", VT.FLOAT32, 3.14159)
    rec.kv("t.f64", VT.FLOAT64, -2.718281828459045)
    rec.kv("t.bool_true", VT.BOOL, True)
    rec.kv("t.bool_false", VT.BOOL, False)
    rec.kv("t.string", VT.STRING, "hello, GGUF")
    rec.kv("t.string_utf8", VT.STRING, "grüße — 你好 🦀\nline two")
    rec.kv("t.string_empty", VT.STRING, "")
    rec.kv("t.arr_u8", VT.ARRAY, [0, 1, 255], VT.UINT8)
    rec.kv("t.arr_i8", VT.ARRAY, [-128, 0, 127], VT.INT8)
    rec.kv("t.arr_u16", VT.ARRAY, [0, 65535], VT.UINT16)
    rec.kv("t.arr_i16", VT.ARRAY, [-32768, 32767], VT.INT16)
    rec.kv("t.arr_u32", VT.ARRAY, [1, 2, 3, 4294967295], VT.UINT32)
    rec.kv("t.arr_i32", VT.ARRAY, [-1, 0, 1, 2147483647], VT.INT32)
    rec.kv("t.arr_u64", VT.ARRAY, [0, 18446744073709551615], VT.UINT64)
    rec.kv("t.arr_i64", VT.ARRAY, [-9223372036854775808, 9223372036854775807], VT.INT64)
    rec.kv("t.arr_f32", VT.ARRAY, [0.5, -1.25, 1e-3], VT.FLOAT32)
    rec.kv("t.arr_f64", VT.ARRAY, [1e300, -0.1], VT.FLOAT64)
    rec.kv("t.arr_bool", VT.ARRAY, [True, False, True], VT.BOOL)
    rec.kv("t.arr_str", VT.ARRAY, ["<s>", "</s>", "", "▁the", "日本"], VT.STRING)
    # Nested arrays: each inner array carries its own element type.
    rec.kv("t.arr_nested", VT.ARRAY, [[1, 2, 3], [4], ["a", "bc"]], VT.ARRAY)
    rec.kv("t.arr_nested2", VT.ARRAY, [[[1.5], [2.5, 3.5]], [[True]]], VT.ARRAY)
    rec.tensor("w.f32", ramp(16, 0.25, np.float32).reshape(2, 8))
    rec.tensor("w.f16", ramp(16, 0.5, np.float16))
    rec.tensor("w.q8_0", ramp(128, 0.03125, np.float32).reshape(2, 64), QT.Q8_0)
    finish(rec, path)
    return file_entry(rec, path)


def aligned(out: Path, alignment: int) -> dict:
    path = out / f"align{alignment}.gguf"
    w = gguf.GGUFWriter(path, "fixture")
    rec = Recorder(w)
    rec.alignment(alignment)
    rec.kv("t.note", VT.STRING, f"tensor data aligned to {alignment}")
    # Odd sizes so that padding between tensors is visible.
    rec.tensor("a.f32", ramp(3, 1.0, np.float32))
    rec.tensor("b.f16", ramp(5, 0.5, np.float16))
    rec.tensor("c.q8_0", ramp(32, 0.125, np.float32), QT.Q8_0)
    rec.tensor("d.f32", ramp(6, 2.0, np.float32).reshape(3, 2))
    finish(rec, path)
    return file_entry(rec, path)


def version2(out: Path, source: dict) -> dict:
    """A copy of align32.gguf with the version field set to 2 (same layout as v3)."""
    src = out / source["file"]
    path = out / "v2.gguf"
    data = bytearray(src.read_bytes())
    data[4:8] = (2).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    entry = dict(source)
    entry["file"] = path.name
    entry["version"] = 2
    return entry


def split(out: Path) -> list[dict]:
    path = out / "split.gguf"
    w = gguf.GGUFWriter(path, "fixture", split_max_tensors=2)
    rec = Recorder(w)
    rec.kv("t.note", VT.STRING, "three shards")
    rec.kv("t.block_count", VT.UINT32, 3)
    rec.tensor("blk.0.a", ramp(8, 0.5, np.float32))
    rec.tensor("blk.0.b", ramp(32, 0.25, np.float32), QT.Q8_0)
    rec.tensor("blk.1.a", ramp(8, 1.5, np.float16))
    rec.tensor("blk.1.b", ramp(4, 1.0, np.float32).reshape(2, 2))
    rec.tensor("blk.2.a", ramp(64, 0.0625, np.float32).reshape(2, 32), QT.Q8_0)
    rec.tensor("blk.2.b", ramp(10, 0.75, np.float16))
    finish(rec, path)
    n = 3
    shards = []
    for i in range(n):
        p = out / f"split-{i + 1:05d}-of-{n:05d}.gguf"
        split_meta = [
            {"key": "split.no", **encode(VT.UINT16, i)},
            {"key": "split.count", **encode(VT.UINT16, n)},
            {"key": "split.tensors.count", **encode(VT.INT32, len(rec.tensors))},
        ]
        shards.append(
            {
                "file": p.name,
                "version": 3,
                # gguf-py puts all metadata in the first shard, then the split keys.
                "metadata": (rec.meta if i == 0 else []) + split_meta,
                "tensors": rec.tensors[2 * i : 2 * i + 2],
                "reader": reader_view(p),
            }
        )
    return shards


def main() -> int:
    version = importlib.metadata.version("gguf")
    if version != "0.19.0":
        print(f"expected gguf 0.19.0, found {version}", file=sys.stderr)
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    files = [all_types(OUT)]
    a32 = aligned(OUT, 32)
    files += [a32, aligned(OUT, 64), version2(OUT, a32)]
    doc = {
        "generator": "scripts/gen_gguf_fixtures.py with gguf 0.19.0 (GGUFWriter/GGUFReader)",
        "files": files,
        "split": split(OUT),
    }
    with open(OUT / "expected.json", "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
