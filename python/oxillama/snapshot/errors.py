"""Snapshot exceptions."""

from __future__ import annotations

from ..errors import GenerateError, LoadError, LoraError, OxiLlamaError

__all__ = [
    "AdapterMismatchError",
    "ModelMismatchError",
    "SnapshotError",
    "SnapshotFormatError",
    "SnapshotWriteError",
]


class SnapshotError(OxiLlamaError):
    """A snapshot cannot be written or restored. Catches every snapshot
    failure; the subclasses are also caught the way code written for the
    runtime we model expects (``LoadError`` for a model mismatch,
    ``GenerateError`` for a corrupt snapshot, ``OSError`` for a failed
    save)."""


class SnapshotFormatError(SnapshotError, GenerateError):
    """Bad magic, truncation, checksum mismatch or unsupported version (also
    a ``GenerateError``)."""


class SnapshotWriteError(SnapshotError, OSError):
    """A save failed (disk full, permission denied, missing folder...): the
    previous file is intact and the temp file is gone (unless the message
    says the new file was written and only the folder's fsync failed). Also
    an ``OSError`` whose ``errno`` is the cause's."""


class ModelMismatchError(SnapshotError, LoadError):
    """The model found is not the one the snapshot was taken with (also a
    ``LoadError``)."""

    def __init__(self, message: str, *, expected: object = None, found: object = None) -> None:
        super().__init__(message)
        self.expected = expected
        self.found = found


class AdapterMismatchError(SnapshotError, LoraError):
    """A LoRA adapter the snapshot was taken with is missing, unreadable or
    changed (its BLAKE3 differs); the message names it. ``name`` and
    ``path`` are the adapter's as recorded."""

    def __init__(self, message: str, *, name: str, path: str) -> None:
        super().__init__(message)
        self.name = name
        self.path = path
