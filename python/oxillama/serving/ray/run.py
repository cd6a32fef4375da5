"""``oxillama serve --ray``: the deployment on a Ray cluster (a local one
unless ``--ray-address`` or ``$RAY_ADDRESS`` names one), until SIGTERM or
Ctrl-C, which stop the replicas gracefully (each drains and saves its
live sessions) and exit 0. A local cluster listens on 127.0.0.1 only,
unless ``--host`` is another interface (:func:`init_ray`)."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import ray
from ray import serve
from ray._private import ray_constants

from oxillama.serving.http.app_spec import AppSpec
from oxillama.serving.ray.deployment import deployment
from oxillama.serving.ray.options import RayOptions

__all__ = ["init_ray", "run_on_ray"]

log = logging.getLogger("oxillama.serving")


def run_on_ray(
    spec: AppSpec, options: RayOptions, *, host: str, port: int, address: str | None
) -> int:
    application = deployment(spec, options)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    init_ray(address, host, logging_level=logging.WARNING)
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


def init_ray(address: str | None, host: str, **kwargs: Any) -> None:
    """``ray.init(address, **kwargs)``. Where that starts a local cluster
    (no ``address``, no ``$RAY_ADDRESS``) and ``host``, where the Serve
    proxy listens, is a loopback address, the cluster's node address is
    127.0.0.1: its GCS, raylet, agents and workers (the replicas and their
    metrics endpoints among them) then listen on 127.0.0.1 only, where by
    default they listen on every interface or the machine's address."""
    target = address or os.environ.get("RAY_ADDRESS") or "local"
    if target != "local" or not _is_loopback(host):
        ray.init(address=address, **kwargs)
        return
    with _single_node():
        ray.init(address=address, _node_ip_address="127.0.0.1", **kwargs)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to


@contextlib.contextmanager
def _single_node() -> Iterator[None]:
    """Ray's switch for clusters of several nodes, off while ``ray.init``
    starts one: it turns the node address 127.0.0.1 into the machine's
    (``resolve_ip_for_localhost``), and the GCS, raylet and workers bind
    127.0.0.1 only when that is their node address (every interface
    otherwise). Ray reads the switch from the environment at import, so
    this process's copy is turned off too; the processes ``ray.init``
    starts inherit the environment, and the raylet passes it to the
    workers it starts later."""
    name = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    saved = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[name] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved[0]
        ray_constants.ENABLE_RAY_CLUSTER = saved[1]
