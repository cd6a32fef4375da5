"""``Engine.rerank`` on the two tiny cross-encoders of
tests/reference/make_rerank_reference.py against llama.cpp's rank pooling:
the same token ids for every (query, document) pair and the same scores
within 1e-3 relative; the ordering, ``top_n``, and the typed errors of a
model or a request that cannot be reranked."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oxillama import Engine, GenerateError, LoadError, ParameterError, RerankResult
from oxillama.engine.rerank import pair_tokens
from tests.reference.make_rerank_reference import FLAVOURS, OUT, fixture_path, write_fixture

NAMES = [f.name for f in FLAVOURS]


@functools.cache
def _reference() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(OUT).read_text("utf-8"))
    return data


def _fixture(name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(f for f in _reference()["fixtures"] if f["name"] == name)
    return found


@functools.cache
def _engine(name: str) -> Engine:
    return Engine(fixture_path(name), context_size=128, threads=1)


def test_reference_is_for_the_committed_fixtures() -> None:
    for name in NAMES:
        digest = hashlib.sha256(fixture_path(name).read_bytes()).hexdigest()
        assert digest == _fixture(name)["sha256"], name


@pytest.mark.parametrize("name", NAMES)
def test_pair_tokens_equal_llama_server(name: str) -> None:
    e = _engine(name)
    head = e.model.rank_head
    assert head is not None
    for p in _fixture(name)["pairs"]:
        assert pair_tokens(head, e.tokenizer, p["query"], p["document"]) == p["ids"]


@pytest.mark.parametrize("name", NAMES)
def test_scores_equal_llama_cpp(name: str) -> None:
    e = _engine(name)
    ref = _reference()
    docs = ref["documents"]
    for q in ref["queries"]:
        want = {
            docs.index(p["document"]): p["score"]
            for p in _fixture(name)["pairs"]
            if p["query"] == q
        }
        got = e.rerank(q, docs)
        assert sorted(r.index for r in got) == list(range(len(docs)))
        ours = np.array(
            [next(r.relevance_score for r in got if r.index == i) for i in range(len(docs))]
        )
        theirs = np.array([want[i] for i in range(len(docs))])
        np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=0)
        # Best first, as llama-server sorts them.
        assert [r.index for r in got] == sorted(range(len(docs)), key=lambda i: -theirs[i])


def test_top_n_and_result_shape() -> None:
    e = _engine("roberta")
    docs = _reference()["documents"]
    q = _reference()["queries"][0]
    every = e.rerank(q, docs)
    assert all(isinstance(r, RerankResult) for r in every)
    assert e.rerank(q, docs, top_n=2) == every[:2]
    assert e.rerank(q, docs, top_n=100) == every
    scores = [r.relevance_score for r in every]
    assert scores == sorted(scores, reverse=True)
    one = e.rerank(q, [docs[3]])
    assert one[0].index == 0
    assert one[0].relevance_score == pytest.approx(
        next(r.relevance_score for r in every if r.index == 3), rel=1e-6
    )


def test_rerank_leaves_the_session_alone() -> None:
    e = _engine("direct")
    before = e.n_past
    e.rerank("hello world", ["hello world", "the cat"])
    assert e.n_past == before


@pytest.mark.parametrize(
    ("query", "documents", "top_n", "needle"),
    [
        (3, ["a"], None, "query must be a string"),
        ("q", "a document", None, "documents must be a list"),
        ("q", [], None, "documents is an empty list"),
        ("q", ["a", 5], None, "documents[1] must be a string"),
        ("q", ["a"], 0, "top_n must be a positive integer"),
        ("q", ["a"], True, "top_n must be a positive integer"),
    ],
)
def test_bad_requests_are_parameter_errors(
    query: Any, documents: Any, top_n: Any, needle: str
) -> None:
    with pytest.raises(ParameterError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        _engine("roberta").rerank(query, documents, top_n=top_n)


def test_a_pair_over_the_position_table_is_named() -> None:
    with pytest.raises(GenerateError, match=r"documents\[1\].*more than the model's limit of 128"):
        _engine("roberta").rerank("q", ["short", "word " * 200])


@pytest.mark.parametrize("name", NAMES)
def test_embed_on_a_reranker_needs_an_explicit_pooling(name: str) -> None:
    e = _engine(name)
    with pytest.raises(ParameterError, match="this model is a reranker"):
        e.embed("hello world")
    assert e.embed("hello world", pooling="cls").shape == (32,)


def _variant(tmp_path: Path, **changes: Any) -> Path:
    """``roberta`` with ``changes`` (the same weights: the seed is its name)."""
    path = tmp_path / "variant.gguf"
    write_fixture(dataclasses.replace(FLAVOURS[0], **changes), path)
    return path


def test_a_model_that_is_not_a_reranker_is_refused(tmp_path: Path) -> None:
    # The same BERT with CLS pooling and no classifier head: an embedding model.
    path = _variant(tmp_path, pooling=2, dense=False, output=False)
    e = Engine(path, context_size=64, threads=1)
    assert e.model.rank_head is None
    with pytest.raises(ParameterError, match=r"not a reranker.*cls\.weight or cls\.output\.weight"):
        e.rerank("q", ["a"])
    assert e.embed("hello").shape == (32,)


def test_a_head_with_another_pooling_still_reranks(tmp_path: Path) -> None:
    # A sentence-transformers pooling config gives the file a pooling type;
    # llama-server's --reranking ranks it anyway, from the CLS state.
    ranked = _engine("roberta").rerank("hello world", ["a cat", "hello world"])
    e = Engine(_variant(tmp_path, pooling=1), context_size=64, threads=1)
    assert e.rerank("hello world", ["a cat", "hello world"]) == ranked
    assert e.pooling == "mean"


def test_rank_pooling_without_a_classifier_head_does_not_load(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match=r"neither cls\.weight nor cls\.output\.weight"):
        Engine(_variant(tmp_path, pooling=4, dense=False, output=False), context_size=64, threads=1)


def test_the_async_engine_reranks_as_the_engine() -> None:
    import asyncio

    from oxillama import AsyncEngine

    docs = _reference()["documents"]
    q = _reference()["queries"][1]

    async def run() -> list[RerankResult]:
        async with AsyncEngine(fixture_path("direct"), context_size=128, threads=1) as ai:
            return await ai.rerank(q, docs, top_n=3)

    got, want = asyncio.run(run()), _engine("direct").rerank(q, docs, top_n=3)
    assert [r.index for r in got] == [r.index for r in want]
    assert [r.relevance_score for r in got] == pytest.approx(
        [r.relevance_score for r in want], rel=1e-6
    )


@pytest.mark.parametrize("head_type", ["F16", "Q8_0"])
def test_a_quantized_head_is_read_exactly(tmp_path: Path, head_type: str) -> None:
    import gguf

    path = _variant(tmp_path, head_type=head_type)
    head = Engine(path, context_size=64, threads=1).model.rank_head
    assert head is not None and head.dense is not None and head.out is not None
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for name, got in (("cls.weight", head.dense), ("cls.output.weight", head.out)):
        t = tensors[name]
        assert t.tensor_type.name == head_type
        want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(got.shape)
        np.testing.assert_array_equal(got, want.astype(np.float64))
