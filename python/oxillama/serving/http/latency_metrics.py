"""Per-request latency histograms, completed requests by finish reason
and HTTP requests by route and status for ``/metrics``, kept by
``prometheus_client`` in the app's registry (vLLM's names, with the prefix
``oxillama:``): time to first token, inter-token latency, end-to-end
latency, queue time and prompt length. The scheduler reports each
completed request's times (``Scheduler.add_observer``)."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Histogram

from oxillama.serving.scheduler import RequestTimes, Scheduler

__all__ = ["LatencyMetrics", "route_label"]

#: Seconds: from a few milliseconds (a cached prompt, a small model) to
#: minutes (a long generation on a loaded CPU).
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_GAP = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_PROMPT = (1, 8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768)
#: Route labels are the app's route templates (a bounded set): a session
#: id never becomes a label value, and unknown paths are "other".
_ROUTES = frozenset(
    {
        "/health",
        "/ready",
        "/metrics",
        "/openapi.json",
        "/v1/models",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/messages",
        "/v1/messages/count_tokens",
    }
)
_SESSION_ROUTE = re.compile(r"/v1/sessions/[^/]+/(save|restore)")


def route_label(path: str) -> str:
    if path in _ROUTES:
        return path
    m = _SESSION_ROUTE.fullmatch(path)
    return f"/v1/sessions/{{sid}}/{m.group(1)}" if m else "other"


class LatencyMetrics:
    def __init__(self, scheduler: Scheduler, registry: CollectorRegistry) -> None:
        self.registry = registry

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, buckets=buckets, registry=self.registry)

        self.ttft = hist(
            "oxillama:time_to_first_token_seconds",
            "Arrival of a request to its first generated token.",
            _LATENCY,
        )
        self.itl = hist(
            "oxillama:inter_token_latency_seconds",
            "Mean time between a request's generated tokens.",
            _TOKEN_GAP,
        )
        self.e2e = hist(
            "oxillama:e2e_request_latency_seconds",
            "Arrival of a request to its completion.",
            _LATENCY,
        )
        self.queue = hist(
            "oxillama:request_queue_time_seconds",
            "Arrival of a request to the first work done for it.",
            _LATENCY,
        )
        self.prompt = hist(
            "oxillama:request_prompt_tokens", "Prompt length of a request, in tokens.", _PROMPT
        )
        self.success = Counter(
            "oxillama:request_success",
            "Generation requests completed, by finish reason as the API reports it.",
            ["finished_reason"],
            registry=self.registry,
        )
        for reason in ("stop", "length"):
            self.success.labels(finished_reason=reason)
        self.requests = Counter(
            "oxillama:http_requests",
            "HTTP requests answered, by route template and status.",
            ["route", "status"],
            registry=self.registry,
        )
        scheduler.add_observer(self.observe)

    def count_request(self, path: str, status: int) -> None:
        self.requests.labels(route=route_label(path), status=str(status)).inc()

    def observe(self, t: RequestTimes) -> None:
        self.e2e.observe(t.e2e_seconds)
        self.queue.observe(t.queue_seconds)
        self.prompt.observe(t.prompt_tokens)
        # OpenAI (and vLLM) have no "eos": the model ending its turn is a "stop".
        self.success.labels(
            finished_reason="length" if t.finish_reason == "length" else "stop"
        ).inc()
        if t.first_token_seconds is not None:
            self.ttft.observe(t.first_token_seconds)
        if t.inter_token_seconds is not None:
            self.itl.observe(t.inter_token_seconds)
