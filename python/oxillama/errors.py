"""Every exception oxillama raises derives from :class:`OxiLlamaError`.

The Rust extension raises these same classes (it imports them from here), so
there is exactly one definition of each.
"""

from __future__ import annotations

__all__ = [
    "AdapterMismatchError",
    "GenerateError",
    "GrammarError",
    "InternalError",
    "JsonSchemaError",
    "KvCacheFullError",
    "LoadError",
    "LoraError",
    "ModelMismatchError",
    "OverloadedError",
    "OxiLlamaError",
    "ParameterError",
    "SnapshotError",
    "SnapshotFormatError",
    "SnapshotWriteError",
    "TemplateError",
    "TokenizeError",
]


class OxiLlamaError(Exception):
    """Base class for all oxillama errors."""


class InternalError(OxiLlamaError):
    """A bug in oxillama: please report it. The Rust core panicked (on the
    calling thread or in a worker thread) and the call was abandoned; the
    process keeps working, and a session or matcher the panic interrupted
    refuses further use with this same error."""


class LoadError(OxiLlamaError):
    """A model or tokenizer file is missing, truncated, corrupt or unsupported."""


class LoraError(LoadError):
    """A LoRA adapter is unreadable, targets a tensor the base model does not
    have (or that oxillama does not modify), has the wrong shapes, or is not
    registered; the message names the tensor or adapter."""


class GenerateError(OxiLlamaError):
    """A generation request cannot be served, e.g. the prompt exceeds the context."""


class KvCacheFullError(GenerateError):
    """A shared KV pool has no free page left (the batching scheduler
    preempts a sequence and retries; direct callers may free sessions)."""


class OverloadedError(GenerateError):
    """The scheduler's waiting queue is full; the request was not queued and
    may be retried later (the server answers 503 with ``Retry-After``)."""


class ParameterError(OxiLlamaError, ValueError):
    """A parameter is out of range or of the wrong kind (also a ValueError)."""


class GrammarError(OxiLlamaError, ValueError):
    """A grammar is invalid. ``line`` and ``column`` (1-based) locate the
    problem in the GBNF source when it has one."""

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None):
        if line is not None:
            message = f"line {line}, column {column}: {message}"
        super().__init__(message)
        self.line = line
        self.column = column


class JsonSchemaError(GrammarError):
    """A JSON Schema cannot be turned into a grammar. ``keyword`` names the
    unsupported or invalid keyword, ``path`` the JSON pointer to it."""

    def __init__(self, message: str, *, keyword: str | None = None, path: str = "#"):
        super().__init__(f"{path}: {message}")
        self.keyword = keyword
        self.path = path


class TemplateError(OxiLlamaError):
    """A chat template is invalid or failed to render (e.g. raise_exception)."""


class TokenizeError(OxiLlamaError, ValueError):
    """Text cannot be tokenized as given, e.g. it holds a lone UTF-16
    surrogate (which no UTF-8 byte sequence spells); ``position`` is the
    index of the offending character. Nothing is replaced silently."""

    def __init__(self, message: str, *, position: int | None = None):
        super().__init__(message)
        self.position = position


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
