"""Every architecture's loader reads its own metadata (softcaps, multipliers,
sliding windows, rope factors, SSM and expert shapes). Whatever value a key
holds, loading gives a model or a LoadError naming the problem, and a model
that loads evaluates tokens or refuses them with a typed error: never a
panic (InternalError), an abort or a hang.

The values are overwritten in place in the committed fixtures
(tests/models/fixtures), so every other byte of a real file of that
architecture stays as llama.cpp's conventions have it."""

from __future__ import annotations

import functools
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oxillama import _native
from oxillama.errors import InternalError, OxiLlamaError

FIXTURES = Path(__file__).parent / "models" / "fixtures"

# GGUF scalar value types and their sizes.
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@functools.cache
def _image(arch: str) -> bytes:
    return (FIXTURES / f"{arch}.gguf").read_bytes()


@functools.cache
def _scalar_keys(arch: str) -> list[tuple[str, int, int]]:
    """`(key, offset of its value, value size)` of every scalar key that
    belongs to the architecture (`<arch>.…`)."""
    data = _image(arch)
    meta = _native.GgufFile.from_bytes(data).metadata()
    out = []
    for key in meta:
        if not key.startswith(f"{arch}."):
            continue
        raw = key.encode()
        at = data.find(struct.pack("<Q", len(raw)) + raw)
        assert at >= 0, key
        ty_at = at + 8 + len(raw)
        (ty,) = struct.unpack_from("<I", data, ty_at)
        if ty in _SIZES:
            out.append((key, ty_at + 4, _SIZES[ty]))
    return out


ARCHS = [
    "llama",
    "mistral3",
    "granite",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "gemma",
    "gemma2",
    "gemma3",
    "phi3",
    "command-r",
    "starcoder2",
    "olmo2",
    "mamba2",
    "smollm3",
    "gpt-oss",
    "lfm2",
    "lfm2moe",
    "granitehybrid",
    "jamba",
    "deepseek2",
]

# Values that reach edge cases: zero, one, huge, negative or non-finite
# floats, and random bits.
_EDGE = [
    b"\x00" * 8,
    b"\x01" + b"\x00" * 7,
    b"\xff" * 8,
    struct.pack("<f", float("nan")) * 2,
    struct.pack("<f", float("-inf")) * 2,
    struct.pack("<f", -1.0) * 2,
    struct.pack("<d", 1e300),
    struct.pack("<I", 1 << 31) * 2,
]


def _load_and_run(data: bytes) -> None:
    try:
        model = _native.Model(_native.GgufFile.from_bytes(data))
    except InternalError:
        raise
    except OxiLlamaError:
        return
    session = _native.Session(model, 32, 1, "f32")
    try:
        session.eval(np.asarray([1, 2, 3], dtype=np.uint32), True)
    except InternalError:
        raise
    except OxiLlamaError:
        pass


@pytest.mark.parametrize("arch", ARCHS)
def test_every_key_at_every_edge_value(arch: str) -> None:
    keys = _scalar_keys(arch)
    assert keys, f"{arch} has no scalar metadata of its own"
    for key, at, size in keys:
        for edge in _EDGE:
            data = bytearray(_image(arch))
            data[at : at + size] = edge[:size]
            try:
                _load_and_run(bytes(data))
            except InternalError as e:  # pragma: no cover - the failure itself
                pytest.fail(f"{arch}: {key} = {edge[:size].hex()} -> {e}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arch=st.sampled_from(ARCHS),
    which=st.integers(min_value=0, max_value=1 << 16),
    value=st.binary(min_size=8, max_size=8),
)
def test_random_values_load_or_fail_typed(arch: str, which: int, value: bytes) -> None:
    keys = _scalar_keys(arch)
    _key, at, size = keys[which % len(keys)]
    data = bytearray(_image(arch))
    data[at : at + size] = value[:size]
    _load_and_run(bytes(data))
