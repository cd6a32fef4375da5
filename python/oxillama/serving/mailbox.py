"""Delivery from the scheduler thread to an event loop, one wake-up per batch.

A batched decode step produces one piece for each of its streams. Waking
the loop once per piece (``call_soon_threadsafe`` writes the loop's
self-pipe every time) costs a loop iteration per stream per step, on a
core the next forward pass wants. The mailbox queues the deliveries and
wakes the loop only when it is not already due to run them.

While the scheduler samples a step's tokens it holds the wake-ups
(``wakeups_held``): a loop woken by the first of eight pieces would take the
GIL while the other seven are still being sampled, and the sampling thread
waited for it. Woken once the step's pieces are all posted, the loop runs
while the forward pass, which releases the GIL, computes the next step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Mailbox", "wakeups_held"]

# Per thread: the mailboxes whose wake-up waits for `wakeups_held` to end,
# or None outside it.
_held = threading.local()


@contextmanager
def wakeups_held() -> Iterator[None]:
    """Within it, posts from this thread queue their items but wake no loop;
    on leaving (however it is left), each mailbox posted to is woken once.
    Nested uses wake at the outermost exit."""
    if getattr(_held, "boxes", None) is not None:
        yield
        return
    boxes: list[Mailbox] = []
    _held.boxes = boxes
    try:
        yield
    finally:
        _held.boxes = None
        for box in boxes:
            box._wake()


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
        held: list[Mailbox] | None = getattr(_held, "boxes", None)
        if held is not None:
            held.append(self)
            return
        self._wake()

    def _wake(self) -> None:
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
