"""Speculative decoding on a real pair made by scripts/make_spec_pair.py:
SmolLM2 dequantized to F16 (target) and requantized to Q4_0 (draft).
Greedy output is the target's token for token, sampling keeps the target's
distribution (chi-square), and split generations equal whole ones."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import numpy as np
import pytest

from oxillama import Engine, SamplerConfig
from oxillama.engine.speculative import SpeculativeEngine
from oxillama.errors import ParameterError
from tests._gguf_meta import gemma3_path

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "Water boils at",
    "The three primary colors are",
    "In 1969, astronauts",
    "My favourite fruit is",
    "The quick brown fox",
]


def pair_paths() -> tuple[Path, Path]:
    """The test pair, written once by scripts/make_spec_pair.py."""
    spec = importlib.util.spec_from_file_location(
        "make_spec_pair", ROOT / "scripts/make_spec_pair.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    target, draft = mod.make_pair(Path.home() / ".cache/oxillama/spec")
    return Path(target), Path(draft)


@pytest.fixture(scope="module")
def pair() -> tuple[Engine, Engine]:
    target, draft = pair_paths()
    return (
        Engine(target, context_size=512, threads=2),
        Engine(draft, context_size=512, threads=2),
    )


def test_greedy_is_the_target_token_for_token(pair: tuple[Engine, Engine]) -> None:
    target, draft = pair
    greedy = SamplerConfig.greedy()
    se = SpeculativeEngine(target, draft, num_speculative=4)
    for p in PROMPTS:
        target.reset()
        want = target.generate(p, 24, sampler=greedy, ignore_eos=True).tokens
        se.reset()
        got = se.generate(p, 24, sampler=greedy, ignore_eos=True)
        assert got.tokens == want, p
        assert got.text == target.detokenize(want)
    assert 0 < se.stats.accepted <= se.stats.drafted


@pytest.mark.parametrize("cfg", [SamplerConfig.greedy(), SamplerConfig(temperature=0.9, seed=3)])
def test_split_generations_equal_whole_ones(
    pair: tuple[Engine, Engine], cfg: SamplerConfig
) -> None:
    se = SpeculativeEngine(*pair, num_speculative=3, seed=11)
    whole = se.generate("The sea", 60, sampler=cfg, ignore_eos=True).tokens
    se.reset()
    first = se.generate("The sea", 20, sampler=cfg, ignore_eos=True).tokens
    rest = se.generate("", 40, sampler=cfg, ignore_eos=True).tokens
    assert first + rest == whole


@pytest.mark.parametrize("async_draft", [False, True])
def test_sampling_keeps_the_target_distribution(
    pair: tuple[Engine, Engine], async_draft: bool
) -> None:
    """Chi-square of the first sampled token against the target's own
    distribution (top-k 6, so every category is well populated); with
    ``async_draft`` the drafts' draws are keyed, the rule is the same."""
    target, draft = pair
    cfg = SamplerConfig(temperature=1.5, top_k=6, top_p=1.0, min_p=0.0)
    prompt = "My favourite colour is"
    target.reset()
    logits = target.eval(target.tokenize(prompt, add_special=True))
    se = SpeculativeEngine(target, draft, num_speculative=2, seed=0, async_draft=async_draft)
    p = se._dist(logits, cfg)
    support = np.nonzero(p)[0]
    assert len(support) == 6
    n = 300
    counts = dict.fromkeys(support.tolist(), 0)
    for seed in range(n):
        se.seed = seed
        se.reset()
        tok = se.generate(prompt, 1, sampler=cfg, ignore_eos=True).tokens[0]
        counts[tok] += 1
    expected = n * p[support]
    chi2 = sum((counts[t] - e) ** 2 / e for t, e in zip(support.tolist(), expected, strict=True))
    # 5 degrees of freedom: P(chi2 > 20.5) = 0.001.
    assert chi2 < 20.5, (chi2, counts, expected)
    # And the draft really disagreed sometimes (the rule was exercised).
    assert se.stats.drafted > 0


def test_mismatched_vocabularies_and_bad_samplers(pair: tuple[Engine, Engine]) -> None:
    """Every stage of the chain is accepted now; only configs that are not
    SamplerConfigs (or do not fit the vocabulary) are refused."""
    target, draft = pair
    gemma = Engine(gemma3_path(), context_size=64, threads=1)
    with pytest.raises(ParameterError, match="vocabularies differ"):
        SpeculativeEngine(target, gemma)
    every_stage = SamplerConfig(
        repetition_penalty=1.2,
        frequency_penalty=0.1,
        presence_penalty=0.1,
        dry_multiplier=0.5,
        xtc_probability=0.5,
        xtc_threshold=0.1,
        typical_p=0.9,
        top_a=0.1,
        eta_cutoff=0.001,
        epsilon_cutoff=0.0001,
        seed=1,
    )
    se = SpeculativeEngine(target, draft, seed=2, draft_sampler=SamplerConfig(mirostat=2))
    assert len(se.generate("x", 4, sampler=every_stage, ignore_eos=True).tokens) == 4
    for bad in ({"temperature": 0.5}, "greedy", 1.0):
        with pytest.raises(ParameterError, match="draft_sampler must be a SamplerConfig"):
            SpeculativeEngine(target, draft, draft_sampler=bad)  # type: ignore[arg-type]
        with pytest.raises(ParameterError, match="sampler must be a SamplerConfig"):
            se.generate("x", 1, sampler=bad)  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="banned_tokens"):
        SpeculativeEngine(target, draft, draft_sampler=SamplerConfig(banned_tokens=[10**7]))
    with pytest.raises(ParameterError, match="num_speculative"):
        SpeculativeEngine(target, draft, num_speculative=0)


CHILD = """
import json, sys
from oxillama import SamplerConfig
from oxillama.engine.speculative import SpeculativeEngine
out = {}
for name, (path, cfg) in json.loads(sys.argv[1]).items():
    se = SpeculativeEngine.restore(path)
    out[name] = se.generate("", 40, sampler=SamplerConfig(**cfg), ignore_eos=True).tokens
print(json.dumps(out))
"""


def test_oxispec1_continues_exactly_in_another_process(
    pair: tuple[Engine, Engine], tmp_path: Path
) -> None:
    import json
    import subprocess
    import sys

    cases = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.9, "top_p": 0.95}}
    whole, first, jobs = {}, {}, {}
    for name, kw in cases.items():
        cfg = SamplerConfig(**kw)
        se = SpeculativeEngine(*pair, num_speculative=3, seed=21)
        whole[name] = se.generate("A quiet harbour", 60, sampler=cfg, ignore_eos=True).tokens
        se.reset()
        first[name] = se.generate("A quiet harbour", 20, sampler=cfg, ignore_eos=True).tokens
        path = tmp_path / f"{name}.oxispec"
        se.snapshot(path)
        assert path.read_bytes()[:8] == b"OXISPEC1"
        jobs[name] = (str(path), kw)
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


def test_oxispec1_rejects_bad_files(pair: tuple[Engine, Engine]) -> None:
    from oxillama.snapshot import SnapshotFormatError

    se = SpeculativeEngine(*pair, num_speculative=2, seed=1)
    se.generate("Hi", 4, ignore_eos=True)
    blob = se.snapshot_bytes()
    with pytest.raises(SnapshotFormatError, match="bad magic"):
        SpeculativeEngine.restore_bytes(b"OXISNAP1" + blob[8:])
    with pytest.raises(SnapshotFormatError, match="truncated"):
        SpeculativeEngine.restore_bytes(blob[: len(blob) // 2])
    bad = bytearray(blob)
    bad[-100] ^= 1
    with pytest.raises(SnapshotFormatError, match="checksum"):
        SpeculativeEngine.restore_bytes(bytes(bad))
    newer = bytearray(blob)
    newer[8:12] = (9).to_bytes(4, "little")
    with pytest.raises(SnapshotFormatError, match="version 9"):
        SpeculativeEngine.restore_bytes(bytes(newer))
    again = SpeculativeEngine.restore_bytes(blob)
    assert again.tokens == se.tokens and again.num_speculative == 2


JSON_GBNF = r"""
root   ::= "{" ws "\"name\":" ws string "," ws "\"age\":" ws [0-9]{1,3} ws "}"
string ::= "\"" [a-zA-Z ]{1,20} "\""
ws     ::= | " "
"""


def test_grammar_constrains_drafts_and_verification(
    pair: tuple[Engine, Engine], tmp_path: Path
) -> None:
    import json

    target, draft = pair
    greedy = SamplerConfig.greedy()
    target.reset()
    want = target.generate("A person as JSON:", 40, sampler=greedy, grammar=JSON_GBNF)
    se = SpeculativeEngine(target, draft, num_speculative=4, seed=2)
    got = se.generate("A person as JSON:", 40, sampler=greedy, grammar=JSON_GBNF)
    assert got.tokens == want.tokens and got.finish_reason == want.finish_reason
    json.loads(got.text)
    cfg = SamplerConfig(temperature=1.0, seed=9)
    for seed in range(3):
        se.seed = seed
        se.reset()
        out = se.generate("A person as JSON:", 40, sampler=cfg, grammar=JSON_GBNF)
        assert out.finish_reason in ("stop", "eos"), out.text
        json.loads(out.text)
    # Mid-grammar snapshot: the continuation is the uninterrupted one.
    se.seed = 4
    se.reset()
    whole = se.generate("A person as JSON:", 40, sampler=cfg, grammar=JSON_GBNF).tokens
    se.reset()
    head = se.generate("A person as JSON:", 6, sampler=cfg, grammar=JSON_GBNF).tokens
    again = SpeculativeEngine.restore_bytes(se.snapshot_bytes())
    tail = again.generate("", 40, sampler=cfg, grammar=JSON_GBNF).tokens
    assert head + tail == whole


def test_auto_picks_the_smallest_compatible_draft(tmp_path: Path) -> None:
    target, draft = pair_paths()
    se = SpeculativeEngine.auto(
        target, [gemma3_path(), tmp_path / "missing.gguf", target, draft], context_size=128
    )
    assert se.draft.model_path == Path(draft)
    with pytest.raises(ParameterError, match="no compatible draft") as e:
        SpeculativeEngine.auto(target, [gemma3_path(), target], context_size=128)
    assert "vocabularies differ" in str(e.value) or "not smaller" in str(e.value)


def test_async_drafting_keeps_greedy_output_and_uses_look_aheads(
    pair: tuple[Engine, Engine],
) -> None:
    target, draft = pair
    greedy = SamplerConfig.greedy()
    se = SpeculativeEngine(target, draft, num_speculative=2, async_draft=True)
    used = cancelled = 0
    for p in PROMPTS:
        target.reset()
        want = target.generate(p, 24, sampler=greedy, ignore_eos=True).tokens
        se.reset()
        assert se.generate(p, 24, sampler=greedy, ignore_eos=True).tokens == want, p
        used += se.stats.ahead_used
        cancelled += se.stats.ahead_cancelled
    # Look-aheads were taken when the verdict agreed, thrown away otherwise.
    assert used > 0 and cancelled > 0, (used, cancelled)


def test_close_ends_the_drafting_thread_and_loses_nothing(pair: tuple[Engine, Engine]) -> None:
    def drafting() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("oxillama-draft")}

    greedy = SamplerConfig.greedy()
    # Other tests' engines may still own (or be releasing) drafting threads.
    before = drafting()
    with SpeculativeEngine(*pair, num_speculative=2, async_draft=True) as se:
        first = se.generate(PROMPTS[0], 12, sampler=greedy, ignore_eos=True).tokens
        ours = drafting() - before
        assert len(ours) == 1
        se.close()
        assert not any(t.is_alive() for t in ours)
        # Continues where it was, starting a new thread for its look-aheads.
        more = se.generate("", 12, sampler=greedy, ignore_eos=True).tokens
        second = drafting() - before - ours
        assert len(second) == 1
    assert not any(t.is_alive() for t in second)
    target = pair[0]
    target.reset()
    want = target.generate(PROMPTS[0], 24, sampler=greedy, ignore_eos=True).tokens
    assert first + more == want


@pytest.mark.parametrize("cfg", [SamplerConfig.greedy(), SamplerConfig(temperature=0.9, seed=3)])
def test_async_drafting_is_deterministic_across_splits_and_snapshots(
    pair: tuple[Engine, Engine], cfg: SamplerConfig
) -> None:
    """Seeded async runs repeat exactly, whether a look-ahead was used or
    dropped (a snapshot drops it), so 20 + snapshot + 40 equals 60."""
    se = SpeculativeEngine(*pair, num_speculative=3, seed=5, async_draft=True)
    whole = se.generate("Rain on the roof", 60, sampler=cfg, ignore_eos=True).tokens
    se.reset()
    assert se.generate("Rain on the roof", 60, sampler=cfg, ignore_eos=True).tokens == whole
    se.reset()
    first = se.generate("Rain on the roof", 20, sampler=cfg, ignore_eos=True).tokens
    restored = SpeculativeEngine.restore_bytes(se.snapshot_bytes())
    assert restored.async_draft
    rest = restored.generate("", 40, sampler=cfg, ignore_eos=True).tokens
    assert first + rest == whole
    # The original continues the same way after its snapshot dropped its look-ahead.
    assert se.generate("", 40, sampler=cfg, ignore_eos=True).tokens == rest
