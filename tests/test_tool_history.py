"""Every message shape the OpenAI and Anthropic-style agent loops send back
(``null`` content beside tool calls, several calls in one turn, text and a
call, tool results) renders through the templates of our test models and
of the tool-calling families, with tools in the request and without; and a
call, a result or a text is never silently dropped. Templates that insist
on alternating roles get runs of one role joined into one turn; Mistral's
tool templates keep what their format cannot hold out (named below)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oxillama.decoding.tool_calls.history import history_for_template, joined_turns, render_history
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
    # Anthropic's user turn holding tool_result blocks and then text, as
    # the tool messages and a user message that follows them.
    "results, then the user's words": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("call00005", "Paris")]},
        {"role": "tool", "tool_call_id": "call00005", "content": "18C and sunny"},
        {"role": "user", "content": "And should I take a coat?"},
    ],
    # An agent loop's whole run: two rounds of calls, the final answer and
    # the next question.
    "two rounds, an answer, a follow-up": [
        {"role": "user", "content": "Is Rome warmer than Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("call00006", "Paris")]},
        {"role": "tool", "tool_call_id": "call00006", "content": "18C and sunny"},
        {
            "role": "assistant",
            "content": "Now Rome.",
            "tool_calls": [_call("call00007", "Rome")],
        },
        {"role": "tool", "tool_call_id": "call00007", "content": "25C"},
        {"role": "assistant", "content": "Yes, Rome is warmer."},
        {"role": "user", "content": "And Oslo?"},
    ],
    # A client that sends the text and the call as two assistant turns.
    "text, then the call in a turn of its own": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "I will look it up."},
        {"role": "assistant", "content": None, "tool_calls": [_call("call00008", "Oslo")]},
        {"role": "tool", "tool_call_id": "call00008", "content": "3C"},
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
        "gemma-2-2b-it",
        "gemma-7b-it",
        "mistral-7b-instruct-v0.2",
    )
    out = {"smollm2": _smollm2_template(), "chatml": CHATML}
    out.update({n: (TEMPLATES / f"{n}.jinja").read_text() for n in names})
    return out


ALL = _templates()

#: Mistral's templates render an assistant turn with tool calls as its
#: [TOOL_CALLS] alone: text beside the calls is not in their format (as in
#: llama.cpp, which renders the same template).
DROPS_TEXT_BESIDE_CALLS = {"mistral-nemo-instruct-2407", "mistral-small-3.2-24b-instruct-2506"}
#: ... and their alternation rule, which skips tool turns, refuses a user
#: turn right after tool results: a TemplateError that says so.
REFUSED = {
    (name, "results, then the user's words")
    for name in ("mistral-nemo-instruct-2407", "mistral-small-3.2-24b-instruct-2506")
}


@pytest.mark.parametrize("with_tools", [False, True], ids=["no tools", "tools"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("name", sorted(ALL))
def test_tool_history_renders_with_every_call_and_result(
    name: str, shape: str, with_tools: bool
) -> None:
    t = ChatTemplate(ALL[name], bos_token="<s>", eos_token="</s>")
    kwargs: dict[str, Any] = {"tools": TOOLS} if with_tools else {}
    if (name, shape) in REFUSED:
        with pytest.raises(TemplateError, match="roles must alternate"):
            render_history(t, SHAPES[shape], **kwargs)
        return
    out = render_history(t, SHAPES[shape], **kwargs)
    for m in SHAPES[shape]:
        if isinstance(m["content"], str):
            beside_calls = bool(m.get("tool_calls")) and name in DROPS_TEXT_BESIDE_CALLS
            rendered = m["content"] in out
            assert rendered != beside_calls, f"{name}: {m['role']} text {m['content']!r}"
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


def test_an_alternating_template_gets_one_user_turn_for_two_results() -> None:
    # Gemma-2 has no tool role: each result is a user <tool_response> turn,
    # and two in a row are joined into the one turn its template allows.
    source = ALL["gemma-2-2b-it"]
    history = history_for_template(SHAPES["two calls in one turn"], source)
    assert [m["role"] for m in history] == ["user", "assistant", "user"]
    assert history[2]["content"] == (
        "<tool_response>\n18C and sunny\n</tool_response>\n\n<tool_response>\n25C\n</tool_response>"
    )
    out = ChatTemplate(source, bos_token="<bos>").render(history)
    assert out.count("<start_of_turn>user") == 2


def test_joined_turns_joins_runs_of_text_only() -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "s1"},
        {"role": "system", "content": "s2"},
        {"role": "user", "content": "a"},
        {"role": "user", "content": ""},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"},
        {"role": "assistant", "content": [{"type": "text", "text": "d"}]},
        {"role": "tool", "content": "e"},
        {"role": "tool", "content": "f"},
    ]
    before = repr(msgs)
    assert joined_turns(msgs) == [
        {"role": "system", "content": "s1"},
        {"role": "system", "content": "s2"},
        {"role": "user", "content": "a\n\nb"},
        {"role": "assistant", "content": "c"},
        {"role": "assistant", "content": [{"type": "text", "text": "d"}]},
        {"role": "tool", "content": "e"},
        {"role": "tool", "content": "f"},
    ]
    assert repr(msgs) == before


@pytest.mark.parametrize("name", ["gemma-2-2b-it", "gemma-7b-it", "mistral-7b-instruct-v0.2"])
def test_two_user_turns_in_a_row_render_where_roles_must_alternate(name: str) -> None:
    t = ChatTemplate(ALL[name], bos_token="<s>", eos_token="</s>")
    msgs = [{"role": "user", "content": "First."}, {"role": "user", "content": "Second."}]
    out = render_history(t, msgs)
    assert "First.\n\nSecond." in out
