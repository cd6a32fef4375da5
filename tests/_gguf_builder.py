"""A minimal GGUF writer with full control over every field, so tests can
produce both valid files and precisely corrupted ones."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

# GGUF metadata value type ids.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {
    U8: "<B",
    I8: "<b",
    U16: "<H",
    I16: "<h",
    U32: "<I",
    I32: "<i",
    F32: "<f",
    BOOL: "<?",
    U64: "<Q",
    I64: "<q",
    F64: "<d",
}


def gguf_string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def encode_value(ty: int, v: Any) -> bytes:
    if ty == STRING:
        return gguf_string(v)
    if ty == ARRAY:
        elem_ty, items = v
        out = struct.pack("<IQ", elem_ty, len(items))
        return out + b"".join(encode_value(elem_ty, x) for x in items)
    return struct.pack(_FMT[ty], v)


@dataclass
class Tensor:
    name: str
    dims: list[int]
    ggml_type: int
    data: bytes


@dataclass
class GGUF:
    kvs: list[tuple[str, int, Any]] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    version: int = 3
    alignment: int = 32

    def build(self) -> bytes:
        out = bytearray(b"GGUF")
        out += struct.pack("<IQQ", self.version, len(self.tensors), len(self.kvs))
        for k, ty, v in self.kvs:
            out += gguf_string(k) + struct.pack("<I", ty) + encode_value(ty, v)
        offset = 0
        offsets = []
        for t in self.tensors:
            offsets.append(offset)
            offset += len(t.data)
            offset = (offset + self.alignment - 1) // self.alignment * self.alignment
        for t, off in zip(self.tensors, offsets, strict=False):
            out += gguf_string(t.name) + struct.pack("<I", len(t.dims))
            out += b"".join(struct.pack("<Q", d) for d in t.dims)
            out += struct.pack("<IQ", t.ggml_type, off)
        pad = (-len(out)) % self.alignment
        out += b"\0" * pad
        for t in self.tensors:
            out += t.data
            out += b"\0" * ((-len(t.data)) % self.alignment)
        return bytes(out)


def small_model_file() -> GGUF:
    """A small file exercising every metadata type, nested arrays, and
    tensors of several formats."""
    import numpy as np

    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((4, 32)).astype(np.float32)
    f16 = rng.standard_normal((2, 64)).astype(np.float16)
    q8_0 = bytearray()
    for _ in range(3):  # 3 blocks of Q8_0 (d f16 + 32 int8)
        q8_0 += np.float16(0.05).tobytes() + rng.integers(-127, 128, 32, dtype=np.int8).tobytes()
    return GGUF(
        kvs=[
            ("general.architecture", STRING, "llama"),
            ("general.name", STRING, "tiny test ✓"),
            ("test.u8", U8, 7),
            ("test.i8", I8, -7),
            ("test.u16", U16, 65535),
            ("test.i16", I16, -300),
            ("test.u32", U32, 4_000_000_000),
            ("test.i32", I32, -2_000_000_000),
            ("test.f32", F32, 0.5),
            ("test.bool", BOOL, True),
            ("test.u64", U64, 2**63),
            ("test.i64", I64, -(2**62)),
            ("test.f64", F64, 1.25),
            ("test.strings", ARRAY, (STRING, ["a", "bc", ""])),
            ("test.nested", ARRAY, (ARRAY, [(I32, [1, 2]), (I32, [3])])),
            ("test.empty", ARRAY, (F32, [])),
        ],
        tensors=[
            Tensor("a.weight", [32, 4], 0, f32.tobytes()),
            Tensor("b.weight", [64, 2], 1, f16.tobytes()),
            Tensor("c.weight", [96], 8, bytes(q8_0)),
        ],
    )
