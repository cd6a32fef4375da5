"""Every exception oxillama raises derives from :class:`OxiLlamaError`.

The Rust extension raises these same classes (it imports them from here), so
there is exactly one definition of each.
"""

from __future__ import annotations

__all__ = [
    "GenerateError",
    "GrammarError",
    "LoadError",
    "OxiLlamaError",
    "ParameterError",
    "TemplateError",
]


class OxiLlamaError(Exception):
    """Base class for all oxillama errors."""


class LoadError(OxiLlamaError):
    """A model or tokenizer file is missing, truncated, corrupt or unsupported."""


class GenerateError(OxiLlamaError):
    """A generation request cannot be served, e.g. the prompt exceeds the context."""


class ParameterError(OxiLlamaError, ValueError):
    """A parameter is out of range or of the wrong kind (also a ValueError)."""


class GrammarError(OxiLlamaError, ValueError):
    """A grammar or JSON Schema is invalid (message carries line and column)."""


class TemplateError(OxiLlamaError):
    """A chat template is invalid or failed to render (e.g. raise_exception)."""
