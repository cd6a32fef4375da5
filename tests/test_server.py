"""The OpenAI-compatible server, driven by the official `openai` client on
a free loopback port: plain and streaming completions and chat, concurrent
requests, response_format with a JSON Schema, the extra sampling fields,
/metrics, and every error case with OpenAI's error object."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from oxillama import AsyncEngine
from tests._serve import serving

MODEL = "smollm2"


@pytest.fixture(scope="module")
def base_url(model_path: Path) -> Iterator[str]:
    engine = AsyncEngine(model_path, context_size=256, threads=2, max_batch=8)
    with serving(engine, MODEL) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def test_models_and_health(client: openai.OpenAI, base_url: str) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    body = json.loads(urllib.request.urlopen(base_url + "/health").read())
    assert body == {"status": "ok"}


def test_completion_and_chat(client: openai.OpenAI) -> None:
    c = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, seed=1
    )
    assert c.choices[0].text and c.usage is not None
    assert c.usage.completion_tokens <= 8 and c.usage.prompt_tokens > 0
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=12,
        temperature=0,
    )
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


def test_streaming_equals_non_streaming(client: openai.OpenAI) -> None:
    args = dict(
        model=MODEL,
        prompt="Once upon a time",
        max_tokens=16,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    whole = client.completions.create(**args).choices[0].text  # type: ignore[call-overload]
    parts = [ch.choices[0].text for ch in client.completions.create(stream=True, **args)]  # type: ignore[call-overload]
    assert "".join(parts) == whole
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=16,
            temperature=0,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text and chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_concurrent_requests(client: openai.OpenAI) -> None:
    def one(i: int) -> str:
        return (
            client.completions.create(
                model=MODEL, prompt=f"Number {i} is", max_tokens=8, temperature=0
            )
            .choices[0]
            .text
        )

    with ThreadPoolExecutor(6) as ex:
        outs = list(ex.map(one, range(6)))
    assert all(isinstance(o, str) for o in outs) and len(outs) == 6


def test_response_format_and_extra_fields(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is ice cold? JSON please."}],
        max_tokens=24,
        temperature=0.7,
        seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    assert json.loads(r.choices[0].message.content or "")["answer"] in ("yes", "no")
    o = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A JSON object, please."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if o.choices[0].finish_reason != "length":
        assert isinstance(json.loads(o.choices[0].message.content or ""), dict)
    else:
        assert (o.choices[0].message.content or "").startswith("{")
    c = client.completions.create(
        model=MODEL,
        prompt="Pick:",
        max_tokens=4,
        temperature=0.9,
        extra_body={
            "grammar": 'root ::= "red" | "blue"',
            "top_k": 5,
            "min_p": 0.1,
            "repetition_penalty": 1.1,
            "mirostat": 0,
        },
    )
    assert c.choices[0].text in ("red", "blue")


def test_errors_follow_openai(client: openai.OpenAI, base_url: str) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.completions.create(model="gpt-9", prompt="x", max_tokens=1)
    assert "does not exist" in str(nf.value)
    with pytest.raises(openai.BadRequestError, match="context size is 256") as big:
        client.completions.create(model=MODEL, prompt="word " * 400, max_tokens=1)
    assert "tokens" in str(big.value)
    with pytest.raises(openai.BadRequestError, match="undefined rule"):
        client.completions.create(
            model=MODEL, prompt="x", max_tokens=2, extra_body={"grammar": "root ::= nope"}
        )
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, temperature=-1)
    req = urllib.request.Request(
        base_url + "/v1/completions",
        data=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as he:
        urllib.request.urlopen(req)
    assert he.value.code == 400
    assert json.loads(he.value.read())["error"]["type"] == "invalid_request_error"


def test_metrics_are_prometheus_text(client: openai.OpenAI, base_url: str) -> None:
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    text = urllib.request.urlopen(base_url + "/metrics").read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["oxillama:generation_tokens"].type == "counter"
    assert families["oxillama:num_requests_running"].type == "gauge"
    assert families["oxillama:sessions_live"].type == "gauge"
    assert families["oxillama:http_requests"].type == "counter"
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for s in (s for f in families.values() for s in f.samples)
    }
    assert values[("oxillama:generation_tokens_total", ())] > 0
    assert values[("oxillama:num_requests_running", ())] >= 0
    ok = (("route", "/v1/completions"), ("status", "200"))
    assert values[("oxillama:http_requests_total", ok)] >= 1


def test_client_disconnect_cancels_the_generation(base_url: str) -> None:
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": "Tell a long story.",
            "max_tokens": 200,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    req = urllib.request.Request(
        base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )

    def metric(name: str) -> float:
        text = urllib.request.urlopen(base_url + "/metrics").read().decode()
        values = dict(line.split() for line in text.splitlines() if not line.startswith("#"))
        return float(values[f"oxillama:{name}"])

    cancelled = metric("requests_cancelled_total")
    generated = metric("generation_tokens_total")
    resp = urllib.request.urlopen(req)
    assert resp.readline().startswith(b"data: ")
    resp.close()  # hang up mid-stream
    for _ in range(100):
        if metric("requests_cancelled_total") > cancelled and metric("num_requests_running") == 0:
            break
        time.sleep(0.05)
    assert metric("requests_cancelled_total") == cancelled + 1
    assert metric("num_requests_running") == 0
    # Stopped long before its 200 tokens.
    assert metric("generation_tokens_total") - generated < 150


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=6,
)
FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "stream",
    "logit_bias",
    "response_format",
    "grammar",
    "top_k",
    "ignore_eos",
]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    route=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
    body=st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=6),
)
def test_hostile_bodies_get_openai_errors_never_500(
    base_url: str, route: str, body: dict[str, object]
) -> None:
    body.setdefault("max_tokens", 2)
    if body.get("model") is not None and not isinstance(body["model"], str):
        body["model"] = MODEL
    req = urllib.request.Request(
        base_url + route,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200
            resp.read()
    except urllib.error.HTTPError as e:
        assert e.code in (400, 404), (e.code, body)
        assert "message" in json.loads(e.read())["error"]
