"""A chat stream's pieces passed through as the model writes them, its
finished :class:`~oxillama.Completion` split as the non-streamed chat
splits it (see :class:`~oxillama.decoding.reasoning.ReplySplit`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable

from oxillama.decoding.completion import Completion
from oxillama.decoding.reasoning import ReplySplit

__all__ = ["split_result"]


async def split_result(
    start: Callable[[list[Completion]], tuple[ReplySplit, AsyncGenerator[str, None]]],
    result: list[Completion] | None,
) -> AsyncGenerator[str, None]:
    """Yields the pieces of the stream ``start`` opens (it is given the list
    its raw completion goes to, and returns the split with the stream);
    ``result`` then receives the split completion. Nothing starts until
    the first piece is awaited, and leaving early closes the inner stream
    at once."""
    whole: list[Completion] = []
    split, pieces = start(whole)
    async with contextlib.aclosing(pieces):
        async for piece in pieces:
            yield piece
    if result is not None and whole:
        result.append(split.apply(whole[-1]))
