"""Harmony replies (gpt-oss) split by channel: ``analysis`` is reasoning,
``final`` the answer, ``commentary`` to ``functions.NAME`` a tool call,
fed whole or streamed in pieces of every size; and ``Engine.chat`` on the
gpt-oss fixture with gpt-oss's own template (tests/reference/chat_templates),
its reply forced by a grammar, returning the three apart, and the server
giving them as ``reasoning_content``, ``content`` and ``tool_calls``,
streamed or whole; ``oxillama chat`` showing and keeping the answer only."""

from __future__ import annotations

import io
import json
import random
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oxillama import AsyncEngine, Engine, SamplerConfig
from oxillama.cli.chat_repl import ChatRepl
from oxillama.decoding.reasoning import HarmonyDelta, HarmonyParser, parse_harmony, speaks_harmony
from tests._serve import serving
from tests.models._rewrite import rewrite
from tests.reference.family_chats import TOOLS, template_source

ANALYSIS = "<|channel|>analysis<|message|>The user wants Paris weather; call the tool.<|end|>"
PREAMBLE = "<|start|>assistant<|channel|>commentary<|message|>Checking the weather.<|end|>"
# The recipient after the channel, with harmony's <|constrain|> marker.
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris", "units": ["c", "f"]}'
)
FINAL = "<|start|>assistant<|channel|>final<|message|>It is 21 °C and clear.<|end|>"
# The recipient before the channel, as gpt-oss's template renders calls.
CALL_FIRST = (
    "<|start|>assistant to=functions.get_time<|channel|>commentary json"
    '<|message|>{"zone": "CET"}<|call|>'
)
REPLY = ANALYSIS + PREAMBLE + CALL + "<|call|>" + FINAL + CALL_FIRST


def _streamed(text: str, cuts: list[int]) -> tuple[HarmonyDelta, list[HarmonyDelta]]:
    p = HarmonyParser()
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    deltas = [p.feed(piece) for piece in pieces]
    deltas.append(p.finish())
    total = HarmonyDelta()
    for d in deltas:
        total += d
    return total, deltas


def test_whole_reply_splits_into_its_three_channels() -> None:
    h = parse_harmony(REPLY)
    assert h.reasoning == "The user wants Paris weather; call the tool."
    assert h.content == "Checking the weather.It is 21 °C and clear."
    assert [(c.name, c.arguments) for c in h.calls] == [
        ("get_weather", {"city": "Paris", "units": ["c", "f"]}),
        ("get_time", {"zone": "CET"}),
    ]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 64])
def test_streamed_in_pieces_of_any_size_gives_the_whole_split(size: int) -> None:
    whole = parse_harmony(REPLY)
    cuts = list(range(size, len(REPLY), size))
    total, deltas = _streamed(REPLY, cuts)
    assert (total.reasoning, total.content) == (whole.reasoning, whole.content)
    assert [(c.name, c.arguments) for c in total.calls] == [
        (c.name, c.arguments) for c in whole.calls
    ]
    # No marker, nor a piece of one, ever reaches the reasoning or the answer.
    for d in deltas:
        assert "<|" not in d.reasoning + d.content
        assert not (d.reasoning + d.content).endswith("<")


def test_streamed_at_random_cuts_releases_each_part_when_it_is_complete() -> None:
    rng = random.Random(55)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(REPLY)), rng.randint(1, 40)))
        total, deltas = _streamed(REPLY, cuts)
        assert total.reasoning == parse_harmony(REPLY).reasoning
        # Each call comes out once, in the piece that completes its <|call|>.
        ends = [REPLY.index("<|call|>") + len("<|call|>"), len(REPLY)]
        got = [i for i, d in enumerate(deltas) for _ in d.calls]
        want = [next(k for k, c in enumerate([*cuts, len(REPLY)]) if c >= e) for e in ends]
        assert got == want


def test_reasoning_streams_before_its_message_ends() -> None:
    p = HarmonyParser()
    first = p.feed("<|channel|>analysis<|message|>Think")
    assert first.reasoning == "Think"
    assert p.feed("ing<|e").reasoning == "ing"  # "<|e" may begin <|end|>
    assert p.feed("nd|><|start|>assistant<|channel|>final<|message|>Hi").content == "Hi"


def test_a_reply_cut_by_max_tokens_keeps_what_it_had() -> None:
    h = parse_harmony("<|channel|>analysis<|message|>half a thou")
    assert (h.reasoning, h.content, h.calls) == ("half a thou", "", [])
    # A call cut inside its arguments is not a call: the text stays content.
    cut = CALL[: CALL.index('"units"')]
    h = parse_harmony(ANALYSIS + cut)
    assert h.calls == []
    assert h.content.endswith('{"city": "Paris", ')


def test_text_outside_the_format_stays_content() -> None:
    assert parse_harmony("Just text.").content == "Just text."
    h = parse_harmony(ANALYSIS + " then plain text")
    assert h.content == " then plain text"  # as written
    h = parse_harmony("<|channel|>memo<|message|>odd<|end|>")
    assert h.content == "<|start|><|channel|>memo<|message|>odd"


def test_speaks_harmony_reads_the_template() -> None:
    assert speaks_harmony(template_source("openai-gpt-oss-120b"))
    assert not speaks_harmony(template_source("qwen3-0.6b"))
    assert not speaks_harmony(None)


@pytest.fixture(scope="module")
def harmony_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gpt-oss fixture with gpt-oss's real chat template."""
    src = Path(__file__).parent / "models" / "fixtures" / "gpt-oss.gguf"
    dst = tmp_path_factory.mktemp("harmony") / "gpt-oss-chat.gguf"
    rewrite(src, dst, strings={"tokenizer.chat_template": template_source("openai-gpt-oss-120b")})
    return dst


@pytest.fixture(scope="module")
def harmony_engine(harmony_path: Path) -> Engine:
    return Engine(harmony_path, context_size=1024, threads=2, sampler=SamplerConfig.greedy())


def _forced(text: str) -> str:
    return "root ::= " + json.dumps(text)


def test_engine_chat_returns_reasoning_answer_and_calls_apart(harmony_engine: Engine) -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = harmony_engine.apply_chat_template(messages, tools=TOOLS)
    assert prompt.endswith("<|start|>assistant")
    reply = ANALYSIS + CALL
    done = harmony_engine.chat(messages, 400, grammar=_forced(reply), tools=TOOLS)
    assert done.reasoning == "The user wants Paris weather; call the tool."
    assert done.text == ""
    assert [(c.name, c.arguments) for c in done.tool_calls] == [
        ("get_weather", {"city": "Paris", "units": ["c", "f"]})
    ]
    answer = ANALYSIS + FINAL.removesuffix("<|end|>")
    harmony_engine.reset()
    done = harmony_engine.chat(messages, 400, grammar=_forced(answer))
    assert (done.reasoning, done.text, done.tool_calls) == (
        "The user wants Paris weather; call the tool.",
        "It is 21 °C and clear.",
        (),
    )
    # "none": the reply as generated.
    harmony_engine.reset()
    raw = harmony_engine.chat(messages, 400, grammar=_forced(answer), reasoning_format="none")
    assert (raw.text, raw.reasoning) == (answer, None)


def _chat(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        data: bytes = resp.read()
    return data


def test_server_gives_reasoning_content_and_tool_calls(harmony_path: Path) -> None:
    ae = AsyncEngine(harmony_path, context_size=1024, threads=2)
    body = {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": TOOLS,
        "max_tokens": 400,
        "temperature": 0,
        "grammar": _forced(ANALYSIS + CALL),
    }
    with serving(ae, "gpt-oss") as url:
        whole = json.loads(_chat(url, body))
        stream = _chat(url, {**body, "stream": True}).decode()
        answer = json.loads(_chat(url, {**body, "grammar": _forced(ANALYSIS + FINAL)}))
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["reasoning_content"] == "The user wants Paris weather; call the tool."
    assert msg["content"] is None
    [call] = msg["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "units": ["c", "f"]}
    deltas = [
        json.loads(line[len("data: ") :])["choices"][0]
        for line in stream.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    reasoning = "".join(d["delta"].get("reasoning_content", "") for d in deltas)
    assert reasoning == msg["reasoning_content"]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == ""
    calls = [c for d in deltas for c in d["delta"].get("tool_calls", [])]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_weather")]
    assert deltas[-1]["finish_reason"] == "tool_calls"
    final = answer["choices"][0]
    assert final["message"]["content"] == "It is 21 °C and clear."
    assert final["message"]["reasoning_content"] == msg["reasoning_content"]
    assert final["finish_reason"] == "stop"


class _Forced:
    """The harmony engine, its chat replies forced to ``reply``."""

    def __init__(self, engine: Engine, reply: str) -> None:
        self.engine, self.reply = engine, reply
        self.chat_template_source = engine.chat_template_source

    def chat_stream(self, messages: list[dict[str, str]], max_tokens: int) -> Iterator[str]:
        self.engine.reset()
        return self.engine.chat_stream(messages, max_tokens, grammar=_forced(self.reply))


def test_cli_chat_shows_and_keeps_the_final_answer_only(harmony_engine: Engine) -> None:
    out = io.StringIO()
    repl = ChatRepl(_Forced(harmony_engine, ANALYSIS + FINAL), system=None, max_tokens=400, out=out)
    repl.reply("What is the weather in Paris?")
    assert out.getvalue() == "It is 21 °C and clear.\n"
    assert repl.messages[-1] == {"role": "assistant", "content": "It is 21 °C and clear."}
    # The answer goes back through the template on the final channel.
    text = harmony_engine.apply_chat_template(repl.messages)
    assert "<|channel|>final<|message|>It is 21 °C and clear." in text
    assert "<|channel|>analysis" not in text
