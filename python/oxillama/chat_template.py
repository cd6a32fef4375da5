"""Chat templates rendered the way transformers renders them: the GGUF's
``tokenizer.chat_template`` in a sandboxed Jinja2 environment."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import TemplateError

__all__ = ["CHATML", "ChatTemplate"]

#: Used when a model carries no template: the widely supported ChatML format.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateError(f"invalid chat template: {e}") from e
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> ChatTemplate:
        """The model's template, or ChatML when it has none."""
        tokens = metadata.get("tokenizer.ggml.tokens") or []

        def tok(key: str) -> str:
            i = metadata.get(f"tokenizer.ggml.{key}")
            return str(tokens[i]) if isinstance(i, int) and 0 <= i < len(tokens) else ""

        source = metadata.get("tokenizer.chat_template")
        return cls(
            source if isinstance(source, str) and source else CHATML,
            bos_token=tok("bos_token_id"),
            eos_token=tok("eos_token_id"),
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m:
                raise TemplateError(f"message {i} must be a mapping with a 'role' key, got {m!r}")
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **kwargs,
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e}") from e
