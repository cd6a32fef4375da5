"""A parser for llama.cpp's GBNF dialect, producing a small syntax tree.

The parser is iterative where input controls depth (nested groups), so a
hostile grammar ends in a :class:`~oxillama.GrammarError` naming the line
and column, never in a ``RecursionError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from oxillama.errors import GrammarError

#: The largest repetition bound accepted in ``{m,n}``: each repetition is
#: expanded into the compiled grammar, so bounds are kept to what a real
#: grammar needs.
MAX_REPEAT = 10_000
#: Deepest nesting of parenthesised groups.
MAX_NESTING = 1_000
MAX_CODE_POINT = 0x10FFFF


@dataclass(frozen=True)
class Pos:
    line: int
    column: int


# ----------------------------------------------------------------- the tree


@dataclass
class Chars:
    """One code point from the sorted, disjoint inclusive ``ranges``."""

    ranges: list[tuple[int, int]]


@dataclass
class Ref:
    name: str
    pos: Pos


@dataclass
class TokenRef:
    """A whole token: by id (``<[42]>``) or by its text (``<think>``)."""

    token: int | str
    negated: bool
    pos: Pos


@dataclass
class Repeat:
    item: Node
    min: int
    max: int | None  # None: unbounded


@dataclass
class Alternatives:
    alts: list[list[Node]] = field(default_factory=list)


Node = Chars | Ref | TokenRef | Repeat | Alternatives


@dataclass
class Rule:
    name: str
    body: Alternatives
    pos: Pos


# --------------------------------------------------------------- the parser

_ESCAPES = {"t": 0x09, "r": 0x0D, "n": 0x0A, "\\": 0x5C, '"': 0x22, "[": 0x5B, "]": 0x5D}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


# Lexing runs of characters with `re` instead of one Python step each: the
# JSON Schema compiler's output is parsed on every schema compile.
_BLANKS = re.compile(r"(?:[ \t]+|#[^\r\n]*)+")
_BLANKS_NL = re.compile(r"(?:[ \t\r\n]+|#[^\r\n]*)+")
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_PLAIN_RUN = re.compile(r'[^"\\\r\n]+')


def _is_name_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c in "-_")


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    # -- positions and errors

    def pos(self, i: int | None = None) -> Pos:
        i = self.i if i is None else i
        line = self.s.count("\n", 0, i) + 1
        col = i - (self.s.rfind("\n", 0, i) + 1) + 1
        return Pos(line, col)

    def error(self, message: str, i: int | None = None) -> GrammarError:
        p = self.pos(i)
        return GrammarError(message, line=p.line, column=p.column)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    # -- whitespace

    def skip(self, newlines: bool) -> None:
        """Skips blanks and comments; newlines only when ``newlines``."""
        m = (_BLANKS_NL if newlines else _BLANKS).match(self.s, self.i)
        if m is not None:
            self.i = m.end()

    def continues_on_next_line(self) -> bool:
        """A top-level sequence may go on after a line break when the next
        meaningful line starts with ``|``."""
        save = self.i
        self.skip(True)
        if self.peek() == "|":
            return True
        self.i = save
        return False

    # -- grammar

    def grammar(self) -> list[Rule]:
        rules: list[Rule] = []
        self.skip(True)
        while self.i < len(self.s):
            rules.append(self.rule())
            self.skip(True)
        return rules

    def rule(self) -> Rule:
        start = self.i
        name = self.name()
        self.skip(False)
        if not self.s.startswith("::=", self.i):
            raise self.error(f"expected '::=' after rule name {name!r}")
        self.i += 3
        self.skip(True)
        body = self.alternatives()
        self.skip(False)
        if self.i < len(self.s) and self.peek() not in "\r\n":
            raise self.error(f"unexpected {self.peek()!r}: expected the end of rule {name!r}")
        return Rule(name, body, self.pos(start))

    def name(self) -> str:
        start = self.i
        m = _NAME.match(self.s, start)
        if m is not None:
            self.i = m.end()
        if self.i == start:
            c = self.peek()
            raise self.error(f"expected a rule name, found {c!r}" if c else "expected a rule name")
        return self.s[start : self.i]

    def alternatives(self) -> Alternatives:
        """Parses ``seq ('|' seq)*`` with an explicit stack of open groups,
        so nesting depth is bounded by MAX_NESTING, not by Python's stack."""
        # Each frame: (the group's alternatives, the sequence being built,
        # the index of its opening parenthesis).
        root = Alternatives([[]])
        frames: list[tuple[Alternatives, int]] = [(root, -1)]
        while True:
            group, open_at = frames[-1]
            nested = len(frames) > 1
            seq = group.alts[-1]
            self.skip(nested)
            c = self.peek()
            if c == "" or (c in "\r\n" and not nested):
                if c and self.continues_on_next_line():
                    continue
                if len(frames) > 1:
                    raise self.error("unbalanced '(': missing ')'", open_at)
                return root
            if c == "|":
                self.i += 1
                self.skip(True)
                group.alts.append([])
                continue
            if c == ")":
                if len(frames) == 1:
                    raise self.error("unbalanced ')': no group is open")
                self.i += 1
                frames.pop()
                self.postfix(frames[-1][0].alts[-1])
                continue
            if c == "(":
                if len(frames) > MAX_NESTING:
                    raise self.error(f"groups nested deeper than {MAX_NESTING}")
                inner = Alternatives([[]])
                seq.append(inner)
                frames.append((inner, self.i))
                self.i += 1
                continue
            seq.append(self.atom())
            self.postfix(seq)

    def atom(self) -> Node:
        c = self.peek()
        start = self.i
        if c == '"':
            self.i += 1
            return self.literal(start)
        if c == "[":
            self.i += 1
            return self.char_class(start)
        if c == ".":
            self.i += 1
            return Chars([(0, 0xD7FF), (0xE000, MAX_CODE_POINT)])
        if c == "<" or (c == "!" and self.peek(1) == "<"):
            return self.token_ref()
        if _is_name_char(c):
            name = self.name()
            save = self.i
            self.skip(False)
            if self.s.startswith("::=", self.i):
                raise self.error(
                    f"rule {name!r} starts before the previous rule ended "
                    "(a rule's first line must be on a line of its own)",
                    start,
                )
            self.i = save
            return Ref(name, self.pos(start))
        if c == "*" or c == "+" or c == "?" or c == "{":
            raise self.error(f"{c!r} has nothing to repeat")
        if c == "]":
            raise self.error("unbalanced ']': no character class is open")
        raise self.error(f"unexpected character {c!r}")

    def postfix(self, seq: list[Node]) -> None:
        while True:
            self.skip(False)
            c = self.peek()
            if c not in ("*", "+", "?", "{") or c == "":
                return
            item = seq.pop()
            if c == "{":
                lo, hi = self.bounds()
            else:
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            seq.append(Repeat(item, lo, hi))

    def bounds(self) -> tuple[int, int | None]:
        start = self.i
        self.i += 1
        self.skip(False)
        lo = self.number(start)
        self.skip(False)
        hi: int | None = lo
        if self.peek() == ",":
            self.i += 1
            self.skip(False)
            hi = None if self.peek() == "}" else self.number(start)
            self.skip(False)
        if self.peek() != "}":
            raise self.error("expected '}' to close the repetition bounds", start)
        self.i += 1
        if hi is not None and hi < lo:
            raise self.error(f"repetition bounds {{{lo},{hi}}}: the maximum is below the minimum")
        if max(lo, hi or 0) > MAX_REPEAT:
            raise self.error(f"repetition bound over {MAX_REPEAT}", start)
        return lo, hi

    def number(self, start: int) -> int:
        j = self.i
        while self.i < len(self.s) and self.s[self.i].isascii() and self.s[self.i].isdigit():
            self.i += 1
        if self.i == j:
            raise self.error("expected a number in the repetition bounds", start)
        digits = self.s[j : self.i]
        if len(digits) > 9:
            raise self.error(f"repetition bound over {MAX_REPEAT}", start)
        return int(digits)

    def char(self, closing: str) -> int:
        """One possibly escaped code point inside a literal or class."""
        if self.i >= len(self.s):
            what = "string" if closing == '"' else "character class"
            raise self.error(f"unterminated {what}")
        c = self.s[self.i]
        if c != "\\":
            if c in "\r\n" and closing == '"':
                raise self.error("unterminated string: line break before the closing '\"'")
            self.i += 1
            return ord(c)
        e = self.peek(1)
        if e in _ESCAPES:
            self.i += 2
            return _ESCAPES[e]
        if e == "-" and closing == "]":
            self.i += 2
            return ord("-")
        if e in _HEX_ESCAPES:
            n = _HEX_ESCAPES[e]
            digits = self.s[self.i + 2 : self.i + 2 + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"\\{e} needs exactly {n} hex digits")
            cp = int(digits, 16)
            if cp > MAX_CODE_POINT or 0xD800 <= cp <= 0xDFFF:
                raise self.error(f"\\{e}{digits} is not a Unicode scalar value")
            self.i += 2 + n
            return cp
        raise self.error(f"unknown escape '\\{e}'" if e else "unterminated escape")

    def literal(self, start: int) -> Node:
        cps: list[int] = []
        while True:
            plain = _PLAIN_RUN.match(self.s, self.i)
            if plain is not None:
                cps.extend(map(ord, plain.group()))
                self.i = plain.end()
            if self.i >= len(self.s):
                raise self.error("unterminated string: missing the closing '\"'", start)
            if self.s[self.i] == '"':
                self.i += 1
                break
            cps.append(self.char('"'))
        return Alternatives([[Chars([(c, c)]) for c in cps]])

    def char_class(self, start: int) -> Chars:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        while True:
            if self.i >= len(self.s):
                raise self.error("unbalanced '[': missing ']'", start)
            if self.s[self.i] == "]":
                self.i += 1
                break
            lo = self.char("]")
            hi = lo
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                hi = self.char("]")
                if hi < lo:
                    raise self.error(f"character range {chr(lo)!r}-{chr(hi)!r} is reversed")
            ranges.append((lo, hi))
        merged = normalize(ranges)
        return Chars(complement(merged) if negated else merged)

    def token_ref(self) -> TokenRef:
        start = self.i
        negated = self.peek() == "!"
        if negated:
            self.i += 1
        self.i += 1  # '<'
        end = self.s.find(">", self.i)
        nl = self.s.find("\n", self.i)
        if end < 0 or (0 <= nl < end):
            raise self.error("unterminated token reference: missing '>'", start)
        inner = self.s[self.i : end]
        self.i = end + 1
        if inner.startswith("[") and inner.endswith("]"):
            digits = inner[1:-1]
            if not digits.isascii() or not digits.isdigit() or len(digits) > 9:
                raise self.error(f"token reference <{inner}> needs a numeric id", start)
            return TokenRef(int(digits), negated, self.pos(start))
        if not inner:
            raise self.error("empty token reference <>", start)
        return TokenRef(inner, negated, self.pos(start))


def normalize(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged, surrogate-free ranges."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return _without_surrogates(out)


def complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return _without_surrogates(out)


def _without_surrogates(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if lo < 0xD800 <= hi or lo <= 0xDFFF < hi or (lo >= 0xD800 and hi <= 0xDFFF):
            if lo < 0xD800:
                out.append((lo, 0xD7FF))
            if hi > 0xDFFF:
                out.append((0xE000, hi))
        else:
            out.append((lo, hi))
    return out


def parse(text: str) -> list[Rule]:
    """The rules of a GBNF grammar, in source order."""
    if not isinstance(text, str):
        raise GrammarError(f"a grammar is text, not {type(text).__name__}")
    return _Parser(text).grammar()
