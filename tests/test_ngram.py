"""n-gram (prompt-lookup) speculative decoding on SmolLM2 Q4_1: greedy
output is the target's token for token, sampling keeps the target's
distribution, a snapshot continues exactly in another process, and the
index, the adaptive k and the shared cache do what they say."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oxillama import Engine, NgramCache, NgramDraft, SamplerConfig, SpeculativeEngine
from oxillama.decoding import ngram_draft
from oxillama.decoding.ngram_draft import best_k, row_cost
from oxillama.errors import ParameterError
from oxillama.sessions import sections as S
from oxillama.sessions import spec as spec_format
from oxillama.sessions.format import Section, decode, encode
from oxillama.snapshot import SnapshotFormatError

PASSAGE = (
    "The lighthouse at Port Elray was built in 1871 from granite quarried on the "
    "island. Its lamp burned whale oil until 1902, when it was converted to kerosene."
)

#: Four prompts the model copies from, four with nothing to copy.
PROMPTS = [
    f"Repeat this passage exactly:\n\n{PASSAGE}\n\nRepeat:",
    "Name: Ada Lovelace\nBorn: 1815\nName: Alan Turing\nBorn: 1912\nName: Ada Lovelace\nBorn:",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "one two three four five one two three four five one two",
    "The capital of France is",
    "Once upon a time",
    "Water boils at",
    "In 1969, astronauts",
]


@pytest.fixture(scope="module")
def target(model_path: Path) -> Engine:
    return Engine(model_path, context_size=1024, threads=2)


def test_greedy_is_the_target_token_for_token(target: Engine) -> None:
    greedy = SamplerConfig.greedy()
    drafted = 0
    for p in PROMPTS:
        target.reset()
        want = target.generate(p, 24, sampler=greedy, ignore_eos=True).tokens
        se = SpeculativeEngine(target, NgramDraft())
        got = se.generate(p, 24, sampler=greedy, ignore_eos=True)
        assert got.tokens == want, p
        assert got.text == target.detokenize(want)
        drafted += se.stats.drafted
    # The copying prompts really drafted, and drafts passed.
    assert drafted > 0


def test_a_copying_prompt_accepts_most_drafts(target: Engine) -> None:
    se = SpeculativeEngine(target, NgramDraft(n_max=4, num_speculative=8))
    se.generate(PROMPTS[0], 30, sampler=SamplerConfig.greedy(), ignore_eos=True)
    assert se.stats.drafted >= 10
    assert se.stats.acceptance_rate > 0.6
    # Fewer rounds than tokens: several tokens per target pass.
    assert se.stats.rounds < 25


def test_drafts_stop_at_max_tokens(target: Engine) -> None:
    """A call verifies no draft past its max_tokens: nothing is held back
    for the next call to evaluate again, and continuations in small pieces
    give the tokens of one call."""
    greedy = SamplerConfig.greedy()
    whole = SpeculativeEngine(target, NgramDraft()).generate(
        PROMPTS[0], 40, sampler=greedy, ignore_eos=True
    )
    se = SpeculativeEngine(target, NgramDraft())
    got: list[int] = []
    prompt = PROMPTS[0]
    while len(got) < 40:
        c = se.generate(prompt, min(5, 40 - len(got)), sampler=greedy, ignore_eos=True)
        prompt = ""
        got += c.tokens
        assert se._ahead == []
        assert se._t.n_past == len(se.tokens) - 1  # the pending token is not evaluated
    assert got == whole.tokens
    assert se.stats.drafted > 0


def test_sampling_keeps_the_target_distribution(target: Engine) -> None:
    """Chi-square of the first sampled token against the target's own
    distribution (top-k 6), on a prompt whose end repeats an earlier
    n-gram, so a draft is proposed (and often rejected) at that position."""
    cfg = SamplerConfig(temperature=1.5, top_k=6, top_p=1.0, min_p=0.0)
    prompt = "red, blue, red, blue, red,"
    target.reset()
    logits = target.eval(target.tokenize(prompt, add_special=True))
    se = SpeculativeEngine(target, NgramDraft(num_speculative=2), seed=0)
    p = se._dist(logits, cfg)
    support = np.nonzero(p)[0]
    assert len(support) == 6
    n = 300
    counts = dict.fromkeys(support.tolist(), 0)
    drafted = rejected = 0
    for seed in range(n):
        se.seed = seed
        se.reset()
        # A prior that always drafts, so the rule is exercised every time.
        assert se._ng is not None
        se._ng.agree = {n_: 0.95 for n_ in range(1, 5)}
        # The prompt alone, then two tokens (drafts stop at max_tokens):
        # the first is drawn in a round that verifies a draft (right after
        # a prompt the first token comes from the prompt pass, as Engine's
        # does).
        se.generate(prompt, 0, sampler=cfg)
        tok = se.generate("", 2, sampler=cfg, ignore_eos=True).tokens[0]
        counts[tok] += 1
        drafted += se.stats.drafted
        rejected += se.stats.rejected
    expected = n * p[support]
    chi2 = sum((counts[t] - e) ** 2 / e for t, e in zip(support.tolist(), expected, strict=True))
    # 5 degrees of freedom: P(chi2 > 20.5) = 0.001.
    assert chi2 < 20.5, (chi2, counts, expected)
    assert drafted >= n and 0 < rejected < n


CHILD = """
import json, sys
from oxillama import SamplerConfig
from oxillama.engine.speculative import SpeculativeEngine
out = {}
for name, (path, cfg) in json.loads(sys.argv[1]).items():
    se = SpeculativeEngine.restore(path)
    out[name] = se.generate("", 40, sampler=SamplerConfig(**cfg), ignore_eos=True).tokens
    out[name + "_stats"] = [se.stats.drafted, se.stats.accepted]
print(json.dumps(out))
"""


def test_oxispec1_continues_exactly_in_another_process(target: Engine, tmp_path: Path) -> None:
    cases = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.9, "top_p": 0.95}}
    whole, first, jobs, stats = {}, {}, {}, {}
    for name, kw in cases.items():
        cfg = SamplerConfig(**kw)
        se = SpeculativeEngine(target, NgramDraft(n_max=3, num_speculative=6), seed=21)
        whole[name] = se.generate(PROMPTS[0], 60, sampler=cfg, ignore_eos=True).tokens
        se.reset()
        first[name] = se.generate(PROMPTS[0], 20, sampler=cfg, ignore_eos=True).tokens
        path = tmp_path / f"{name}.oxispec"
        se.snapshot(path)
        info = json.loads(bytes(decode(path.read_bytes(), magic=spec_format.MAGIC)[1][1]))
        assert info["draft"]["method"] == "ngram" and info["draft"]["n_max"] == 3
        jobs[name] = (str(path), kw)
        # The same 20 + 40 in this process: what the restored run must
        # draft (drafts stop at a call's max_tokens, so the round at the
        # cut can differ from the 60-token run's; the tokens cannot).
        rest = se.generate("", 40, sampler=cfg, ignore_eos=True).tokens
        assert first[name] + rest == whole[name], name
        stats[name] = [se.stats.drafted, se.stats.accepted]
    run = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    rest = json.loads(run.stdout.strip().splitlines()[-1])
    for name in cases:
        assert first[name] + rest[name] == whole[name], name
    # The restored adaptive state drafts exactly as the run that went on.
    for name in cases:
        assert rest[name + "_stats"] == stats[name], name


def test_grammar_constrains_ngram_drafts(target: Engine) -> None:
    gbnf = r"""
root ::= "{\"name\": \"" [A-Za-z ]{1,30} "\", \"year\": " [0-9]{4} "}"
"""
    prompt = "Ada Lovelace was born in 1815. As JSON: "
    greedy = SamplerConfig.greedy()
    target.reset()
    want = target.generate(prompt, 40, sampler=greedy, grammar=gbnf)
    se = SpeculativeEngine(target, NgramDraft())
    got = se.generate(prompt, 40, sampler=greedy, grammar=gbnf)
    assert got.tokens == want.tokens and got.finish_reason == want.finish_reason


def test_index_is_incremental_and_finds_the_longest_match() -> None:
    d = NgramDraft(n_max=3, n_min=1, num_speculative=4)
    st = d.new_state([5, 6, 7, 8, 9, 1, 6, 7, 2, 3])
    st.extend([5, 6, 7])
    # "5 6 7" occurred at the start, followed by 8 9 1 6.
    assert st.lookup(4) == (3, [8, 9, 1, 6])
    st.extend([2])
    # "6 7 2" is the longest match (from position 6), followed by 3 5 6 7.
    assert st.lookup(4) == (3, [3, 5, 6, 7])
    st.extend([42])
    assert st.lookup(4) == (0, [])
    # A context that changed otherwise is indexed again from scratch.
    st.sync([1, 2, 1])
    assert st.tokens == [1, 2, 1] and st.lookup(4) == (1, [2, 1])


@pytest.mark.parametrize("level", ["avx2", "avx512vnni"])
def test_adaptive_k_follows_agreement_and_cost(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each kernel level's measured cost table, whatever this CPU has.
    monkeypatch.setattr(ngram_draft, "_costs", lambda: ngram_draft._COSTS[level])
    assert best_k(0.05, 8)[0] == 0
    assert best_k(ngram_draft._PRIOR, 8)[0] == 0  # the prior: nothing drafted before evidence
    # Verification rows cheap enough that half the drafts passing pays.
    assert (best_k(0.5, 8)[0] > 0) == (level == "avx512vnni")
    k, gain = best_k(0.95, 8)
    assert k >= 4 and gain > 0.8 * k
    # A pass that already holds 8 rows of other sequences: drafts cost less
    # per row there, but must beat the tokens per cost it already has.
    assert best_k(0.9, 8, tokens=8.0, rows=8)[0] != best_k(0.9, 8)[0]
    assert row_cost(1) == 1.0 and row_cost(8) < row_cost(9)
    d = NgramDraft(num_speculative=8)
    st = d.new_state([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    n, proposal, drafts, _ = st.propose(100)
    assert n == 3 and proposal == [4, 5, 6, 7, 8, 9, 1, 2] and drafts == []
    for _ in range(20):  # the proposals' first tokens keep agreeing
        st.feedback(n, proposal, 0, [4])
    drafts = st.propose(100)[2]
    if level == "avx2":
        # 7 drafts fill one GEMM group with the pending token; an 8th would
        # start a second group.
        assert drafts == proposal[:7]
    else:
        # Rows through the sixteen-rows tile: each further row costs about a
        # fifth to a third of a step, so the draft stops where that
        # outweighs the next draft's chance.
        assert drafts == proposal[: len(drafts)] and len(drafts) >= 4
    for _ in range(20):  # then the drafts keep failing
        st.feedback(n, proposal, 8, [9])
    assert st.propose(100)[2] == []


def test_estimates_start_as_running_means_and_settle_into_averages() -> None:
    st = NgramDraft().new_state([1, 2, 3, 4, 5, 1, 2])
    n, proposal, drafts, _ = st.propose(100)
    assert n == 2 and drafts == []
    # The prior counts as one observation: one agreeing token moves the
    # estimate halfway to 1, three put it past 0.75 (an average with a
    # weight of 0.2 from the start would be at 0.54).
    st.feedback(n, proposal, 0, [proposal[0]])
    assert st.agree[n] == pytest.approx(0.1 + 0.9 / 2)
    for _ in range(2):
        st.feedback(n, proposal, 0, [proposal[0]])
    assert st.agree[n] > 0.75 and st.count[n] == 3 and st.count_all == 3
    assert st.propose(100)[2]  # drafting after three agreeing tokens
    # Later observations weigh _ALPHA each: one miss after many hits.
    for _ in range(40):
        st.feedback(n, proposal, 0, [proposal[0]])
    before = st.agree[n]
    st.feedback(n, proposal, 0, [proposal[0] + 1])
    assert st.agree[n] == pytest.approx(before * (1 - ngram_draft._ALPHA))


def test_estimates_round_trip_and_older_states_load_settled() -> None:
    st = NgramDraft().new_state([1, 2, 3, 1, 2])
    n, proposal, _, _ = st.propose(100)
    st.feedback(n, proposal, 0, [proposal[0]])
    saved = st.export()
    twin = NgramDraft().new_state()
    twin.load(saved)
    assert (twin.agree, twin.agree_all, twin.count, twin.count_all) == (
        st.agree,
        st.agree_all,
        st.count,
        st.count_all,
    )
    # A state written before counts were kept resumes past the start.
    old = NgramDraft().new_state()
    old.load({"agree": saved["agree"], "agree_all": saved["agree_all"]})
    assert old.count == {n: ngram_draft._SETTLED} and old.count_all == ngram_draft._SETTLED
    for bad in (
        {**saved, "count": {"7": 1}},
        {**saved, "count": {str(n): -1}},
        {**saved, "count": {str(n): True}},
        {**saved, "count_all": 2.5},
        {k: v for k, v in saved.items() if k != "count_all"},
    ):
        with pytest.raises(ValueError, match="count"):
            NgramDraft().new_state().load(bad)


def test_shared_cache_drafts_an_earlier_requests_tokens(target: Engine) -> None:
    cache = NgramCache(n=3)
    greedy = SamplerConfig.greedy()
    prompt = "Write one sentence about the sea."
    se = SpeculativeEngine(target, NgramDraft(cache=cache))
    first = se.generate(prompt, 24, sampler=greedy, ignore_eos=True)
    assert len(cache) > 0
    se.reset()
    second = se.generate(prompt, 24, sampler=greedy, ignore_eos=True)
    assert second.tokens == first.tokens
    assert cache.hits > 0 and se.stats.accepted > 0


def test_bad_parameters_are_named(target: Engine) -> None:
    with pytest.raises(ParameterError, match="n_max"):
        NgramDraft(n_max=0)
    with pytest.raises(ParameterError, match="n_min"):
        NgramDraft(n_max=2, n_min=3)
    with pytest.raises(ParameterError, match="num_speculative"):
        NgramDraft(num_speculative=33)
    with pytest.raises(ParameterError, match="cache"):
        NgramDraft(cache={})  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="num_speculative is set on the NgramDraft"):
        SpeculativeEngine(target, NgramDraft(), num_speculative=3)
    with pytest.raises(ParameterError, match="async_draft"):
        SpeculativeEngine(target, NgramDraft(), async_draft=True)
    with pytest.raises(ParameterError, match="draft must be"):
        SpeculativeEngine(target, "ngram")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def blob(target: Engine) -> bytes:
    se = SpeculativeEngine(target, NgramDraft(n_max=2), seed=5)
    se.generate("a b a b a", 4, sampler=SamplerConfig.greedy(), ignore_eos=True)
    return spec_format.dumps(se)


def with_meta(blob: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    _, secs = decode(blob, magic=spec_format.MAGIC)
    meta = json.loads(bytes(secs[spec_format.META]))
    edit(meta)
    parts = [Section(spec_format.META, S.encode_json(meta))]
    parts += [Section(t, bytes(v)) for t, v in secs.items() if t != spec_format.META]
    return encode(parts, magic=spec_format.MAGIC, version=spec_format.VERSION)


def test_an_ngram_snapshot_restores_its_draft(blob: bytes) -> None:
    se = spec_format.loads(with_meta(blob, lambda m: None))
    assert isinstance(se.draft, NgramDraft) and se.draft.n_max == 2
    with pytest.raises(ParameterError, match="draft_model_path"):
        spec_format.loads(blob, draft_model_path="x.gguf")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: m["draft"].update(method="medusa"), "unknown draft method"),
        (lambda m: m["draft"].update(n_max=99), "n-gram parameters"),
        (lambda m: m["draft"].pop("n_min"), "n-gram parameters"),
        (lambda m: m["draft"].update(agree={"1": 2.0}), "probability"),
        (lambda m: m["draft"].update(agree={"7": 0.5}), "outside"),
        (lambda m: m["draft"].update(agree=[1]), "not an object"),
        (lambda m: m.update(num_speculative=3), "differs"),
    ],
)
def test_bad_ngram_metadata_is_a_format_error(
    blob: bytes, edit: Callable[[dict[str, Any]], None], match: str
) -> None:
    with pytest.raises(SnapshotFormatError, match=match):
        spec_format.loads(with_meta(blob, edit))
