"""Sets of Unicode code points as sorted, disjoint, non-adjacent inclusive ranges."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

__all__ = [
    "ALL",
    "MAX_CP",
    "SURROGATES",
    "Ranges",
    "complement",
    "contains",
    "intersect",
    "normalize",
    "single",
    "subtract",
    "union",
]

MAX_CP = 0x10FFFF
Ranges = tuple[tuple[int, int], ...]

# Set algebra on the same few classes (string bodies, digits, hex, the
# surrogate block) repeats hundreds of times per schema: memoized, compiling
# a schema costs a few milliseconds instead of tens. Ranges are tuples, so
# hashable and safe to share.
_memo = lru_cache(maxsize=4096)
ALL: Ranges = ((0, MAX_CP),)
SURROGATES: Ranges = ((0xD800, 0xDFFF),)


def normalize(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in ranges if r[0] <= r[1]):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def single(cp: int) -> Ranges:
    return ((cp, cp),)


@_memo
def union(*sets: Ranges) -> Ranges:
    return normalize(r for s in sets for r in s)


@_memo
def complement(ranges: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CP:
        out.append((nxt, MAX_CP))
    return tuple(out)


@_memo
def intersect(a: Ranges, b: Ranges) -> Ranges:
    return complement(union(complement(a), complement(b)))


@_memo
def subtract(a: Ranges, b: Ranges) -> Ranges:
    return intersect(a, complement(b))


def contains(ranges: Ranges, cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)
