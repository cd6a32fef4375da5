"""Bounds on what rendering one chat template may cost.

A chat template comes from the GGUF, so from whoever made the file. The
sandbox (:mod:`oxillama.text.template_sandbox`) checks every operation that can
grow a value against these limits before it runs, and the loops and calls
of the template against a wall-clock deadline, so a hostile template ends
in a :class:`~oxillama.errors.TemplateError` in bounded time and memory.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from oxillama.errors import ParameterError, TemplateError

__all__ = ["TemplateLimits"]

#: Largest integer (in bits) a template may compute. Python prints at most
#: 4300 digits anyway (``sys.get_int_max_str_digits``); beyond this a
#: product or power only burns time.
MAX_INT_BITS = 1 << 14
#: Deadline checks while walking a big value or iterating a filter's input.
CHECK_EVERY = 1024


@dataclass(frozen=True)
class TemplateLimits:
    """What one render may cost. Every bound is checked before the work it
    guards, so exceeding one raises :class:`~oxillama.errors.TemplateError`
    without allocating first.

    - ``max_seconds``: wall-clock time of one render (checked at each loop
      iteration, call and filter, and while walking big values).
    - ``max_output_chars``: the rendered prompt, and any one value the
      template builds (a string, or a list or mapping counted as its
      characters plus one per item, shared parts counted each time).
    - ``max_items``: elements one filter may iterate over.
    - ``max_alloc_bytes``: bytes of all strings and lists the template builds
      during the render, together (what it could keep alive at once).
    """

    max_seconds: float = 1.0
    max_output_chars: int = 4 << 20
    max_items: int = 1 << 20
    max_alloc_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        for name in ("max_output_chars", "max_items", "max_alloc_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ParameterError(f"{name} must be a positive integer, got {v!r}")
        s = self.max_seconds
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s < float("inf"):
            raise ParameterError(f"max_seconds must be a positive number, got {s!r}")


class Budget:
    """The running account of one render (or one compile)."""

    __slots__ = ("_deadline", "allocated", "limits")

    def __init__(self, limits: TemplateLimits) -> None:
        self.limits = limits
        self._deadline = time.monotonic() + limits.max_seconds
        self.allocated = 0

    def tick(self) -> None:
        if time.monotonic() > self._deadline:
            raise TemplateError(
                f"chat template ran longer than its limit of {self.limits.max_seconds:g} s"
            )

    def size(self, n: int, what: str) -> None:
        """Refuses a value of ``n`` characters (or weight) over the output bound."""
        if n > self.limits.max_output_chars:
            raise TemplateError(
                f"chat template: {what} would hold {n:,} characters, over the limit of "
                f"{self.limits.max_output_chars:,}"
            )

    def items(self, n: int, what: str) -> None:
        if n > self.limits.max_items:
            raise TemplateError(
                f"chat template: {what} would iterate over more than "
                f"{self.limits.max_items:,} items"
            )

    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        if self.allocated > self.limits.max_alloc_bytes:
            raise TemplateError(
                "chat template built more than "
                f"{self.limits.max_alloc_bytes:,} bytes of strings and lists"
            )

    def bounded(self, iterable: Any, what: str) -> Iterator[Any]:
        """``iterable``'s items, refusing more than ``max_items`` and
        checking the deadline as it goes (for iterators of unknown length)."""
        limit = self.limits.max_items
        n = 0
        for item in iterable:
            n += 1
            if n % CHECK_EVERY == 0:
                self.tick()
                if n > limit:
                    self.items(n, what)
            yield item


_DEFAULT = TemplateLimits()
_CURRENT: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "oxillama_template_budget", default=None
)


def current() -> Budget:
    """The budget of the render running in this context (a fresh default one
    when the sandbox is used outside :class:`~oxillama.text.chat_template.ChatTemplate`)."""
    b = _CURRENT.get()
    if b is None:
        b = Budget(_DEFAULT)
        _CURRENT.set(b)
    return b


def start(limits: TemplateLimits) -> contextvars.Token[Budget | None]:
    return _CURRENT.set(Budget(limits))


def finish(token: contextvars.Token[Budget | None]) -> None:
    _CURRENT.reset(token)
