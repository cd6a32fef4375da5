"""Unseeded sampling: ``SamplerConfig.seed`` defaults to ``None``, which
draws a fresh seed from the OS for each live sampler (once for an engine's
own sampler, per call for a ``sampler=`` argument, per server request and
CLI run); the seed used is reported, and sending it back repeats the text."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import openai
import pytest

from oxillama import AsyncEngine, Engine, SamplerConfig
from oxillama.errors import ParameterError
from tests._serve import serving

PROMPT = "Once upon a time, in a small village by the sea,"
# Sampled hot enough that 4 identical 24-token texts would be a coincidence
# of probability far below 1e-9 on this model (checked over 200 runs: no two
# equal).
HOT = SamplerConfig(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0)
N = 24


def test_default_seed_is_none_and_seeded_draws_64_bits() -> None:
    assert SamplerConfig().seed is None
    drawn = {SamplerConfig().seeded().seed for _ in range(8)}
    assert len(drawn) == 8
    assert all(isinstance(s, int) and 0 <= s < 2**64 for s in drawn)
    fixed = SamplerConfig(seed=7)
    assert fixed.seeded() is fixed
    assert SamplerConfig.from_dict(SamplerConfig().to_dict()).seed is None
    with pytest.raises(ParameterError, match="seed"):
        SamplerConfig(seed=-1)


def test_unseeded_calls_differ_and_report_a_seed_that_repeats_them(model_path: Path) -> None:
    engine = Engine(model_path, context_size=256, threads=2)
    outs = []
    for _ in range(4):
        engine.reset()
        outs.append(engine.generate(PROMPT, N, sampler=HOT, ignore_eos=True))
    assert len({o.text for o in outs}) > 1, [o.text for o in outs]
    assert len({o.seed for o in outs}) == 4
    for o in outs[:2]:
        engine.reset()
        again = engine.generate(PROMPT, N, sampler=replace(HOT, seed=o.seed), ignore_eos=True)
        assert again.tokens == o.tokens
        assert again.seed == o.seed


def test_an_engines_own_sampler_draws_once_and_continues_its_stream(model_path: Path) -> None:
    a = Engine(model_path, context_size=256, threads=2, sampler=HOT)
    first = a.generate(PROMPT, N, ignore_eos=True)
    second = a.generate(" Then", N, ignore_eos=True)
    assert first.seed == second.seed == a.sampler.seed
    assert a.sampler.seed is not None
    # The same two calls on an engine given that seed: the same stream.
    b = Engine(model_path, context_size=256, threads=2, sampler=replace(HOT, seed=a.sampler.seed))
    assert b.generate(PROMPT, N, ignore_eos=True).tokens == first.tokens
    assert b.generate(" Then", N, ignore_eos=True).tokens == second.tokens


def test_an_unseeded_session_snapshot_continues_exactly(model_path: Path, tmp_path: Path) -> None:
    engine = Engine(model_path, context_size=256, threads=2, sampler=HOT)
    engine.generate(PROMPT, 8, ignore_eos=True)
    path = tmp_path / "s.oxisnap"
    engine.snapshot(path)
    tail = engine.generate("", N, ignore_eos=True)
    restored = Engine.restore(path)
    assert restored.generate("", N, ignore_eos=True).tokens == tail.tokens
    assert restored.sampler.seed == engine.sampler.seed


def test_greedy_ignores_the_seed(model_path: Path) -> None:
    engine = Engine(model_path, context_size=256, threads=2)
    outs = []
    for _ in range(2):
        engine.reset()
        outs.append(engine.generate(PROMPT, 12, sampler=SamplerConfig.greedy()))
    assert outs[0].tokens == outs[1].tokens
    assert outs[0].seed != outs[1].seed


def test_async_engine_requests_draw_their_own_seeds(model_path: Path) -> None:
    async def run() -> list[tuple[list[int], int | None]]:
        eng = AsyncEngine(model_path, context_size=256, threads=2, max_batch=4)
        try:
            outs = await asyncio.gather(
                *(eng.generate(PROMPT, N, sampler=HOT, ignore_eos=True) for _ in range(4))
            )
            seeded = replace(HOT, seed=outs[0].seed)
            again = await eng.generate(PROMPT, N, sampler=seeded, ignore_eos=True)
            return [(o.tokens, o.seed) for o in [*outs, again]]
        finally:
            await eng.close()

    res = asyncio.run(run())
    assert len({s for _, s in res[:4]}) == 4
    assert len({tuple(t) for t, _ in res[:4]}) > 1
    assert res[4] == res[0]


@pytest.fixture(scope="module")
def client(model_path: Path) -> Iterator[openai.OpenAI]:
    engine = AsyncEngine(model_path, context_size=256, threads=2, max_batch=4)
    with serving(engine, "smollm2") as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_server_draws_a_seed_per_request_and_reports_it(client: openai.OpenAI) -> None:
    msgs: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "Tell me a short story about a fox."}
    ]
    outs = [
        client.chat.completions.create(
            model="smollm2", messages=msgs, max_tokens=N, temperature=1.2
        )
        for _ in range(4)
    ]
    seeds = [o.model_extra["seed"] for o in outs if o.model_extra]
    assert len(seeds) == 4 and len(set(seeds)) == 4
    texts = [o.choices[0].message.content for o in outs]
    assert len(set(texts)) > 1, texts
    again = client.chat.completions.create(
        model="smollm2", messages=msgs, max_tokens=N, temperature=1.2, seed=seeds[0]
    )
    assert again.choices[0].message.content == texts[0]
    assert again.model_extra is not None and again.model_extra["seed"] == seeds[0]
    # A stream carries the seed on its last chunk.
    chunks = list(
        client.completions.create(
            model="smollm2", prompt=PROMPT, max_tokens=4, temperature=1.0, stream=True
        )
    )
    assert chunks[-1].model_extra is not None and "seed" in chunks[-1].model_extra


def test_cli_draws_a_seed_and_says_which() -> None:
    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "oxillama",
                "generate",
                PROMPT,
                "-n",
                str(N),
                "--quiet",
                "--temperature",
                "1.2",
                "--top-k",
                "0",
                "--top-p",
                "1",
                "--min-p",
                "0",
                "--ignore-eos",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )

    first = run()
    assert first.returncode == 0, first.stderr
    line = [x for x in first.stderr.splitlines() if x.startswith("oxillama: seed ")]
    assert len(line) == 1, first.stderr
    seed = line[0].split()[-1]
    again = run("--seed", seed)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    assert "oxillama: seed" not in again.stderr
