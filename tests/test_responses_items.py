"""The Responses API's items without a model: input items as chat
messages, and a reply (reasoning, text, tool calls) as output items and
the events announcing them, streamed piece by piece or whole, every event
valid under the ``openai`` SDK's own models."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from oxillama.decoding.reasoning import ReasoningSplitter
from oxillama.serving.http.api_error import ApiError
from oxillama.serving.http.responses.output import OutputItems
from oxillama.serving.http.responses.request import chat_messages, read_request
from oxillama.serving.http.tools import ChoiceCalls

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
REPLY = (
    "<think>\nThe user wants Paris.\n</think>\n\n"
    'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "</tool_call>"
)


def _items(pieces: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    out = OutputItems(ReasoningSplitter(), ChoiceCalls("qwen"))
    events = [ev for p in pieces for ev in out.feed(p)]
    events += out.finish(False)
    for n, ev in enumerate(events):
        ev["sequence_number"] = n
        EVENTS.validate_python(ev)
    return out.items, events


def test_reasoning_text_and_a_call_become_three_items() -> None:
    items, events = _items([REPLY])
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    assert items[0]["content"][0]["text"].strip() == "The user wants Paris."
    assert items[1]["content"][0]["text"].strip() == "Let me look."
    assert json.loads(items[2]["arguments"]) == {"city": "Paris"}
    assert all(i["status"] == "completed" for i in items)
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == ["reasoning", "message", "function_call"]
    kinds = [e["type"] for e in events]
    # Each item is done before the next is added.
    opened = 0
    for k in kinds:
        if k == "response.output_item.added":
            assert opened == 0
            opened += 1
        elif k == "response.output_item.done":
            opened -= 1
    assert "response.reasoning_text.delta" in kinds
    assert "response.function_call_arguments.done" in kinds


def test_streamed_character_by_character_gives_the_same_items() -> None:
    whole, _ = _items([REPLY])
    pieces, events = _items(list(REPLY))
    strip = [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in whole]
    assert [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in pieces] == strip
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == pieces[1]["content"][0]["text"]


def test_a_reply_of_only_calls_has_no_message_and_an_empty_one_has_one() -> None:
    only, _ = _items(['<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n'])
    assert [i["type"] for i in only] == ["function_call"]
    empty, _ = _items([""])
    assert [i["type"] for i in empty] == ["message"]
    assert empty[0]["content"][0]["text"] == ""


def test_a_cut_reply_leaves_its_item_incomplete() -> None:
    out = OutputItems(None, None)
    out.feed("Once upon a")
    events = out.finish(True)
    assert out.items[0]["status"] == "incomplete"
    assert events[-1]["item"]["status"] == "incomplete"


def test_the_response_object_parses_in_the_sdk() -> None:
    items, _ = _items([REPLY])
    Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 0,
            "model": "m",
            "output": items,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    )


def test_input_items_become_chat_turns() -> None:
    msgs = chat_messages(
        [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "Call the tool."}],
            },
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Looking.", "annotations": []}],
            },
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"c": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"c": 2}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": "rain"},
        ]
    )
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[1] == {"role": "user", "content": "Weather in Paris?"}
    assistant = msgs[2]
    assert assistant["content"] == "Looking."
    assert assistant["reasoning_content"] == "Call the tool."
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert msgs[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny", "name": "w"}
    assert msgs[4]["content"] == "rain" and len(msgs) == 5


def test_a_call_after_a_tool_result_opens_a_new_assistant_turn() -> None:
    msgs = chat_messages(
        [
            {"role": "user", "content": "x"},
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "1"},
            {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"},
        ]
    )
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[3]["content"] is None


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "'input_file'"),
        ({"input": [{"role": "user", "content": "x", "audio": "y"}]}, "'audio'"),
        ({"input": "x", "tools": [{"type": "function", "name": "f", "extra": 1}]}, "'extra'"),
        ({"input": "x", "tools": [{"type": "file_search"}]}, "'file_search'"),
        ({"input": "x", "text": {"verbosity": "low"}}, "'text.verbosity'"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "'text.format.schema'"),
    ],
)
def test_what_is_not_read_is_refused_by_name(body: dict[str, Any], named: str) -> None:
    with pytest.raises(ApiError, match=named):
        read_request(body)


def test_function_tools_and_choice_take_the_chat_shape() -> None:
    ask = read_request(
        {
            "input": "x",
            "tools": [{"type": "function", "name": "f", "parameters": {}, "strict": True}],
            "tool_choice": {"type": "function", "name": "f"},
            "parallel_tool_calls": False,
            "text": {"format": {"type": "json_object"}},
        }
    )
    assert ask.chat_tools == {
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {}, "strict": True}}
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": False,
    }
    assert ask.json_schema == {"type": "object"} and ask.store and not ask.parallel_tool_calls
