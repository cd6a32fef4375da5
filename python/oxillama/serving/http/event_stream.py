"""What every streaming route (chat and text completions, Messages,
Responses) does at the two ends of its event stream: await the first
piece before the response starts, and close the pieces, then give the
session back, however the response ends."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from oxillama.serving.http.session_table import Lease

__all__ = ["EventStream", "first_item", "lease_closer"]

T = TypeVar("T")


class EventStream(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends: after
    the last event, when the client hangs up, and also when it hangs up
    before the first event (the body iterator then never starts, so its own
    ``finally`` would not run)."""

    def __init__(
        self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


async def first_item(items: AsyncGenerator[T, None]) -> T | None:
    """The first of ``items`` (None when there are none), awaited before the
    response starts so that a request the scheduler refuses is answered
    with its status, not a 200; ``items`` is closed when that fails."""
    try:
        return await anext(items, None)
    except BaseException:
        await items.aclose()
        raise


def lease_closer(
    items: AsyncGenerator[object, None], lease: Lease | None
) -> Callable[[], Awaitable[None]]:
    """Closes ``items`` (which cancels their requests in the scheduler),
    then releases ``lease``: the turn ends before the session is free for
    anyone else."""

    async def close() -> None:
        try:
            await items.aclose()
        finally:
            if lease is not None:
                lease.release()

    return close
