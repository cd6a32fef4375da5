"""Runs an app built by `oxillama.serving.http.build_app` on a free loopback port
in a background thread, for the tests that drive it over HTTP."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette

from oxillama import AsyncEngine
from oxillama.serving.http import build_app


@contextmanager
def serving(engine: AsyncEngine, model_name: str, **app_options: Any) -> Iterator[str]:
    """Yields the base URL once /health answers; stops the server and
    closes the engine afterwards. ``app_options`` go to ``build_app``."""
    with serving_app(build_app(engine, model_name=model_name, **app_options), engine) as url:
        yield url


@contextmanager
def serving_app(app: Starlette, engine: AsyncEngine) -> Iterator[str]:
    """:func:`serving` for an app built by the caller (who keeps it, e.g.
    to read ``app.state.server`` after the server stopped)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        asyncio.run(engine.close())
