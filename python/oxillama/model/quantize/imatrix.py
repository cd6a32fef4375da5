"""Importance matrices, as llama-quantize reads them: the GGUF form
(`<tensor>.in_sum2` and `<tensor>.counts` per tensor, written by today's
llama-imatrix) and the older `.dat` form. Each becomes one float per
column (per expert, for 3-D tensors): the mean squared activation."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import numpy.typing as npt

from oxillama.errors import LoadError
from oxillama.model.quantize.gguf_io import GGUF_MAGIC, read_layout

Imatrix = dict[str, npt.NDArray[np.float32]]


def _from_gguf(path: Path) -> Imatrix:
    layout = read_layout(path)
    try:
        by_name = {t.name: t for t in layout.tensors}
        out: Imatrix = {}
        for name, t in by_name.items():
            if not name.endswith(".in_sum2"):
                continue
            base = name[: -len(".in_sum2")]
            counts = by_name.get(base + ".counts")
            if counts is None or t.type_id != 0 or counts.type_id != 0:
                raise LoadError(f"{path}: mismatched sums and counts for {base}")
            ne0 = t.shape[0]
            ne1 = t.n_elements // ne0 if ne0 else 0
            sums = np.frombuffer(layout.tensor_bytes(t, 4 * t.n_elements), dtype="<f4")
            cnt = np.frombuffer(layout.tensor_bytes(counts, 4 * counts.n_elements), dtype="<f4")
            if cnt.size < ne1:
                raise LoadError(f"{path}: {base} has {cnt.size} counts for {ne1} matrices")
            e = np.ones(ne0 * ne1, dtype=np.float32)
            for j in range(ne1):
                c = np.float32(cnt[j])
                if c > 0:
                    e[j * ne0 : (j + 1) * ne0] = sums[j * ne0 : (j + 1) * ne0] / c
            out[base] = e
        return out
    finally:
        layout.close()


def _from_dat(path: Path) -> Imatrix:
    data = path.read_bytes()
    pos = 0

    def take(fmt: str) -> tuple[int, ...]:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise LoadError(f"{path}: truncated importance matrix")
        v = struct.unpack_from(fmt, data, pos)
        pos += size
        return v

    (n_entries,) = take("<i")
    if n_entries < 1:
        raise LoadError(f"{path}: no entries in the importance matrix")
    out: Imatrix = {}
    for _ in range(n_entries):
        (n,) = take("<i")
        if n < 0 or pos + n > len(data):
            raise LoadError(f"{path}: truncated importance matrix")
        name = data[pos : pos + n].split(b"\0", 1)[0].decode(errors="replace")
        pos += n
        ncall, nval = take("<ii")
        if nval < 0 or pos + 4 * nval > len(data):
            raise LoadError(f"{path}: truncated importance matrix")
        e = np.frombuffer(data, dtype="<f4", count=nval, offset=pos).astype(np.float32)
        pos += 4 * nval
        if ncall > 0:
            e = e / np.float32(ncall)
        out[name] = e
    return out


def load_imatrix(path: str | os.PathLike[str]) -> Imatrix:
    """The importance vectors of the imatrix file at `path`, by tensor name."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise LoadError(f"cannot open importance matrix {p}: {err.strerror}") from None
    out = _from_gguf(p) if magic == GGUF_MAGIC else _from_dat(p)
    if not out:
        raise LoadError(f"{p}: the importance matrix has no entries")
    for name, e in out.items():
        if not np.all(np.isfinite(e)):
            raise LoadError(f"{p}: the importance matrix of {name} holds a non-finite value")
    return out
