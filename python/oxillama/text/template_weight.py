"""The weight of a template value: what printing, comparing, hashing or
serialising it costs.

It is the value's characters (strings, bytes, digits) plus one per item,
with a part that is shared counted each time it is reached, since ``str``,
``==`` and ``tojson`` walk it each time: ``[x, x]`` weighs twice ``x``. A
template can build a value whose printed form is exponential in its memory
(``ns.x = [ns.x, ns.x]`` in a loop), so this is computed by a walk that
visits each object once (memoised by identity), without recursion, stops as
soon as the total passes a cap, and checks the render's deadline as it goes.
"""

from __future__ import annotations

from collections import abc
from collections.abc import Iterator
from typing import Any

from jinja2.utils import Namespace

from oxillama.text.template_limits import CHECK_EVERY, Budget

__all__ = ["WeightedList", "weight"]

_ATOMS = (bool, float, complex, type(None))


class WeightedList(list[Any]):
    """A list the sandbox built, carrying its weight so that growing it
    (``ns.items = ns.items + [x]`` in a loop) does not walk it again."""

    __slots__ = ("_weight",)

    def __init__(self, items: Any, weight: int) -> None:
        super().__init__(items)
        self._weight = weight


def _leaf(v: Any) -> int | None:
    """The weight of a value with no parts, or None for a container."""
    if isinstance(v, (str, bytes, bytearray)):
        return len(v) + 2
    if isinstance(v, int):
        return v.bit_length() // 3 + 1
    if isinstance(v, _ATOMS):
        return 1
    if isinstance(v, WeightedList):
        return v._weight
    if isinstance(v, range):
        return 1
    return None


def _parts(v: Any) -> Iterator[Any] | None:
    """The parts a container is printed and compared by, or None when ``v``
    is not one (it then weighs one)."""
    if isinstance(v, Namespace):
        attrs: dict[str, Any] = object.__getattribute__(v, "_Namespace__attrs")
        return _mapping_parts(attrs)
    if isinstance(v, abc.Mapping):
        return _mapping_parts(v)
    if isinstance(v, (abc.Collection, abc.MappingView)) and not isinstance(v, str):
        return iter(v)  # type: ignore[arg-type]
    return None


def _mapping_parts(m: abc.Mapping[Any, Any]) -> Iterator[Any]:
    for k, x in m.items():
        yield k
        yield x


def weight(value: Any, budget: Budget, cap: int | None = None) -> int:
    """``value``'s weight, or any number above ``cap`` once it is known to
    be (``cap`` defaults to the output bound)."""
    w = _leaf(value)
    if w is not None:
        return w - 2 if isinstance(value, (str, bytes, bytearray)) else w
    limit = budget.limits.max_output_chars if cap is None else cap
    done: dict[int, int] = {}
    active: set[int] = set()
    keep: list[Any] = []  # parts made on the fly (a dict's items) must not free their ids
    parts = _parts(value)
    if parts is None:
        return 1
    stack: list[tuple[Any, Iterator[Any], int]] = [(value, parts, 1)]
    active.add(id(value))
    visited = 0
    while stack:
        obj, it, total = stack[-1]
        child = next(it, _END)
        if child is _END:
            stack.pop()
            active.discard(id(obj))
            done[id(obj)] = total
            if stack:
                parent, pit, ptotal = stack[-1]
                stack[-1] = (parent, pit, ptotal + total)
                if ptotal + total > limit:
                    return ptotal + total
            else:
                return total
            continue
        visited += 1
        if visited % CHECK_EVERY == 0:
            budget.tick()
        w = _leaf(child)
        if w is None:
            key = id(child)
            if key in done:
                w = done[key]
            elif key in active:
                w = 5  # a cycle prints as [...]
            else:
                sub = _parts(child)
                if sub is None:
                    w = 1
                else:
                    keep.append(child)
                    active.add(key)
                    stack.append((child, sub, 1))
                    continue
        total += w
        stack[-1] = (obj, it, total)
        if total > limit:
            return total
    raise AssertionError("unreachable")


_END = object()
