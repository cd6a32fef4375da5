"""The server's bounds: an oversized body is refused (413) before it is
read, deep nesting, lone surrogates and non-numbers are 400s, every
generation field is bounded (400 naming it), unknown or unsupported
fields are refused rather than ignored, a full queue is a 503 with
Retry-After, library errors are 4xx and anything else a generic 500. After
each refusal the server answers the next request normally."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from pathlib import Path
from typing import Any

import openai
import pytest

from oxillama import AsyncEngine, LoadError
from oxillama.serving.http import Limits
from tests._serve import serving

MODEL = "smollm2"
CTX = 128
BODY_LIMIT = 256 << 10


@pytest.fixture(scope="module")
def served(model_path: Path) -> Iterator[tuple[str, AsyncEngine]]:
    engine = AsyncEngine(model_path, context_size=CTX, threads=2, max_batch=4)
    with serving(engine, MODEL, limits=Limits(max_body_bytes=BODY_LIMIT)) as url:
        yield url, engine


@pytest.fixture(scope="module")
def url(served: tuple[str, AsyncEngine]) -> str:
    return served[0]


def post(url: str, body: Any, *, raw: bytes | None = None) -> tuple[int, Message, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def answers_normally(url: str) -> None:
    status, _, out = post(url + "/v1/completions", {"prompt": "Hello", "max_tokens": 2})
    assert status == 200 and out["usage"]["completion_tokens"] == 2


def refused(url: str, body: Any, status: int = 400, *, raw: bytes | None = None) -> str:
    """The error message of a refused request; checks OpenAI's shape."""
    got, _, out = post(url, body, raw=raw)
    assert got == status, out
    assert set(out["error"]) == {"message", "type", "param", "code"}
    return str(out["error"]["message"])


def raw_exchange(url: str, head: bytes, chunks: list[bytes]) -> bytes:
    """Sends ``head`` and ``chunks`` on a fresh connection, never ending the
    body, and returns the status line the server answers with."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=15) as s:
        s.sendall(head)
        for c in chunks:
            try:
                s.sendall(c)
            except (BrokenPipeError, ConnectionResetError):
                break
        reply = b""
        while b"\r\n" not in reply:
            part = s.recv(4096)
            if not part:
                break
            reply += part
    return reply.split(b"\r\n", 1)[0]


def test_oversized_bodies_get_413_before_they_are_read(url: str) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    # A declared length over the limit: refused with no body byte sent.
    line = raw_exchange(url, head + b"Content-Length: 1000000000000\r\n\r\n", [])
    assert line.startswith(b"HTTP/1.1 413")
    # A chunked body that never ends: refused once the count passes the
    # limit (a server waiting for the whole body would hang here).
    chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
    n = BODY_LIMIT // 0x4000 + 2
    line = raw_exchange(url, head + b"Transfer-Encoding: chunked\r\n\r\n", [chunk] * n)
    assert line.startswith(b"HTTP/1.1 413")
    msg = refused(url + "/v1/completions", {"prompt": "x" * BODY_LIMIT}, 413)
    assert str(BODY_LIMIT) in msg and "--max-body-bytes" in msg
    answers_normally(url)


def test_deep_nesting_is_a_400_and_brackets_in_strings_do_not_count(url: str) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    msg = refused(url + "/v1/completions", None, raw=b'{"prompt": ' + deep + b"}")
    assert "100001 deep" in msg and "at most 64" in msg
    assert "deep" in refused(url + "/v1/chat/completions", None, raw=deep)
    status, _, _ = post(url + "/v1/completions", {"prompt": "[{" * 40, "max_tokens": 1})
    assert status == 200
    answers_normally(url)


def test_bad_text_and_numbers_in_bodies_are_400s(url: str) -> None:
    chat = url + "/v1/chat/completions"
    msg = refused(chat, {"messages": [{"role": "user", "content": "hi \ud800 there"}]})
    assert "messages[0].content" in msg and "surrogate" in msg
    assert "surrogate" in refused(chat, {"messages": [{"role": "user", "\udc00": "x"}]})
    assert "surrogate" in refused(url + "/v1/completions", {"prompt": "\udfff"})
    for raw, what in [
        (b'{"prompt": "x", "temperature": NaN}', "NaN"),
        (b'{"prompt": "x", "top_p": Infinity}', "Infinity"),
        (b'{"prompt": "x", "seed": 1' + b"0" * 5000 + b"}", "digits"),
        (b'{"prompt": "\xff\xfe"}', "UTF-8"),
        (b"{not json", "not valid JSON"),
        (b'"a string"', "JSON object"),
    ]:
        assert what in refused(url + "/v1/completions", None, raw=raw)
    answers_normally(url)


BASE = {"prompt": "Hi", "max_tokens": 2}
CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"max_tokens": CTX + 1}, "max_tokens", f"at most {CTX}"),
    ({"max_tokens": -1}, "max_tokens", "at least 0"),
    ({"max_tokens": 1.5}, "max_tokens", "integer"),
    ({"max_tokens": "5"}, "max_tokens", "integer"),
    ({"max_completion_tokens": True}, "max_completion_tokens", "integer"),
    ({"n": 0}, "n", "at least 1"),
    ({"stop": ["."] * 17}, "stop", "at most 16"),
    ({"stop": "x" * 257}, "stop", "at most 256"),
    ({"stop": [""]}, "stop", "at least 1"),
    ({"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias", "at most 1024"),
    ({"logit_bias": {"49152": 1}}, "logit_bias", "not a token id"),
    ({"logit_bias": {"-1": 1}}, "logit_bias", "key"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "key"),
    ({"logit_bias": {"5": 101}}, "logit_bias", "at most 100"),
    ({"logit_bias": {"5": "x"}}, "logit_bias", "number"),
    ({"temperature": -1}, "temperature", "at least 0"),
    ({"top_p": 0}, "top_p", "greater than 0"),
    ({"mirostat": 1}, "mirostat", "one of"),
    ({"seed": 2**64}, "seed", "at most"),
    ({"prompt": "word " * 30_000}, "prompt", "characters"),
    ({"prompt": "word " * 300}, "prompt", f"context size is {CTX}"),
    ({"prompt": ["a", "b"]}, "prompt", "array of one such string"),
    ({"prompt": [49152]}, "prompt", "token ids below 49152"),
    ({"prompt": list(range(CTX))}, "prompt", "token ids"),
    ({"prompt": []}, "prompt", "prompt"),
    ({"prompt": None}, "prompt", "prompt"),
    ({"foo": 1}, "foo", "not a field this server accepts"),
    ({"presence_penalty": 2.5}, "presence_penalty", "at most 2"),
    ({"frequency_penalty": -3}, "frequency_penalty", "at least -2"),
    ({"logprobs": 21}, "logprobs", "at most 20"),
    ({"n": 17}, "n", "at most 16"),
    ({"echo": True}, "echo", "not supported"),
    ({"best_of": 3}, "best_of", "best_of=1"),
    ({"suffix": "end"}, "suffix", "not supported"),
    ({"session": "no spaces"}, "session", "must match"),
    ({"response_format": {"type": "yaml"}}, "response_format", "json_schema"),
    ({"stream_options": {"include_usage": True, "x": 1}}, "stream_options", "x"),
]


@pytest.mark.parametrize(("change", "param", "words"), CASES)
def test_completion_fields_are_bounded(
    url: str, change: dict[str, Any], param: str, words: str
) -> None:
    got, _, out = post(url + "/v1/completions", {**BASE, **change})
    assert got == 400, out
    assert out["error"]["param"] == param and words in out["error"]["message"]


CHAT_CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"messages": []}, "messages", "at least 1"),
    ({"messages": [{"content": "no role"}]}, "messages", "role"),
    ({"messages": [{"role": "user"}]}, "messages", "content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages", "text"),
    ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools", "must match"),
    ({"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]}, "tools", "x"),
    ({"tool_choice": "auto"}, "tool_choice", "needs tools"),
    ({"tool_choice": "sometimes"}, "tool_choice", "required"),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        "tool_choice",
        "not among the tools",
    ),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f", "strict": True}}],
            "response_format": {"type": "json_object"},
        },
        "tool_choice",
        "own grammar",
    ),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "required",
            "grammar": 'root ::= "x"',
        },
        "tool_choice",
        "own grammar",
    ),
    ({"top_logprobs": 3}, "top_logprobs", "logprobs set to true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "at most 20"),
    ({"n": 2, "session": "s1"}, "n", "stateful session"),
    ({"messages": [{"role": "user", "content": "word " * 30_000}]}, "messages", "characters"),
]


@pytest.mark.parametrize(("change", "param", "words"), CHAT_CASES)
def test_chat_fields_are_bounded(url: str, change: dict[str, Any], param: str, words: str) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **change}
    got, _, out = post(url + "/v1/chat/completions", body)
    assert got == 400, out
    assert out["error"]["param"] == param and words in out["error"]["message"], out


def test_what_the_openai_client_sends_is_accepted_and_honoured(
    served: tuple[str, AsyncEngine],
) -> None:
    url, engine = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    target = 1000  # a token id: a bias of 100 makes greedy decoding pick it
    c = client.completions.create(
        model=MODEL,
        prompt="Hello",
        max_tokens=3,
        n=1,
        temperature=0,
        top_p=1,
        seed=7,
        user="u-1",
        presence_penalty=0,
        frequency_penalty=0,
        logit_bias={str(target): 100},
        stop=[f"stop{i}" for i in range(16)],
    )
    assert c.usage is not None and c.usage.completion_tokens == 3
    assert c.choices[0].text == engine.engine.detokenize([target] * 3)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say hi."}]}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        logit_bias={str(target): 100},
        temperature=0,
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 4 and chunks[-1].choices == []
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == engine.engine.detokenize([target] * 4)


def test_a_full_queue_answers_503_with_retry_after(model_path: Path) -> None:
    engine = AsyncEngine(model_path, context_size=64, threads=1, max_batch=1, max_queue=1)
    body = {"prompt": "Count:", "max_tokens": 24, "ignore_eos": True}
    with serving(engine, MODEL) as base:
        with ThreadPoolExecutor(6) as pool:
            outs = list(pool.map(lambda _: post(base + "/v1/completions", body), range(6)))
        full = [(h, out) for status, h, out in outs if status == 503]
        assert full and all(status in (200, 503) for status, _, _ in outs)
        for headers, out in full:
            assert headers["Retry-After"] == "1"
            err = out["error"]
            assert err["type"] == "server_error" and "overloaded" in err["message"]
        answers_normally(base)


def test_library_errors_are_4xx_and_other_failures_a_generic_500(
    served: tuple[str, AsyncEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, engine = served

    def fail_with(exc: Exception) -> None:
        def tokenize(*args: object, **kwargs: object) -> list[int]:
            raise exc

        monkeypatch.setattr(engine, "tokenize", tokenize)

    fail_with(LoadError("the vocabulary is damaged"))
    assert "damaged" in refused(url + "/v1/completions", BASE, 400)
    # A real TemplateError: SmolLM2's template adds the content to a string.
    chat = {"messages": [{"role": "user", "content": None}]}
    got, _, out = post(url + "/v1/chat/completions", chat)
    assert got == 400 and out["error"]["param"] == "messages"
    assert "template" in out["error"]["message"]
    fail_with(RuntimeError("secret sk-live-123 in a stack"))
    got, _, out = post(url + "/v1/completions", BASE)
    assert got == 500 and out["error"]["message"] == "internal server error"
    assert "sk-live" not in json.dumps(out)
    monkeypatch.undo()
    answers_normally(url)


def test_unknown_routes_and_methods_get_openai_errors(url: str) -> None:
    assert refused(url + "/v1/nothing", {}, 404) == "Not Found"
    req = urllib.request.Request(url + "/v1/completions")  # GET
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405 and "error" in json.loads(e.value.read())
    assert "POST" in str(e.value.headers["Allow"])
