"""oxillama against llama.cpp on the real SmolLM2 model.

The reference files come from tests/reference/make_reference.py (llama.cpp
through llama-cpp-python; provenance in tests/reference/meta.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oxillama import Engine

REF = Path(__file__).parent / "reference"


def load_json(name: str) -> list[dict[str, object]]:
    return json.loads((REF / name).read_text())  # type: ignore[no-any-return]


TOKEN_CASES = load_json("tokens_smollm2.json")


@pytest.mark.parametrize(
    "case", TOKEN_CASES, ids=lambda c: repr(c["text"])[:30] + str(c["parse_special"])
)
def test_token_ids_equal_llama_cpp(shared_engine: Engine, case: dict[str, object]) -> None:
    text, special, want = case["text"], case["parse_special"], case["ids"]
    assert isinstance(text, str) and isinstance(special, bool)
    assert shared_engine.tokenize(text, parse_special=special) == want


def test_token_corpus_is_large_and_varied() -> None:
    assert len({c["text"] for c in TOKEN_CASES}) >= 20


@pytest.fixture(scope="module")
def teacher_forced(shared_engine: Engine) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    ref = dict(np.load(REF / "logits_smollm2.npz"))
    shared_engine.reset()
    ours = shared_engine.eval(ref["tokens"].tolist(), all_logits=True)
    shared_engine.reset()
    return ours, ref


@pytest.fixture(scope="module")
def teacher_forced_seq(shared_engine: Engine) -> np.ndarray:
    """Our decoding path: the same tokens evaluated one at a time."""
    ref = np.load(REF / "logits_smollm2.npz")
    shared_engine.reset()
    ours = np.stack([shared_engine.forward_one(int(t)) for t in ref["tokens"]])
    shared_engine.reset()
    return ours


def _closeness(ours: np.ndarray, ids: np.ndarray, logits: np.ndarray) -> tuple[float, float]:
    mine = np.take_along_axis(ours, ids, axis=1)
    corr = np.mean([np.corrcoef(a, b)[0, 1] for a, b in zip(mine, logits, strict=True)])
    return float(np.abs(mine - logits).mean()), float(corr)


def _margins(top: np.ndarray) -> np.ndarray:
    return top[:, 0] - top[:, 1]  # type: ignore[no-any-return]


def _noise_margin(ref: dict[str, np.ndarray]) -> float:
    """The largest top-1/top-2 margin at which llama.cpp's two paths (batched
    and token by token) pick different tokens: below it, a different pick
    is rounding, not error. Int8 activations make this model sensitive:
    rounding differences as small as a changed summation order move logits
    by ~0.15 on average (llama.cpp against itself)."""
    split = ref["seq_argmax"] != ref["batch_argmax"]
    both = np.maximum(_margins(ref["seq_top_logits"]), _margins(ref["batch_top_logits"]))
    return float(both[split].max())


# llama.cpp's own two paths agree on 93% of argmaxes here (80 of 86); we ask
# for 90% against either of them.
MIN_AGREEMENT = 0.90


def test_argmax_agrees_with_llama_cpp_decode_path(
    teacher_forced: tuple[np.ndarray, dict[str, np.ndarray]], teacher_forced_seq: np.ndarray
) -> None:
    """Decoding paths compared: ours and llama.cpp's, one token at a time.
    Wherever llama.cpp picks its top token by more than the noise margin,
    we must pick it too."""
    _, ref = teacher_forced
    ours = teacher_forced_seq
    assert len(ref["tokens"]) >= 50
    agree = ours.argmax(axis=1) == ref["seq_argmax"]
    assert float(agree.mean()) >= MIN_AGREEMENT, f"argmax agreement {agree.mean():.3f}"
    decisive = _margins(ref["seq_top_logits"]) > _noise_margin(ref)
    assert decisive.sum() >= len(decisive) // 2
    assert agree[decisive].all(), np.nonzero(decisive & ~agree)
    delta, corr = _closeness(ours, ref["seq_top_ids"], ref["seq_top_logits"])
    assert delta < 0.35 and corr > 0.97, (delta, corr)


def test_decisive_positions_agree_with_llama_cpp_batched_path(
    teacher_forced: tuple[np.ndarray, dict[str, np.ndarray]],
) -> None:
    """The same for the batched paths (our prefill against llama.cpp's)."""
    ours, ref = teacher_forced
    top = ref["batch_top_logits"]
    decisive = _margins(top) > _noise_margin(ref)
    assert decisive.sum() >= len(decisive) // 2
    agree = ours.argmax(axis=1) == ref["batch_argmax"]
    assert float(agree.mean()) >= MIN_AGREEMENT - 0.05, f"argmax agreement {agree.mean():.3f}"
    assert agree[decisive].all(), np.nonzero(decisive & ~agree)
    delta, corr = _closeness(ours, ref["batch_top_ids"], top)
    assert delta < 0.35 and corr > 0.97, (delta, corr)


def test_noise_margin_is_llama_cpp_self_disagreement() -> None:
    """The margin the two tests above use is measured, not chosen: llama.cpp
    disagrees with itself at margins up to it and never above."""
    ref = dict(np.load(REF / "logits_smollm2.npz"))
    m = _noise_margin(ref)
    assert 0.0 < m < 0.5
    for a, b in (("seq", "batch"), ("batch", "seq")):
        above = _margins(ref[f"{b}_top_logits"]) > m
        assert (ref[f"{a}_argmax"][above] == ref[f"{b}_argmax"][above]).all()


def test_our_batched_and_decoding_paths_agree(
    teacher_forced: tuple[np.ndarray, dict[str, np.ndarray]], teacher_forced_seq: np.ndarray
) -> None:
    """Prefill (GEMM microkernels, tiled attention) and one-token decode share
    their matrix arithmetic bit for bit; what is left is attention rounding,
    far below llama.cpp's own gap between its two paths."""
    batched, ref = teacher_forced
    seq = teacher_forced_seq
    assert float((batched.argmax(axis=1) == seq.argmax(axis=1)).mean()) >= 0.95
    gap = float(np.abs(batched - seq).mean())
    llama_gap = float(np.abs(ref["batch_top_logits"] - ref["seq_top_logits"]).mean())
    assert gap < 0.1 < llama_gap, (gap, llama_gap)


def test_llama_cpp_paths_disagree_with_each_other_too() -> None:
    """Documents the noise floor the bars above are measured against."""
    ref = np.load(REF / "logits_smollm2.npz")
    own = float((ref["batch_argmax"] == ref["seq_argmax"]).mean())
    assert own < 1.0


def test_greedy_continuations_match(engine: Engine) -> None:
    cases = load_json("greedy_smollm2.json")
    assert len(cases) >= 8
    matches = 0
    for c in cases:
        engine.reset()
        assert engine.tokenize(str(c["prompt"])) == c["prompt_ids"]
        out = engine.generate(list(c["prompt_ids"]), 16, ignore_eos=True).tokens  # type: ignore[call-overload]
        matches += out == list(c["greedy_ids"])[:16]  # type: ignore[call-overload]
    # The bar: 16-token greedy continuations of >= 8 prompts match for >= 6.
    assert matches >= 6, f"{matches} of {len(cases)} greedy continuations match llama.cpp"
