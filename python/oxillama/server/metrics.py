"""``/metrics`` in Prometheus' text format, and the middleware counting
responses by status."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ResponseCounter", "render"]

#: Scheduler metrics that only ever grow (the rest are gauges). Their names
#: predate this list and stay as they are for existing dashboards.
SCHEDULER_COUNTERS = frozenset(
    {
        "prompt_tokens",
        "generated_tokens",
        "prefill_seconds",
        "decode_seconds",
        "decode_steps",
        "finished",
        "cancelled",
        "preempted",
        "shared_prompt_tokens",
        "session_turns",
        "session_decode_tokens",
        "mixed_decode_steps",
        "session_hibernations",
        "session_wakes",
        "session_swaps",
        "prefix_cache_hits",
        "prefix_cache_misses",
        "prefix_cache_hit_tokens",
        "offload_layer_loads",
        "offload_evictions",
        "offload_bytes_read",
        "offload_passes",
    }
)


class ResponseCounter:
    """Counts every response the app sends, by HTTP status (a bounded set
    of labels: statuses are three-digit numbers)."""

    def __init__(self, app: ASGIApp, by_status: collections.Counter[int]) -> None:
        self.app, self.by_status = app, by_status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.by_status[int(message["status"])] += 1
            await send(message)

        await self.app(scope, receive, counting)


def _number(v: float) -> str:
    return repr(float(v))


def render(
    scheduler: Mapping[str, float | int],
    server: Mapping[str, tuple[str, int]],
    responses: Mapping[int, int],
) -> str:
    """The text exposition: every metric with its ``# TYPE`` line."""
    lines: list[str] = []

    def add(name: str, kind: str, samples: Iterable[tuple[str, float]]) -> None:
        lines.append(f"# TYPE oxillama_{name} {kind}")
        lines.extend(f"oxillama_{name}{labels} {_number(v)}" for labels, v in samples)

    for k, v in scheduler.items():
        add(k, "counter" if k in SCHEDULER_COUNTERS else "gauge", [("", v)])
    for k, (kind, v) in server.items():
        add(k, kind, [("", v)])
    add(
        "http_responses_total",
        "counter",
        [(f'{{code="{code}"}}', n) for code, n in sorted(responses.items())],
    )
    return "\n".join(lines) + "\n"
