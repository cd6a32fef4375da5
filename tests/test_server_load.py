"""The bounded load test: 32 concurrent clients send 200 requests to a
server on loopback through the official `openai` client. Plain and
streaming, completions and chat, some with stop strings, in a KV pool
too small for every running request at once, so the scheduler preempts
under load. Expect no errors, every completion finished, and every KV page
back in the pool afterwards."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from oxillama import AsyncEngine
from tests._serve import serving

MODEL = "smollm2"
CLIENTS = 32
REQUESTS = 200
# Requests of 10 to 35 tokens hold one to three pages of 16 each: sixteen
# running at once do not fit, any one alone does (a context is 4 pages).
KV_PAGES = 8


@pytest.fixture(scope="module")
def served(model_path: Path) -> Iterator[tuple[str, AsyncEngine]]:
    engine = AsyncEngine(
        model_path,
        context_size=64,
        threads=2,
        max_batch=16,
        prefix_cache_bytes=0,  # so "no page leaked" means exactly zero in use
        kv_pages=KV_PAGES,
    )
    with serving(engine, MODEL) as url:
        yield url, engine


TOPICS = ["the sea", "a robot", "Paris", "prime numbers", "tea", "winter", "a river", "music"]


async def one_request(client: openai.AsyncOpenAI, i: int) -> tuple[str, int, int]:
    """Request i (its shape varies with i); returns (finish_reason, tokens
    the usage reports, max_tokens)."""
    max_tokens = 4 + i % 13
    topic = TOPICS[i % len(TOPICS)]
    stop = ["\n\n"] if i % 5 == 0 else None
    if i % 4 == 0:
        chat = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Say something about {topic}."}],
            max_tokens=max_tokens,
            temperature=0.8,
            seed=i,
            stop=stop,
        )
        assert chat.usage is not None
        return str(chat.choices[0].finish_reason), chat.usage.completion_tokens, max_tokens
    if i % 4 == 1:
        stream = await client.completions.create(
            model=MODEL,
            prompt=f"A short note about {topic}:",
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            stop=stop,
        )
        finish, pieces, used = "", 0, -1
        async for chunk in stream:
            for ch in chunk.choices:
                pieces += bool(ch.text)
                finish = ch.finish_reason or finish
            if chunk.usage is not None:
                used = chunk.usage.completion_tokens
        # Text held back as a possible start of a stop string is flushed in
        # one more chunk when the length runs out: a piece per token, + 1.
        assert used >= 0 and pieces <= used + 1, (pieces, used)
        return finish, used, max_tokens
    done = await client.completions.create(
        model=MODEL,
        prompt=f"Write about {topic}.",
        max_tokens=max_tokens,
        temperature=0.0 if i % 2 else 0.7,
        stop=stop,
    )
    assert done.usage is not None
    return str(done.choices[0].finish_reason), done.usage.completion_tokens, max_tokens


def test_32_clients_200_requests_no_errors_no_leaked_pages(
    served: tuple[str, AsyncEngine],
) -> None:
    url, engine = served
    before = engine.metrics()

    async def main() -> list[tuple[str, int, int] | BaseException]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        gate = asyncio.Semaphore(CLIENTS)

        async def guarded(i: int) -> tuple[str, int, int]:
            async with gate:
                return await one_request(client, i)

        try:
            return await asyncio.gather(
                *(guarded(i) for i in range(REQUESTS)), return_exceptions=True
            )
        finally:
            await client.close()

    results = asyncio.run(main())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    for finish, tokens, max_tokens in results:  # type: ignore[misc]
        assert finish in ("stop", "length"), finish
        assert tokens <= max_tokens
        if finish == "length":
            assert tokens > 0
    after = engine.metrics()
    assert after["finished"] - before["finished"] == REQUESTS
    assert after["cancelled"] == before["cancelled"]
    assert after["running"] == 0 and after["queue_length"] == 0, after
    assert after["kv_pages_used"] == 0 and after["kv_pages_free"] == KV_PAGES, after
    # Under this load the pool ran out and sequences were recomputed.
    assert after["preempted"] > before["preempted"], after
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    assert any(
        line.split()[-1] in ("0", "0.0") for line in text.splitlines() if "kv_pages_used" in line
    ), text
