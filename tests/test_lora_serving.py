"""LoRA adapters in the batching scheduler and the OpenAI server: requests
with different adapters (and none) decode in the same batched steps, each
giving exactly the tokens of a lone Engine with that adapter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from oxillama import AsyncEngine, Engine, LoraError, SamplerConfig
from tests._serve import serving
from tests.lora import adapters, cases

PROMPTS = ["Once upon a time", "The capital of France is", "def fib(n):", "My favourite food"]


@pytest.fixture(scope="module")
def pair(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("lora_serving")
    a, b = d / "alpha.gguf", d / "beta.gguf"
    cases.smol_a(model_path, a)
    arch, shapes = adapters.base_shapes(model_path)
    ab = adapters.pairs(shapes, adapters.smollm2_layers(), rank=8, seed=7, b_std=0.03)
    adapters.write(b, arch, ab, alpha=None)
    return {"alpha": a, "beta": b}


def alone(model_path: Path, prompt: str, n: int, lora: Path | None) -> list[int]:
    e = Engine(model_path, context_size=256, threads=2, sampler=SamplerConfig.greedy())
    return e.generate(prompt, n, lora=lora).tokens


def test_async_engine_mixes_adapters_in_one_batch(model_path: Path, pair: dict[str, Path]) -> None:
    names = [None, "alpha", "beta", "alpha", None, "beta"]

    async def main() -> tuple[list[list[int]], dict[str, float | int]]:
        async with AsyncEngine(
            model_path, context_size=256, threads=2, max_batch=8, loras=pair
        ) as ai:
            g = SamplerConfig.greedy()
            outs = await asyncio.gather(
                *(
                    ai.generate(PROMPTS[i % 4], 16, sampler=g, lora=name)
                    for i, name in enumerate(names)
                )
            )
            with pytest.raises(LoraError, match="'gamma'"):
                await ai.generate("x", 2, lora="gamma")
            return [o.tokens for o in outs], ai.metrics()

    got, metrics = asyncio.run(main())
    for i, name in enumerate(names):
        want = alone(model_path, PROMPTS[i % 4], 16, None if name is None else pair[name])
        assert got[i] == want, (i, name)
    # Batched: far fewer forward passes than one per request and token.
    assert metrics["decode_steps"] < 6 * 16


@pytest.fixture(scope="module")
def client(model_path: Path, pair: dict[str, Path]) -> Iterator[openai.OpenAI]:
    engine = AsyncEngine(model_path, context_size=256, threads=2, max_batch=8, loras=pair)
    with serving(engine, "smollm2") as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_server_two_adapters_and_base_concurrently(
    client: openai.OpenAI, model_path: Path, pair: dict[str, Path]
) -> None:
    assert [m.id for m in client.models.list().data] == ["smollm2", "alpha", "beta"]
    # (model, extra body) per request: by model name, or by the lora field.
    asks = [
        ("smollm2", {}),
        ("alpha", {}),
        ("beta", {}),
        ("smollm2", {"lora": "alpha"}),
        ("smollm2", {"lora": "beta"}),
        ("alpha", {}),
    ]

    def ask(i: int) -> list[int] | str:
        model, extra = asks[i]
        r = client.completions.create(
            model=model,
            prompt=PROMPTS[i % 4],
            max_tokens=12,
            temperature=0,
            extra_body=extra,
        )
        assert r.model == extra.get("lora", model)
        return r.choices[0].text

    with ThreadPoolExecutor(len(asks)) as ex:
        texts = list(ex.map(ask, range(len(asks))))
    for i, (model, extra) in enumerate(asks):
        name = extra.get("lora", model)
        path = None if name == "smollm2" else pair[name]
        e = Engine(model_path, context_size=256, threads=2, sampler=SamplerConfig.greedy())
        assert texts[i] == e.generate(PROMPTS[i % 4], 12, lora=path).text, (i, name)


def test_server_refuses_unknown_adapters(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="gamma"):
        client.completions.create(model="gamma", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="unknown LoRA adapter 'gamma'"):
        client.completions.create(
            model="smollm2", prompt="x", max_tokens=1, extra_body={"lora": "gamma"}
        )
    with pytest.raises(openai.BadRequestError, match="pick one"):
        client.completions.create(
            model="alpha", prompt="x", max_tokens=1, extra_body={"lora": "beta"}
        )
