"""Delivery from the scheduler thread to an event loop, one wake-up per batch.

A batched decode step produces one piece for each of its streams. Waking
the loop once per piece (``call_soon_threadsafe`` writes the loop's
self-pipe every time) costs a loop iteration per stream per step, on a
core the next forward pass wants. The mailbox queues the deliveries and
wakes the loop only when it is not already due to run them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Mailbox"]


class Mailbox:
    """Runs ``deliver(item)`` calls, posted from any thread, on ``loop``, in
    the order they were posted."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[Callable[[Any], None], Any]] = []
        self._due = False

    def post(self, deliver: Callable[[Any], None], item: Any) -> None:
        with self._lock:
            self._items.append((deliver, item))
            if self._due:
                return
            self._due = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is listening
            pass

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._due = False
        for deliver, item in items:
            deliver(item)
