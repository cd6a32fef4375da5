"""``POST /v1/rerank`` and ``/rerank`` on a real server (httpx over
loopback) with the tiny cross-encoder of
tests/reference/make_rerank_reference.py: llama-server's request and
response shapes, scores equal to llama.cpp's, and the typed errors of a
server started without ``--reranking`` or with a model that is no
reranker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from oxillama import AsyncEngine, ParameterError
from oxillama.serving.flags import serve_options_from_mapping
from oxillama.serving.http import build_app
from tests._serve import serving
from tests.reference.make_rerank_reference import OUT, fixture_path

KEY = "sk-rerank"


def _reference() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(OUT).read_text("utf-8"))
    return data


def _engine() -> AsyncEngine:
    return AsyncEngine(fixture_path("roberta"), context_size=128, threads=1, max_batch=2)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serving(_engine(), "tiny-reranker", reranking=True, api_keys=[KEY]) as u:
        yield u


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_scores_in_llama_server_shape(client: httpx.Client, path: str) -> None:
    ref = _reference()
    docs, query = ref["documents"], ref["queries"][0]
    pairs = [p for p in ref["fixtures"][0]["pairs"] if p["query"] == query]
    r = client.post(path, json={"query": query, "documents": docs, "model": "tiny-reranker"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"model", "object", "usage", "results"}
    assert body["model"] == "tiny-reranker" and body["object"] == "list"
    used = sum(len(p["ids"]) for p in pairs)
    assert body["usage"] == {"prompt_tokens": used, "total_tokens": used}
    results = body["results"]
    assert all(set(x) == {"index", "relevance_score"} for x in results)
    want = sorted(((docs.index(p["document"]), p["score"]) for p in pairs), key=lambda t: -t[1])
    assert [x["index"] for x in results] == [i for i, _ in want]
    for x, (_, score) in zip(results, want, strict=True):
        assert x["relevance_score"] == pytest.approx(score, rel=1e-3)


def test_the_answer_matches_the_openapi_document(client: httpx.Client) -> None:
    doc = client.get("/openapi.json").json()
    ref = _reference()
    body = client.post("/rerank", json={"query": "q", "documents": ref["documents"]}).json()
    jsonschema.validate(body, doc["components"]["schemas"]["RerankList"])
    request = doc["components"]["schemas"]["RerankRequest"]
    jsonschema.validate({"query": "q", "documents": ["a"], "top_n": 1}, request)
    for path in ("/v1/rerank", "/rerank"):
        op = doc["paths"][path]["post"]
        assert {"200", "400", "401", "501"} <= set(op["responses"])


def test_top_n_and_default_model_name(client: httpx.Client) -> None:
    ref = _reference()
    body = {"query": ref["queries"][1], "documents": ref["documents"]}
    every = client.post("/v1/rerank", json=body).json()
    assert every["model"] == "tiny-reranker"  # the server's name when the body has none
    best = client.post("/v1/rerank", json={**body, "top_n": 2}).json()
    assert best["results"] == every["results"][:2]
    assert best["usage"] == every["usage"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": "q"}, "documents"),
        ({"documents": ["a"]}, "query"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": ["a", 1]}, "documents"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        # TEI's shape, which we do not serve: named, not ignored.
        ({"query": "q", "documents": ["a"], "texts": ["a"]}, "texts"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(
    client: httpx.Client, body: dict[str, Any], param: str
) -> None:
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 400, r.text
    assert param in r.text


def test_another_model_name_is_a_404(client: httpx.Client) -> None:
    r = client.post("/v1/rerank", json={"query": "q", "documents": ["a"], "model": "other"})
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "model"


def test_a_pair_longer_than_the_model_takes_is_a_400(client: httpx.Client) -> None:
    r = client.post("/v1/rerank", json={"query": "q", "documents": ["word " * 200]})
    assert r.status_code == 400
    assert "documents[0]" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_both_routes_need_the_key(url: str, path: str) -> None:
    r = httpx.post(url + path, json={"query": "q", "documents": ["a"]})
    assert r.status_code == 401


def test_without_reranking_the_route_says_how_to_enable_it() -> None:
    with serving(_engine(), "tiny-reranker") as u:
        r = httpx.post(u + "/v1/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 501
    err = r.json()["error"]
    assert err["type"] == "not_supported_error"
    assert "--reranking" in err["message"]


def test_reranking_with_a_model_that_is_no_reranker_fails_to_start(model_path: Path) -> None:
    engine = AsyncEngine(model_path, context_size=64, threads=1, max_batch=1)
    try:
        with pytest.raises(ParameterError, match="--reranking needs a reranker"):
            build_app(engine, reranking=True)
    finally:
        import asyncio

        asyncio.run(engine.close())


def test_the_flag_reaches_the_app_spec() -> None:
    spec, _ = serve_options_from_mapping({"model": "x.gguf", "reranking": "true"})
    assert spec.reranking is True
    spec, _ = serve_options_from_mapping({"model": "x.gguf"})
    assert spec.reranking is False
