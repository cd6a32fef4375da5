"""Each model family's real chat template through oxillama's Jinja path
(``ChatTemplate``: bounded sandbox, transformers' settings), against
llama-cpp-python's ``Jinja2ChatFormatter`` (renderings recorded in
tests/reference/chat_families.json by make_chat_reference.py) and against
plain jinja2 configured as transformers configures it, rendered here.

Templates: tests/reference/chat_templates/ (origins in its README) and the
templates inside llama.cpp's vocabulary-only GGUFs (command-r, phi-3,
qwen2), read through ``ChatTemplate.from_metadata`` as the engine reads
them. Conversations: tests/reference/family_chats.py (system + user,
multi-turn, no generation prompt, tools and a tool call, Qwen3's
``enable_thinking``). A conversation a template rejects (Gemma has no
system role) must fail the same way everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from oxillama.errors import TemplateError
from oxillama.text.chat_template import CHATML, ChatTemplate
from tests._vocab_files import vocab_metadata
from tests.reference.family_chats import (
    CONVERSATIONS,
    GGUF_TEMPLATES,
    TEMPLATE_FILES,
    fixed_strftime_now,
    template_source,
)

REF: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "reference" / "chat_families.json").read_text("utf-8")
)
TEMPLATES = [*TEMPLATE_FILES, *(f"gguf:{n}" for n in GGUF_TEMPLATES)]
CASES = [(t, c) for t in TEMPLATES for c in CONVERSATIONS]


class _Raised(Exception):
    """raise_exception() called by a template rendered with plain jinja2."""


class _Generation(jinja2.ext.Extension):
    tags = {"generation"}  # noqa: RUF012 (declared as a set by jinja2.ext.Extension)

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        body: list[jinja2.nodes.Node] = parser.parse_statements(
            ("name:endgeneration",), drop_needle=True
        )
        return body


def _raise(message: str) -> None:
    raise _Raised(message)


def _tojson(x: Any, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(x, ensure_ascii=False, indent=indent, **kw)


def _plain_jinja2(source: str) -> Callable[..., str]:
    """transformers' chat-template environment, without oxillama's bounds."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = fixed_strftime_now
    return env.from_string(source).render


def _source(template: str) -> tuple[str, str, str]:
    if template.startswith("gguf:"):
        meta = vocab_metadata(template[5:])
        t = ChatTemplate.from_metadata(meta)
        return t.source, t.bos_token, t.eos_token
    bos, eos = TEMPLATE_FILES[template]
    return template_source(template), bos, eos


def _ours(template: str) -> ChatTemplate:
    if template.startswith("gguf:"):
        return ChatTemplate.from_metadata(vocab_metadata(template[5:]))
    bos, eos = TEMPLATE_FILES[template]
    return ChatTemplate(template_source(template), bos_token=bos, eos_token=eos)


def test_every_template_and_conversation_has_a_reference() -> None:
    assert set(REF) == set(TEMPLATES)
    for t in TEMPLATES:
        assert set(CONVERSATIONS) <= set(REF[t]), t
    rendered = sum("text" in REF[t][c] for t, c in CASES)
    assert rendered >= 0.85 * len(CASES)


@pytest.mark.parametrize("template", [t for t in TEMPLATES if t.startswith("gguf:")])
def test_gguf_template_and_special_tokens_are_the_ones_llama_cpp_reads(template: str) -> None:
    ours = _ours(template)
    assert (ours.bos_token, ours.eos_token) == (REF[template]["bos"], REF[template]["eos"])
    assert ours.source == vocab_metadata(template[5:])["tokenizer.chat_template"]


@pytest.mark.parametrize(("template", "conversation"), CASES, ids=[f"{t}-{c}" for t, c in CASES])
def test_renders_as_llama_cpp_python_and_jinja2(template: str, conversation: str) -> None:
    messages, add_generation_prompt, extra = CONVERSATIONS[conversation]
    ref = REF[template][conversation]
    source, bos, eos = _source(template)
    kwargs = {"tools": None, "documents": None, **extra}
    try:
        plain: str | Exception = _plain_jinja2(source)(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos,
            eos_token=eos,
            **kwargs,
        )
    except Exception as e:
        plain = e
    try:
        ours: str | Exception = _ours(template).render(
            messages,
            add_generation_prompt=add_generation_prompt,
            strftime_now=fixed_strftime_now,
            **extra,
        )
    except TemplateError as e:
        ours = e
    if "text" in ref:
        assert ours == ref["text"]
        assert plain == ref["text"]
        return
    # The template refused the conversation: the same message everywhere
    # (llama-cpp-python wraps raise_exception's text in a ValueError).
    assert isinstance(ours, TemplateError), ours
    assert isinstance(plain, Exception), plain
    kind, _, message = ref["error"].partition(": ")
    if kind == "ValueError":
        assert isinstance(plain, _Raised) and str(plain) == message
        assert str(ours) == message
    else:
        assert type(plain).__name__ == kind and str(plain) == message
        assert str(ours) == f"chat template failed: {kind}: {message}"


def test_starcoder2_has_no_template_and_gets_chatml() -> None:
    meta = vocab_metadata("starcoder")
    assert "tokenizer.chat_template" not in meta
    assert ChatTemplate.from_metadata(meta, fallback=False) is None
    t = ChatTemplate.from_metadata(meta)
    assert t.source == CHATML
    assert t.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
