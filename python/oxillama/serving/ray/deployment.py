"""The Ray Serve deployment: ``serve run oxillama.serving.ray:app
model=PATH sessions_dir=DIR replicas=2`` (every ``oxillama serve`` option
by its flag name, dashes or underscores), or ``oxillama serve --ray``.

Each replica is an :class:`~oxillama.AsyncEngine` behind the Starlette app
of ``oxillama serve`` (``serve.ingress``), so routes, validation, errors
and streaming are the same. Sessions are routed by ``X-Session-Id``
(:class:`SessionAffinityRouter`); a session named in the body only is
served too, routed as a request without a session, and counted
(``oxillama:session_requests_without_affinity_total``). Every session turn
ends with its snapshot in the shared sessions folder, so whichever replica
a turn reaches, and when a replica is lost, its next turn is exact."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ray.util
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oxillama.errors import ParameterError
from oxillama.model.model import Model
from oxillama.serving.http.app_spec import AppSpec
from oxillama.serving.ray.options import RayOptions
from oxillama.serving.ray.replica_metrics import ReplicaMetrics

__all__ = ["OxiLlamaReplica", "RayOptions", "app", "deployment"]

#: Imported by Ray where it routes (the proxy, every deployment handle).
_ROUTER = "oxillama.serving.ray.router.SessionAffinityRouter"


@serve.ingress()
class OxiLlamaReplica:
    """One replica: loads the model, builds the app, and serves its own
    metrics on a port of its own (every replica's counters, not whichever
    one the proxy picked)."""

    def __init__(self, spec: AppSpec, metrics_targets_dir: str | None = None) -> None:
        _internal_grpc_on_loopback()
        self._app = spec.build()
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self._metrics = ReplicaMetrics(
            self._app.state.server.metrics_exposition, self.replica, metrics_targets_dir
        )

    def __serve_build_asgi_app__(self) -> ASGIApp:
        return _Tagged(self._app, self.replica)

    def __del__(self) -> None:
        metrics = getattr(self, "_metrics", None)
        if metrics is not None:
            metrics.close()


def _internal_grpc_on_loopback() -> None:
    """On a node whose address is 127.0.0.1 (the local cluster of
    ``oxillama serve --ray``), this replica's gRPC server for calls from
    other deployments listens there too. Ray Serve binds it to every
    interface (``[::]:0``, with no setting to change it): the one port of
    such a cluster that would. Ray starts it after this ``__init__``."""
    from ray.serve._private import replica as internals

    bind = getattr(internals, "add_port_to_grpc_server", None)
    node = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    if bind is None or node != "127.0.0.1":
        return

    def on_loopback(server: Any, address: str) -> int:
        return int(bind(server, "127.0.0.1:0" if address == "[::]:0" else address))

    setattr(internals, "add_port_to_grpc_server", on_loopback)  # noqa: B010


class _Tagged:
    """Every response names the replica that made it (``X-Oxillama-Replica``):
    how a client, or a test, sees where its session lives. Ray's proxy
    forwards its ``X-Request-Id`` (the client's, or one it made) and sets
    it on the response itself, so the app's echo of it is dropped."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app, self.header = app, (b"x-oxillama-replica", replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"]
                message = {**message, "headers": [*kept, self.header]}
            await send(message)

        await self.app(scope, receive, tagged)


def deployment(spec: AppSpec, options: RayOptions | None = None) -> Application:
    """The application ``serve.run`` takes: ``spec``'s server on every
    replica, sessions routed by ``X-Session-Id``, every session turn saved
    to ``spec.sessions_dir`` (which every replica must see: a shared
    volume on a cluster)."""
    options = options or RayOptions()
    if isinstance(spec.model, Model):
        raise ParameterError("a Ray deployment takes the model's path (or hf), not a loaded Model")
    if spec.sessions_dir is None:
        raise ParameterError(
            "a Ray deployment needs a sessions folder every replica shares (sessions_dir): "
            "it is where a session survives the loss of its replica"
        )
    spec = dataclasses.replace(
        spec,
        threads=spec.threads or max(1, int(options.replica_cpus)),
        limits=dataclasses.replace(spec.limits, persist_turns=True),
        routed_by_session_header=True,
    )
    targets = options.metrics_targets_dir or f"{spec.sessions_dir}/metrics-targets"
    scaling = options.autoscaling()
    replicas: dict[str, Any] = (
        {"autoscaling_config": scaling}
        if scaling is not None
        else {"num_replicas": options.replicas}
    )
    make = serve.deployment(
        name=options.name,
        max_ongoing_requests=options.max_ongoing_requests or 2 * spec.max_batch,
        graceful_shutdown_timeout_s=options.drain_seconds,
        # Ray's pydantic model declares the field loosely; a dotted path is
        # what its docs pass.
        request_router_config=RequestRouterConfig(request_router_class=_ROUTER),  # type: ignore[arg-type]
        ray_actor_options={"num_cpus": options.replica_cpus},
        **replicas,
    )
    application: Application = make(OxiLlamaReplica).bind(spec, targets)
    return application


def app(args: Mapping[str, Any]) -> Application:
    """``serve run oxillama.serving.ray:app key=value ...``: the keys are
    ``oxillama serve``'s flags (``model``, ``sessions_dir``, ``replicas``,
    ``max_replicas``, ``context_size``, ...), checked and defaulted by the
    same parser."""
    from oxillama.serving.flags import serve_options_from_mapping

    spec, options = serve_options_from_mapping(args)
    return deployment(spec, options)
