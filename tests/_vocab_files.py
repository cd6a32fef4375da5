"""Test helper: llama.cpp's vocabulary-only GGUFs, fetched by
scripts/fetch_vocabs.py, read with oxillama's own GGUF reader. A missing
file fails the test (never skips), naming the script that fetches it."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from oxillama import _native

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "tests" / "reference" / "vocabs"


def _fetch_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "fetch_vocabs", ROOT / "scripts" / "fetch_vocabs.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: scripts/fetch_vocabs.py as a module (its VOCABS list and vocab_path()).
FETCH = _fetch_module()


@functools.cache
def reference(name: str) -> dict[str, Any]:
    """llama.cpp's tokenization of the corpus with this vocabulary
    (tests/reference/vocabs/<name>.json)."""
    data: dict[str, Any] = json.loads((REF / f"{name}.json").read_text("utf-8"))
    return data


def vocab_bytes(name: str) -> bytes:
    path: Path = FETCH.vocab_path(name)
    if not path.is_file():
        pytest.fail(
            f"{path} is missing: run `python scripts/fetch_vocabs.py` (downloads "
            "llama-cpp-python's sdist from PyPI once; OXILLAMA_VOCAB_DIR moves the cache)",
            pytrace=False,
        )
    data = path.read_bytes()
    want = reference(name)["file_sha256"]
    assert hashlib.sha256(data).hexdigest() == want, f"{path} is not the file the reference used"
    return data


@functools.cache
def vocab_metadata(name: str) -> dict[str, Any]:
    data = vocab_bytes(name)
    # llama.cpp writes a vocabulary-only file without the alignment padding
    # before its (empty) tensor data; our reader wants the data section to
    # start inside the file, so the padding is added back.
    data += b"\0" * (-len(data) % 32)
    meta: dict[str, Any] = _native.GgufFile.from_bytes(data).metadata()
    return meta
