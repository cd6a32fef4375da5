"""A Rust panic, on the calling thread or in a thread-pool worker, reaches
Python as `InternalError` (an `OxiLlamaError`), never as pyo3's
`PanicException` (a BaseException) and never as an abort; the process and
its pools keep computing exactly, and a session the panic interrupted
refuses further use with the same typed error."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from oxillama import Engine, InternalError, Model, OxiLlamaError, SamplerConfig, _native

PROMPT = "The capital of France is"


def _logits(model: Model, tokens: npt.NDArray[np.uint32]) -> npt.NDArray[np.float32]:
    session = _native.Session(model.native, 64, 2)
    return session.eval(tokens)


@pytest.fixture(scope="module")
def model(model_path: str) -> Model:
    return Model(model_path)


@pytest.fixture(scope="module")
def tokens(model: Model) -> npt.NDArray[np.uint32]:
    return np.array(model.tokenizer.encode(PROMPT), dtype=np.uint32)


@pytest.mark.parametrize("where", ["main", "worker"])
def test_panic_is_an_internal_error(where: str) -> None:
    with pytest.raises(InternalError, match="bug in oxillama") as info:
        _native._panic_for_test(where)
    assert isinstance(info.value, OxiLlamaError)
    assert "test panic" in str(info.value)


def test_pool_computes_exactly_after_a_worker_panic(
    model: Model, tokens: npt.NDArray[np.uint32]
) -> None:
    before = _logits(model, tokens)
    for _ in range(3):
        with pytest.raises(InternalError):
            _native._panic_for_test("worker")
    np.testing.assert_array_equal(_logits(model, tokens), before)


def test_session_interrupted_by_a_panic_is_poisoned(
    model: Model, tokens: npt.NDArray[np.uint32]
) -> None:
    before = _logits(model, tokens)
    session = _native.Session(model.native, 64, 2)
    session.eval(tokens[:2])
    _native._panic_for_test("next-dispatch")
    with pytest.raises(InternalError, match="worker thread panicked"):
        session.eval(tokens[2:])
    # Its KV cache may be half written: every later use is refused.
    for use in (
        lambda: session.eval(tokens[:1]),
        session.reset,
        session.export_kv,
        session.last_hidden,
        lambda: session.truncate(0),
        lambda: session.fork(0),
    ):
        with pytest.raises(InternalError, match="unusable"):
            use()
    np.testing.assert_array_equal(_logits(model, tokens), before)


def test_batch_interrupted_by_a_panic_poisons_every_session(
    model: Model, tokens: npt.NDArray[np.uint32]
) -> None:
    pool = _native.KvPool(model.native, 16)
    sessions = [_native.Session(model.native, 64, 2, pool=pool) for _ in range(2)]
    _native._panic_for_test("next-dispatch")
    with pytest.raises(InternalError):
        _native.eval_batch(sessions, [list(tokens), list(tokens[:3])])
    for s in sessions:
        with pytest.raises(InternalError, match="unusable"):
            s.eval(tokens[:1])
    del sessions, s
    # The poisoned sessions give their pages back when they go.
    assert pool.free_pages == pool.n_pages


def test_engine_after_a_panic(model: Model) -> None:
    engine = Engine(model, context_size=64, threads=2, sampler=SamplerConfig.greedy())
    expected = engine.generate(PROMPT, 4).text
    engine.reset()
    _native._panic_for_test("next-dispatch")
    with pytest.raises(InternalError):
        engine.generate(PROMPT, 4)
    with pytest.raises(InternalError):
        engine.generate(PROMPT, 4)
    fresh = Engine(model, context_size=64, threads=2, sampler=SamplerConfig.greedy())
    assert fresh.generate(PROMPT, 4).text == expected
