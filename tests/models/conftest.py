"""Fixtures for the per-architecture tests: the session's cache of F32
rewrites, and each family's ``names`` as the ``name`` parameter."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def f32_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the all-F32 rewrites of the fixtures are built, once a session."""
    return tmp_path_factory.mktemp("f32_fixtures")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # A family's test class lists its references in `names`; every check of
    # ArchitectureSuite then runs once per reference.
    names = getattr(metafunc.cls, "names", None)
    if names is not None and "name" in metafunc.fixturenames:
        metafunc.parametrize("name", names)
