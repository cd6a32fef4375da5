"""Each Ray Serve replica's ``/metrics`` on a port of its own.

Through the proxy, ``/metrics`` reaches whichever replica the router
picks; Prometheus needs every replica. Each one serves its exposition on
an ephemeral port and writes a ``file_sd`` target file naming it, which a
Prometheus ``file_sd_configs`` entry watches (docs/deploy.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["ReplicaMetrics"]

log = logging.getLogger("oxillama.serving")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ReplicaMetrics:
    """Serves ``exposition()`` at ``http://<node ip>:<port>/metrics``; with
    ``targets_dir``, writes ``<targets_dir>/<replica>.json`` for
    Prometheus and removes it on :meth:`close`. The exposition runs on the
    event loop that created this object (where the engine's state
    changes), never on the HTTP thread."""

    def __init__(
        self,
        exposition: Callable[[], bytes],
        replica: str,
        targets_dir: str | os.PathLike[str] | None,
        host: str | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()

        async def scrape() -> bytes:
            return exposition()

        self.host = host or _node_ip()
        self._http = ThreadingHTTPServer((self.host, 0), _handler(scrape, loop))
        self._http.daemon_threads = True
        self.port = int(self._http.server_address[1])
        self.url = f"http://{self.host}:{self.port}/metrics"
        threading.Thread(
            target=self._http.serve_forever, name="oxillama-metrics", daemon=True
        ).start()
        self.target: Path | None = None
        if targets_dir is not None:
            self.target = Path(targets_dir) / f"{replica}.json"
            _write_atomic(
                self.target,
                json.dumps(
                    [{"targets": [f"{self.host}:{self.port}"], "labels": {"replica": replica}}]
                ),
            )
        log.info("replica %s metrics at %s", replica, self.url)

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        if self.target is not None:
            self.target.unlink(missing_ok=True)


def _handler(
    scrape: Callable[[], Coroutine[Any, Any, bytes]], loop: asyncio.AbstractEventLoop
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            try:
                body = asyncio.run_coroutine_threadsafe(scrape(), loop).result(timeout=10)
            except Exception:
                log.exception("metrics scrape failed")
                self.send_error(500)
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every few seconds; not worth a log line each

    return Handler


def _node_ip() -> str:
    try:
        import ray.util

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    except Exception:
        return "127.0.0.1"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
