"""Regular expressions to GBNF, for ``pattern`` and the string formats.

The accepted syntax is the common subset of ECMA-262 (what JSON Schema
specifies) and Python's ``re`` (what Python validators run): literals and
escapes, ``.``, classes with ranges, negation and ``\\d \\w \\s \\D \\W \\S``,
capturing, non-capturing and named groups, alternation, the quantifiers
``* + ? {m} {m,} {m,n}`` and their lazy forms (laziness does not change the
language), and ``^`` / ``$`` at the ends of top-level alternatives.
Lookarounds, backreferences, word boundaries, inline flags and the like
raise :class:`RegexError` naming the construct.

Where the two engines disagree on what a class matches, the grammar admits
only what both agree on, so whatever it produces passes either engine:
``\\d`` is ``[0-9]`` (Python's also has other scripts' digits), ``\\D`` excludes
every Unicode digit, ``.`` excludes ``\\n \\r`` U+2028 and U+2029, and ``$``
means the end of the string (Python's also matches before a final newline).

A pattern is unanchored, as in JSON Schema: an alternative without ``^`` may
be preceded by anything, one without ``$`` followed by anything.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from oxillama.decoding.grammar.charset import (
    ALL,
    Ranges,
    complement,
    intersect,
    normalize,
    single,
    union,
)
from oxillama.decoding.grammar.gbnf_writer import EMPTY, Expr, alt, rep, seq

__all__ = [
    "MAX_REPEAT",
    "LengthUnsupported",
    "RegexError",
    "compile_regex",
    "length_range",
    "parse_regex",
]

#: Largest count a regex quantifier may give (each repetition is spelled out
#: by GBNF matchers).
MAX_REPEAT = 1000


class RegexError(ValueError):
    """The pattern is malformed or uses a construct a grammar cannot express."""


class LengthUnsupported(Exception):
    """Length bounds cannot be pushed into this regex exactly."""


# ------------------------------------------------------------------ syntax tree


@dataclass(frozen=True)
class Chars:
    ranges: Ranges  # one code point from these


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    node: Node
    lo: int
    hi: int | None


Node = Chars | Seq | Alt | Repeat


@dataclass(frozen=True)
class Branch:
    """A top-level alternative and whether it is anchored at each end."""

    start: bool
    body: Node
    end: bool


# ------------------------------------------------------------------ class sets


@functools.cache
def _python_class(letter: str) -> Ranges:
    """What Python's ``re`` matches for ``\\d``, ``\\w`` or ``\\s`` (str patterns)."""
    every = "".join(map(chr, range(0x110000)))
    return normalize((m.start(), m.end() - 1) for m in re.finditer(f"\\{letter}+", every))


_ECMA_CLASS: dict[str, Ranges] = {
    "d": ((0x30, 0x39),),
    "w": normalize([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]),
    "s": normalize(
        [
            (0x09, 0x0D),
            (0x20, 0x20),
            (0xA0, 0xA0),
            (0x1680, 0x1680),
            (0x2000, 0x200A),
            (0x2028, 0x2029),
            (0x202F, 0x202F),
            (0x205F, 0x205F),
            (0x3000, 0x3000),
            (0xFEFF, 0xFEFF),
        ]
    ),
}
_LINE_TERMINATORS = normalize([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])


def _class_escape(letter: str) -> tuple[Ranges, Ranges]:
    """(inner, outer) sets for ``\\d``-style escapes: inner is what both
    engines match (safe to accept), outer what either matches (what a
    negation must exclude)."""
    lower = letter.lower()
    ecma = _ECMA_CLASS[lower]
    python = _python_class(lower)
    inner, outer = intersect(ecma, python), union(ecma, python)
    if letter.isupper():
        return complement(outer), complement(inner)
    return inner, outer


# ----------------------------------------------------------------------- parser

_QUANT = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")
_SIMPLE = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "v": 0x0B}


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0

    def error(self, message: str) -> RegexError:
        return RegexError(f"{message} at offset {self.i} of pattern {self.p!r}")

    def peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def top(self) -> list[Branch]:
        branches = [self.branch()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.branch())
        if self.i < len(self.p):
            raise self.error("unbalanced ')'")
        return branches

    def branch(self) -> Branch:
        start = self.peek() == "^"
        if start:
            self.i += 1
        items = self.items(top=True)
        end = self.peek() == "$"
        if end:
            self.i += 1
            if self.peek() not in ("", "|"):
                raise self.error("'$' is only supported at the end of the pattern")
        return Branch(start, Seq(tuple(items)), end)

    def alternation(self) -> Node:
        options = [Seq(tuple(self.items(top=False)))]
        while self.peek() == "|":
            self.i += 1
            options.append(Seq(tuple(self.items(top=False))))
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def items(self, top: bool) -> list[Node]:
        out: list[Node] = []
        while self.peek() not in ("", "|", ")") and not (top and self.peek() == "$"):
            out.append(self.quantified(self.atom()))
        return out

    def atom(self) -> Node:
        c = self.peek()
        if c == "^":
            raise self.error("'^' is only supported at the start of the pattern")
        if c == "$":
            raise self.error("'$' is only supported at the end of the pattern")
        if c in "*+?":
            raise self.error(f"{c!r} has nothing to repeat")
        if c == "{" and _QUANT.match(self.p, self.i):
            raise self.error("'{' quantifier has nothing to repeat")
        self.i += 1
        if c == ".":
            return Chars(complement(_LINE_TERMINATORS))
        if c == "[":
            return Chars(self.char_class())
        if c == "(":
            return self.group()
        if c == "\\":
            inner, _ = self.escape(in_class=False)
            return Chars(inner)
        return Chars(single(ord(c)))

    def group(self) -> Node:
        if self.p.startswith("?", self.i):
            rest = self.p[self.i :]
            if rest.startswith(("?=", "?!", "?<=", "?<!")):
                raise self.error("lookaround assertions are not supported")
            if rest.startswith("?P="):
                raise self.error("backreferences are not supported")
            if rest.startswith("?:"):
                self.i += 2
            elif m := re.match(r"\?P?<([A-Za-z_][A-Za-z0-9_]*)>", rest):
                self.i += m.end()
            else:
                raise self.error("group flags and extensions (?...) are not supported")
        inner = self.alternation()
        if self.peek() != ")":
            raise self.error("missing ')'")
        self.i += 1
        return inner

    def quantified(self, node: Node) -> Node:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{" and (m := _QUANT.match(self.p, self.i)):
            self.i = m.end()
            lo = int(m.group(1))
            hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if hi is not None and hi < lo:
                raise self.error(f"quantifier {m.group(0)} has its maximum below its minimum")
            if max(lo, hi or 0) > MAX_REPEAT:
                raise self.error(f"quantifier {m.group(0)} exceeds {MAX_REPEAT}")
        elif c == "{" and self.p.startswith("{,", self.i):
            raise self.error("'{,n}' means different things in ECMA-262 and Python")
        else:
            return node
        if self.peek() == "?":
            self.i += 1  # lazy: same language
        if self.peek() in ("*", "+", "?", "{") and (
            self.peek() != "{" or _QUANT.match(self.p, self.i)
        ):
            raise self.error("possessive or repeated quantifiers are not supported")
        return Repeat(node, lo, hi)

    def escape(self, in_class: bool) -> tuple[Ranges, Ranges]:
        """Parses after a backslash; returns (inner, outer) sets."""
        c = self.peek()
        if not c:
            raise self.error("pattern ends with a lone backslash")
        self.i += 1
        if c in "dwsDWS":
            return _class_escape(c)
        if c in _SIMPLE:
            s = single(_SIMPLE[c])
            return s, s
        if c == "b" and in_class:
            return single(8), single(8)
        if c in "bBAZzG":
            raise self.error(f"the assertion \\{c} is not supported")
        if c == "0" and not self.peek().isdigit():
            return single(0), single(0)
        if c.isdigit() or c == "k":
            raise self.error("backreferences are not supported")
        if c in "xu":
            width = 2 if c == "x" else 4
            digits = self.p[self.i : self.i + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"\\{c} needs {width} hex digits")
            self.i += width
            cp = int(digits, 16)
            if 0xD800 <= cp <= 0xDFFF:
                raise self.error("surrogate escapes are not supported")
            return single(cp), single(cp)
        if c in "pP":
            raise self.error("Unicode property escapes are not supported")
        if c.isascii() and c.isalnum():
            raise self.error(f"the escape \\{c} is not supported")
        return single(ord(c)), single(ord(c))

    def char_class(self) -> Ranges:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        if self.peek() == "]":
            raise self.error("'[]' means different things in ECMA-262 and Python")
        inner: list[Ranges] = []
        outer: list[Ranges] = []
        while True:
            c = self.peek()
            if not c:
                raise self.error("missing ']'")
            if c == "]":
                self.i += 1
                break
            lo_in, lo_out = self.class_atom()
            if self.peek() == "-" and self.p[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                hi_in, _ = self.class_atom()
                if len(lo_in) != 1 or len(hi_in) != 1 or lo_in[0][0] != lo_in[0][1]:
                    raise self.error("a class range needs single characters at both ends")
                lo, hi = lo_in[0][0], hi_in[0][0]
                if hi_in[0][0] != hi_in[0][1] or hi < lo:
                    raise self.error("bad class range")
                inner.append(((lo, hi),))
                outer.append(((lo, hi),))
            else:
                inner.append(lo_in)
                outer.append(lo_out)
        if negated:
            return complement(union(*outer))
        return union(*inner)

    def class_atom(self) -> tuple[Ranges, Ranges]:
        c = self.peek()
        self.i += 1
        if c == "\\":
            return self.escape(in_class=True)
        if c == "[" and self.peek() in (":", "=", "."):
            raise self.error("POSIX classes are not supported")
        return single(ord(c)), single(ord(c))


def parse_regex(pattern: str) -> list[Branch]:
    """The top-level alternatives of ``pattern``; raises RegexError."""
    return list(_parse_cached(pattern))


@functools.lru_cache(maxsize=512)
def _parse_cached(pattern: str) -> tuple[Branch, ...]:
    # Trees are frozen, so the format regexes (parsed for every schema that
    # uses `format`) are parsed once per process.
    return tuple(_Parser(pattern).top())


# ------------------------------------------------------------------- lengths


def length_range(node: Node) -> tuple[int, int | None]:
    """Fewest and most code points ``node`` matches (None: unbounded)."""
    if isinstance(node, Chars):
        return 1, 1
    if isinstance(node, Seq):
        lo, hi = 0, 0
        unbounded = False
        for item in node.items:
            a, b = length_range(item)
            lo += a
            if b is None:
                unbounded = True
            else:
                hi += b
        return lo, None if unbounded else hi
    if isinstance(node, Alt):
        ranges = [length_range(o) for o in node.options]
        highs = [b for _, b in ranges]
        return min(a for a, _ in ranges), None if None in highs else max(b or 0 for b in highs)
    a, b = length_range(node.node)
    return a * node.lo, (None if node.hi is None or b is None else b * node.hi)


# --------------------------------------------------------------------- output

Units = Callable[[Ranges], "Expr | None"]


def compile_regex(
    pattern: str, units: Units, min_len: int = 0, max_len: int | None = None
) -> Expr | None:
    """The strings ``pattern`` matches (searched, i.e. unanchored unless it
    says otherwise) with ``min_len..max_len`` code points, as GBNF over the
    units ``units`` builds for a code point set. None when no string
    qualifies. Raises RegexError, or LengthUnsupported when the length
    bounds cannot be expressed exactly for this pattern."""
    anything = Repeat(Chars(ALL), 0, None)
    options: list[Node] = []
    for b in parse_regex(pattern):
        items: list[Node] = [] if b.start else [anything]
        items.append(b.body)
        if not b.end:
            items.append(anything)
        options.append(Seq(tuple(items)))
    tree: Node = options[0] if len(options) == 1 else Alt(tuple(options))
    return _Emitter(units).bounded(tree, min_len, max_len)


class _Emitter:
    def __init__(self, units: Units) -> None:
        self.units = units

    def plain(self, node: Node) -> Expr | None:
        if isinstance(node, Chars):
            return self.units(node.ranges) if node.ranges else None
        if isinstance(node, Seq):
            parts = [self.plain(i) for i in node.items]
            return None if any(p is None for p in parts) else seq(*(p for p in parts if p))
        if isinstance(node, Alt):
            present = [p for p in (self.plain(o) for o in node.options) if p is not None]
            return alt(*present) if present else None
        body = self.plain(node.node)
        if body is None:
            return EMPTY if node.lo == 0 else None
        return rep(body, node.lo, node.hi)

    def bounded(self, node: Node, lo: int, hi: int | None) -> Expr | None:
        """``node``'s strings with lo..hi code points: bounds are pushed down
        to the one part whose length varies, or into a repetition count."""
        nlo, nhi = length_range(node)
        if (hi is not None and nlo > hi) or (nhi is not None and nhi < lo):
            return None
        if nlo >= lo and (hi is None or (nhi is not None and nhi <= hi)):
            return self.plain(node)
        if isinstance(node, Alt):
            present = [p for p in (self.bounded(o, lo, hi) for o in node.options) if p]
            return alt(*present) if present else None
        if isinstance(node, Seq):
            lengths = [length_range(i) for i in node.items]
            varying = [k for k, (a, b) in enumerate(lengths) if a != b]
            if len(varying) != 1:
                raise LengthUnsupported
            k = varying[0]
            fixed = sum(a for j, (a, _) in enumerate(lengths) if j != k)
            inner = self.bounded(
                node.items[k], max(lo - fixed, 0), None if hi is None else hi - fixed
            )
            if inner is None:
                return None
            parts = [self.plain(i) if j != k else inner for j, i in enumerate(node.items)]
            return None if any(p is None for p in parts) else seq(*(p for p in parts if p))
        if isinstance(node, Repeat):
            a, b = length_range(node.node)
            if a != b or a == 0:
                raise LengthUnsupported
            count_lo = max(node.lo, -(-lo // a))
            count_hi = (
                node.hi if hi is None else min(hi // a, node.hi if node.hi is not None else hi)
            )
            if count_hi is not None and count_hi < count_lo:
                return None
            body = self.plain(node.node)
            if body is None:
                return EMPTY if count_lo == 0 else None
            return rep(body, count_lo, count_hi)
        raise LengthUnsupported  # a single character always fits or never does
