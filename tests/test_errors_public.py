"""Every public error class is importable from ``oxillama``, documented in
the error table of docs/errors.md, and caught the way code written for the runtime
we model catches it: a model mismatch as ``LoadError``, a corrupt snapshot
as ``GenerateError``, a failed save as ``OSError``; ``SnapshotError``
catches all three."""

from __future__ import annotations

import builtins
import re
from pathlib import Path

import pytest

import oxillama
from oxillama import (
    Engine,
    GenerateError,
    LoadError,
    ModelMismatchError,
    OxiLlamaError,
    SamplerConfig,
    SnapshotError,
    SnapshotFormatError,
    SnapshotWriteError,
)
from tests.models import _checks as arch

ERRORS_DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


def public_errors() -> set[str]:
    return {
        name
        for name in oxillama.__all__
        if isinstance(getattr(oxillama, name), type)
        and issubclass(getattr(oxillama, name), OxiLlamaError)
    }


def test_every_error_class_is_exported_and_in_the_docs_table() -> None:
    from oxillama import errors

    assert set(errors.__all__) <= public_errors()
    text = ERRORS_DOC.read_text()
    section = text[: text.index("\n## ")]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \|$", section, re.M)
    documented = {name: bases for name, _, bases in rows}
    assert set(documented) == public_errors()
    for name, bases in documented.items():
        cls = getattr(oxillama, name)
        for base in re.findall(r"`(\w+)`", bases):
            want = getattr(oxillama, base, None) or getattr(builtins, base)
            assert issubclass(cls, want), (name, base)


@pytest.fixture(scope="module")
def saved(model_path: Path) -> tuple[Engine, bytes]:
    eng = Engine(model_path, context_size=128, threads=2, sampler=SamplerConfig.greedy())
    eng.generate("Hello", 2)
    return eng, eng.snapshot_bytes()


def test_a_model_mismatch_is_a_load_error(saved: tuple[Engine, bytes]) -> None:
    _, blob = saved
    other = arch.reference("llama").path  # a different GGUF
    with pytest.raises(LoadError) as info:
        Engine.restore_bytes(blob, model_path=other)
    assert isinstance(info.value, ModelMismatchError)
    assert isinstance(info.value, SnapshotError)


def test_a_corrupt_snapshot_is_a_generate_error(saved: tuple[Engine, bytes]) -> None:
    _, blob = saved
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(GenerateError) as info:
        Engine.restore_bytes(bytes(bad))
    assert isinstance(info.value, SnapshotFormatError)
    with pytest.raises(GenerateError):
        Engine.restore_bytes(b"OXISNAP1" + b"\0" * 10)


def test_a_failed_save_is_an_os_error_naming_the_path(
    saved: tuple[Engine, bytes], tmp_path: Path
) -> None:
    eng, _ = saved
    path = tmp_path / "missing" / "s.oxisnap"
    with pytest.raises(OSError) as info:
        eng.snapshot(path)
    assert isinstance(info.value, SnapshotWriteError)
    assert isinstance(info.value, SnapshotError)
    assert "missing" in str(info.value)
    assert not path.parent.exists()


def test_import_oxillama_alone_gives_the_snapshot_module_and_its_errors() -> None:
    """As the original documents use it: no import of ``oxillama.snapshot``
    beyond ``import oxillama`` itself, in a fresh interpreter."""
    import subprocess
    import sys

    code = (
        "import oxillama\n"
        "s = oxillama.snapshot\n"
        "assert all(callable(getattr(s, n)) for n in ('load', 'dump', 'dumps', 'loads', 'info'))\n"
        "assert issubclass(oxillama.SnapshotFormatError, oxillama.SnapshotError)\n"
        "assert issubclass(oxillama.ModelMismatchError, oxillama.SnapshotError)\n"
        "assert issubclass(oxillama.SnapshotError, oxillama.OxiLlamaError)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
