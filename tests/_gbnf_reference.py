"""An independent GBNF reference: parse a grammar, decide whether it accepts a text.

Deliberately simple so it can be trusted as an oracle (for the JSON Schema
compiler and for differential tests of the Rust matcher): the grammar becomes
a small tree, and ``Matcher.ends(node, pos)`` returns every position where a
match of ``node`` starting at ``pos`` can end, memoized per (node, pos). A text
is accepted when the root can end exactly at its length. Exhaustive and
memoized, so ambiguity and nested repetitions of nullable things cost
polynomial time, never exponential; left recursion is reported as an error.

Dialect (llama.cpp GBNF): ``name ::= body`` with names ``[a-zA-Z0-9-]+``; a body
may span lines (it ends where the next ``name ::=`` begins); alternation ``|``
(empty alternatives allowed), grouping ``( )``, string literals, character
classes ``[...]`` / ``[^...]``, ``.`` (any one code point), the postfix
repetitions ``* + ? {m} {m,} {m,n}`` and ``#`` comments. Escapes in literals
and classes: ``\\xXX \\uXXXX \\UXXXXXXXX \\t \\r \\n \\\\ \\" \\[ \\] \\-``.
Texts are sequences of Unicode code points (Python ``str``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

__all__ = [
    "Alt",
    "AnyChar",
    "CharClass",
    "Grammar",
    "Literal",
    "Node",
    "Ref",
    "Repeat",
    "Seq",
    "accepts",
    "parse",
]


@dataclass(eq=False)
class Literal:
    text: str


@dataclass(eq=False)
class CharClass:
    ranges: list[tuple[int, int]]
    negated: bool

    def matches(self, ch: str) -> bool:
        cp = ord(ch)
        inside = any(lo <= cp <= hi for lo, hi in self.ranges)
        return inside != self.negated


@dataclass(eq=False)
class AnyChar:
    pass


@dataclass(eq=False)
class Ref:
    name: str


@dataclass(eq=False)
class Seq:
    items: list[Node]


@dataclass(eq=False)
class Alt:
    options: list[Seq]


@dataclass(eq=False)
class Repeat:
    node: Node
    lo: int
    hi: int | None  # None: unbounded


Node = Literal | CharClass | AnyChar | Ref | Seq | Alt | Repeat


@dataclass
class Grammar:
    rules: dict[str, Alt] = field(default_factory=dict)


# --------------------------------------------------------------------------- parser

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_SIMPLE_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]"}
_SIMPLE_ESCAPES["-"] = "-"
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.pos = 0

    def error(self, message: str) -> ValueError:
        line = self.src.count("\n", 0, self.pos) + 1
        column = self.pos - (self.src.rfind("\n", 0, self.pos) + 1) + 1
        return ValueError(f"GBNF line {line}, column {column}: {message}")

    def skip_space(self) -> None:
        while self.pos < len(self.src):
            c = self.src[self.pos]
            if c in " \t\r\n":
                self.pos += 1
            elif c == "#":
                end = self.src.find("\n", self.pos)
                self.pos = len(self.src) if end == -1 else end
            else:
                return

    def peek(self) -> str:
        self.skip_space()
        return self.src[self.pos] if self.pos < len(self.src) else ""

    def name(self) -> str:
        start = self.pos
        while self.pos < len(self.src) and self.src[self.pos] in _NAME_CHARS:
            self.pos += 1
        if start == self.pos:
            raise self.error("expected a rule name")
        return self.src[start : self.pos]

    def at_rule_start(self) -> bool:
        """True when the next tokens are ``name ::=`` (a new rule begins)."""
        save = self.pos
        try:
            self.skip_space()
            if self.pos >= len(self.src) or self.src[self.pos] not in _NAME_CHARS:
                return False
            self.name()
            self.skip_space()
            return self.src.startswith("::=", self.pos)
        finally:
            self.pos = save

    def grammar(self) -> Grammar:
        g = Grammar()
        while self.peek():
            rule_name = self.name()
            self.skip_space()
            if not self.src.startswith("::=", self.pos):
                raise self.error("expected '::='")
            self.pos += 3
            if rule_name in g.rules:
                raise self.error(f"rule {rule_name!r} is defined twice")
            g.rules[rule_name] = self.alternation(nested=False)
        for body in g.rules.values():
            self.check_refs(body, g)
        return g

    def check_refs(self, node: Node, g: Grammar) -> None:
        if isinstance(node, Ref):
            if node.name not in g.rules:
                raise ValueError(f"GBNF: undefined rule {node.name!r}")
        elif isinstance(node, Alt):
            for option in node.options:
                self.check_refs(option, g)
        elif isinstance(node, Seq):
            for item in node.items:
                self.check_refs(item, g)
        elif isinstance(node, Repeat):
            self.check_refs(node.node, g)

    def alternation(self, nested: bool) -> Alt:
        options = [self.sequence(nested)]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence(nested))
        return Alt(options)

    def sequence(self, nested: bool) -> Seq:
        items: list[Node] = []
        while True:
            c = self.peek()
            if c in ("", "|", ")"):
                break
            if not nested and self.at_rule_start():
                break
            items.append(self.postfix(self.primary()))
        return Seq(items)

    def primary(self) -> Node:
        c = self.peek()
        if c == '"':
            self.pos += 1
            chars: list[str] = []
            while True:
                if self.pos >= len(self.src):
                    raise self.error("unterminated string literal")
                c = self.src[self.pos]
                if c == '"':
                    self.pos += 1
                    return Literal("".join(chars))
                chars.append(self.char())
        if c == "[":
            return self.char_class()
        if c == ".":
            self.pos += 1
            return AnyChar()
        if c == "(":
            self.pos += 1
            inner = self.alternation(nested=True)
            if self.peek() != ")":
                raise self.error("expected ')'")
            self.pos += 1
            return inner
        if c in _NAME_CHARS:
            return Ref(self.name())
        raise self.error(f"unexpected {c!r}")

    def char(self) -> str:
        """One (possibly escaped) character inside a literal or class."""
        c = self.src[self.pos]
        if c != "\\":
            self.pos += 1
            return c
        esc = self.src[self.pos + 1 : self.pos + 2]
        if esc in _SIMPLE_ESCAPES:
            self.pos += 2
            return _SIMPLE_ESCAPES[esc]
        if esc in _HEX_ESCAPES:
            width = _HEX_ESCAPES[esc]
            digits = self.src[self.pos + 2 : self.pos + 2 + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"\\{esc} needs {width} hex digits")
            value = int(digits, 16)
            if value > 0x10FFFF:
                raise self.error("code point out of range")
            self.pos += 2 + width
            return chr(value)
        raise self.error(f"unknown escape \\{esc}")

    def char_class(self) -> CharClass:
        self.pos += 1  # '['
        negated = self.src.startswith("^", self.pos)
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        while True:
            if self.pos >= len(self.src):
                raise self.error("unterminated character class")
            if self.src[self.pos] == "]":
                self.pos += 1
                return CharClass(ranges, negated)
            lo = ord(self.char())
            hi = lo
            if self.src.startswith("-", self.pos) and self.src[self.pos + 1 : self.pos + 2] not in (
                "]",
                "",
            ):
                self.pos += 1
                hi = ord(self.char())
                if hi < lo:
                    raise self.error("reversed range in character class")
            ranges.append((lo, hi))

    def postfix(self, node: Node) -> Node:
        while True:
            # llama.cpp allows spaces between an operand and its operator.
            c = self.peek()
            if c == "*":
                self.pos += 1
                node = Repeat(node, 0, None)
            elif c == "+":
                self.pos += 1
                node = Repeat(node, 1, None)
            elif c == "?":
                self.pos += 1
                node = Repeat(node, 0, 1)
            elif c == "{":
                self.pos += 1
                lo = self.integer()
                hi: int | None = lo
                if self.peek() == ",":
                    self.pos += 1
                    hi = None if self.peek() == "}" else self.integer()
                if self.peek() != "}":
                    raise self.error("expected '}'")
                self.pos += 1
                if hi is not None and hi < lo:
                    raise self.error("repetition maximum below minimum")
                node = Repeat(node, lo, hi)
            else:
                return node

    def integer(self) -> int:
        self.skip_space()
        start = self.pos
        while (
            self.pos < len(self.src)
            and self.src[self.pos].isascii()
            and self.src[self.pos].isdigit()
        ):
            self.pos += 1
        if start == self.pos:
            raise self.error("expected a number")
        return int(self.src[start : self.pos])


def parse(grammar_text: str) -> Grammar:
    """Parses GBNF text; raises ValueError (with line and column) when malformed."""
    return _Parser(grammar_text).grammar()


# --------------------------------------------------------------------------- matcher


class Matcher:
    """All-parses matcher: ``ends(node, pos)`` is the set of end positions."""

    def __init__(self, grammar: Grammar, text: str) -> None:
        self.grammar = grammar
        self.text = text
        self.memo: dict[tuple[int, int], frozenset[int]] = {}
        self.active: set[tuple[int, int]] = set()

    def ends(self, node: Node, pos: int) -> frozenset[int]:
        key = (id(node), pos)
        found = self.memo.get(key)
        if found is not None:
            return found
        if key in self.active:
            raise ValueError("GBNF: left recursion (a rule reaches itself without consuming input)")
        self.active.add(key)
        try:
            result = self.compute(node, pos)
        finally:
            self.active.discard(key)
        self.memo[key] = result
        return result

    def compute(self, node: Node, pos: int) -> frozenset[int]:
        text = self.text
        if isinstance(node, Literal):
            return frozenset({pos + len(node.text)}) if text.startswith(node.text, pos) else _NONE
        if isinstance(node, CharClass):
            return frozenset({pos + 1}) if pos < len(text) and node.matches(text[pos]) else _NONE
        if isinstance(node, AnyChar):
            return frozenset({pos + 1}) if pos < len(text) else _NONE
        if isinstance(node, Ref):
            return self.ends(self.grammar.rules[node.name], pos)
        if isinstance(node, Alt):
            out: set[int] = set()
            for option in node.options:
                out |= self.ends(option, pos)
            return frozenset(out)
        if isinstance(node, Seq):
            current: set[int] = {pos}
            for item in node.items:
                following: set[int] = set()
                for p in current:
                    following |= self.ends(item, p)
                current = following
                if not current:
                    break
            return frozenset(current)
        # Repeat: breadth-first over the number of repetitions done so far.
        level: set[int] = {pos}
        result: set[int] = set(level) if node.lo == 0 else set()
        # Positions already reached with at least ``lo`` repetitions done.
        seen_unbounded: set[int] = set(level) if node.lo == 0 else set()
        count = 0
        while level and (node.hi is None or count < node.hi):
            nxt: set[int] = set()
            for p in level:
                nxt |= self.ends(node.node, p)
            count += 1
            if node.hi is None and count >= node.lo:
                # Past the minimum, only new positions can lead anywhere new.
                nxt -= seen_unbounded
                seen_unbounded |= nxt
            if count >= node.lo:
                result |= nxt
            level = nxt
        return frozenset(result)


_NONE: frozenset[int] = frozenset()


def accepts(grammar_text: str, text: str, root: str = "root") -> bool:
    """Whether ``text`` (all of it) is in the language of rule ``root``."""
    grammar = parse(grammar_text)
    if root not in grammar.rules:
        raise ValueError(f"GBNF: no rule named {root!r}")
    # Right-recursive rules recurse once per repetition; give deep texts room.
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 20_000 + 50 * len(text)))
    try:
        return len(text) in Matcher(grammar, text).ends(grammar.rules[root], 0)
    finally:
        sys.setrecursionlimit(old_limit)
