"""A route's reply as the model writes it, in the request's session when
it names one, else as a one-shot request: the chat, Messages and
Responses routes split reasoning, tool calls and channels themselves."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oxillama.decoding.completion import Completion
from oxillama.engine.engine import Message
from oxillama.serving.async_engine import AsyncEngine
from oxillama.serving.async_session import AsyncSession

__all__ = ["RawTurn"]


@dataclass(frozen=True)
class RawTurn:
    """In ``session``, only the part of the rendered chat (``messages`` under
    ``variables``) it has not seen is evaluated; without one, ``tokens``
    (the rendered prompt) is a one-shot request."""

    engine: AsyncEngine
    session: AsyncSession | None
    messages: Sequence[Message]
    tokens: list[int]
    variables: Mapping[str, Any]

    async def complete(self, max_tokens: int, **kwargs: Any) -> Completion:
        if self.session is None:
            return await self.engine.generate(self.tokens, max_tokens, **kwargs)
        return await self.session.chat(
            self.messages, max_tokens, reasoning_format="none", **self.variables, **kwargs
        )

    def stream(
        self, max_tokens: int, *, result: list[Completion], **kwargs: Any
    ) -> AsyncGenerator[str, None]:
        if self.session is None:
            return self.engine.stream(self.tokens, max_tokens, result=result, **kwargs)
        return self.session.chat_stream(
            self.messages,
            max_tokens,
            result=result,
            reasoning_format="none",
            **self.variables,
            **kwargs,
        )
