"""Chat templates rendered the way HuggingFace transformers renders them.

A GGUF carries the model's Jinja2 template under ``tokenizer.chat_template``.
It is compiled in an ``ImmutableSandboxedEnvironment`` with ``trim_blocks``
and ``lstrip_blocks``, the ``loopcontrols`` extension and transformers'
``{% generation %}`` tag, plus the helpers templates expect:
``raise_exception(msg)``, ``strftime_now(fmt)`` and a ``tojson`` filter that
keeps non-ASCII text. Rendering sees ``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token``, ``tools`` and ``documents`` (``None`` unless
given) and any extra keyword arguments.

Models without a template get :data:`CHATML` (see
:meth:`ChatTemplate.from_metadata`).

Every failure, compiling or rendering, raises
:class:`oxillama.errors.TemplateError`. A template comes from whoever made
the GGUF, so rendering is bounded in time, output and memory by
:class:`~oxillama.text.template_limits.TemplateLimits` (``ChatTemplate(...,
limits=...)``; by default 1 s, 4 Mi characters): see
:mod:`oxillama.text.template_sandbox` for how.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, overload

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser

from oxillama.errors import OxiLlamaError, TemplateError
from oxillama.text import template_limits
from oxillama.text.template_limits import TemplateLimits
from oxillama.text.template_sandbox import BoundedEnvironment

__all__ = ["CHATML", "ChatTemplate", "TemplateLimits"]

#: Longest ``strftime_now`` format (its output grows with each directive).
_MAX_STRFTIME = 4096

#: The template used when a model has none: ChatML, the format llama.cpp and
#: transformers also fall back to. Each message becomes
#: ``<|im_start|>{role}\n{content}<|im_end|>\n``; the generation prompt is
#: ``<|im_start|>assistant\n``.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}``: marks the
    assistant's part of the text; rendering keeps the body as is."""

    tags = {"generation"}  # noqa: RUF012 (a set, as jinja2.ext.Extension declares it)

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        body: list[jinja2.nodes.Node] = parser.parse_statements(
            ("name:endgeneration",), drop_needle=True
        )
        return body


def _raise_exception(message: str) -> None:
    raise TemplateError(str(message))


def _strftime_now(fmt: str) -> str:
    if not isinstance(fmt, str) or len(fmt) > _MAX_STRFTIME:
        raise TemplateError(f"strftime_now takes a format of at most {_MAX_STRFTIME} characters")
    return datetime.now().strftime(fmt)


def _environment() -> BoundedEnvironment:
    env = BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template.

    >>> t = ChatTemplate(CHATML, bos_token="", eos_token="<|im_end|>")
    >>> t.render([{"role": "user", "content": "Hi"}])
    '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        limits: TemplateLimits | None = None,
    ) -> None:
        if not isinstance(source, str):
            raise TemplateError(f"chat template must be a string, not {type(source).__name__}")
        #: Bounds on one render (time, output, memory); may be replaced.
        self.limits = TemplateLimits() if limits is None else limits
        if not isinstance(self.limits, TemplateLimits):
            raise TemplateError(f"limits must be TemplateLimits, not {type(limits).__name__}")
        if len(source) > self.limits.max_output_chars:
            raise TemplateError(
                f"chat template has {len(source):,} characters, over the limit of "
                f"{self.limits.max_output_chars:,}"
            )
        # Compiling folds constant expressions, so it runs template code too.
        token = template_limits.start(self.limits)
        try:
            self._template = _environment().from_string(source)
        except OxiLlamaError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"invalid chat template: {e}") from e
        except Exception as e:  # RecursionError on deep nesting, SyntaxError...
            raise TemplateError(f"invalid chat template: {type(e).__name__}: {e}") from e
        finally:
            template_limits.finish(token)
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        #: Other special tokens the template may use (unk_token, pad_token...).
        self.special_tokens: dict[str, str] = {}

    @overload
    @classmethod
    def from_metadata(
        cls, metadata: Mapping[str, Any], *, fallback: Literal[True] = ...
    ) -> ChatTemplate: ...

    @overload
    @classmethod
    def from_metadata(
        cls, metadata: Mapping[str, Any], *, fallback: bool
    ) -> ChatTemplate | None: ...

    @classmethod
    def from_metadata(
        cls, metadata: Mapping[str, Any], *, fallback: bool = True
    ) -> ChatTemplate | None:
        """The template of a GGUF (``tokenizer.chat_template``) with its BOS
        and EOS texts. A model without one gets :data:`CHATML`, or ``None``
        with ``fallback=False``."""
        tokens = metadata.get("tokenizer.ggml.tokens")
        tokens = tokens if isinstance(tokens, Sequence) and not isinstance(tokens, str) else []

        def tok(key: str) -> str | None:
            i = metadata.get(f"tokenizer.ggml.{key}")
            if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(tokens):
                return str(tokens[i])
            return None

        source = metadata.get("tokenizer.chat_template")
        if not (isinstance(source, str) and source.strip()):
            if not fallback:
                return None
            source = CHATML
        t = cls(source, bos_token=tok("bos_token_id") or "", eos_token=tok("eos_token_id") or "")
        for name, key in (
            ("unk_token", "unknown_token_id"),
            ("pad_token", "padding_token_id"),
            ("sep_token", "seperator_token_id"),
            ("mask_token", "mask_token_id"),
        ):
            text = tok(key)
            if text is not None:
                t.special_tokens[name] = text
        return t

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text for ``messages`` (mappings with ``role`` and
        usually ``content``). Extra keyword arguments (``tools``,
        ``documents``, ``enable_thinking``...) are template variables and
        may override ``bos_token`` / ``eos_token``."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TemplateError(f"messages must be a sequence of mappings, got {messages!r}")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m:
                raise TemplateError(f"message {i} must be a mapping with a 'role' key, got {m!r}")
        context: dict[str, Any] = {
            **self.special_tokens,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "tools": None,
            "documents": None,
            **kwargs,
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        token = template_limits.start(self.limits)
        try:
            return self._bounded_render(context)
        except OxiLlamaError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e}") from e
        except Exception as e:  # the template's own Python errors (TypeError...)
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
        finally:
            template_limits.finish(token)

    def _bounded_render(self, context: dict[str, Any]) -> str:
        budget = template_limits.current()
        parts: list[str] = []
        total = 0
        for piece in self._template.generate(**context):
            total += len(piece)
            budget.size(total, "the rendered prompt")
            parts.append(piece)
        return "".join(parts)
