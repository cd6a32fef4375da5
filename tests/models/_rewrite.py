"""Rewrites of a fixture: with every tensor dequantized to F32, or under
another ``general.architecture``.

The all-F32 rewrite keeps the metadata and gives every tensor as F32
(``gguf.quants`` dequantizes). Both engines then multiply F32 weights by F32
activations, so what is left between them is each architecture's
semantics, not how each quantizes activations on the way into a quantized
matmul. It is deterministic: make_fixtures.py records its sha256 beside
llama.cpp's logits on it, and the tests rebuild it from the committed
fixture and check that hash, so a ``gguf`` release that writes other bytes
fails loudly instead of comparing against logits of a different file."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.quants import dequantize

_VT = gguf.GGUFValueType


def rewrite(
    src: Path,
    dst: Path,
    *,
    f32: bool = False,
    arch: str | None = None,
    strings: Mapping[str, str] | None = None,
    extra: Mapping[str, np.ndarray] | None = None,
    values: Mapping[str, Any] | None = None,
    tensors: Mapping[str, np.ndarray] | None = None,
) -> str:
    """Writes ``dst`` from ``src``, with F32 tensors if ``f32``, with
    ``arch`` as the architecture (its own keys renamed after it) if given,
    with the string keys ``strings`` and the ``extra`` F32 tensors added,
    and the existing keys in ``values`` given those values (of their type)
    and the tensors in ``tensors`` those F32 contents.
    Returns the sha256 of
    ``dst``."""
    r = gguf.GGUFReader(str(src))
    old = r.fields["general.architecture"].contents()
    new = arch if arch is not None else old
    w = gguf.GGUFWriter(str(dst), new)
    for key, field in r.fields.items():
        # The writer adds the header fields and the architecture itself.
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == _VT.ARRAY else None
        if key.startswith(old + "."):
            key = new + key[len(old) :]
        value = (values or {}).get(key, field.contents())
        w.add_key_value(key, value, kind, sub_type=sub)
    for key, value in (strings or {}).items():
        w.add_string(key, value)
    for t in r.tensors:
        if t.name in (tensors or {}):
            w.add_tensor(t.name, np.asarray((tensors or {})[t.name], dtype=np.float32))
        elif f32:
            data = dequantize(t.data, t.tensor_type).astype(np.float32)
            w.add_tensor(t.name, data.reshape([int(n) for n in reversed(t.shape)]))
        else:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    for name, data in (extra or {}).items():
        w.add_tensor(name, data.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hashlib.sha256(dst.read_bytes()).hexdigest()


def rewrite_f32(src: Path, dst: Path) -> str:
    """The all-F32 rewrite; returns its sha256."""
    return rewrite(src, dst, f32=True)
