"""The model fingerprint: bounded I/O whatever the model's size.

A fingerprint is the file size, its modification time, and BLAKE3 digests of
its first and last ``probe`` bytes (8 MiB by default, the whole file when it
is smaller). Two files match when size and both digests are equal; the
modification time is recorded for information only, because a model copied
to another machine keeps its bytes but not its mtime.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import oxillama._native as _native
from oxillama.errors import SnapshotFormatError

PROBE = 8 << 20


@dataclass(frozen=True)
class Fingerprint:
    size: int
    mtime_ns: int
    probe: int
    head_blake3: str
    tail_blake3: str

    def matches(self, other: Fingerprint) -> bool:
        return (self.size, self.head_blake3, self.tail_blake3) == (
            other.size,
            other.head_blake3,
            other.tail_blake3,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: object) -> Fingerprint:
        if not isinstance(d, dict):
            raise SnapshotFormatError("fingerprint is not an object")
        missing = [k for k in _FIELDS if k not in d]
        if missing:
            raise SnapshotFormatError(f"bad fingerprint: missing {', '.join(missing)}")
        # Exact types: a float (infinity included), a bool or a string in
        # an integer field is a damaged snapshot, not a value to convert.
        for k, want in _FIELDS.items():
            v = d[k]
            if type(v) is not want:
                raise SnapshotFormatError(
                    f"bad fingerprint field {k}: {type(v).__name__}, expected {want.__name__}"
                )
        fp = cls(**{k: d[k] for k in _FIELDS})
        if fp.size < 0 or fp.probe <= 0:
            raise SnapshotFormatError("bad fingerprint: negative size or probe")
        return fp

    def __str__(self) -> str:
        return (
            f"size={self.size} head={self.head_blake3[:16]} tail={self.tail_blake3[:16]} "
            f"(probe {self.probe} bytes)"
        )


#: The fields of a stored fingerprint and their JSON types.
_FIELDS: dict[str, type] = {
    "size": int,
    "mtime_ns": int,
    "probe": int,
    "head_blake3": str,
    "tail_blake3": str,
}


def fingerprint(path: str | os.PathLike[str], probe: int = PROBE) -> Fingerprint:
    """Fingerprints the file at ``path``, reading at most ``2 * probe`` bytes."""
    p = Path(path)
    with p.open("rb") as f:
        st = os.fstat(f.fileno())
        head = f.read(probe)
        f.seek(max(0, st.st_size - probe))
        tail = f.read(probe)
    return Fingerprint(
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        probe=probe,
        head_blake3=_native.blake3(head).hex(),
        tail_blake3=_native.blake3(tail).hex(),
    )


_CACHE: dict[tuple[str, int, int, int, int, int], Fingerprint] = {}


def cached_fingerprint(path: str | os.PathLike[str], probe: int = PROBE) -> Fingerprint:
    """:func:`fingerprint`, remembered per process for as long as the file's
    identity (device, inode, size, mtime) is unchanged: repeated snapshots
    of one model cost no model I/O."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, probe)
    fp = _CACHE.get(key)
    if fp is None:
        fp = _CACHE[key] = fingerprint(path, probe)
    return fp


def prefetch_fingerprint(path: str | os.PathLike[str], probe: int = PROBE) -> Callable[[], None]:
    """Starts :func:`cached_fingerprint` of ``path`` on a thread and returns
    the function that waits for it. The reads and hashes run without the
    GIL, so a restore fingerprints the model while it builds the tokenizer.
    Errors are left to the caller's own :func:`cached_fingerprint`, which
    then finds nothing cached and raises them."""
    try:
        st = os.stat(path)
    except OSError:
        return _nothing
    key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, probe)
    if key in _CACHE:
        return _nothing

    def run() -> None:
        # The caller raises whatever this would: swallowed here.
        with contextlib.suppress(Exception):
            cached_fingerprint(path, probe)

    t = threading.Thread(target=run, name="oxillama-fingerprint", daemon=True)
    t.start()
    return t.join


def _nothing() -> None:
    pass
