"""Engine API semantics on the real SmolLM2 model."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from oxillama import Engine, GenerateError, LoadError, OxiLlamaError, SamplerConfig


def test_metadata_and_sizes(engine: Engine) -> None:
    assert engine.arch == "llama"
    assert engine.vocab_size == 49152
    assert engine.n_ctx == 2048
    assert engine.metadata["general.architecture"] == "llama"
    cfg = engine.config
    assert (cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["n_head_kv"]) == (30, 576, 9, 3)


def test_eval_shapes_and_last_row_consistency(engine: Engine) -> None:
    toks = engine.tokenize("The quick brown fox jumps over the lazy dog")
    last = engine.eval(toks)
    assert last.shape == (engine.vocab_size,) and last.dtype == np.float32
    assert engine.n_past == len(toks) and engine.tokens == toks
    engine.reset()
    every = engine.eval(toks, all_logits=True)
    assert every.shape == (len(toks), engine.vocab_size)
    np.testing.assert_array_equal(every[-1], last)
    assert np.isfinite(every).all()


def test_incremental_eval_matches_batch(engine: Engine) -> None:
    toks = engine.tokenize("One token at a time must equal the batch.")
    batch = engine.eval(toks, all_logits=True)
    engine.reset()
    rows = [engine.forward_one(t) for t in toks]
    np.testing.assert_allclose(np.stack(rows), batch, rtol=0, atol=2e-3)


def test_truncate_then_reeval_reproduces_logits(engine: Engine) -> None:
    a = engine.tokenize("Paris is the capital of France. Berlin is")
    b = engine.tokenize(" the capital of Germany")
    engine.eval(a)
    want = engine.eval(b)
    engine.truncate(len(a))
    assert engine.n_past == len(a) and engine.tokens == a
    got = engine.eval(b)
    np.testing.assert_array_equal(got, want)


def test_generate_greedy_completion(engine: Engine) -> None:
    c = engine.generate("The capital of France is", 12)
    assert c.finish_reason in ("length", "eos")
    assert 0 < len(c.tokens) <= 12
    assert c.text == engine.detokenize(c.tokens)
    assert c.timings.prompt_tokens > 0 and c.decode_tokens_per_second > 0
    assert "Paris" in c.text


def test_session_continues_and_split_equals_whole(engine: Engine) -> None:
    for cfg in (
        SamplerConfig.greedy(),
        SamplerConfig(temperature=0.9, top_p=0.95, seed=1234, repetition_penalty=1.1),
    ):
        engine.reset()
        engine.set_sampler(cfg)
        whole = engine.generate("Write a story about a robot:", 64, ignore_eos=True).tokens
        engine.reset()
        engine.set_sampler(cfg)
        first = engine.generate("Write a story about a robot:", 20, ignore_eos=True).tokens
        rest = engine.generate("", 44, ignore_eos=True).tokens
        assert first + rest == whole
        assert engine.tokens[-64:] == whole


def test_stream_equals_generate(engine: Engine) -> None:
    pieces = list(engine.stream("Emoji and accents: 🎉 café", 24, ignore_eos=True))
    text = "".join(pieces)
    engine.reset()
    assert engine.generate("Emoji and accents: 🎉 café", 24, ignore_eos=True).text == text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_strings_cut_and_report_stop(engine: Engine) -> None:
    full = engine.generate("Count: 1, 2, 3, 4,", 16, ignore_eos=True).text
    assert " 6" in full
    engine.reset()
    c = engine.generate("Count: 1, 2, 3, 4,", 16, stop=[" 6"], ignore_eos=True)
    assert c.finish_reason == "stop"
    assert c.text == full[: full.index(" 6")]
    engine.reset()
    streamed = "".join(engine.stream("Count: 1, 2, 3, 4,", 16, stop=[" 6"], ignore_eos=True))
    assert streamed == c.text


def test_on_token_can_stop(engine: Engine) -> None:
    seen: list[int] = []

    def cb(tok: int, _text: str) -> bool:
        seen.append(tok)
        return len(seen) < 3

    c = engine.generate("Hello", 20, on_token=cb, ignore_eos=True)
    assert len(c.tokens) == 3 and c.finish_reason == "stop" and seen == c.tokens


def test_prompt_longer_than_context_is_an_error_and_changes_nothing(model_path: Path) -> None:
    e = Engine(model_path, context_size=16, threads=1)
    e.eval(e.tokenize("a b c"))
    before = (e.n_past, e.tokens)
    with pytest.raises(GenerateError) as err:
        e.generate("word " * 40, 4)
    msg = str(err.value)
    assert "16" in msg and str(len(e.tokenize("word " * 40))) in msg
    assert (e.n_past, e.tokens) == before
    c = e.generate("", 100, ignore_eos=True)
    assert c.finish_reason == "length" and e.n_past == 16


def test_bad_token_ids_and_parameters(engine: Engine) -> None:
    with pytest.raises(GenerateError, match="outside the vocabulary"):
        engine.eval([1, engine.vocab_size])
    assert engine.n_past == 0
    with pytest.raises(GenerateError):
        engine.generate([-1], 2)
    with pytest.raises(ValueError, match="max_tokens"):
        engine.generate("x", -1)
    with pytest.raises(GenerateError, match="nothing to continue"):
        engine.generate("", 3)
    with pytest.raises(ValueError, match="truncate"):
        engine.truncate(5)
    assert issubclass(GenerateError, OxiLlamaError) and issubclass(LoadError, OxiLlamaError)


def test_constructor_validation(model_path: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="context_size"):
        Engine(model_path, context_size=0)
    with pytest.raises(ValueError, match="threads"):
        Engine(model_path, threads=0)
    with pytest.raises(LoadError, match="not found"):
        Engine(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(LoadError):
        Engine(bad)


def test_from_bytes_matches_file(model_path: Path, engine: Engine) -> None:
    e2 = Engine.from_bytes(model_path.read_bytes(), context_size=64, threads=1)
    toks = engine.tokenize("Same weights, same logits.")
    np.testing.assert_array_equal(e2.eval(toks), engine.eval(toks))


def test_thread_count_does_not_change_results(model_path: Path) -> None:
    toks = list(range(100, 164))
    outs = []
    for t in (1, 2):
        e = Engine(model_path, context_size=256, threads=t)
        outs.append(e.eval(toks, all_logits=True))
        outs.append(np.stack([e.forward_one(x) for x in (5, 6, 7)]))
    np.testing.assert_array_equal(outs[0], outs[2])
    np.testing.assert_array_equal(outs[1], outs[3])


def test_gil_is_released_during_eval(engine: Engine) -> None:
    toks = engine.tokenize("word " * 300)
    ticks = 0
    done = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0)

    th = threading.Thread(target=spin)
    th.start()
    t0 = time.perf_counter()
    engine.eval(toks)
    elapsed = time.perf_counter() - t0
    done.set()
    th.join()
    # With the GIL held for the whole eval the spinner would be frozen.
    assert elapsed > 0.05 and ticks > 100


def test_reset_restarts_sampler(engine: Engine) -> None:
    engine.set_sampler(SamplerConfig(temperature=1.0, seed=7))
    a = engine.generate("Hi", 10, ignore_eos=True).tokens
    engine.reset()
    b = engine.generate("Hi", 10, ignore_eos=True).tokens
    assert a == b


def test_bad_parameters_raise_parameter_error_from_python_and_rust(engine: Engine) -> None:
    from oxillama import OxiLlamaError, ParameterError

    assert issubclass(ParameterError, OxiLlamaError) and issubclass(ParameterError, ValueError)
    with pytest.raises(ParameterError, match="truncate"):
        engine.truncate(-1)
    # Raised by the Rust core, mapped in rust/python/errors.rs.
    with pytest.raises(ParameterError, match="KV data is 3 bytes"):
        engine._session.import_kv(1, b"abc")
