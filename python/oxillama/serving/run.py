"""``oxillama serve --ray``: the deployment on a Ray cluster (a local one
unless ``--ray-address`` or ``$RAY_ADDRESS`` names one), until SIGTERM or
Ctrl-C, which stop the replicas gracefully (each drains and saves its
live sessions) and exit 0."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import ray
from ray import serve

from ..server.app_spec import AppSpec
from .options import RayOptions
from .ray import deployment

__all__ = ["run_on_ray"]

log = logging.getLogger("oxillama.serving")


def run_on_ray(
    spec: AppSpec, options: RayOptions, *, host: str, port: int, address: str | None
) -> int:
    application = deployment(spec, options)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    ray.init(address=address, logging_level=logging.WARNING)
    stop = threading.Event()

    def on_signal(sig: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application, name=options.name, route_prefix="/")
        log.info(
            "Ray Serve: %s on http://%s:%d, sessions in %s",
            options.name,
            host,
            port,
            spec.sessions_dir,
        )
        while not stop.wait(0.5):
            pass
        log.info("stopping: the replicas drain (up to %.0f s)", options.drain_seconds)
        serve.delete(options.name)
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
