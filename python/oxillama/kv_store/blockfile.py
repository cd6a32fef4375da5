"""One stored block as bytes: a header naming its key, its KV payload and a
checksum of both (``_native.checksum``, as snapshots carry), so a flipped or
missing byte is detected before the block reaches a session. Blocks of the
first layout (``OXIKVB01``, a BLAKE3 digest) read as misses."""

from __future__ import annotations

import struct

import oxillama._native as _native

MAGIC = b"OXIKVB02"
_HEAD = struct.Struct("<8s32sIQ")  # magic, key, positions, payload bytes
_DIGEST = 16


class CorruptBlock(Exception):
    """A stored block that is truncated, damaged or not the one asked for
    (a miss, counted; never raised to a user)."""


def encode(key: bytes, positions: int, payload: bytes | memoryview) -> bytes:
    body = _HEAD.pack(MAGIC, key, positions, len(payload)) + payload
    return body + _native.checksum(body)


def decode(key: bytes, positions: int, data: bytes | memoryview) -> memoryview:
    """The payload of ``data``, checked against ``key`` and ``positions``."""
    if len(data) < _HEAD.size + _DIGEST:
        raise CorruptBlock(f"{len(data)} bytes is shorter than a block header")
    magic, got_key, got_n, size = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CorruptBlock("not a KV block (bad magic)")
    if len(data) != _HEAD.size + size + _DIGEST:
        raise CorruptBlock(f"{len(data)} bytes, the header says {_HEAD.size + size + _DIGEST}")
    view = memoryview(data)
    if _native.checksum(view[:-_DIGEST]) != bytes(view[-_DIGEST:]):
        raise CorruptBlock("checksum mismatch")
    if got_key != key or got_n != positions:
        raise CorruptBlock("the block holds another key")
    return view[_HEAD.size : -_DIGEST]
