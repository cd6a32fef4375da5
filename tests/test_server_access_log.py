"""Request ids and the JSON access log (server/access_log.py): a client's
``X-Request-Id`` is echoed, a missing or malformed one replaced by a fresh
id; one JSON line per request with the id, route, status, latency, tokens
and session; neither prompts nor keys are ever logged."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from oxillama import AsyncEngine
from tests._serve import serving

PROMPT = "The secret prompt text is"
KEY = "sk-access-log-test-key"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def served(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, _Lines]]:
    logger = logging.getLogger("oxillama.access")
    handler = _Lines()
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    engine = AsyncEngine(model_path, context_size=256, threads=2, max_batch=4)
    folder = tmp_path_factory.mktemp("sessions")
    try:
        with serving(engine, "smollm2", api_keys=[KEY], sessions_dir=folder) as url:
            yield url, handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def _records(handler: _Lines) -> list[dict[str, object]]:
    return [json.loads(line) for line in handler.lines]


def test_ids_are_echoed_or_made(served: tuple[str, _Lines]) -> None:
    url, handler = served
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.get(url + "/health", headers={"X-Request-Id": "trace-42.a:b"})
    assert r.headers["x-request-id"] == "trace-42.a:b"
    made = httpx.get(url + "/health").headers["x-request-id"]
    assert len(made) == 32 and int(made, 16) >= 0
    for bad in ("has space", "x" * 129, "ünïcode"):
        got = httpx.get(url + "/health", headers={"X-Request-Id": bad.encode()})
        assert got.headers["x-request-id"] != bad and len(got.headers["x-request-id"]) == 32
    # Errors carry it too (here: no key).
    r = httpx.post(url + "/v1/completions", json={"prompt": "x"}, headers={"X-Request-Id": "e1"})
    assert r.status_code == 401 and r.headers["x-request-id"] == "e1"
    r = httpx.post(
        url + "/v1/completions",
        json={"prompt": "x", "max_tokens": 2},
        headers={**auth, "X-Request-Id": "ok1"},
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == "ok1"
    assert {"e1", "ok1", "trace-42.a:b", made} <= {rec["id"] for rec in _records(handler)}


def test_one_json_line_per_request_with_tokens_and_session(served: tuple[str, _Lines]) -> None:
    url, handler = served
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, headers={**auth, "X-Request-Id": "plain"})
    usage = r.json()["usage"]
    stream = {**body, "stream": True}
    with httpx.stream(
        "POST", url + "/v1/completions", json=stream, headers={**auth, "X-Request-Id": "streamed"}
    ) as s:
        for _ in s.iter_lines():
            pass
    turn = {**body, "session": "chat-7"}
    r = httpx.post(url + "/v1/completions", json=turn, headers={**auth, "X-Request-Id": "turn"})
    assert r.status_code == 200, r.text
    by_id = {rec["id"]: rec for rec in _records(handler)}
    plain, streamed, sess = by_id["plain"], by_id["streamed"], by_id["turn"]
    assert plain["method"] == "POST" and plain["path"] == "/v1/completions"
    assert plain["status"] == 200 and isinstance(plain["latency_ms"], float)
    assert plain["prompt_tokens"] == usage["prompt_tokens"]
    assert plain["completion_tokens"] == usage["completion_tokens"] == 5
    assert streamed["status"] == 200 and streamed["completion_tokens"] == 5
    assert sess["session"] == "chat-7" and "session" not in plain
    # Neither the prompt nor the key is ever written.
    text = "\n".join(handler.lines)
    assert PROMPT not in text and KEY not in text
    assert all(set(rec) <= ACCESS_FIELDS for rec in _records(handler))


ACCESS_FIELDS = {
    "id",
    "method",
    "path",
    "status",
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "session",
}
