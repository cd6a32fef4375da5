"""mamba2 (rust/model/arch/mamba2.rs), the recurrent architecture: the
common checks against llama.cpp (its snapshot carries the convolution and
SSM state), then what a state instead of a KV cache changes: rollback only
to kept states, re-evaluation from the nearest one, the prefix cache off,
and speculative decoding and grammars, which both roll back."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from oxillama import AsyncEngine, Model, SpeculativeEngine, _native
from oxillama.errors import ParameterError
from tests.models import _checks as c
from tests.models._suite import ArchitectureSuite


class TestMamba2(ArchitectureSuite):
    names = ("mamba2",)


@pytest.fixture(scope="module")
def ref() -> c.Reference:
    return c.reference("mamba2")


def test_rolling_the_state_back_where_none_was_kept_is_a_typed_error(ref: c.Reference) -> None:
    kv = _native.Session(Model(ref.path).native, ref.n_ctx, c.THREADS)
    kv.eval(np.asarray(ref.tokens[:40], dtype=np.uint32), False)
    assert kv.can_truncate(0) and kv.can_truncate(40) and not kv.can_truncate(17)
    with pytest.raises(ParameterError, match=r"recurrent .*keeps its state only at positions"):
        kv.truncate(17)
    assert kv.n_past == 40


def test_generating_after_a_rewind_equals_a_fresh_run(ref: c.Reference) -> None:
    """Engine.truncate to a position with no kept state evaluates again
    from the nearest kept one: the continuation and the logits are those of
    a session that never went past that position."""
    e = c.engine(ref.path, ref)
    e.generate(ref.tokens[:40], 8, ignore_eos=True)
    e.truncate(17)
    rewound = e.generate("", 12, ignore_eos=True).tokens
    more = e.eval(ref.tokens[40:50], all_logits=True)
    fresh = c.engine(ref.path, ref)
    assert fresh.generate(ref.tokens[:17], 12, ignore_eos=True).tokens == rewound
    assert np.array_equal(fresh.eval(ref.tokens[40:50], all_logits=True), more)


def test_metrics_say_the_prefix_cache_is_off_for_a_recurrent_model(ref: c.Reference) -> None:
    recurrent = AsyncEngine(ref.path, context_size=ref.n_ctx, threads=c.THREADS)
    attention = AsyncEngine(c.reference("llama").path, context_size=256, threads=c.THREADS)
    m, a = recurrent.metrics(), attention.metrics()
    asyncio.run(recurrent.close())
    asyncio.run(attention.close())
    assert (m["prefix_cache_enabled"], m["recurrent_model"]) == (0, 1)
    assert (a["prefix_cache_enabled"], a["recurrent_model"]) == (1, 0)


def speculative(target: c.Reference, draft: c.Reference) -> SpeculativeEngine:
    return SpeculativeEngine(
        c.engine(target.path, target), c.engine(draft.path, draft), num_speculative=4
    )


@pytest.mark.parametrize("role", ["target", "draft"])
def test_speculative_decoding_with_mamba2_is_exact(ref: c.Reference, role: str) -> None:
    """Every fixture shares one vocabulary, so the llama fixture drafts for
    mamba2 and the other way round. It proposes tokens the target rejects,
    so the rounds roll the recurrent state back."""
    llama = c.reference("llama")
    target, draft = (ref, llama) if role == "target" else (llama, ref)
    spec = speculative(target, draft)
    got = spec.generate(ref.greedy_prompt, 24, sampler=c.GREEDY, ignore_eos=True).tokens
    lone = c.engine(target.path, target).generate(ref.greedy_prompt, 24, ignore_eos=True)
    assert got == lone.tokens
    assert spec.stats.rejected > 0, spec.stats


# Words of letters between spaces, then a full stop: a constraint every
# step of the random model's greedy path has to be steered by.
GRAMMAR = r"""root ::= word (" " word){2,5} "."
word ::= [a-z]{1,6}"""
SENTENCE = re.compile(r"[a-z]{1,6}( [a-z]{1,6}){2,5}\.")


def test_grammar_constrained_generation_on_mamba2(ref: c.Reference) -> None:
    """A grammar holds alone and under speculative decoding, where a
    rejected draft rolls the matcher back with the state; both give the
    same text."""
    plain = c.engine(ref.path, ref).generate(
        ref.greedy_prompt, 64, grammar=GRAMMAR, ignore_eos=True
    )
    assert SENTENCE.fullmatch(plain.text), plain.text
    assert plain.finish_reason == "stop"
    spec = speculative(ref, c.reference("llama"))
    out = spec.generate(ref.greedy_prompt, 64, sampler=c.GREEDY, grammar=GRAMMAR, ignore_eos=True)
    assert out.tokens == plain.tokens
    assert spec.stats.rejected > 0, spec.stats
