"""An ``openai-agents`` agent with a function tool, run to its final
output against ``/v1/responses`` (its Responses model, tracing off)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI

from oxillama import AsyncEngine
from tests._serve import serving

MODEL = "smollm2"


@pytest.fixture(scope="module")
def url(model_path: Path) -> Iterator[str]:
    engine = AsyncEngine(model_path, context_size=2048, threads=2, max_batch=4)
    with serving(engine, MODEL) as base:
        yield base


def test_an_agent_calls_its_tool_and_answers(url: str) -> None:
    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"It is sunny and 24 C in {city}."

    async def run() -> object:
        client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        agent = Agent(
            name="weather",
            instructions="You answer questions about the weather using your tool.",
            tools=[get_weather],
            model=OpenAIResponsesModel(model=MODEL, openai_client=client),
            # The first turn must call the tool; the agent then resets the
            # choice to auto (its default), and the model answers.
            model_settings=ModelSettings(temperature=0, max_tokens=120, tool_choice="required"),
        )
        try:
            return await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        finally:
            await client.close()

    result = asyncio.run(run())
    items = result.new_items  # type: ignore[attr-defined]
    assert any(isinstance(i, ToolCallItem) for i in items)
    assert any(isinstance(i, ToolCallOutputItem) for i in items)
    assert isinstance(items[-1], MessageOutputItem)
    assert asked and all(isinstance(c, str) and c for c in asked)
    final = result.final_output  # type: ignore[attr-defined]
    assert isinstance(final, str) and final.strip()
