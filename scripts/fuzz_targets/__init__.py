"""Fuzz targets for `scripts/fuzz.py`, one module per input format.

A target turns one input into one call of oxillama's code: returning is a
pass, an `OxiLlamaError` is a typed error, any other exception (pyo3's
`PanicException` included) is a crash. Binary targets take the fuzzer's
bytes as they are; structured targets draw a value from a hypothesis
strategy with those bytes (`fuzz_one_input`), so the same coverage-guided
engine drives both, and a saved input is the value's own encoding (JSON),
readable and independent of the hypothesis version.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

__all__ = ["NAMES", "JsonTarget", "Target", "load"]

# name -> module (in this package) that defines `TARGET`.
_MODULES = {
    "gguf-bytes": "gguf",
    "gguf-file": "gguf",
    "oxisnap": "snapshots",
    "oxispec": "snapshots",
    "gbnf": "gbnf",
    "json-schema": "json_schema",
    "template": "template",
    "tokenizer": "tokenizer",
    "http": "http_api",
}
NAMES = tuple(_MODULES)
# Fails on purpose (see its module); run by name only, never by `all`.
_MODULES["selftest"] = "selftest"


class Target:
    """One fuzz target. Binary targets set `strategy` to None."""

    name: str
    strategy: st.SearchStrategy[Any] | None = None

    def setup(self, workdir: Path) -> None:
        """Loads what every input needs (models, vocabularies, servers)."""

    def close(self) -> None:
        """Releases what `setup` started (a server process)."""

    def seeds(self) -> list[bytes]:
        """Initial corpus of a binary target (ignored for structured ones)."""
        return []

    def encode(self, value: Any) -> bytes:
        """A structured value as the bytes saved for a crash."""
        raise NotImplementedError

    def decode(self, data: bytes) -> Any:
        """The value `encode` saved (binary targets: the bytes)."""
        return data

    def run(self, value: Any) -> None:
        """Runs one input; raises on a typed error or a crash."""
        raise NotImplementedError


class JsonTarget(Target):
    """A structured target whose values are plain JSON (kept as such)."""

    def encode(self, value: Any) -> bytes:
        return json.dumps(value).encode()

    def decode(self, data: bytes) -> Any:
        return json.loads(data)


def load(name: str) -> Target:
    if name not in _MODULES:
        raise SystemExit(f"unknown target {name!r}; known: {', '.join(NAMES)}")
    module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    target: Target = module.TARGETS[name]()
    return target
