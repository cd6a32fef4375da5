"""Several piece streams (a request's ``n`` choices) as one stream of
``(choice index, piece)`` events in the order they are produced."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

__all__ = ["merged"]

_END = object()


async def merged(streams: Sequence[AsyncIterator[str]]) -> AsyncGenerator[tuple[int, str | None]]:
    """Yields ``(i, piece)`` as stream ``i`` produces it and ``(i, None)``
    when it ends; an error in any stream ends them all and is raised.
    Closing this generator cancels every stream."""
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator[str]) -> None:
        try:
            async for piece in s:
                await queue.put((i, piece))
            await queue.put((i, _END))
        except BaseException as e:  # delivered to the consumer, then re-raised there
            await queue.put((i, e))
            if isinstance(e, asyncio.CancelledError):
                raise

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        live = len(tasks)
        while live:
            i, item = await queue.get()
            if item is _END:
                live -= 1
                yield i, None
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        for s in streams:
            aclose = getattr(s, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(BaseException):
                    await aclose()
