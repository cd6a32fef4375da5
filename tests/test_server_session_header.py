"""A session named by the ``X-Session-Id`` header (what a router in front
of several replicas sees) is the same session as one named by the body's
``session``; the two must agree, and behind a header-routing deployment a
session named in the body only is served and counted (it lost affinity)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from oxillama import AsyncEngine
from oxillama.serving.http import build_app

FIRST = {"prompt": "The lighthouse keeper", "max_tokens": 6, "ignore_eos": True, "seed": 5}
SECOND = {**FIRST, "prompt": " Then,", "max_tokens": 6}


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[AsyncEngine]:
    e = AsyncEngine(model_path, context_size=256, threads=2, max_batch=2)
    yield e
    asyncio.run(e.close())


def _post(c: TestClient, body: dict[str, Any], sid: str | None = None) -> Any:
    headers = {} if sid is None else {"X-Session-Id": sid}
    return c.post("/v1/completions", json=body, headers=headers)


def _text(r: Any) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def test_header_and_body_name_the_same_session(engine: AsyncEngine) -> None:
    with TestClient(build_app(engine)) as c:
        by_body = [_text(_post(c, {**b, "session": "b"})) for b in (FIRST, SECOND)]
        by_header = [_text(_post(c, b, "h")) for b in (FIRST, SECOND)]
        mixed = [_text(_post(c, FIRST, "m")), _text(_post(c, {**SECOND, "session": "m"}))]
        agreeing = _text(_post(c, {**FIRST, "session": "a"}, "a"))
        fresh = _text(_post(c, SECOND))
    assert by_header == by_body == mixed
    assert agreeing == by_body[0]
    # The second turn continued the first (without it, the text differs).
    assert fresh != by_body[1]


def test_header_and_body_must_agree(engine: AsyncEngine) -> None:
    with TestClient(build_app(engine)) as c:
        r = _post(c, {**FIRST, "session": "one"}, "two")
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "session"
        assert "X-Session-Id" in r.json()["error"]["message"]
        bad = _post(c, FIRST, "not a valid id!")
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "session"


def _without_affinity(c: TestClient) -> float | None:
    for family in text_string_to_metric_families(c.get("/metrics").text):
        if family.name == "oxillama:session_requests_without_affinity":
            assert family.type == "counter"
            return float(family.samples[0].value)
    return None


def test_a_header_routed_deployment_counts_sessions_named_in_the_body(
    engine: AsyncEngine,
) -> None:
    """Behind a router that routes by the header, a session named only in
    the body is served as anywhere else (the router sent it where requests
    without a session go) and counted as a request without affinity."""
    with TestClient(build_app(engine, routed_by_session_header=True)) as c:
        assert _without_affinity(c) == 0
        by_body = [_text(_post(c, {**b, "session": "s"})) for b in (FIRST, SECOND)]
        assert _without_affinity(c) == 2
        by_header = [_text(_post(c, b, "h")) for b in (FIRST, SECOND)]
        agreeing = _text(_post(c, {**FIRST, "session": "a"}, "a"))
        _text(_post(c, FIRST))
        assert _without_affinity(c) == 2
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        ok = c.post("/v1/chat/completions", json={**chat, "session": "c"})
        assert ok.status_code == 200, ok.text
        assert _without_affinity(c) == 3
        differ = _post(c, {**FIRST, "session": "one"}, "two")
        assert differ.status_code == 400
        assert differ.json()["error"]["param"] == "session"
        assert _without_affinity(c) == 3
    assert by_body == by_header
    assert agreeing == by_body[0]


def test_a_lone_server_has_no_affinity_to_lose(engine: AsyncEngine) -> None:
    with TestClient(build_app(engine)) as c:
        _text(_post(c, {**FIRST, "session": "s"}))
        assert _without_affinity(c) is None
