"""How code points are written inside JSON strings, as GBNF.

One code point of a JSON string can be written raw (anything but ``"``,
``\\`` and the controls U+0000-U+001F), as a short escape (``\\" \\\\ \\/ \\b
\\f \\n \\r \\t``), as ``\\uXXXX`` in either case or, above U+FFFF, as a UTF-16
surrogate pair ``\\uD83D\\uDE00``. The grammars built here describe a set of
code points by the ways of writing its members, so one grammar "unit" is
always exactly one code point of the decoded string: that is what keeps
``minLength``, ``maxLength`` and ``pattern`` exact. Escapes of lone
surrogates are never produced (they decode to no character).
"""

from __future__ import annotations

from functools import lru_cache

from oxillama.decoding.grammar.charset import (
    ALL,
    MAX_CP,
    SURROGATES,
    Ranges,
    contains,
    intersect,
    normalize,
    single,
    subtract,
    union,
)
from oxillama.decoding.grammar.gbnf_writer import EMPTY, Expr, alt, char_class, literal, rep, seq

__all__ = ["RAW_OK", "hex_digits", "string_literal", "units"]

#: Code points JSON allows unescaped inside a string.
RAW_OK: Ranges = subtract(ALL, union(((0, 0x1F),), single(0x22), single(0x5C), SURROGATES))
_SHORT = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
_PRINTABLE_ASCII: Ranges = ((0x20, 0x7E),)
_BMP: Ranges = subtract(((0, 0xFFFF),), SURROGATES)
_ASTRAL: Ranges = ((0x10000, MAX_CP),)


@lru_cache(maxsize=1024)
def units(cs: Ranges, *, every_form: bool = False) -> Expr | None:
    """One code point from ``cs``, written any way a JSON text may write it;
    None when ``cs`` is empty.

    By default the forms are the ones JSON writers produce: raw where JSON
    allows it, the short escapes except ``\\/``, and ``\\u`` escapes only for
    code points outside printable ASCII (what ``json.dumps`` writes with
    ``ensure_ascii``). ``every_form`` adds ``\\/`` and ``\\u`` escapes of
    everything, for the catch-all string rule.
    """
    parts: list[Expr] = []
    raw = intersect(cs, RAW_OK)
    if raw:
        parts.append(char_class(raw))
    short = [e for c, e in _SHORT.items() if contains(cs, ord(c)) and (every_form or c != "/")]
    if short:
        parts.append(seq(literal("\\"), char_class(normalize((ord(e), ord(e)) for e in short))))
    bmp = intersect(cs, _BMP)
    if not every_form:
        bmp = subtract(bmp, _PRINTABLE_ASCII)
    hex4 = hex_digits(bmp, 4)
    if hex4 is not None:
        parts.append(seq(literal("\\u"), hex4))
    parts.extend(_surrogate_pairs(intersect(cs, _ASTRAL)))
    return alt(*parts) if parts else None


def string_literal(s: str) -> Expr | None:
    """The JSON string ``s``, quotes included, each character in any of its
    usual forms (so ``json.dumps`` output matches with or without
    ``ensure_ascii``); None if ``s`` holds a lone surrogate."""
    parts = [literal('"')]
    for c in s:
        if 0x20 <= ord(c) <= 0x7E and c not in '"\\':
            parts.append(literal(c))
        else:
            u = units(single(ord(c)))
            if u is None:
                return None
            parts.append(u)
    parts.append(literal('"'))
    return seq(*parts)


def _hex_class(digits: list[int]) -> Expr:
    cps: list[tuple[int, int]] = []
    for d in digits:
        if d < 10:
            cps.append((0x30 + d, 0x30 + d))
        else:
            cps += [(0x61 + d - 10, 0x61 + d - 10), (0x41 + d - 10, 0x41 + d - 10)]
    return char_class(normalize(cps))


@lru_cache(maxsize=1024)
def hex_digits(values: Ranges, width: int) -> Expr | None:
    """Exactly ``width`` hex digits (either case) whose value is in
    ``values``; None when ``values`` is empty.

    Built as a trie on the leading digit, with digits that share the same
    continuation merged into one class, so a range costs a few alternatives
    per digit rather than one per value.
    """
    if not values:
        return None
    if width == 0:
        return EMPTY
    top = 16**width - 1
    if values == ((0, top),):
        return rep(_hex_class(list(range(16))), width, width)
    span = 16 ** (width - 1)
    by_tail: dict[str, tuple[list[int], Expr]] = {}
    for d in range(16):
        base = d * span
        sub = intersect(values, ((base, base + span - 1),))
        if not sub:
            continue
        tail = hex_digits(tuple((lo - base, hi - base) for lo, hi in sub), width - 1)
        assert tail is not None
        by_tail.setdefault(tail.text, ([], tail))[0].append(d)
    return alt(*(seq(_hex_class(digits), tail) for digits, tail in by_tail.values()))


def _surrogate_pairs(astral: Ranges) -> list[Expr]:
    """``\\uHIGH\\uLOW`` for the code points in ``astral`` (all above U+FFFF)."""
    # Split each range into (high-surrogate range, low-surrogate range)
    # rectangles, then share one alternative among highs with equal lows.
    by_low: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for lo, hi in astral:
        ha, la = divmod(lo - 0x10000, 0x400)
        hb, lb = divmod(hi - 0x10000, 0x400)
        if ha == hb:
            pieces = [((ha, ha), (la, lb))]
        else:
            pieces = [((ha, ha), (la, 0x3FF)), ((ha + 1, hb - 1), (0, 0x3FF)), ((hb, hb), (0, lb))]
        for highs, lows in pieces:
            if highs[0] <= highs[1]:
                by_low.setdefault(lows, []).append(highs)
    out = []
    for (l1, l2), high_ranges in by_low.items():
        high = hex_digits(normalize((0xD800 + a, 0xD800 + b) for a, b in high_ranges), 4)
        low = hex_digits(((0xDC00 + l1, 0xDC00 + l2),), 4)
        assert high is not None and low is not None
        out.append(seq(literal("\\u"), high, literal("\\u"), low))
    return out
