"""Running the server (what ``oxillama serve`` calls)."""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Iterable, Mapping
from types import FrameType
from typing import Any

from oxillama.decoding.tool_calls import ToolFormat
from oxillama.model.model import Model
from oxillama.model.offload import OffloadPolicy
from oxillama.serving.http.app_spec import AppSpec
from oxillama.serving.http.auth import ENV_VAR
from oxillama.serving.http.limits import Limits
from oxillama.serving.http.malloc import pin_mmap_threshold

__all__ = ["run", "serve"]

log = logging.getLogger("oxillama.server")


def serve(
    model: str | Model | None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    threads: int | None = None,
    context_size: int = 2048,
    max_batch: int = 8,
    kv_pages: int | None = None,
    max_queue: int = 256,
    offload: OffloadPolicy | None = None,
    model_name: str | None = None,
    sessions_dir: str | os.PathLike[str] | None = None,
    api_keys: Iterable[str] = (),
    api_key_file: str | os.PathLike[str] | None = None,
    metrics_auth: bool = False,
    limits: Limits | None = None,
    loras: Mapping[str, str | os.PathLike[str]] | None = None,
    tool_format: ToolFormat | None = None,
    speculative: str | None = None,
    drain_seconds: float = 30.0,
    webui: bool = True,
    reranking: bool = False,
) -> None:
    """Runs the server until interrupted. The keys are ``api_keys``, the
    lines of ``api_key_file`` and ``$OXILLAMA_API_KEY`` together.

    SIGTERM (or SIGINT) drains: ``/ready`` answers 503 at once, no new
    connection is taken, the requests in flight finish (for at most
    ``drain_seconds``), every live session is saved to ``sessions_dir``,
    and the process exits 0. ``webui`` serves the chat page at ``/``;
    ``reranking`` serves ``/v1/rerank`` (a reranker model only)."""
    spec = AppSpec(
        model,
        threads=threads,
        context_size=context_size,
        max_batch=max_batch,
        kv_pages=kv_pages,
        max_queue=max_queue,
        offload=offload,
        model_name=model_name,
        sessions_dir=None if sessions_dir is None else os.fspath(sessions_dir),
        api_keys=tuple(api_keys),
        api_key_file=None if api_key_file is None else os.fspath(api_key_file),
        metrics_auth=metrics_auth,
        limits=limits or Limits(),
        loras=None if loras is None else {k: os.fspath(v) for k, v in loras.items()},
        tool_format=tool_format,
        speculative=speculative,
        webui=webui,
        reranking=reranking,
    )
    run(spec, host=host, port=port, drain_seconds=drain_seconds)


def run(spec: AppSpec, *, host: str, port: int, drain_seconds: float) -> None:
    """Serves ``spec``'s app until a stop signal (see :func:`serve`)."""
    import uvicorn

    pin_mmap_threshold()
    keys = spec.keys()
    app = spec.build(keys)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    if keys:
        # How many, never which.
        log.info("API keys: %d accepted; /v1/* needs 'Authorization: Bearer <key>'", len(keys))
    elif host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "serving on %s with no API key: anyone who reaches it can use it "
            "(--api-key, --api-key-file or $%s)",
            host,
            ENV_VAR,
        )
    if spec.webui:
        log.info("chat page: http://%s:%d/", host, port)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        # The access log is ours (server/access_log.py: JSON lines, ids).
        access_log=False,
        timeout_graceful_shutdown=max(0, math.ceil(drain_seconds)),
    )
    _draining(uvicorn.Server, app.state.server)(config).run()


def _draining(base: type[Any], app_server: Any) -> type[Any]:
    """uvicorn's server class, telling the app the moment a stop signal
    arrives (uvicorn itself tells it only after the requests in flight are
    done, in the lifespan's shutdown)."""

    class Draining(base):  # type: ignore[misc]
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            app_server.draining = True
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:
                # uvicorn raises captured signals again once it has shut
                # down; a drained SIGTERM is a clean stop, exit status 0.
                captured = getattr(self, "_captured_signals", None)
                if isinstance(captured, list) and sig in captured:
                    captured.remove(sig)

    return Draining
