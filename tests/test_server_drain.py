"""Graceful drain and readiness: SIGTERM during 4 streaming requests lets
all 4 finish, saves the live sessions to the sessions folder and exits 0
within the deadline; ``/ready`` answers 503 while draining, ``/health``
stays 200."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from oxillama import AsyncEngine, Engine
from oxillama.serving.http import build_app

DRAIN_SECONDS = 30
TOKENS = 40


def test_ready_turns_503_while_draining_and_health_stays(model_path: Path) -> None:
    engine = AsyncEngine(model_path, context_size=256, threads=2, max_batch=2)
    app = build_app(engine, model_name="smollm2")

    async def probe() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            assert (await c.get("/ready")).json() == {"status": "ready"}
            app.state.server.draining = True
            r = await c.get("/ready")
            assert r.status_code == 503 and r.json()["error"]["code"] == "draining"
            assert "retry-after" in r.headers
            assert (await c.get("/health")).status_code == 200
        await engine.close()

    asyncio.run(probe())


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigterm_finishes_streams_saves_sessions_and_exits_0(tmp_path: Path) -> None:
    folder = tmp_path / "sessions"
    folder.mkdir()
    port = _port()
    cmd = [sys.executable, "-m", "oxillama", "serve", "--port", str(port), "--threads", "2"]
    cmd += ["--context-size", "512", "--max-batch", "4", "--sessions-dir", str(folder)]
    cmd += ["--drain-seconds", str(DRAIN_SECONDS)]
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        turn = {"prompt": "Hello there,", "max_tokens": 4, "temperature": 0, "session": "kept"}
        assert httpx.post(url + "/v1/completions", json=turn, timeout=60).status_code == 200

        started = threading.Barrier(5)
        results: list[list[dict[str, object]] | None] = [None] * 4

        def stream(i: int) -> None:
            body = {
                "prompt": f"Story {i}:",
                "max_tokens": TOKENS,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
            events: list[dict[str, object]] = []
            done = False
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if not events and not done:
                        started.wait(timeout=60)
                    if line == "data: [DONE]":
                        done = True
                        continue
                    events.append(json.loads(line[6:]))
            results[i] = events if done else None

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        started.wait(timeout=60)  # every stream has its first event
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=DRAIN_SECONDS + 30)
        code = proc.wait(timeout=DRAIN_SECONDS + 30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    server_log = (tmp_path / "server.log").read_text(errors="replace")
    assert code == 0, server_log[-3000:]
    assert took < DRAIN_SECONDS + 10
    for events in results:
        assert events is not None, "a stream did not finish"
        text = "".join(str(e["choices"][0]["text"]) for e in events)  # type: ignore[index]
        finishes = [e["choices"][0]["finish_reason"] for e in events]  # type: ignore[index]
        assert finishes[-1] == "length" and text
    # The live session went to the folder, and it continues from there.
    saved = folder / "kept.oxisnap"
    assert saved.exists(), server_log[-3000:]
    assert Engine.restore(saved).n_past > 0
    assert "drained: 1 live session(s) saved" in server_log
