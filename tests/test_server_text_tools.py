"""llama-server's ``/tokenize``, ``/detokenize`` and ``/apply-template``
in its shapes: what tools that count and render before generating call."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from oxillama import AsyncEngine
from oxillama.serving.http import build_app

TEXT = "Hello <|im_start|> world, café"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[AsyncEngine]:
    e = AsyncEngine(model_path, context_size=256, threads=2, max_batch=2)
    yield e
    asyncio.run(e.close())


@pytest.fixture(scope="module")
def client(engine: AsyncEngine) -> Iterator[TestClient]:
    with TestClient(build_app(engine)) as c:
        yield c


def _ok(r: Any) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


def test_tokenize_and_detokenize_round_trip(engine: AsyncEngine, client: TestClient) -> None:
    ids = _ok(client.post("/tokenize", json={"content": TEXT}))["tokens"]
    assert ids == engine.engine.tokenize(TEXT)
    # Special-token text is read as the token unless parse_special is false.
    special = engine.engine.tokenize("<|im_start|>")
    assert len(special) == 1 and special[0] in ids
    plain = _ok(client.post("/tokenize", json={"content": TEXT, "parse_special": False}))
    assert special[0] not in plain["tokens"]
    assert _ok(client.post("/detokenize", json={"tokens": ids}))["content"] == TEXT


def test_tokenize_with_pieces_and_add_special(engine: AsyncEngine, client: TestClient) -> None:
    got = _ok(client.post("/tokenize", json={"content": "café", "with_pieces": True}))["tokens"]
    ids = engine.engine.tokenize("café")
    assert [t["id"] for t in got] == ids
    joined = b"".join(
        p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in got
    )
    assert joined.decode() == "café"
    with_bos = _ok(client.post("/tokenize", json={"content": "hi", "add_special": True}))
    assert with_bos["tokens"] == engine.engine.tokenize("hi", add_special=True)


def test_apply_template_is_the_chat_endpoints_prompt(
    engine: AsyncEngine, client: TestClient
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = _ok(client.post("/apply-template", json={"messages": messages}))["prompt"]
    assert prompt == engine.engine.apply_chat_template(messages)
    assert prompt.endswith("<|im_start|>assistant\n")
    bare = _ok(
        client.post("/apply-template", json={"messages": messages, "add_generation_prompt": False})
    )["prompt"]
    assert prompt.startswith(bare) and not bare.endswith("assistant\n")
    # With tools, as the chat endpoint renders them (the instructions and
    # the tool's schema in the system turn, for a template without tools).
    tooled = _ok(client.post("/apply-template", json={"messages": messages, "tools": TOOLS}))
    assert "get_weather" in tooled["prompt"] and "Be brief." in tooled["prompt"]
    # The usage the chat endpoint reports counts exactly that prompt.
    r = _ok(client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}))
    assert r["usage"]["prompt_tokens"] == len(engine.engine.tokenize(prompt, add_special=True))


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"content": "x", "add_bos": True}, "add_bos"),
        ("/tokenize", {}, "content"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/apply-template", {"messages": []}, "messages"),
    ],
)
def test_bad_bodies_are_typed_400s_naming_the_field(
    client: TestClient, path: str, body: dict[str, Any], param: str
) -> None:
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert param in r.text


def test_the_text_tools_are_guarded_by_the_api_key(engine: AsyncEngine) -> None:
    with TestClient(build_app(engine, api_keys=["sekret"])) as c:
        assert c.post("/tokenize", json={"content": "x"}).status_code == 401
        ok = c.post("/tokenize", json={"content": "x"}, headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200
