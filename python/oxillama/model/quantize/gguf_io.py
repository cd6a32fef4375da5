"""Reading a GGUF file's layout and writing a new one, keeping each
metadata entry's bytes exactly as the input spelled them (llama-quantize
copies them the same way, so the two outputs can be compared byte for
byte)."""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oxillama.errors import LoadError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types, as GGUF numbers them.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {
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


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ne[0] (the row length) first, as GGUF stores it
    type_id: int
    offset: int  # from the start of the data section

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class GgufLayout:
    """A parsed GGUF file: its metadata entries as raw bytes (key first),
    the decoded values, and its tensors."""

    path: Path
    version: int
    raw_kv: list[tuple[str, bytes]]
    values: dict[str, Any]
    tensors: list[TensorInfo]
    alignment: int
    data_start: int
    _map: mmap.mmap | None = field(default=None, repr=False)

    def tensor_bytes(self, t: TensorInfo, nbytes: int) -> memoryview:
        """The `nbytes` bytes of tensor `t` (a view of the mapped file)."""
        if self._map is None:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        start = self.data_start + t.offset
        if start + nbytes > len(self._map):
            raise LoadError(f"{self.path}: tensor {t.name!r} runs past the end of the file")
        return memoryview(self._map)[start : start + nbytes]

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a caller still holds a view: the map goes with it
            self._map = None


class _Reader:
    def __init__(self, data: bytes | mmap.mmap, path: Path):
        self.data = data
        self.pos = 0
        self.path = path

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise LoadError(f"{self.path}: truncated GGUF header")
        b = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return b

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        try:
            return self.take(n).decode()
        except UnicodeDecodeError:
            raise LoadError(f"{self.path}: a metadata string is not UTF-8") from None

    def value(self, ty: int) -> Any:
        if ty in _SCALAR:
            return self.unpack(_SCALAR[ty])
        if ty == STRING:
            return self.string()
        if ty == ARRAY:
            elem = self.unpack("<I")
            n = self.unpack("<Q")
            if elem in _SCALAR:
                size = struct.calcsize(_SCALAR[elem])
                raw = self.take(size * n)
                # Arrays of numbers (token scores...) are skipped as a block.
                return np.frombuffer(raw, dtype=np.dtype(_SCALAR[elem]))
            return [self.value(elem) for _ in range(n)]
        raise LoadError(f"{self.path}: unknown metadata value type {ty}")


def read_layout(path: str | Path) -> GgufLayout:
    """Parses the header of the GGUF file at `path`."""
    p = Path(path)
    try:
        f = open(p, "rb")
    except OSError as e:
        raise LoadError(f"cannot open {p}: {e.strerror}") from None
    with f:
        try:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:
            raise LoadError(f"{p}: empty file") from None
    r = _Reader(m, p)
    if r.take(4) != GGUF_MAGIC:
        raise LoadError(f"{p}: not a GGUF file (bad magic)")
    version = r.unpack("<I")
    if version not in (2, 3):
        raise LoadError(f"{p}: GGUF version {version} is not supported")
    n_tensors = r.unpack("<Q")
    n_kv = r.unpack("<Q")
    raw_kv: list[tuple[str, bytes]] = []
    values: dict[str, Any] = {}
    for _ in range(n_kv):
        start = r.pos
        key = r.string()
        ty = r.unpack("<I")
        values[key] = r.value(ty)
        raw_kv.append((key, bytes(m[start : r.pos])))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.unpack("<I")
        shape = tuple(r.unpack("<Q") for _ in range(n_dims))
        type_id = r.unpack("<I")
        offset = r.unpack("<Q")
        tensors.append(TensorInfo(name, shape, type_id, offset))
    alignment = int(values.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-r.pos // alignment) * alignment
    return GgufLayout(p, version, raw_kv, values, tensors, alignment, data_start, m)


def encode_kv(key: str, ty: int, value: Any) -> bytes:
    """One metadata entry (scalar or string) in GGUF's encoding."""
    k = key.encode()
    out = struct.pack("<Q", len(k)) + k + struct.pack("<I", ty)
    if ty == STRING:
        v = str(value).encode()
        return out + struct.pack("<Q", len(v)) + v
    return out + struct.pack(_SCALAR[ty], value)


def pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def header_bytes(
    raw_kv: Sequence[tuple[str, bytes]],
    tensors: Sequence[tuple[str, tuple[int, ...], int, int]],
    alignment: int,
) -> bytes:
    """The header of a version-3 file: entries, then (name, shape, type,
    offset) of each tensor, padded to the data's alignment."""
    out = bytearray(GGUF_MAGIC)
    out += struct.pack("<IQQ", 3, len(tensors), len(raw_kv))
    for _, raw in raw_kv:
        out += raw
    for name, shape, type_id, offset in tensors:
        n = name.encode()
        out += struct.pack("<Q", len(n)) + n
        out += struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", type_id, offset)
    out += bytes(pad(len(out), alignment) - len(out))
    return bytes(out)
