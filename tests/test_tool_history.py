"""Every message shape the OpenAI and Anthropic-style agent loops send back
(``null`` content beside tool calls, several calls in one turn, text and a
call, tool results) renders through the templates of our test models and
of the tool-calling families, with tools in the request and without; and a
call or a result is never silently dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oxillama.decoding.tool_calls.history import history_for_template, render_history
from oxillama.errors import TemplateError
from oxillama.text.chat_template import CHATML, ChatTemplate
from tests._gguf_meta import read_metadata, smollm2_path

TEMPLATES = Path(__file__).parent / "reference" / "chat_templates"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def _call(cid: str, city: str, *, as_string: bool = True) -> dict[str, Any]:
    args: Any = f'{{"city": "{city}"}}' if as_string else {"city": city}
    return {"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": args}}


# Tool call ids of nine alphanumerics, which Mistral's templates insist on.
SHAPES: dict[str, list[dict[str, Any]]] = {
    "null content, one call": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("call00001", "Paris")]},
        {"role": "tool", "tool_call_id": "call00001", "content": "18C and sunny"},
    ],
    "two calls in one turn": [
        {"role": "user", "content": "Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("call00002", "Paris"), _call("call00003", "Rome")],
        },
        {"role": "tool", "tool_call_id": "call00002", "content": "18C and sunny"},
        {"role": "tool", "tool_call_id": "call00003", "content": "25C"},
    ],
    "text beside a call, arguments as a mapping": [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [_call("call00004", "Oslo", as_string=False)],
        },
        {"role": "tool", "tool_call_id": "call00004", "name": "get_weather", "content": "18C"},
    ],
}


def _smollm2_template() -> str:
    return str(read_metadata(smollm2_path())["tokenizer.chat_template"])


def _templates() -> dict[str, str]:
    # Our test models (SmolLM2's own, Gemma-3's ChatML fallback) and the
    # families whose templates render tool turns.
    names = (
        "qwen2.5-7b-instruct",
        "qwen3-0.6b",
        "granite-3.0-8b-instruct",
        "granite-3.3-2b-instruct",
        "granite-4.0",
        "gemma-4-31b-it",
        "phi-3-mini",
        "phi-3.5-mini-instruct",
        "mistral-nemo-instruct-2407",
        "mistral-small-3.2-24b-instruct-2506",
    )
    out = {"smollm2": _smollm2_template(), "chatml": CHATML}
    out.update({n: (TEMPLATES / f"{n}.jinja").read_text() for n in names})
    return out


ALL = _templates()


@pytest.mark.parametrize("with_tools", [False, True], ids=["no tools", "tools"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("name", sorted(ALL))
def test_tool_history_renders_with_every_call_and_result(
    name: str, shape: str, with_tools: bool
) -> None:
    t = ChatTemplate(ALL[name], bos_token="<s>", eos_token="</s>")
    kwargs: dict[str, Any] = {"tools": TOOLS} if with_tools else {}
    out = render_history(t, SHAPES[shape], **kwargs)
    for m in SHAPES[shape]:
        if m["role"] == "tool":
            assert m["content"] in out, f"{name}: the tool result {m['content']!r} was dropped"
        for c in m.get("tool_calls", []):
            city = c["function"]["arguments"]
            city = city["city"] if isinstance(city, dict) else city.split('"')[3]
            assert "get_weather" in out and city in out, f"{name}: the call {c} was dropped"


def test_the_request_messages_are_not_changed() -> None:
    msgs = SHAPES["null content, one call"]
    before = repr(msgs)
    render_history(ChatTemplate(_smollm2_template()), msgs)
    assert repr(msgs) == before


def test_a_template_without_tools_gets_the_call_as_the_model_wrote_it() -> None:
    plain = history_for_template(SHAPES["null content, one call"], CHATML)
    assert plain[1] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>",
    }
    # ChatML names no tool role: the result comes back as a user turn.
    assert plain[2] == {
        "role": "user",
        "content": "<tool_response>\n18C and sunny\n</tool_response>",
    }


def test_a_template_with_tools_gets_arguments_as_a_mapping() -> None:
    native = history_for_template(SHAPES["null content, one call"], ALL["qwen2.5-7b-instruct"])
    call = native[1]["tool_calls"][0]
    assert call["function"]["arguments"] == {"city": "Paris"} == call["arguments"]
    assert native[1]["content"] is None  # the template tests it itself


def test_a_template_that_refuses_the_conversation_still_says_why() -> None:
    # Gemma-2's template refuses a system turn: a typed error naming it.
    t = ChatTemplate((TEMPLATES / "gemma-2-2b-it.jinja").read_text())
    msgs = [{"role": "system", "content": "Be brief."}, *SHAPES["null content, one call"]]
    with pytest.raises(TemplateError, match="System role not supported"):
        render_history(t, msgs)
