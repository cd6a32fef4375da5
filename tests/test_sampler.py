"""Each sampler stage's defining property, through the Rust bindings."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxillama import SamplerConfig, _native

V = 64
PLAIN: dict[str, Any] = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def sampler(**kw: Any) -> _native.Sampler:
    cfg = SamplerConfig(**{**PLAIN, **kw})
    return _native.Sampler(cfg.to_dict(), V, [])


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def draws(s: _native.Sampler, logits: np.ndarray, n: int = 300) -> set[int]:
    return {s.sample(logits) for _ in range(n)}


logit_vectors = st.lists(st.floats(-6, 6, allow_nan=False, width=32), min_size=V, max_size=V).map(
    lambda v: np.array(v, dtype=np.float32)
)


@settings(max_examples=25, deadline=None)
@given(logit_vectors, st.integers(1, 10), st.integers(0, 2**32))
def test_top_k_never_leaves_the_k_best(logits: np.ndarray, k: int, seed: int) -> None:
    kth = np.sort(logits)[::-1][k - 1]
    for t in draws(sampler(top_k=k, seed=seed), logits, 100):
        assert logits[t] >= kth


@settings(max_examples=25, deadline=None)
@given(logit_vectors, st.floats(0.05, 0.9), st.integers(0, 2**32))
def test_min_p_cuts_below_fraction_of_the_best(logits: np.ndarray, mp: float, seed: int) -> None:
    p = softmax(logits.astype(np.float64))
    for t in draws(sampler(min_p=mp, seed=seed), logits, 100):
        assert p[t] >= mp * p.max() * (1 - 1e-4)


@settings(max_examples=25, deadline=None)
@given(logit_vectors, st.floats(0.1, 0.95), st.integers(0, 2**32))
def test_top_p_stays_inside_the_nucleus(logits: np.ndarray, tp: float, seed: int) -> None:
    p = softmax(logits.astype(np.float64))
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    size = int(np.searchsorted(cum, tp * (1 - 1e-5))) + 1
    nucleus = set(order[: size + 1].tolist())  # +1 absorbs float ties at the edge
    assert draws(sampler(top_p=tp, seed=seed), logits, 100) <= nucleus


def test_typical_keeps_tokens_near_the_entropy() -> None:
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.05, 0.05] + [1e-6] * (V - 5), dtype=np.float32))
    p = softmax(logits.astype(np.float64))
    h = -(p * np.log(p)).sum()
    dev = np.abs(-np.log(p) - h)
    got = draws(sampler(typical_p=0.5), logits)
    # The kept set is ordered by closeness to the entropy, not by probability.
    assert got and all(dev[t] <= np.sort(dev)[len(got) - 1] + 1e-6 for t in got)
    assert max(dev[t] for t in got) < dev[3]


def test_top_a_and_epsilon_and_eta_cut_by_their_rules() -> None:
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.1] + [1e-9] * (V - 4), dtype=np.float32))
    assert draws(sampler(top_a=0.7), logits) == {0, 1}  # p >= 0.7 * 0.5**2 = 0.175
    assert draws(sampler(epsilon_cutoff=0.12), logits) <= {0, 1, 2}
    p = softmax(logits.astype(np.float64))
    h = -(p * np.log(p)).sum()
    eta = 0.2
    cut = min(eta, math.sqrt(eta) * math.exp(-h))
    assert draws(sampler(eta_cutoff=eta), logits) <= {int(i) for i in np.nonzero(p >= cut)[0]}


def test_xtc_removes_top_choices_when_it_fires() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05] + [1e-9] * (V - 4), dtype=np.float32))
    assert 0 not in draws(sampler(xtc_threshold=0.2, xtc_probability=1.0), logits)
    assert 0 in draws(sampler(xtc_threshold=0.2, xtc_probability=0.0), logits)
    # With a single token above the threshold there is nothing to exclude.
    assert 0 in draws(sampler(xtc_threshold=0.4, xtc_probability=1.0), logits)


def test_mirostat_v2_mu_update() -> None:
    # One token far more likely than the mu cut allows for the rest: after
    # truncation it has p = 1, surprise 0, so mu += eta * tau.
    logits = np.full(V, -30.0, dtype=np.float32)
    logits[7] = 0.0
    s = sampler(mirostat=2, mirostat_tau=5.0, mirostat_eta=0.1)
    assert s.get_state()["mirostat_mu"] == pytest.approx(10.0)
    assert s.sample(logits) == 7
    assert s.get_state()["mirostat_mu"] == pytest.approx(10.5)


def test_dry_penalizes_extending_a_repeat() -> None:
    logits = np.zeros(V, dtype=np.float32)
    logits[4] = 1.0  # would continue the repeat 1 2 3 -> 4
    logits[9] = 0.9
    for dry, want in ((0.0, 4), (0.8, 9)):
        s = sampler(temperature=0.0, dry_multiplier=dry, dry_base=2.0, dry_allowed_length=2)
        for t in [1, 2, 3, 4, 5, 6, 1, 2, 3]:
            s.accept(t)
        assert s.sample(logits) == want


def test_repetition_penalty_inside_window_only() -> None:
    logits = np.zeros(V, dtype=np.float32)
    logits[[3, 5]] = [2.0, 1.5]
    s = sampler(temperature=0.0, repetition_penalty=2.0, repetition_penalty_window=2)
    for t in (3, 0, 0):
        s.accept(t)
    assert s.sample(logits) == 3  # 3 fell out of the 2-token window
    s.accept(3)
    assert s.sample(logits) == 5  # 2.0 / 2 = 1.0 < 1.5


def test_logit_bias_and_banned_tokens() -> None:
    logits = np.zeros(V, dtype=np.float32)
    assert draws(sampler(logit_bias={11: 50.0}), logits, 100) == {11}
    banned = list(range(0, V, 2))
    assert not draws(sampler(banned_tokens=banned), logits, 500) & set(banned)


def test_temperature_zero_is_argmax_and_seeds_reproduce() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(V).astype(np.float32)
    assert sampler(temperature=0.0).sample(logits) == int(np.argmax(logits))
    a = [sampler(seed=3).sample(logits) for _ in range(1)]
    s1, s2 = sampler(seed=3), sampler(seed=3)
    assert [s1.sample(logits) for _ in range(50)] == [s2.sample(logits) for _ in range(50)]
    assert a[0] == sampler(seed=3).sample(logits)
    # Low temperature concentrates, high temperature spreads.
    cold = draws(sampler(temperature=0.05, seed=1), logits, 200)
    hot = draws(sampler(temperature=5.0, seed=1), logits, 200)
    assert len(cold) < len(hot)


def test_state_round_trip_continues_the_stream() -> None:
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(V).astype(np.float32)
    a = sampler(seed=5, mirostat=2)
    for _ in range(20):
        a.accept(a.sample(logits))
    b = sampler(seed=5, mirostat=2)
    b.set_state(a.get_state())
    for _ in range(10):
        x, y = a.sample(logits), b.sample(logits)
        assert x == y
        a.accept(x)
        b.accept(y)
    with pytest.raises(ValueError):
        b.set_state({"rng": 1, "mirostat_mu": 1.0, "history": [V + 5]})


def test_grammar_mask_is_respected() -> None:
    logits = np.zeros(V, dtype=np.float32)
    mask = np.zeros(V // 8, dtype=np.uint8)
    mask[0] = 0b0000_0110  # tokens 1 and 2 only
    assert draws(
        sampler(),
        logits,
        200,
    ) <= set(range(V))
    s = sampler()
    assert {s.sample(logits, mask.tobytes()) for _ in range(200)} == {1, 2}


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": 0.0}, "top_p"),
        ({"min_p": 2.0}, "min_p"),
        ({"top_k": -3}, "top_k"),
        ({"mirostat": 1}, "mirostat"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"typical_p": 0.0}, "typical_p"),
        ({"xtc_probability": 1.5}, "xtc_probability"),
        ({"dry_base": 0.5}, "dry_base"),
        ({"temperature": float("nan")}, "temperature"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ],
)
def test_invalid_values_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplerConfig(**kw)


def test_token_ids_checked_against_vocabulary() -> None:
    with pytest.raises(ValueError, match="logit_bias"):
        SamplerConfig(logit_bias={V: 1.0}).validate(V)
    with pytest.raises(ValueError, match="banned_tokens"):
        SamplerConfig(banned_tokens=[V]).validate(V)
    with pytest.raises(ValueError, match="logit_bias"):
        _native.Sampler(SamplerConfig(logit_bias={V: 1.0}).to_dict(), V, [])


def test_config_dict_round_trip() -> None:
    cfg = SamplerConfig(temperature=0.7, logit_bias={3: -1.5}, banned_tokens=[1, 2], seed=99)
    assert SamplerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown"):
        SamplerConfig.from_dict({"temprature": 1.0})
