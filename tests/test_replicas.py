"""Several `oxillama serve` processes behind nginx (Debian's package, on
loopback) sharing one sessions folder: a session saved on one replica is
restored on the other and continues with exactly the tokens it would have
produced on the first."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


NGINX = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream replicas {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; }}
    server {{
        listen 127.0.0.1:{port};
        proxy_buffering off;
        location /a/ {{ proxy_pass http://127.0.0.1:{a}/; }}
        location /b/ {{ proxy_pass http://127.0.0.1:{b}/; }}
        location / {{ proxy_pass http://replicas; }}
    }}
}}
"""


@pytest.fixture(scope="module")
def lb(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[str]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    assert Path(nginx).exists(), "nginx is required: apt-get install nginx-light"
    tmp = tmp_path_factory.mktemp("replicas")
    shared = tmp / "sessions"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ports = [_free_port(), _free_port()]
        for p in ports:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "oxillama",
                        "serve",
                        "--model",
                        str(model_path),
                        "--port",
                        str(p),
                        "--threads",
                        "1",
                        "--context-size",
                        "512",
                        "--sessions-dir",
                        str(shared),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for p, proc in zip(ports, procs, strict=True):
            _wait(f"http://127.0.0.1:{p}/health", proc)
        port = _free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(NGINX.format(tmp=tmp, a=ports[0], b=ports[1], port=port))
        procs.append(subprocess.Popen([nginx, "-c", str(conf), "-p", str(tmp)]))
        _wait(f"http://127.0.0.1:{port}/health", procs[-1])
        yield f"http://127.0.0.1:{port}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        out: dict[str, object] = json.loads(r.read())
        return out


def text(resp: dict[str, object]) -> str:
    choices = resp["choices"]
    assert isinstance(choices, list)
    return str(choices[0]["text"])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_session_moves_between_replicas_and_continues_exactly(lb: str, temperature: float) -> None:
    first = {
        "prompt": "The lighthouse keeper",
        "max_tokens": 12,
        "temperature": temperature,
        "seed": 5,
        "ignore_eos": True,
    }
    second = {**first, "prompt": " Then,", "max_tokens": 16}
    tag = str(temperature).replace(".", "")
    # Uninterrupted, on replica a.
    post(lb + "/a/v1/completions", {**first, "session": f"stay{tag}"})
    want = text(post(lb + "/a/v1/completions", {**second, "session": f"stay{tag}"}))
    # Saved on a, restored on b, continued on b.
    post(lb + "/a/v1/completions", {**first, "session": f"move{tag}"})
    saved = post(lb + f"/a/v1/sessions/move{tag}/save", {})
    assert int(str(saved["tokens"])) > 12
    restored = post(lb + f"/b/v1/sessions/move{tag}/restore", {})
    assert restored["tokens"] == saved["tokens"]
    got = text(post(lb + "/b/v1/completions", {**second, "session": f"move{tag}"}))
    assert got == want


def test_round_robin_and_session_errors(lb: str) -> None:
    names = {
        json.loads(urllib.request.urlopen(lb + "/v1/models").read())["data"][0]["id"]
        for _ in range(4)
    }
    assert len(names) == 1  # both replicas serve the same model
    with pytest.raises(urllib.error.HTTPError) as e:
        post(lb + "/b/v1/sessions/nothere/restore", {})
    assert e.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as e:
        post(lb + "/a/v1/sessions/bad%20id/save", {})
    assert e.value.code == 400


def test_stateful_session_streams(lb: str) -> None:
    body = {
        "prompt": "Once upon a time",
        "max_tokens": 10,
        "temperature": 0,
        "session": "st",
        "stream": True,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        lb + "/a/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    chunks = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                chunks.append(json.loads(line[6:]))
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    plain = post(lb + "/a/v1/completions", {**body, "stream": False, "session": "st2"})
    assert streamed == text(plain)
