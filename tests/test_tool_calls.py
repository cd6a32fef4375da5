"""Tool calls: the incremental detector on every format with the text
split at every offset, the call grammar (arguments always valid against
the function's schema), and the format read from chat templates."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from oxillama import AsyncEngine, Engine, Grammar, ParameterError, SamplerConfig
from oxillama.decoding.tool_calls import Custom, ToolCall, ToolCallDetector, ToolFormat
from oxillama.decoding.tool_calls.grammar import call_grammar, lazy_call_grammar
from oxillama.decoding.tool_calls.templates import (
    format_for_template,
    takes_tools,
    tools_instructions,
)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]

CASES: list[tuple[ToolFormat, str, list[tuple[str, dict[str, Any]]], str]] = [
    (
        "qwen",
        'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>{"name": "add", "args": {"a": 1, "b": 2}}</tool_call> ok',
        [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})],
        "Let me check. \n ok",
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "a]}\\"b"}}, '
        '{"name": "add", "parameters": {"a": 3, "b": 4}}]',
        [("get_weather", {"city": 'a]}"b'}), ("add", {"a": 3, "b": 4})],
        "",
    ),
    (
        "llama3",
        '  {"name": "add", "parameters": {"a": 5, "b": 6}}',
        [("add", {"a": 5, "b": 6})],
        "  ",
    ),
    (
        "llama3",
        '<|python_tag|>{"name": "get_weather", "parameters": "{\\"city\\": \\"Oslo\\"}"}',
        [("get_weather", {"city": "Oslo"})],
        "",
    ),
    (
        Custom("<<call>>", "<</call>>"),
        'x <<call>>{"name": "add", "arguments": {"a": 0, "b": 0}}<</call>> y <<cal',
        [("add", {"a": 0, "b": 0})],
        "x  y <<cal",
    ),
]


def run_detector(fmt: ToolFormat, text: str) -> tuple[list[ToolCall], str, int]:
    return run(fmt, [text])


def run(fmt: ToolFormat, pieces: list[str]) -> tuple[list[ToolCall], str, int]:
    d = ToolCallDetector(fmt)
    calls: list[ToolCall] = []
    content = ""
    reports = 0
    for p in pieces:
        new = d.feed(p)
        reports += len(new)
        calls += new
        content += d.take_content()
    content += d.finish()
    return calls, content, reports


@pytest.mark.parametrize(("fmt", "text", "want", "content"), CASES)
def test_detector_finds_each_call_once_wherever_the_text_is_split(
    fmt: ToolFormat, text: str, want: list[tuple[str, dict[str, Any]]], content: str
) -> None:
    splits = [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    splits += [[text[:i], text[i:j], text[j:]] for i in range(1, len(text), 7) for j in (i + 3,)]
    for pieces in splits:
        calls, got, reports = run(fmt, pieces)
        assert [(c.name, c.arguments) for c in calls] == want, pieces
        assert reports == len(want)
        assert got == content, pieces


def test_text_that_is_not_a_call_stays_content() -> None:
    for fmt, text in [
        ("qwen", "<tool_call>{not json}</tool_call>"),
        ("qwen", '<tool_call>{"arguments": {}}</tool_call>'),  # no name
        ("llama3", 'Here is JSON: {"name": "x", "parameters": {}}'),  # not at the start
        ("llama3", '{"city": "Paris"}'),  # an object, but no call
        ("mistral", "[TOOL_CALLS] nothing"),
    ]:
        calls, content, _ = run(fmt, list(text))  # type: ignore[arg-type]
        assert calls == [] and content == text, (fmt, text)


def test_an_unfinished_call_is_returned_as_content_and_reset_clears() -> None:
    d = ToolCallDetector("qwen")
    assert d.feed('<tool_call>{"name": "add", "argu') == []
    assert d.take_content() == ""
    assert d.finish() == '<tool_call>{"name": "add", "argu'
    d.reset()
    assert d.feed('<tool_call>{"name": "a", "arguments": {}}</tool_call>')[0].name == "a"
    assert [c.name for c in d.calls] == ["a"]


def test_bad_formats_are_refused() -> None:
    with pytest.raises(ParameterError, match="tool-call format"):
        ToolCallDetector("hermes")  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match=r"Custom\.open"):
        Custom("", "x")


def test_format_is_read_from_the_template() -> None:
    assert format_for_template("{% if tools %}<tool_call>{% endif %}") == "qwen"
    assert format_for_template("{{ '[TOOL_CALLS]' }}{{ tools }}") == "mistral"
    assert format_for_template("{{ '<|python_tag|>' }}") == "llama3"
    assert format_for_template(None) == "qwen"
    assert takes_tools("{% if tools %}{% endif %}") and not takes_tools("{{ messages }}")
    assert "get_weather" in tools_instructions(TOOLS)


@pytest.mark.parametrize("fmt", ["qwen", "mistral", "llama3", Custom("<fn>", "</fn>")])
def test_the_call_grammar_forces_valid_calls(engine: Engine, fmt: ToolFormat) -> None:
    """Sampled at temperature 1 under the grammar, every reply is calls the
    detector finds, to offered functions, with arguments that validate."""
    g = call_grammar(TOOLS, fmt, parallel=False)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    engine.generate("User: what is 2 + 3, and the weather in Rome?\nAssistant:", 0)
    n = engine.n_past
    for seed in range(2):
        engine.truncate(n)
        cfg = SamplerConfig(temperature=1.0, seed=seed)
        out = engine.generate("", 60, sampler=cfg, grammar=g)
        assert out.finish_reason in ("stop", "eos"), out.text
        calls, content, _ = run(fmt, [out.text])
        assert len(calls) == 1 and not content.strip(), out.text
        jsonschema.validate(calls[0].arguments, schemas[calls[0].name])


@pytest.mark.parametrize("fmt", ["qwen", "mistral"])
def test_parallel_calls_begin_another_only_when_the_budget_covers_it(
    engine: Engine, fmt: ToolFormat
) -> None:
    """Under a budget that holds one call but not two, the parallel grammar
    ends after the first call (for Mistral, closes its array) instead of
    beginning a second one the budget would cut short; a budget that ends
    exactly with the call is an ordinary end too."""
    prompt = "User: what is 2 + 3, and the weather in Rome?\nAssistant:"
    one = engine.generate(prompt, 200, grammar=call_grammar(TOOLS, fmt, parallel=False))
    want, _, _ = run(fmt, [one.text])
    assert one.finish_reason in ("stop", "eos") and len(want) == 1, one.text
    n1 = len(one.tokens)
    par = call_grammar(TOOLS, fmt)
    assert par.item_end == (0 if fmt == "qwen" else 1)
    for budget in (n1, 2 * n1 - 3):
        engine.reset()
        out = engine.generate(prompt, budget, grammar=par)
        calls, content, _ = run(fmt, [out.text])
        assert out.finish_reason in ("stop", "eos"), (budget, out.text)
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in want]
        assert not content.strip(), out.text
    with pytest.raises(ParameterError, match="item_end"):
        Grammar('root ::= "x"', item_end=-1)


def test_a_named_call_grammar_only_allows_that_function() -> None:
    g = call_grammar(TOOLS, "qwen", only="add")
    assert "get_weather" not in g.source
    with pytest.raises(ParameterError, match="not among the tools"):
        call_grammar(TOOLS, "qwen", only="nope")


def test_arguments_json_round_trips() -> None:
    c = ToolCall("f", {"x": [1, "é"]})
    assert json.loads(c.arguments_json()) == {"x": [1, "é"]} and c.id.startswith("call_")


def test_a_lazy_grammar_applies_from_its_trigger(model_path: Path, engine: Engine) -> None:
    """Free text until the trigger, then the grammar: with a Custom format
    whose opening marker is a word the model writes anyway, the call after
    it is forced valid and the detector finds it."""
    fmt = Custom(" Paris", "!")
    trigger, g = lazy_call_grammar(TOOLS, fmt)
    assert trigger == " Paris"
    free = engine.generate("The capital of France is", 40, sampler=SamplerConfig.greedy())
    assert free.text.startswith(" Paris")

    async def run() -> tuple[str, str, str]:
        async with AsyncEngine(model_path, context_size=256, threads=2) as ai:
            greedy = SamplerConfig.greedy()
            lazy = await ai.generate(
                "The capital of France is", 60, sampler=greedy, grammar=g, grammar_trigger=trigger
            )
            never = await ai.generate(
                "The capital of France is", 8, sampler=greedy, grammar=g, grammar_trigger="zebra"
            )
            return lazy.text, lazy.finish_reason, never.text

    text, finish, untouched = asyncio.run(run())
    calls, content, _ = run_detector(fmt, text)
    assert len(calls) == 1 and content == "", text
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    jsonschema.validate(calls[0].arguments, schemas[calls[0].name])
    assert finish == "stop"  # the grammar ended with the closing marker
    engine.reset()
    assert untouched == engine.generate("The capital of France is", 8).text


def test_grammar_trigger_needs_a_grammar(model_path: Path) -> None:
    async def run() -> None:
        async with AsyncEngine(model_path, context_size=256, threads=2) as ai:
            with pytest.raises(ParameterError, match="grammar_trigger"):
                await ai.generate("Hi", 2, grammar_trigger="x")

    asyncio.run(run())
