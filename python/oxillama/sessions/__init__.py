"""Freeze a live session into an OXISNAP1 snapshot and resume it elsewhere.

The continuation of a restored session is exactly the one the uninterrupted
session would have produced: the snapshot carries the token history, the KV
cache, the last position's logits, and the sampler's configuration and live
state (RNG, mirostat mu, penalty history). Model weights are referenced by
path and fingerprint, never stored. The byte format is specified in
docs/snapshot-format.md.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Protocol

from oxillama.engine.engine import Engine, register_snapshot_codec
from oxillama.engine.session_state import SessionState
from oxillama.engine.speculative import register_spec_codec
from oxillama.errors import (
    AdapterMismatchError,
    ModelMismatchError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotWriteError,
)
from oxillama.mapped import map_file
from oxillama.model.fingerprint import Fingerprint, fingerprint
from oxillama.sessions import spec
from oxillama.sessions.atomic import refuse_temp
from oxillama.sessions.info import SnapshotInfo, info
from oxillama.sessions.session import (
    capture_bytes,
    capture_into,
    restore,
    snapshot_size,
    write_atomic,
    writers,
)


class _HoldsState(Protocol):
    def _view_state(self) -> SessionState: ...


def _state(source: SessionState | _HoldsState) -> SessionState:
    return source if isinstance(source, SessionState) else source._view_state()


__all__ = [
    "AdapterMismatchError",
    "Fingerprint",
    "ModelMismatchError",
    "SnapshotError",
    "SnapshotFormatError",
    "SnapshotInfo",
    "SnapshotWriteError",
    "dump",
    "dumps",
    "fingerprint",
    "info",
    "load",
    "loads",
]


def dumps(engine: Engine | SessionState) -> bytes:
    """The engine's session as bytes."""
    return capture_bytes(_state(engine))


def dump(
    engine: Engine | SessionState, path: str | os.PathLike[str], *, durable: bool = True
) -> None:
    """Writes the engine's session to ``path`` crash-safely (temp file,
    fsync unless ``durable=False``, rename; see :mod:`.atomic`)."""
    state = _state(engine)
    write_atomic(path, writers(state), durable=durable)


def loads(
    blob: bytes | bytearray | memoryview,
    *,
    model_path: str | os.PathLike[str] | None = None,
    threads: int | None = None,
) -> Engine:
    """A new engine continuing the session in ``blob`` (no temp file)."""
    return _engine(restore(blob, model_path=model_path, threads=threads))


def load(
    path: str | os.PathLike[str],
    *,
    model_path: str | os.PathLike[str] | None = None,
    threads: int | None = None,
) -> Engine:
    """A new engine continuing the session saved at ``path``."""
    return _engine(read_state(path, model_path=model_path, threads=threads))


def _engine(state: SessionState) -> Engine:
    return Engine.from_state(state)


def read(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview, **kwargs: Any
) -> SessionState:
    """The session in ``source``: snapshot bytes, or the path of a file
    (see :func:`~.session.restore` for ``kwargs``)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return restore(source, **kwargs)
    return read_state(source, **kwargs)


def read_state(path: str | os.PathLike[str], **kwargs: object) -> SessionState:
    """The session saved at ``path`` (see :func:`~.session.restore` for
    ``kwargs``), read through a mapping of the file."""
    # Mapped, not read (see oxillama.mapped).
    refuse_temp(path)
    try:
        f = Path(path).open("rb")
    except OSError as e:
        raise SnapshotError(f"cannot read snapshot {str(path)!r}: {e}") from e
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            return restore(b"", **kwargs)  # type: ignore[arg-type]
        m = map_file(f.fileno())
    # On an error the traceback still references slices of the mapping; it
    # is then unmapped with the last of them rather than closed here.
    state = restore(memoryview(m), **kwargs)  # type: ignore[arg-type]
    with contextlib.suppress(BufferError):
        m.close()
    return state


class _Codec:
    """OXISNAP1 for :class:`~oxillama.Engine` (see ``SnapshotCodec``)."""

    def dump(self, state: SessionState, path: str | os.PathLike[str], *, durable: bool) -> None:
        write_atomic(path, writers(state), durable=durable)

    def dumps(self, state: SessionState) -> bytes:
        return capture_bytes(state)

    def size(self, state: SessionState) -> int:
        return snapshot_size(state)

    def into(self, state: SessionState, buffer: Any) -> int:
        return capture_into(state, buffer)

    def read(
        self, source: str | os.PathLike[str] | bytes | bytearray | memoryview, **kw: Any
    ) -> SessionState:
        return read(source, **kw)


register_snapshot_codec(_Codec())
# The module's dump/dumps/load/loads are the OXISPEC1 codec.
register_spec_codec(spec)
