"""Engine.embed: pooling modes on SmolLM2 against llama.cpp, the bert
architecture (all-MiniLM-L6-v2) against llama.cpp and a float64 numpy
forward pass of the original weights, retrieval sanity, input shapes,
truncation, errors, and that embedding leaves the generation session
alone. llama.cpp's vectors are committed (tests/embeddings/reference.*,
made by ``python -m tests.embeddings.make_reference``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oxillama import Engine, GenerateError, ParameterError, SamplerConfig
from oxillama.engine.embeddings import pool
from tests.embeddings.minilm_oracle import oracle
from tests.embeddings.texts import DECODER_TEXTS, RETRIEVAL, SENTENCES

HERE = Path(__file__).parent / "embeddings"
REF = np.load(HERE / "reference.npz")
META = json.loads((HERE / "reference.json").read_text())


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def minilm(minilm_path: Path) -> Engine:
    return Engine(minilm_path, threads=2)


@pytest.fixture(scope="module")
def smol_tokens(shared_engine: Engine) -> list[np.ndarray]:
    """SmolLM2's final (output-normed) hidden states of the 20 texts, one
    batched call with pooling none, unnormalized."""
    out = shared_engine.embed(list(DECODER_TEXTS), pooling="none", normalize=False)
    assert isinstance(out, list)
    return out


def test_smollm2_tokens_equal_llamacpp(shared_engine: Engine) -> None:
    ids = [shared_engine.tokenize(t) for t in DECODER_TEXTS]
    assert ids == META["smollm2_token_ids"]


@pytest.mark.parametrize("mode", ["last", "mean", "cls", "max"])
def test_smollm2_pooling_matches_llamacpp(mode: str, smol_tokens: list[np.ndarray]) -> None:
    lengths = [len(t) for t in smol_tokens]
    ours = pool(np.concatenate(smol_tokens), lengths, mode, True)  # type: ignore[arg-type]
    cos = _cos(ours, REF[f"smollm2_{mode}"])
    assert cos.shape == (20,)
    assert cos.min() >= 0.999, (mode, cos.min(), int(cos.argmin()))


def test_every_pooling_mode_of_embed_equals_pooling_its_token_vectors(
    shared_engine: Engine,
) -> None:
    texts = list(DECODER_TEXTS[:4])
    per_token = shared_engine.embed(texts, pooling="none", normalize=False)
    assert isinstance(per_token, list) and len(per_token) == 4
    for toks, text in zip(per_token, texts, strict=True):
        assert toks.shape == (len(shared_engine.tokenize(text)), 576)
    flat, lengths = np.concatenate(per_token), [len(t) for t in per_token]
    for mode in ("last", "mean", "cls", "max"):
        got = shared_engine.embed(texts, pooling=mode)
        assert got.shape == (4, 576) and got.dtype == np.float32
        np.testing.assert_allclose(got, pool(flat, lengths, mode, True), atol=1e-6)  # type: ignore[arg-type]
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert shared_engine.pooling == "last"  # SmolLM2 has no pooling_type key


def test_minilm_matches_llamacpp_and_float64_oracle(minilm: Engine, minilm_zip: Path) -> None:
    assert minilm.arch == "bert" and minilm.pooling == "mean"
    assert [minilm.tokenize(s, add_special=True) for s in SENTENCES] == META["minilm_token_ids"]
    ours = minilm.embed(list(SENTENCES))
    assert ours.shape == (50, 384)
    vs_llama = _cos(ours, REF["minilm_mean"])
    ref = oracle(minilm_zip)
    # The oracle tokenizes with the original tokenizer.json, independently.
    assert [ref.ids(s) for s in SENTENCES] == META["minilm_token_ids"]
    vs_oracle = _cos(ours, ref.embed(list(SENTENCES)))
    assert vs_llama.min() >= 0.999, vs_llama.min()
    assert vs_oracle.min() >= 0.999, vs_oracle.min()


def test_minilm_ranks_every_paraphrase_first(minilm: Engine) -> None:
    for anchor, para, others in RETRIEVAL:
        v = minilm.embed([anchor, para, *others])
        sims = v[1:] @ v[0]
        assert sims[0] > sims[1:].max(), (anchor, sims)


def test_batched_equals_one_at_a_time(minilm: Engine) -> None:
    texts = list(SENTENCES[:6])
    batch = minilm.embed(texts)
    alone = np.array([minilm.embed(t) for t in texts])
    assert _cos(batch, alone).min() > 0.99999


def test_shapes_of_inputs(minilm: Engine) -> None:
    ids = minilm.tokenize("A man is eating food.", add_special=True)
    one = minilm.embed("A man is eating food.")
    assert one.shape == (384,) and one.dtype == np.float32
    np.testing.assert_allclose(minilm.embed(ids), one, atol=1e-6)
    two = minilm.embed([ids, ids[:-2]])
    assert two.shape == (2, 384)
    np.testing.assert_allclose(two[0], one, atol=1e-6)
    # Token ids are used exactly: without [SEP] the vector differs.
    assert _cos(two[1], one) < 0.9999
    raw = minilm.embed("hello there", normalize=False)
    assert abs(float(np.linalg.norm(raw)) - 1.0) > 1e-3
    tokens = minilm.embed("hello there", pooling="none")
    assert isinstance(tokens, np.ndarray) and tokens.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(tokens, axis=1), 1.0, atol=1e-5)


def test_truncation(minilm_path: Path) -> None:
    small = Engine(minilm_path, context_size=32, threads=2)
    long = "word " * 40
    with pytest.raises(GenerateError, match="input 1 has 42 tokens, more than the context size"):
        small.embed(["short", long], truncate=False)
    cut = small.embed(["short", long])
    assert cut.shape == (2, 384)
    # A truncated text keeps its [SEP]: equal to the ids cut by hand.
    ids = small.tokenize(long, add_special=True)
    np.testing.assert_allclose(cut[1], small.embed(ids[:31] + ids[-1:]), atol=1e-6)
    # Token ids are cut as given.
    np.testing.assert_allclose(small.embed([ids])[0], small.embed(ids[:32]), atol=1e-6)


def test_bad_inputs_are_typed_errors(minilm: Engine) -> None:
    with pytest.raises(ParameterError, match="pooling must be one of"):
        minilm.embed("x", pooling="sum")  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="empty list"):
        minilm.embed([])
    with pytest.raises(ParameterError, match="input 1 must be a string or a list of token ids"):
        minilm.embed(["a", 3.5])  # type: ignore[list-item]
    with pytest.raises(ParameterError, match="input 0 is an empty token list"):
        minilm.embed([[]])
    with pytest.raises(ParameterError, match=r"input 1 has a token id outside \[0, 2\*\*32\)"):
        minilm.embed([[101, 102], [101, 2**40]])
    with pytest.raises(ParameterError, match="input 1: token id 99999 is outside"):
        minilm.embed([[101, 102], [101, 99999]])
    with pytest.raises(GenerateError, match=r"encoder .* cannot generate"):
        minilm.generate("hello", 4)


def test_embedding_leaves_the_session_alone(engine: Engine) -> None:
    engine.set_sampler(SamplerConfig.greedy())
    first = engine.generate("The capital of France is", 6, ignore_eos=True)
    before = (engine.n_past, engine.tokens)
    engine.embed(["one text", "and another one"], pooling="mean")
    assert (engine.n_past, engine.tokens) == before
    rest = engine.generate("", 6, ignore_eos=True)
    engine.reset()
    whole = engine.generate("The capital of France is", 12, ignore_eos=True)
    assert first.tokens + rest.tokens == whole.tokens


def test_active_lora_applies_to_embeddings(model_path: Path, tmp_path: Path) -> None:
    from tests.lora import cases

    adapter = tmp_path / "smol_a.gguf"
    cases.smol_a(model_path, adapter)
    eng = Engine(model_path, context_size=128, threads=2)
    text = "The capital of France is Paris."
    plain = eng.embed(text, normalize=False)
    eng.load_lora(adapter, scale=1.0)
    tuned = eng.embed(text, normalize=False)
    # The last token's hidden state is the one generation computes.
    eng.eval(eng.tokenize(text))
    hidden = eng._session.last_hidden()
    assert hidden is not None
    np.testing.assert_allclose(tuned, hidden, rtol=1e-5, atol=1e-5)
    assert _cos(plain, tuned) < 0.9999
