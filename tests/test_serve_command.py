"""`oxillama serve` as a user runs it: keys from --api-key, --api-key-file
and $OXILLAMA_API_KEY (never written to its log), --max-sessions with a
sessions folder, and a restarted process that continues the sessions the
previous one hibernated. `--help` teaches every safety flag."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

FLAG_KEY, FILE_KEY, ENV_KEY = "sk-flag-5a1f", "sk-file-77c2", "sk-env-0b9e"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def oxillama_serve(
    model_path: Path, tmp: Path, log: Path, stop: signal.Signals = signal.SIGINT
) -> Iterator[str]:
    keys = tmp / "keys.txt"
    keys.write_text(f"# one key per line\n\n{FILE_KEY}\n")
    port = _free_port()
    cmd = [sys.executable, "-m", "oxillama", "serve", "--model", str(model_path)]
    cmd += ["--port", str(port), "--threads", "1", "--context-size", "256", "--model-name", "smol"]
    cmd += ["--api-key", FLAG_KEY, "--api-key-file", str(keys)]
    cmd += ["--max-sessions", "1", "--sessions-dir", str(tmp / "sessions")]
    env = {**os.environ, "OXILLAMA_API_KEY": ENV_KEY}
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.05)
        yield url
    finally:
        proc.send_signal(stop)
        proc.wait(timeout=30)


def turn(url: str, key: str, sid: str, prompt: str, n: int) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    out = client.completions.create(
        model="smol",
        prompt=prompt,
        max_tokens=n,
        temperature=0,
        extra_body={"session": sid, "ignore_eos": True},
    )
    return out.choices[0].text


def test_keys_sessions_and_a_restart_after_sigkill_through_the_command(
    model_path: Path, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    # Killed, not stopped: what reached the folder before the kill must be enough.
    with oxillama_serve(model_path, tmp_path, log, stop=signal.SIGKILL) as url:
        with pytest.raises(openai.AuthenticationError):
            turn(url, "sk-wrong", "a", "Hi", 1)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "/v1/models")
        assert e.value.code == 401
        turn(url, FLAG_KEY, "kept", "The old lighthouse", 4)
        turn(url, FILE_KEY, "other", "Hello", 2)  # "kept" hibernates: the bound is 1
        save = urllib.request.Request(
            url + "/v1/sessions/other/save",
            method="POST",
            headers={"Authorization": f"Bearer {FILE_KEY}"},
        )
        assert urllib.request.urlopen(save).status == 200
    assert (tmp_path / "sessions" / "kept.oxisnap").is_file()
    with oxillama_serve(model_path, tmp_path, log) as url:
        turn(url, ENV_KEY, "ref", "The old lighthouse", 4)
        want = turn(url, ENV_KEY, "ref", " stood", 6)
        turn(url, ENV_KEY, "ref2", "Hello", 2)
        want2 = turn(url, ENV_KEY, "ref2", " there", 4)
        assert turn(url, ENV_KEY, "kept", " stood", 6) == want
        assert turn(url, ENV_KEY, "other", " there", 4) == want2
        metrics = urllib.request.urlopen(url + "/metrics").read().decode()
        assert 'oxillama:session_restores_total{reason="adopt"} 2.0' in metrics
    text = log.read_text()
    assert "API keys: 3 accepted" in text and "401" in text
    for key in (FLAG_KEY, FILE_KEY, ENV_KEY, "sk-wrong"):
        assert key not in text


def test_serve_help_teaches_every_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "oxillama", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for flag in (
        "OpenAI-compatible",
        "--port",
        "--max-batch",
        "--api-key",
        "--api-key-file",
        "--metrics-auth",
        "--max-body-bytes",
        "--max-json-depth",
        "--max-prompt-chars",
        "--max-stop",
        "--max-logit-bias",
        "--max-queue",
        "--max-sessions",
        "--speculative",
        "OXILLAMA_API_KEY",
        "413",
        "503",
    ):
        assert flag in out, flag
    assert "(default: 64)" in out
