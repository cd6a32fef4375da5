"""``oxillama.snapshot``: write a live session to an OXISNAP1 snapshot and
read it back (``dump``/``load`` for files, ``dumps``/``loads`` for bytes),
inspect a snapshot without loading its model (``info``), and the snapshot
exceptions. The codec itself lives in :mod:`oxillama.sessions`; this module
is the public name it has always had."""

from __future__ import annotations

from oxillama.errors import (
    AdapterMismatchError,
    ModelMismatchError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotWriteError,
)
from oxillama.model.fingerprint import Fingerprint, fingerprint
from oxillama.sessions import dump, dumps, load, loads
from oxillama.sessions.info import SnapshotInfo, info

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
