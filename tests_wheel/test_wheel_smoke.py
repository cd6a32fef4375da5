"""The installed wheel, not the source tree: run by scripts/wheel_smoke.sh in
a fresh virtual environment with no Rust toolchain on PATH. Each test drives
the package the way a user who ran ``pip install oxillama`` would."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

PY = sys.executable
CLI = str(Path(PY).with_name("oxillama"))


def test_the_wheel_is_what_runs() -> None:
    """The package comes from the venv's site-packages as an abi3 build, and
    no compiler could have built it here."""
    out = subprocess.run(
        [
            PY,
            "-c",
            "import oxillama, oxillama._native as n; print(oxillama.__file__); "
            "print(n.__file__); print(n.simd_level())",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.split()
    assert "site-packages" in out[0], out
    assert out[1].endswith(".abi3.so"), out
    assert out[2] in {"scalar", "avx2", "avx512vnni"} or out[2], out
    assert shutil.which("cargo") is None and shutil.which("rustc") is None


def test_generate_from_the_command_line() -> None:
    r = subprocess.run(
        [CLI, "generate", "--temperature", "0", "-n", "8", "The capital of France is"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout


SAVE = """
import sys
from oxillama import Engine, SamplerConfig
e = Engine(sampler=SamplerConfig(temperature=0.9, seed=7))
e.generate("Once upon a time", 12)
e.snapshot(sys.argv[1])
print(e.generate("", 24).text, end="")
"""

RESTORE = """
import sys
from oxillama import Engine
e = Engine.restore(sys.argv[1])
print(e.generate("", 24).text, end="")
"""


def test_snapshot_round_trip_across_processes(tmp_path: Path) -> None:
    """A sampled session saved in one process continues, token for token,
    in another."""
    snap = str(tmp_path / "s.oxisnap")
    first = subprocess.run(
        [PY, "-c", SAVE, snap], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    second = subprocess.run(
        [PY, "-c", RESTORE, snap], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    assert first and first == second


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        [CLI, "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise AssertionError(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_answers_the_openai_client(server: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
    )
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in {"stop", "length"}
    assert r.usage is not None and r.usage.completion_tokens > 0


def test_an_embedding() -> None:
    """MiniLM, converted to GGUF by the caller (OXILLAMA_SMOKE_EMBEDDER)."""
    path = os.environ["OXILLAMA_SMOKE_EMBEDDER"]
    code = (
        "import sys, json; from oxillama import Engine; "
        "e = Engine(sys.argv[1]); v = e.embed(['a cat', 'a kitten', 'tax law']); "
        "print(json.dumps([list(map(float, x)) for x in v]))"
    )
    out = subprocess.run(
        [PY, "-c", code, path], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    cat, kitten, tax = json.loads(out)
    dot = lambda a, b: sum(x * y for x, y in zip(a, b, strict=True))  # noqa: E731
    assert len(cat) == 384
    assert abs(dot(cat, cat) - 1) < 1e-3  # normalized
    assert dot(cat, kitten) > dot(cat, tax)
