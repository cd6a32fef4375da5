"""Speculative decoding with every sampler stage (issue 25): history-dependent
stages (penalties, DRY, mirostat's mu) see accepted drafts while verifying
and lose rejected ones; greedy output is the target's token for token, and
sampled output keeps the target's distribution."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from oxillama import Engine, SamplerConfig
from oxillama.decoding.sampling import build_sampler
from oxillama.engine.speculative import SpeculativeEngine
from tests.test_speculative import PROMPTS, pair_paths


@pytest.fixture(scope="module")
def pair() -> tuple[Engine, Engine]:
    target, draft = pair_paths()
    return (
        Engine(target, context_size=512, threads=2),
        Engine(draft, context_size=512, threads=2),
    )


# Strong settings, so each stage changes greedy choices within a few tokens.
GREEDY_STAGES = {
    "repetition": SamplerConfig(temperature=0.0, repetition_penalty=1.6),
    "frequency_presence": SamplerConfig(
        temperature=0.0, frequency_penalty=1.0, presence_penalty=0.6
    ),
    "dry": SamplerConfig(temperature=0.0, dry_multiplier=2.0, dry_allowed_length=1),
    # Temperature 0 never reaches mirostat's stage (the target alone is
    # greedy too); the penalty makes the history matter.
    "mirostat2": SamplerConfig(temperature=0.0, mirostat=2, repetition_penalty=1.3),
}


_PLAIN: dict[str, list[int]] = {}


def _plain_greedy(target: Engine, prompt: str) -> list[int]:
    """16 greedy tokens with no stage (the same for every stage: made once)."""
    if prompt not in _PLAIN:
        target.reset()
        _PLAIN[prompt] = target.generate(
            prompt, 16, sampler=SamplerConfig.greedy(), ignore_eos=True
        ).tokens
    return _PLAIN[prompt]


@pytest.mark.parametrize("stage", list(GREEDY_STAGES))
def test_greedy_with_a_history_stage_is_the_target_token_for_token(
    pair: tuple[Engine, Engine], stage: str
) -> None:
    """On 8 prompts, 8 + 8 tokens (the second call continues the live
    sampler, so held-back tokens and the committed history carry over)
    equal 16 tokens of the target alone."""
    target, draft = pair
    cfg = GREEDY_STAGES[stage]
    se = SpeculativeEngine(target, draft, num_speculative=3)
    changed = 0
    for p in PROMPTS:
        target.reset()
        want = target.generate(p, 16, sampler=cfg, ignore_eos=True).tokens
        changed += want != _plain_greedy(target, p)
        se.reset()
        first = se.generate(p, 8, sampler=cfg, ignore_eos=True)
        rest = se.generate("", 8, ignore_eos=True)
        assert first.tokens + rest.tokens == want, (stage, p)
    assert changed > 0, f"{stage} never changed a greedy choice: the test shows nothing"
    assert 0 < se.stats.accepted < se.stats.drafted


def _pit(target: Engine, prompt: list[int], out: list[int], cfg: SamplerConfig) -> list[float]:
    """Randomized probability integral transform of each generated token
    under the target alone's distribution at its position: its own chain,
    walked along the text as the target alone would walk it (history, mu).
    For a text drawn from those distributions the values are independent
    and uniform on [0, 1)."""
    ref = build_sampler(cfg, target.tokenizer, target.vocab_size)
    for t in prompt:
        ref.accept(t)
    target.reset()
    target._session.exact_rows = True  # rows equal to one-token steps
    try:
        rows = target._session.eval(np.asarray(prompt + out[:-1], dtype=np.uint32), True)
    finally:
        target._session.exact_rows = False
        target.reset()
    u = np.random.default_rng(7)
    values = []
    for row, tok in zip(rows[len(prompt) - 1 :], out, strict=True):
        p32 = ref.probs(row)
        p = p32.astype(np.float64)
        values.append(float(p[:tok].sum() + u.random() * p[tok]))
        ref.advance(tok, float(p32[tok]))
    return values


SAMPLED_STAGES = {
    "repetition": SamplerConfig(temperature=1.0, repetition_penalty=1.4, top_k=0, top_p=1.0),
    "dry": SamplerConfig(temperature=1.0, dry_multiplier=1.0, dry_allowed_length=1, top_k=0),
    "mirostat2": SamplerConfig(temperature=1.0, mirostat=2, mirostat_tau=3.0),
    "xtc": SamplerConfig(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.05, top_k=20),
    "typical": SamplerConfig(temperature=1.0, typical_p=0.6, top_k=0, min_p=0.0),
}
#: Deliberately unlike the targets above, so drafts are often rejected and
#: the residual draws and rollbacks are exercised.
DRAFT_CFG = SamplerConfig(temperature=1.3, top_k=8, top_p=1.0, min_p=0.0)


@pytest.mark.parametrize("stage", list(SAMPLED_STAGES))
def test_sampling_with_a_stage_keeps_the_target_distribution(
    pair: tuple[Engine, Engine], stage: str
) -> None:
    """Chi-square of the tokens' PIT values (8 equal bins) over a 160-token
    sampled text: uniform exactly when each token came from the target
    alone's distribution given the text before it."""
    target, draft = pair
    cfg = SAMPLED_STAGES[stage]
    prompt = target.tokenize(PROMPTS[4], add_special=True)
    se = SpeculativeEngine(target, draft, num_speculative=3, seed=13, draft_sampler=DRAFT_CFG)
    out = se.generate(prompt, 160, sampler=cfg, ignore_eos=True).tokens
    assert len(out) == 160
    values = np.asarray(_pit(target, prompt, out, cfg))
    counts = np.bincount(np.minimum((values * 8).astype(int), 7), minlength=8)
    expected = len(values) / 8
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    print(f"\n{stage}: chi2 = {chi2:.2f} (7 df), bins {counts.tolist()}, {se.stats}")
    # 7 degrees of freedom: P(chi2 > 24.32) = 0.001.
    assert chi2 < 24.32, (stage, chi2, counts)
    # Both outcomes of the rule happened.
    assert se.stats.rejected > 0 and se.stats.accepted > 0


def test_completion_carries_its_request_figures(pair: tuple[Engine, Engine]) -> None:
    se = SpeculativeEngine(*pair, num_speculative=3)
    greedy = SamplerConfig.greedy()
    a = se.generate(PROMPTS[7], 12, sampler=greedy, ignore_eos=True)
    b = se.generate("", 12, ignore_eos=True)
    assert a.speculation is not None and b.speculation is not None
    ra, rb, total = a.speculation.request, b.speculation.request, b.speculation.total
    for name in ("rounds", "drafted", "accepted", "rejected", "bonus"):
        assert getattr(ra, name) + getattr(rb, name) == getattr(total, name), name
        assert getattr(total, name) == getattr(se.stats, name), name
    assert a.speculation.total == ra
    # Every round either ends at a rejection or with a bonus token.
    assert total.rejected + total.bonus == total.rounds
    assert total.bonus > 0


CHILD = """
import json, sys
from oxillama.engine.speculative import SpeculativeEngine
out = {}
for name, path in json.loads(sys.argv[1]).items():
    se = SpeculativeEngine.restore(path)
    st = se._ts.get_state()
    out[name] = {
        "tokens": se.generate("", 25, ignore_eos=True).tokens,
        "mu": st["mirostat_mu"],
        "history": st["history"],
    }
print(json.dumps(out))
"""

SNAPSHOT_STAGES = {
    "repetition": SamplerConfig(temperature=0.9, repetition_penalty=1.3, frequency_penalty=0.3),
    "dry": SamplerConfig(temperature=0.9, dry_multiplier=1.0, dry_allowed_length=1),
    "mirostat2": SamplerConfig(temperature=0.9, mirostat=2, mirostat_tau=3.0),
    "greedy_dry": SamplerConfig(temperature=0.0, dry_multiplier=2.0, dry_allowed_length=1),
}


def test_oxispec1_restores_each_stage_state_in_another_process(
    pair: tuple[Engine, Engine], tmp_path: Path
) -> None:
    """Snapshots after 15 tokens (mid-round: some tokens are held back)
    continue exactly in a fresh process with the live sampler: history,
    mirostat's mu and the draft's own config all come back."""
    whole, first, jobs, states = {}, {}, {}, {}
    for name, cfg in SNAPSHOT_STAGES.items():
        draft_cfg = SamplerConfig(temperature=1.2, mirostat=2) if name == "dry" else None
        se = SpeculativeEngine(*pair, num_speculative=4, seed=21, draft_sampler=draft_cfg)
        whole[name] = se.generate("A quiet harbour", 40, sampler=cfg, ignore_eos=True).tokens
        se.reset()
        first[name] = se.generate("A quiet harbour", 15, sampler=cfg, ignore_eos=True).tokens
        states[name] = se._ts.get_state()
        path = tmp_path / f"{name}.oxispec"
        se.snapshot(path)
        jobs[name] = str(path)
        again = SpeculativeEngine.restore_bytes(se.snapshot_bytes())
        assert again.sampler == se.sampler and again.draft_sampler == draft_cfg
        assert again._ds.get_state() == se._ds.get_state()
    run = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    rest = json.loads(run.stdout.strip().splitlines()[-1])
    for name in SNAPSHOT_STAGES:
        assert rest[name]["history"] == states[name]["history"], name
        assert rest[name]["mu"] == states[name]["mirostat_mu"], name
        assert first[name] + rest[name]["tokens"] == whole[name], name
    # Mirostat's mu really moved before the snapshot.
    assert states["mirostat2"]["mirostat_mu"] != 2 * 3.0
