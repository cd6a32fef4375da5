"""Embeddings off the event loop and over HTTP: AsyncEngine.embed equals
Engine.embed and shares the worker with a running stream without stalling
it; POST /v1/embeddings through the official `openai` client (base64 and
float encodings, `dimensions`, token-id inputs, usage) and its errors."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from oxillama import AsyncEngine, Engine
from oxillama.serving import async_engine
from tests._serve import serving

MODEL = "minilm"


def test_async_embed_equals_engine_and_keeps_streams_going(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small jobs, so a few texts make several of them.
    monkeypatch.setattr(async_engine, "EMBED_JOB_ROWS", 48)
    texts = [f"sentence number {i} about retrieval and embeddings" for i in range(24)]

    async def run() -> tuple[np.ndarray, list[float], float, float]:
        async with AsyncEngine(model_path, context_size=256, threads=2) as ae:
            arrivals: list[float] = []

            async def consume() -> None:
                async for _ in ae.stream("Once upon a time", 24, ignore_eos=True):
                    arrivals.append(time.perf_counter())

            task = asyncio.create_task(consume())
            while not arrivals:  # the stream is decoding
                await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            got = await ae.embed(texts, pooling="mean")
            t1 = time.perf_counter()
            await task
            return np.asarray(got), arrivals, t0, t1

    got, arrivals, t0, t1 = asyncio.run(run())
    want = Engine(model_path, context_size=256, threads=2).embed(texts, pooling="mean")
    assert got.shape == (24, 576)
    np.testing.assert_allclose(got, want, atol=1e-5)
    # The embedding ran as several jobs between decode steps: the stream
    # produced tokens while it was under way.
    during = [t for t in arrivals if t0 < t < t1]
    assert len(during) >= 1, (len(arrivals), t1 - t0)
    assert len(arrivals) == 24


@pytest.fixture(scope="module")
def minilm_engine(minilm_path: Path) -> Engine:
    return Engine(minilm_path, threads=2)


@pytest.fixture(scope="module")
def base_url(minilm_path: Path) -> Iterator[str]:
    engine = AsyncEngine(minilm_path, context_size=64, threads=2)
    with serving(engine, MODEL) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_embeddings(client: openai.OpenAI, minilm_engine: Engine) -> None:
    texts = ["A man is eating food.", "The new movie is awesome."]
    want = minilm_engine.embed(texts)
    # The client asks for base64 by default and decodes it itself.
    r = client.embeddings.create(model=MODEL, input=texts)
    got = np.array([d.embedding for d in r.data])
    assert [d.index for d in r.data] == [0, 1] and r.model == MODEL
    np.testing.assert_allclose(got, want, atol=1e-6)
    n_tok = sum(len(minilm_engine.tokenize(t, add_special=True)) for t in texts)
    assert r.usage.prompt_tokens == n_tok == r.usage.total_tokens
    f = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    np.testing.assert_allclose(f.data[0].embedding, want[0], atol=1e-6)
    # Matryoshka: the first 64 values, renormalized.
    d = client.embeddings.create(model=MODEL, input=texts, dimensions=64)
    cut = np.array([x.embedding for x in d.data])
    assert cut.shape == (2, 64)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
    ref = want[:, :64] / np.linalg.norm(want[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, ref, atol=1e-5)
    # Token ids, one list and a list of lists, used exactly.
    ids = minilm_engine.tokenize(texts[1], add_special=True)
    one = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, want[1], atol=1e-6)
    two = client.embeddings.create(model=MODEL, input=[ids, ids[:-1]], encoding_format="float")
    assert len(two.data) == 2 and two.usage.prompt_tokens == 2 * len(ids) - 1


def _post(base_url: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        base_url + "/v1/embeddings",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_raw_base64_is_little_endian_float32(base_url: str, minilm_engine: Engine) -> None:
    status, body = _post(base_url, {"input": "hello world", "encoding_format": "base64"})
    assert status == 200
    data = body["data"][0]["embedding"]  # type: ignore[index]
    v = np.frombuffer(base64.b64decode(data), dtype="<f4")
    np.testing.assert_allclose(v, minilm_engine.embed("hello world"), atol=1e-6)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input": "x", "colour": "red"}, "colour"),
        ({"input": "x", "encoding_format": "float16"}, "encoding_format"),
        ({"input": "x", "dimensions": 385}, "dimensions"),
        ({"input": []}, "input"),
        ({"input": [[101, 40000]]}, "input"),
        ({"input": ["fine", "word " * 80]}, "input 1 has 82 tokens"),
    ],
)
def test_bad_requests_are_400_naming_the_field(
    base_url: str, body: dict[str, object], needle: str
) -> None:
    status, err = _post(base_url, body)
    assert status == 400, err
    assert needle in json.dumps(err), err
    assert set(err["error"]) == {"message", "type", "param", "code"}  # type: ignore[arg-type]


def test_truncate_field_cuts_long_texts(base_url: str) -> None:
    status, body = _post(base_url, {"input": ["fine", "word " * 80], "truncate": True})
    assert status == 200
    assert body["usage"] == {"prompt_tokens": 3 + 64, "total_tokens": 67}


def test_async_embed_applies_a_named_lora(model_path: Path, tmp_path: Path) -> None:
    from oxillama import LoraError
    from tests.lora import cases

    adapter = tmp_path / "smol_a.gguf"
    cases.smol_a(model_path, adapter)
    text = "The capital of France is Paris."
    eng = Engine(model_path, context_size=128, threads=2)
    eng.load_lora(adapter, scale=0.5)
    want = eng.embed(text, normalize=False)

    async def run() -> np.ndarray:
        async with AsyncEngine(
            model_path, context_size=128, threads=2, loras={"a": (adapter, 0.5)}
        ) as ae:
            with pytest.raises(LoraError, match="unknown LoRA adapter 'b'"):
                await ae.embed(text, lora="b")
            return np.asarray(await ae.embed(text, normalize=False, lora="a"))

    np.testing.assert_allclose(asyncio.run(run()), want, rtol=1e-5, atol=1e-5)
