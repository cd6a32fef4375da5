"""n-gram speculation in the batching scheduler: requests that verify drafts
in the same forward pass as requests that do not give the tokens they give
without speculation (greedy and seeded sampling), the metrics count the
drafts, and the server validates the per-request field."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from oxillama import AsyncEngine, NgramDraft, SamplerConfig
from oxillama.errors import ParameterError
from tests._serve import serving

PASSAGE = (
    "The lighthouse at Port Elray was built in 1871 from granite quarried on the "
    "island. Its lamp burned whale oil until 1902, when it was converted to kerosene."
)
CHATS = [
    [{"role": "user", "content": f"Repeat this passage exactly:\n\n{PASSAGE}"}],
    [{"role": "user", "content": "Tell me a short story about a cat."}],
    [{"role": "user", "content": "Copy this code:\ndef add(a, b):\n    return a + b\n"}],
    [{"role": "user", "content": "What is the capital of Italy?"}],
]


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[AsyncEngine]:
    eng = AsyncEngine(model_path, context_size=512, threads=2, max_batch=8)
    yield eng
    asyncio.run(eng.close())


def test_batched_requests_give_the_same_tokens_with_and_without_drafts(
    engine: AsyncEngine,
) -> None:
    greedy = SamplerConfig.greedy()
    seeded = SamplerConfig(temperature=0.8, top_p=0.95, seed=11)

    async def run(spec: str) -> list[list[int]]:
        # Both kinds in one batch: the speculating requests' rows share the
        # pass with plain ones.
        kinds = [spec, "none"] * 2
        outs = await asyncio.gather(
            *[
                engine.chat(m, 40, sampler=cfg, speculative=k)
                for cfg in (greedy, seeded)
                for m, k in zip(CHATS, kinds, strict=True)
            ]
        )
        return [o.tokens for o in outs]

    before = engine.metrics()
    plain = asyncio.run(run("none"))
    spec = asyncio.run(run("ngram"))
    assert spec == plain
    after = engine.metrics()
    drafted = after["speculative_drafted_tokens"] - before["speculative_drafted_tokens"]
    accepted = after["speculative_accepted_tokens"] - before["speculative_accepted_tokens"]
    assert drafted > 0 and 0 < accepted <= drafted
    assert 0 < after["speculative_acceptance_rate"] <= 1


def test_an_engine_default_draft_and_bad_values(model_path: Path) -> None:
    with pytest.raises(ParameterError, match="speculative"):
        AsyncEngine(model_path, context_size=64, speculative="medusa")

    async def go() -> None:
        eng = AsyncEngine(
            model_path,
            context_size=256,
            threads=2,
            speculative=NgramDraft(num_speculative=4),
            sampler=SamplerConfig.greedy(),
        )
        try:
            with pytest.raises(ParameterError, match="speculative"):
                await eng.generate("x", 2, speculative="fast")
            a = await eng.chat(CHATS[0], 48)
            b = await eng.chat(CHATS[0], 48, speculative="none")
            assert a.tokens == b.tokens
            assert eng.metrics()["speculative_drafted_tokens"] > 0
        finally:
            await eng.close()

    asyncio.run(go())


@pytest.fixture(scope="module")
def base_url(model_path: Path) -> Iterator[str]:
    eng = AsyncEngine(model_path, context_size=256, threads=2, speculative="ngram")
    with serving(eng, "smol") as url:
        yield url


def post(url: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_server_field_is_validated_and_overrides(base_url: str) -> None:
    body: dict[str, object] = {"messages": CHATS[0], "max_tokens": 24, "temperature": 0}
    status, on = post(base_url, body)
    assert status == 200
    status, off = post(base_url, {**body, "speculative": "none"})
    assert status == 200
    assert on["choices"] == off["choices"]  # type: ignore[comparison-overlap]
    status, err = post(base_url, {**body, "speculative": "medusa"})
    assert status == 400 and "speculative" in json.dumps(err)
    status, err = post(base_url, {**body, "speculative": "ngram", "session": "s1"})
    assert status == 400 and "session" in json.dumps(err)
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    assert "oxillama:spec_decode_num_draft_tokens_total" in text


def test_a_recurrent_model_refuses_scheduler_drafts() -> None:
    from tests.models import _checks as arch

    path = arch.reference("mamba2").path
    with pytest.raises(ParameterError, match="recurrent"):
        AsyncEngine(path, context_size=64, speculative="ngram")
    eng = AsyncEngine(path, context_size=64)
    try:
        with pytest.raises(ParameterError, match="recurrent"):
            asyncio.run(eng.generate([1, 2, 3], 2, speculative="ngram"))
    finally:
        asyncio.run(eng.close())
