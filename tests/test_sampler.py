"""Each sampler stage's defining property, through the Rust bindings."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxillama import GenerateError, SamplerConfig, _native

V = 64
PLAIN: dict[str, Any] = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def sampler(vocab: int = V, breakers: list[list[int]] | None = None, **kw: Any) -> _native.Sampler:
    cfg = SamplerConfig(**{**PLAIN, **kw})
    return _native.Sampler(cfg.seeded().to_dict(), vocab, breakers or [])


def greedy(**kw: Any) -> _native.Sampler:
    return sampler(**{**kw, "temperature": 0.0})


def softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def probs(*p: float, vocab: int = V, rest: float = 1e-9) -> np.ndarray:
    """Logits whose softmax is (nearly) `p` followed by tiny-mass tokens."""
    return np.log(np.array([*p] + [rest] * (vocab - len(p)), dtype=np.float32))


def draws(s: _native.Sampler, logits: np.ndarray, n: int = 300) -> set[int]:
    return {s.sample(logits) for _ in range(n)}


logit_vectors = st.lists(st.floats(-6, 6, allow_nan=False, width=32), min_size=V, max_size=V).map(
    lambda v: np.array(v, dtype=np.float32)
)
seeds = st.integers(0, 2**64 - 1)


# --- truncation stages ---------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(logit_vectors, st.integers(1, 10), seeds)
def test_top_k_never_leaves_the_k_best(logits: np.ndarray, k: int, seed: int) -> None:
    kth = np.sort(logits)[::-1][k - 1]
    got = draws(sampler(top_k=k, seed=seed), logits, 100)
    assert all(logits[t] >= kth for t in got)


def test_top_k_one_is_argmax_and_k_covers_exactly_k() -> None:
    logits = np.random.default_rng(3).standard_normal(V).astype(np.float32)
    assert draws(sampler(top_k=1), logits, 50) == {int(np.argmax(logits))}
    flat = np.zeros(V, dtype=np.float32)
    flat[[5, 9, 40]] = 3.0
    assert draws(sampler(top_k=3), flat, 400) == {5, 9, 40}


@settings(max_examples=25, deadline=None)
@given(logit_vectors, st.floats(0.05, 0.9), seeds)
def test_min_p_cuts_below_fraction_of_the_best(logits: np.ndarray, mp: float, seed: int) -> None:
    p = softmax(logits)
    for t in draws(sampler(min_p=mp, seed=seed), logits, 100):
        assert p[t] >= mp * p.max() * (1 - 1e-4)


@settings(max_examples=25, deadline=None)
@given(logit_vectors, st.floats(0.1, 0.95), seeds)
def test_top_p_stays_inside_the_nucleus(logits: np.ndarray, tp: float, seed: int) -> None:
    p = softmax(logits)
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    size = int(np.searchsorted(cum, tp * (1 - 1e-5))) + 1
    nucleus = set(order[: size + 1].tolist())  # +1 absorbs float ties at the edge
    assert draws(sampler(top_p=tp, seed=seed), logits, 100) <= nucleus


def test_top_p_keeps_the_minimal_nucleus() -> None:
    logits = probs(0.15, 0.5, 0.05, 0.3)
    assert draws(sampler(top_p=0.45), logits) == {1}
    assert draws(sampler(top_p=0.75), logits) == {1, 3}  # .5 + .3 reaches .75
    assert draws(sampler(top_p=0.81), logits, 600) == {0, 1, 3}


def test_typical_keeps_tokens_near_the_entropy() -> None:
    # p = .4 .3 .2 .05 .05: |surprise - entropy| = .433 .145 .260 1.647 1.647,
    # so tokens enter in the order 1, 2, 0, ... until their mass exceeds typical_p.
    logits = probs(0.4, 0.3, 0.2, 0.05, 0.05, rest=1e-12)
    assert draws(sampler(typical_p=0.25), logits) == {1}
    assert draws(sampler(typical_p=0.45), logits) == {1, 2}
    assert draws(sampler(typical_p=0.85), logits, 600) == {0, 1, 2}


def test_top_a_and_epsilon_and_eta_cut_by_their_rules() -> None:
    logits = probs(0.5, 0.25, 0.15, 0.1)
    assert draws(sampler(top_a=0.7), logits) == {0, 1}  # p >= 0.7 * 0.5**2 = 0.175
    assert draws(sampler(top_a=0.5), logits, 600) == {0, 1, 2}  # p >= 0.125
    assert draws(sampler(epsilon_cutoff=0.12), logits, 600) == {0, 1, 2}
    assert draws(sampler(epsilon_cutoff=0.9), logits) == {0}  # never empty
    p = softmax(logits)
    h = -(p * np.log(p)).sum()
    for eta in (0.05, 0.2, 0.4):
        cut = min(eta, math.sqrt(eta) * math.exp(-h))
        want = {int(i) for i in np.nonzero(p >= cut)[0]}
        assert draws(sampler(eta_cutoff=eta), logits, 800) == want


def test_xtc_removes_top_choices_when_it_fires() -> None:
    logits = probs(0.5, 0.3, 0.15, 0.05)
    # .5 and .3 clear 0.2: only the weaker of them (1) stays.
    assert draws(sampler(xtc_threshold=0.2, xtc_probability=1.0), logits, 600) == {1, 2, 3}
    # .5 .3 .15 clear 0.1: only .15 of them stays.
    assert draws(sampler(xtc_threshold=0.1, xtc_probability=1.0), logits, 600) == {2, 3}
    # Never with probability 0; nothing to exclude with one token above.
    assert 0 in draws(sampler(xtc_threshold=0.2, xtc_probability=0.0), logits)
    assert 0 in draws(sampler(xtc_threshold=0.4, xtc_probability=1.0), logits)


def test_xtc_fires_with_its_probability() -> None:
    logits = probs(0.5, 0.5, vocab=V, rest=1e-12)
    s = sampler(xtc_threshold=0.3, xtc_probability=0.3, seed=1)
    n = 3000
    # Fired: only token 1 (the later id of the tie) is left; otherwise a coin flip.
    zeros = sum(s.sample(logits) == 0 for _ in range(n))
    assert zeros / n == pytest.approx(0.7 * 0.5, abs=0.03)


# --- mirostat ------------------------------------------------------------------------------------


def test_mirostat_v2_mu_update() -> None:
    # One token far more likely than the mu cut allows for the rest: after
    # truncation it has p = 1, surprise 0, so mu += eta * tau.
    logits = np.full(V, -30.0, dtype=np.float32)
    logits[7] = 0.0
    s = sampler(mirostat=2, mirostat_tau=5.0, mirostat_eta=0.1)
    assert s.get_state()["mirostat_mu"] == pytest.approx(10.0)
    assert s.sample(logits) == 7
    assert s.get_state()["mirostat_mu"] == pytest.approx(10.5)


@settings(max_examples=30, deadline=None)
@given(st.floats(0.55, 0.95), st.floats(0.3, 2.0), st.floats(0.01, 1.0), seeds)
def test_mirostat_v2_mu_follows_the_surprise(p0: float, temp: float, eta: float, seed: int) -> None:
    # Two live tokens, both under the initial cut (mu = 2 tau = 20 bits):
    # mu' = mu - eta * (-log2 p(drawn) - tau), p after temperature.
    logits = probs(p0, 1 - p0, rest=1e-30)
    tau = 10.0
    s = sampler(mirostat=2, mirostat_tau=tau, mirostat_eta=eta, temperature=temp, seed=seed)
    t = s.sample(logits)
    q = softmax(logits[:2] / np.float32(temp))
    assert t in (0, 1)
    want = 2 * tau - eta * (-math.log2(q[t]) - tau)
    assert s.get_state()["mirostat_mu"] == pytest.approx(want, rel=1e-4)


# --- penalties -----------------------------------------------------------------------------------


def test_dry_penalty_is_multiplier_times_base_to_the_excess_length() -> None:
    # After "1 2 3 10 7 1 2 3", emitting 10 would repeat a 3-token run:
    # penalty = 0.5 * 3 ** (3 - 2) = 1.5, so 10 (logit 5.5 + d) beats 20 (4.0) iff d > 0.
    for d, want in ((0.01, 10), (-0.01, 20)):
        logits = np.zeros(V, dtype=np.float32)
        logits[20] = 4.0
        logits[10] = 5.5 + d
        s = greedy(dry_multiplier=0.5, dry_base=3.0, dry_allowed_length=2)
        for t in [1, 2, 3, 10, 7, 1, 2, 3]:
            s.accept(t)
        assert s.sample(logits) == want
    # allowed_length 3: the same run is now within the allowance: 3.0 ** 0 * 0.5.
    logits = np.zeros(V, dtype=np.float32)
    logits[20] = 4.0
    logits[10] = 4.49
    s = greedy(dry_multiplier=0.5, dry_base=3.0, dry_allowed_length=3)
    for t in [1, 2, 3, 10, 7, 1, 2, 3]:
        s.accept(t)
    assert s.sample(logits) == 20


def test_dry_respects_breakers_and_its_window() -> None:
    logits = np.zeros(V, dtype=np.float32)
    logits[4] = 1.0  # would continue the repeat 1 2 3 -> 4
    logits[9] = 0.9
    history = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    cases: list[tuple[dict[str, Any], list[list[int]], int]] = [
        ({"dry_multiplier": 0.0}, [], 4),
        ({"dry_multiplier": 0.8}, [], 9),
        ({"dry_multiplier": 0.8}, [[2]], 4),  # "3" after the breaker is too short
        ({"dry_multiplier": 0.8}, [[2, 3]], 4),  # multi-token breaker at the end
        ({"dry_multiplier": 0.8}, [[8, 8]], 9),  # absent breaker changes nothing
        ({"dry_multiplier": 0.8, "dry_penalty_last_n": 5}, [], 4),  # run is older
        ({"dry_multiplier": 0.8, "dry_penalty_last_n": 0}, [], 4),  # 0 = off
    ]
    for kw, breakers, want in cases:
        s = sampler(temperature=0.0, breakers=breakers, dry_base=2.0, **kw)
        for t in history:
            s.accept(t)
        assert s.sample(logits) == want, (kw, breakers)


def test_repetition_penalty_inside_window_only() -> None:
    logits = np.zeros(V, dtype=np.float32)
    logits[[3, 5]] = [2.0, 1.5]
    s = greedy(repetition_penalty=2.0, repetition_penalty_window=2)
    for t in (3, 0, 0):
        s.accept(t)
    assert s.sample(logits) == 3  # 3 fell out of the 2-token window
    s.accept(3)
    assert s.sample(logits) == 5  # 2.0 / 2 = 1.0 < 1.5


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    # Token 1 has a negative logit and was seen: -1 * 1.5 = -1.5 loses to -1.2.
    logits = np.full(V, -10.0, dtype=np.float32)
    logits[[1, 2]] = [-1.0, -1.2]
    s = greedy(repetition_penalty=1.5)
    assert s.sample(logits) == 1
    s.accept(1)
    assert s.sample(logits) == 2
    # Positive: 3.0 / 1.5 = 2.0 loses to 2.1, beats 1.9.
    for other, want in ((2.1, 2), (1.9, 1)):
        logits = np.zeros(V, dtype=np.float32)
        logits[[1, 2]] = [3.0, other]
        s = greedy(repetition_penalty=1.5)
        s.accept(1)
        assert s.sample(logits) == want


def test_logit_bias_shifts_and_banned_tokens() -> None:
    logits = np.zeros(V, dtype=np.float32)
    logits[3] = 2.0
    assert greedy(logit_bias={11: 1.99}).sample(logits) == 3
    assert greedy(logit_bias={11: 2.01}).sample(logits) == 11
    assert greedy(logit_bias={3: -2.01}).sample(logits) == 0
    assert draws(sampler(logit_bias={11: 50.0}), np.zeros(V, dtype=np.float32), 100) == {11}
    # A ban beats any bias.
    assert greedy(logit_bias={3: 1e30}, banned_tokens=[3]).sample(logits) == 0


@settings(max_examples=20, deadline=None)
@given(logit_vectors, st.sets(st.integers(0, V - 1), min_size=1, max_size=V - 1), seeds)
def test_banned_tokens_never_appear(logits: np.ndarray, banned: set[int], seed: int) -> None:
    s = sampler(banned_tokens=sorted(banned), seed=seed, temperature=3.0)
    assert not draws(s, logits, 200) & banned


def test_everything_banned_is_an_error() -> None:
    logits = np.zeros(V, dtype=np.float32)
    for s in (sampler(banned_tokens=range(V)), greedy(banned_tokens=range(V))):
        with pytest.raises(GenerateError, match="banned or masked"):
            s.sample(logits)


# --- temperature, seeds, state -------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(logit_vectors)
def test_temperature_zero_is_argmax(logits: np.ndarray) -> None:
    assert greedy().sample(logits) == int(np.argmax(logits))  # lowest id on ties, like numpy
    assert SamplerConfig.greedy().temperature == 0.0


def test_temperature_concentrates_or_spreads() -> None:
    logits = np.random.default_rng(0).standard_normal(V).astype(np.float32)
    cold = draws(sampler(temperature=0.05, seed=1), logits, 200)
    hot = draws(sampler(temperature=5.0, seed=1), logits, 200)
    assert len(cold) < len(hot)
    # Frequencies follow softmax(logits / T).
    s = sampler(temperature=0.7, seed=2)
    n = 20000
    counts = np.bincount([s.sample(logits) for _ in range(n)], minlength=V) / n
    assert np.abs(counts - softmax(logits / 0.7)).max() < 0.015


@settings(max_examples=10, deadline=None)
@given(seeds, st.sampled_from([{}, {"mirostat": 2}, {"top_k": 5, "xtc_probability": 0.5}]))
def test_seeded_sampling_reproduces(seed: int, extra: dict[str, Any]) -> None:
    logits = np.random.default_rng(1).standard_normal(V).astype(np.float32)
    s1, s2 = sampler(seed=seed, **extra), sampler(seed=seed, **extra)
    assert [s1.sample(logits) for _ in range(50)] == [s2.sample(logits) for _ in range(50)]


def test_different_seeds_differ_and_reset_restarts() -> None:
    logits = np.zeros(V, dtype=np.float32)
    a = [sampler(seed=1).sample(logits) for _ in range(1)]
    s = sampler(seed=1)
    first = [s.sample(logits) for _ in range(30)]
    assert first[0] == a[0]
    other = sampler(seed=2)
    assert first != [other.sample(logits) for _ in range(30)]
    s.accept(5)
    s.reset()
    assert s.get_state()["history"] == []
    assert [s.sample(logits) for _ in range(30)] == first


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"mirostat": 2},
        {"repetition_penalty": 1.3, "dry_multiplier": 0.8, "xtc_probability": 0.5},
    ],
)
def test_state_round_trip_continues_the_stream(extra: dict[str, Any]) -> None:
    logits = np.random.default_rng(1).standard_normal(V).astype(np.float32)
    a = sampler(seed=5, **extra)
    for _ in range(20):
        a.accept(a.sample(logits))
    state = a.get_state()
    assert set(state) == {"rng", "mirostat_mu", "history"}
    json.dumps(state)  # plain data
    cont = []
    for _ in range(10):
        t = a.sample(logits)
        a.accept(t)
        cont.append(t)
    b = sampler(seed=999, **extra)  # the seed is irrelevant once the state is set
    b.set_state(state)
    again = []
    for _ in range(10):
        t = b.sample(logits)
        b.accept(t)
        again.append(t)
    assert cont == again


def test_set_state_rejects_bad_states() -> None:
    s = sampler()
    with pytest.raises(ValueError, match="history"):
        s.set_state({"rng": 1, "mirostat_mu": 1.0, "history": [V + 5]})
    with pytest.raises(ValueError, match="mirostat_mu"):
        s.set_state({"rng": 1, "mirostat_mu": float("nan"), "history": []})
    with pytest.raises(KeyError, match="rng"):
        s.set_state({"mirostat_mu": 1.0, "history": []})
    with pytest.raises(ValueError, match="rng"):
        s.set_state({"rng": -1, "mirostat_mu": 1.0, "history": []})


def test_history_is_bounded_by_the_longest_window() -> None:
    s = sampler(repetition_penalty_window=5, dry_penalty_last_n=3)
    for t in range(20):
        s.accept(t)
    assert s.get_state()["history"] == [15, 16, 17, 18, 19]


# --- masks and input checks ----------------------------------------------------------------------


def test_grammar_mask_is_respected() -> None:
    logits = np.zeros(V, dtype=np.float32)
    logits[0] = 100.0  # masked out, however likely
    allowed = np.zeros(V, dtype=bool)
    allowed[[1, 2, 63]] = True
    mask = np.packbits(allowed, bitorder="little").tobytes()
    s = sampler()
    assert {s.sample(logits, mask) for _ in range(300)} == {1, 2, 63}
    assert greedy().sample(logits, mask) in {1, 2, 63}
    with pytest.raises(ValueError, match="allowed"):
        s.sample(logits, mask[:-1])


def test_bad_logits_and_tokens_raise() -> None:
    s = sampler()
    with pytest.raises(ValueError, match="logits"):
        s.sample(np.zeros(V + 1, dtype=np.float32))
    with pytest.raises(TypeError):
        s.sample(np.zeros(V, dtype=np.float64))
    with pytest.raises(ValueError, match="vocabulary"):
        s.accept(V)
    with pytest.raises(ValueError, match="vocabulary"):
        s.accept(-1)
    # Strided views are read correctly.
    wide = np.zeros(2 * V, dtype=np.float32)
    wide[2 * 7] = 50.0
    assert greedy().sample(wide[::2]) == 7
    # NaN counts as -inf; +inf wins.
    logits = np.zeros(V, dtype=np.float32)
    logits[4] = np.nan
    logits[9] = np.inf
    assert draws(sampler(), logits, 50) == {9}


# --- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": 0.0}, "top_p"),
        ({"min_p": 2.0}, "min_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"top_k": -3}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"mirostat": 1}, "mirostat"),
        ({"mirostat_tau": 0.0}, "mirostat_tau"),
        ({"mirostat_eta": 0.0}, "mirostat_eta"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty_window": -1}, "repetition_penalty_window"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"typical_p": 0.0}, "typical_p"),
        ({"xtc_probability": 1.5}, "xtc_probability"),
        ({"xtc_threshold": -0.5}, "xtc_threshold"),
        ({"top_a": 1.5}, "top_a"),
        ({"eta_cutoff": 2.0}, "eta_cutoff"),
        ({"epsilon_cutoff": -1.0}, "epsilon_cutoff"),
        ({"dry_base": 0.5}, "dry_base"),
        ({"dry_multiplier": -1.0}, "dry_multiplier"),
        ({"dry_allowed_length": 0}, "dry_allowed_length"),
        ({"dry_penalty_last_n": -2}, "dry_penalty_last_n"),
        ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": [""]}, "dry_sequence_breakers"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {1: float("nan")}}, "logit_bias"),
        ({"banned_tokens": [-1]}, "banned_tokens"),
        ({"banned_tokens": [1.5]}, "banned_tokens"),
    ],
)
def test_invalid_values_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplerConfig(**kw)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_k", -1),
        ("mirostat", 1),
        ("min_p", float("nan")),
        ("dry_penalty_last_n", -5),
        ("repetition_penalty_window", -1),
    ],
)
def test_native_validation_names_the_field(key: str, value: object) -> None:
    d = SamplerConfig().seeded().to_dict()
    d[key] = value
    with pytest.raises(ValueError, match=key):
        _native.Sampler(d, V, [])


def test_token_ids_checked_against_vocabulary() -> None:
    with pytest.raises(ValueError, match="logit_bias"):
        SamplerConfig(logit_bias={V: 1.0}).validate(V)
    with pytest.raises(ValueError, match="banned_tokens"):
        SamplerConfig(banned_tokens=[V]).validate(V)
    SamplerConfig(logit_bias={V - 1: 1.0}, banned_tokens=[V - 1]).validate(V)
    with pytest.raises(ValueError, match="logit_bias"):
        _native.Sampler(SamplerConfig(logit_bias={V: 1.0}).seeded().to_dict(), V, [])
    with pytest.raises(ValueError, match="banned_tokens"):
        _native.Sampler(SamplerConfig(banned_tokens=[V]).seeded().to_dict(), V, [])
    with pytest.raises(ValueError, match="dry_breakers"):
        _native.Sampler(SamplerConfig().seeded().to_dict(), V, [[V]])
    with pytest.raises(KeyError, match="top_p"):
        d = SamplerConfig().seeded().to_dict()
        del d["top_p"]
        _native.Sampler(d, V, [])


def test_native_accepts_a_plain_bias_dict() -> None:
    d = SamplerConfig(temperature=0.0).seeded().to_dict()
    d["logit_bias"] = {11: 5.0}
    assert _native.Sampler(d, V, []).sample(np.zeros(V, dtype=np.float32)) == 11


config_strategy = st.builds(
    SamplerConfig,
    temperature=st.floats(0, 5),
    top_k=st.integers(0, 100),
    top_p=st.floats(0.01, 1),
    seed=st.integers(0, 2**64 - 1),
    mirostat=st.sampled_from([0, 2]),
    logit_bias=st.dictionaries(st.integers(0, V - 1), st.floats(-10, 10), max_size=4),
    banned_tokens=st.lists(st.integers(0, V - 1), max_size=4),
    dry_multiplier=st.floats(0, 2),
    xtc_probability=st.floats(0, 1),
)


@settings(max_examples=50, deadline=None)
@given(config_strategy)
def test_config_dict_round_trip(cfg: SamplerConfig) -> None:
    assert SamplerConfig.from_dict(cfg.to_dict()) == cfg
    assert SamplerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    s = _native.Sampler(cfg.to_dict(), V, [])
    assert 0 <= s.sample(np.zeros(V, dtype=np.float32)) < V


def test_from_dict_rejects_unknown_fields_and_keeps_defaults() -> None:
    with pytest.raises(ValueError, match="unknown"):
        SamplerConfig.from_dict({"temprature": 1.0})
    assert SamplerConfig.from_dict({"top_k": 7}) == SamplerConfig(top_k=7)
    assert SamplerConfig.from_dict({"logit_bias": {"3": 1}}).logit_bias == {3: 1.0}


def test_dry_breaker_ids() -> None:
    cfg = SamplerConfig(dry_sequence_breakers=("\n", "ab"))

    def encode(s: str) -> list[int]:
        return [ord(c) for c in s]

    assert cfg.dry_breaker_ids(encode) == [[10], [97, 98]]
    pieces = ["x", ".\n", "cab", "a"]
    assert cfg.dry_breaker_ids(encode, pieces) == [[10], [97, 98], [1], [2]]
