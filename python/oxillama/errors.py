"""Every exception oxillama raises derives from :class:`OxiLlamaError`.

The Rust extension raises these same classes (it imports them from here), so
there is exactly one definition of each.
"""

from __future__ import annotations

__all__ = [
    "GenerateError",
    "GrammarError",
    "InternalError",
    "JsonSchemaError",
    "KvCacheFullError",
    "LoadError",
    "LoraError",
    "OverloadedError",
    "OxiLlamaError",
    "ParameterError",
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
