"""OpenAI's frequency and presence penalties in the sampler chain, against
a numpy model of the rule: over the last ``repetition_penalty_window``
accepted tokens, after the repetition penalty, a token seen ``c`` times
loses ``c * frequency_penalty + presence_penalty``."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxillama import ParameterError, SamplerConfig, _native

V = 24


def expected(
    logits: np.ndarray, history: list[int], window: int, rep: float, freq: float, pres: float
) -> np.ndarray:
    x = logits.astype(np.float64).copy()
    seen = Counter(history[-window:] if window else [])
    for t, c in seen.items():
        x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
        x[t] -= c * freq + pres
    return x


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.floats(-4, 4, allow_nan=False, width=32), min_size=V, max_size=V),
    st.lists(st.integers(0, V - 1), max_size=40),
    st.integers(0, 50),
    st.floats(0.5, 2.0),
    st.floats(-2, 2),
    st.floats(-2, 2),
)
def test_greedy_picks_the_argmax_of_the_penalized_logits(
    values: list[float], history: list[int], window: int, rep: float, freq: float, pres: float
) -> None:
    logits = np.array(values, dtype=np.float32)
    cfg = SamplerConfig(
        temperature=0.0,
        repetition_penalty=rep,
        repetition_penalty_window=window,
        frequency_penalty=freq,
        presence_penalty=pres,
        seed=0,
    )
    s = _native.Sampler(cfg.to_dict(), V, [])
    for t in history:
        s.accept(t)
    want = expected(logits, history, window, rep, freq, pres)
    got = s.sample(logits)
    assert want[got] >= want.max() - 1e-4


def test_presence_penalty_changes_sampled_frequencies() -> None:
    logits = np.zeros(V, dtype=np.float32)
    cfg = SamplerConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3)
    plain = _native.Sampler(cfg.to_dict(), V, [])
    pen = _native.Sampler(replace(cfg, presence_penalty=2.0).to_dict(), V, [])
    for s in (plain, pen):
        s.accept(0)
    n = 4000
    hits = [sum(s.sample(logits) == 0 for _ in range(n)) / n for s in (plain, pen)]
    # Token 0 (seen once) keeps weight e^-2 against 1 for the 23 others.
    assert abs(hits[0] - 1 / V) < 0.015
    assert abs(hits[1] - np.exp(-2) / (np.exp(-2) + V - 1)) < 0.01


@pytest.mark.parametrize("name", ["frequency_penalty", "presence_penalty"])
@pytest.mark.parametrize("bad", [2.5, -2.01, float("nan"), float("inf")])
def test_out_of_range_penalties_are_refused(name: str, bad: float) -> None:
    with pytest.raises(ParameterError, match=name):
        SamplerConfig(**{name: bad})


def test_old_configs_without_the_penalties_still_load() -> None:
    d = SamplerConfig(seed=1).to_dict()
    del d["frequency_penalty"], d["presence_penalty"]
    cfg = SamplerConfig.from_dict(d)
    assert cfg.frequency_penalty == 0.0 and cfg.presence_penalty == 0.0
