"""Snapshot exceptions."""

from __future__ import annotations

from ..errors import OxiLlamaError

__all__ = ["ModelMismatchError", "SnapshotError", "SnapshotFormatError"]


class SnapshotError(OxiLlamaError):
    """A snapshot cannot be written or restored."""


class SnapshotFormatError(SnapshotError):
    """Bad magic, truncation, checksum mismatch or unsupported version."""


class ModelMismatchError(SnapshotError):
    """The model found is not the one the snapshot was taken with."""

    def __init__(self, message: str, *, expected: object = None, found: object = None) -> None:
        super().__init__(message)
        self.expected = expected
        self.found = found
