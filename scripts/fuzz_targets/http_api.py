"""http: schemathesis against the server's own `/openapi.json`, one
generated request (valid and invalid data alike, over every route) per
input, on a real `oxillama serve` with SmolLM2, an API key, a sessions
folder and small limits so a request costs little.

Counted as a crash: a 5xx other than 503, a dropped connection (the server
process is restarted), or a `/v1` error answer not in OpenAI's error shape.
Any other 4xx, and 503, is a typed error answer."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from hypothesis import strategies as st

from oxillama import OxiLlamaError

from . import JsonTarget

KEY = "fuzz-key"
CONTEXT = 48
SERVE = [
    "--context-size",
    str(CONTEXT),
    "--threads",
    "1",
    "--api-key",
    KEY,
    "--max-sessions",
    "4",
    "--max-batch",
    "2",
]
SERVE_CMD = [sys.executable, "-m", "oxillama", "serve"]
HEADER_DROPPED = {"X-Schemathesis-TestCaseId", "User-Agent"}


class ErrorAnswer(OxiLlamaError):
    """A well-formed error answer (4xx, or 503), the HTTP typed error."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpTarget(JsonTarget):
    name = "http"

    def setup(self, workdir: Path) -> None:
        import schemathesis
        from schemathesis import GenerationMode
        from schemathesis.core.result import Err

        self.workdir = workdir
        self.start_server()
        schema = schemathesis.openapi.from_url(self.url + "/openapi.json")
        cases = []
        for op in schema.get_all_operations():
            if isinstance(op, Err):
                raise RuntimeError(f"/openapi.json has an invalid operation: {op.err()}")
            cases += [op.ok().as_strategy(generation_mode=mode) for mode in GenerationMode]
        self.strategy = st.tuples(
            st.one_of(cases).map(self._request),
            st.sampled_from(["key"] * 8 + ["none", "wrong"]),
        ).map(lambda t: {**t[0], "auth": t[1]})
        self.http = requests.Session()

    def start_server(self) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        sessions = self.workdir / "sessions"
        sessions.mkdir(exist_ok=True)
        # Same process group as the worker: the driver's kill ends both.
        self.server = subprocess.Popen(
            [*SERVE_CMD, "--port", str(port), "--sessions-dir", str(sessions), *SERVE],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                requests.get(self.url + "/health", timeout=1)
                return
            except requests.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError("oxillama serve did not come up in 120 s")

    def close(self) -> None:
        self.server.kill()
        self.server.wait()

    @staticmethod
    def _request(case: Any) -> dict[str, Any]:
        kw = case.as_transport_kwargs()
        url = urlsplit(kw["url"])
        out: dict[str, Any] = {
            "method": kw["method"],
            "path": url.path + (f"?{url.query}" if url.query else ""),
            "query": kw.get("params") or {},
            "headers": {k: v for k, v in kw["headers"].items() if k not in HEADER_DROPPED},
        }
        if "json" in kw:
            out["json"] = kw["json"]
        elif kw.get("data") is not None:
            data = kw["data"]
            out["data"] = (data if isinstance(data, bytes) else str(data).encode()).hex()
        return out

    def run(self, value: Any) -> None:
        headers = dict(value["headers"])
        if value["auth"] == "key":
            headers["Authorization"] = f"Bearer {KEY}"
        elif value["auth"] == "wrong":
            headers["Authorization"] = "Bearer not-the-key"
        kw: dict[str, Any] = {"json": value["json"]} if "json" in value else {}
        if "data" in value:
            kw["data"] = bytes.fromhex(value["data"])
        try:
            r = self.http.request(
                value["method"],
                self.url + value["path"],
                params=value["query"],
                headers=headers,
                timeout=30,
                **kw,
            )
        except requests.ConnectionError as e:
            if self.server.poll() is not None:
                code = self.server.returncode
                self.start_server()
                raise AssertionError(f"the server died (status {code})") from e
            raise
        path = value["path"].split("?")[0]
        # Server-side statuses a route answers by design: 503 (busy), 501
        # from the rerank routes of a server started without --reranking
        # (as llama-server answers), 529 from /v1/messages when full
        # (Anthropic's overloaded_error).
        designed = (
            r.status_code == 503
            or (r.status_code == 501 and path in ("/v1/rerank", "/rerank"))
            or (r.status_code == 529 and path.startswith("/v1/messages"))
        )
        if r.status_code >= 500 and not designed:
            raise AssertionError(f"{r.status_code} answer: {r.text[:500]}")
        if r.status_code >= 400:
            if value["path"].startswith("/v1"):
                try:
                    err = r.json()["error"]
                    assert isinstance(err["message"], str) and isinstance(err["type"], str)
                except (ValueError, KeyError, TypeError, AssertionError) as e:
                    raise AssertionError(
                        f"{r.status_code} answer not in OpenAI's error shape: {r.text[:300]}"
                    ) from e
            raise ErrorAnswer(str(r.status_code))


TARGETS = {"http": HttpTarget}
