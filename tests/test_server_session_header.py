"""A session named by the ``X-Session-Id`` header (what a router in front
of several replicas sees) is the same session as one named by the body's
``session``; the two must agree, and behind a header-routing deployment
the header is required."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from oxillama import AsyncEngine
from oxillama.server import build_app

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


def test_a_header_routed_deployment_requires_the_header(engine: AsyncEngine) -> None:
    with TestClient(build_app(engine, require_session_header=True)) as c:
        r = _post(c, {**FIRST, "session": "s"})
        assert r.status_code == 400
        assert "X-Session-Id: s" in r.json()["error"]["message"]
        assert _post(c, FIRST, "s").status_code == 200
        # Requests without a session need no header.
        assert _post(c, FIRST).status_code == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert c.post("/v1/chat/completions", json={**chat, "session": "c"}).status_code == 400
        ok = c.post("/v1/chat/completions", json=chat, headers={"X-Session-Id": "c"})
        assert ok.status_code == 200, ok.text
