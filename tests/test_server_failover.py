"""Two `oxillama serve --persist-turns` replicas sharing a sessions folder:
a session's turns may land on either, and when one replica is killed its
sessions continue on the other with exactly the tokens one server alone
gives (greedy and seeded)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

TURNS = [" Tell me about the sea.", " And the mountains?", " Which is older?"]
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 10}
SEEDED: dict[str, Any] = {"temperature": 0.9, "seed": 7, "max_tokens": 10}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(folder: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    cmd = [sys.executable, "-m", "oxillama", "serve", "--port", str(port), "--threads", "1"]
    cmd += ["--context-size", "512", "--sessions-dir", str(folder), "--persist-turns"]
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(900):
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(log.read_text(errors="replace")[-3000:])


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    folder = tmp_path / "store"
    folder.mkdir()
    reps = [_start(folder, tmp_path / f"replica-{i}.log") for i in range(2)]
    try:
        yield reps
    finally:
        for proc, _ in reps:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in reps:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _turn(url: str, sid: str, i: int, sampling: dict[str, Any]) -> str:
    body = {"prompt": TURNS[i], "session": sid, **sampling}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def test_turns_move_between_replicas_and_survive_a_killed_one(
    replicas: list[tuple[subprocess.Popen[bytes], str]],
) -> None:
    (proc_a, a), (_, b) = replicas
    for name, sampling in (("greedy", GREEDY), ("seeded", SEEDED)):
        # The reference: one server takes all three turns.
        want = [_turn(a, f"ref-{name}", i, sampling) for i in range(3)]
        # Turns alternate: each replica reads the other's newer file.
        got = [_turn(url, f"moving-{name}", i, sampling) for i, url in enumerate((b, a, b))]
        assert got == want, name
        # Two turns on A, A killed (no drain, no save of its own), the
        # third on B.
        _turn(a, f"lost-{name}", 0, sampling)
        _turn(a, f"lost-{name}", 1, sampling)
        if name == "seeded":
            proc_a.send_signal(signal.SIGKILL)
            proc_a.wait(timeout=30)
            assert _turn(b, f"lost-{name}", 2, sampling) == want[2]
        else:
            assert _turn(b, f"lost-{name}", 2, sampling) == want[2]
    metrics = httpx.get(b + "/metrics").text
    saves = [
        ln
        for ln in metrics.splitlines()
        if ln.startswith('oxillama:session_saves_total{reason="turn"}')
    ]
    assert saves and float(saves[0].split()[-1]) >= 4
