"""Building GBNF text: expressions with precedence, and a set of named rules.

Expressions are immutable strings tagged with their precedence, so
combinators add parentheses only where the GBNF syntax needs them, and with
the rule names they mention, so that :meth:`RuleSet.render` can drop rules
nothing reaches (left over from a branch that turned out unsatisfiable).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from oxillama.decoding.grammar import gbnf as _g
from oxillama.decoding.grammar.charset import (
    MAX_CP,
    SURROGATES,
    Ranges,
    complement,
    normalize,
    union,
)

__all__ = [
    "EMPTY",
    "REPEAT_CHUNK",
    "Expr",
    "RuleSet",
    "alt",
    "char_class",
    "literal",
    "opt",
    "ref",
    "rep",
    "sanitize",
    "seq",
]

_ALT, _SEQ, _ATOM = 0, 1, 2

#: Repetition bounds above this are split into nested repetitions, because
#: GBNF readers limit (and expand) repetition counts.
REPEAT_CHUNK = 1000
#: The radix of the chunk counts above the first level (see ``_big_rep``).
CHUNK_RADIX = 16


@dataclass(frozen=True)
class Expr:
    text: str
    prec: int
    refs: frozenset[str] = frozenset()
    #: The matched string when the expression is a plain literal, so that
    #: adjacent literals can be merged into one.
    literal: str | None = None
    #: The parts of a sequence, so nested sequences flatten.
    items: tuple[Expr, ...] = ()
    #: The syntax tree ``gbnf.parse`` would read from ``text``, built
    #: alongside it so a compiled schema need not be parsed back: for an
    #: atom its node, for an alternation its options (sequences use
    #: ``items``). See :func:`rule_body`.
    ast: object = None


EMPTY = Expr('""', _ATOM, literal="", ast=_g.Alternatives([[]]))
_NO_POS = _g.Pos(0, 0)
_ANY_CHAR = [(0, 0xD7FF), (0xE000, MAX_CP)]

_NAME_OK = re.compile(r"[A-Za-z0-9-]+")


def _escape_char(cp: int, in_class: bool) -> str:
    c = chr(cp)
    if c == "\\":
        return "\\\\"
    if c == '"' and not in_class:
        return '\\"'
    if in_class and c in "[]-^":
        return f"\\x{cp:02X}"
    if 0x20 <= cp < 0x7F:
        return c
    if c == "\n":
        return "\\n"
    if c == "\t":
        return "\\t"
    if c == "\r":
        return "\\r"
    # Everything else as a numeric escape: the grammar stays plain ASCII.
    if cp <= 0xFF:
        return f"\\x{cp:02X}"
    if cp <= 0xFFFF:
        return f"\\u{cp:04X}"
    return f"\\U{cp:08X}"


@lru_cache(maxsize=4096)
def literal(s: str) -> Expr:
    """The exact string ``s`` (memoized: schemas repeat their punctuation and
    property names, and sequences rebuild merged literals)."""
    if not s:
        return EMPTY
    return Expr(
        '"' + "".join(_escape_char(ord(c), False) for c in s) + '"',
        _ATOM,
        literal=s,
        ast=_g.Alternatives([[_g.Chars([(ord(c), ord(c))]) for c in s]]),
    )


@lru_cache(maxsize=2048)
def _char_class(ranges: Ranges) -> Expr:
    """One code point from ``ranges`` (non-empty), written positively or
    negated, whichever needs fewer ranges.

    Surrogate code points are treated as "don't care" when choosing, since
    text produced by a model is UTF-8 and cannot contain them: a class may
    or may not include them.
    """
    if not ranges:
        raise ValueError("empty character class")
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return literal(chr(ranges[0][0]))
    filled = union(ranges, SURROGATES)
    if filled == ((0, MAX_CP),):
        return Expr(".", _ATOM, ast=_g.Chars(list(_ANY_CHAR)))
    positive = min((ranges, filled), key=len)
    negated = min((complement(filled), complement(ranges)), key=len)
    # Whichever way it is written, the parser reads the same code points
    # less the surrogates, as sorted merged ranges.
    node = _g.Chars(_g.normalize(list(ranges)))
    if len(negated) <= len(positive):
        return Expr("[^" + _class_body(negated) + "]", _ATOM, ast=node)
    return Expr("[" + _class_body(positive) + "]", _ATOM, ast=node)


def char_class(ranges: Iterable[tuple[int, int]]) -> Expr:
    """One code point from ``ranges`` (non-empty), written positively or
    negated, whichever needs fewer ranges (memoized: schemas reuse a few
    classes many times)."""
    return _char_class(normalize(ranges))


def _class_body(ranges: Ranges) -> str:
    parts = []
    for lo, hi in ranges:
        if lo == hi:
            parts.append(_escape_char(lo, True))
        elif hi == lo + 1:
            parts.append(_escape_char(lo, True) + _escape_char(hi, True))
        else:
            parts.append(_escape_char(lo, True) + "-" + _escape_char(hi, True))
    return "".join(parts)


def ref(name: str) -> Expr:
    return Expr(name, _ATOM, frozenset({name}), ast=_g.Ref(name, _NO_POS))


def _wrap(e: Expr, prec: int) -> str:
    return e.text if e.prec >= prec else "(" + e.text + ")"


def seq(*parts: Expr) -> Expr:
    """The concatenation of ``parts``."""
    items: list[Expr] = []
    run: list[str] = []  # adjacent literals, merged into one at the end of the run
    refs: set[str] = set()
    for part in parts:
        for p in part.items or (part,):
            lit = p.literal
            if lit is not None:
                if lit:
                    run.append(lit)
                continue
            if run:
                items.append(literal("".join(run)) if len(run) > 1 else literal(run[0]))
                run.clear()
            items.append(p)
            refs.update(p.refs)
    if run:
        items.append(literal("".join(run)))
    if not items:
        return EMPTY
    if len(items) == 1:
        return items[0]
    return Expr(
        " ".join([p.text if p.prec >= _SEQ else "(" + p.text + ")" for p in items]),
        _SEQ,
        frozenset(refs),
        items=tuple(items),
    )


def alt(*parts: Expr) -> Expr:
    """Any one of ``parts`` (duplicates dropped; an empty part makes the
    whole optional). Needs at least one part."""
    unique: dict[str, Expr] = {}
    nullable = False
    for p in parts:
        if p.literal == "":
            nullable = True
        else:
            unique.setdefault(p.text, p)
    options = list(unique.values())
    if not options:
        return EMPTY
    if len(options) == 1:
        body = options[0]
    else:
        body = Expr(
            " | ".join(_wrap(p, _SEQ) for p in options),
            _ALT,
            frozenset().union(*(p.refs for p in options)),
            ast=tuple(options),
        )
    return opt(body) if nullable else body


def rep(e: Expr, lo: int, hi: int | None) -> Expr:
    """``e`` repeated ``lo`` to ``hi`` times (``hi`` None: unbounded)."""
    return _rep(e, lo, hi, REPEAT_CHUNK, {})


_Towers = dict[tuple[str, int, int | None, int], "Expr"]


def _rep(e: Expr, lo: int, hi: int | None, limit: int, towers: _Towers) -> Expr:
    """``rep`` with the radix ``limit``. ``towers`` holds the repetitions
    made so far for one big bound: each branch of the split reuses the same
    objects, which the lowering then builds once (see ``compile``)."""
    key = (e.text, lo, hi, limit)
    hit = towers.get(key)
    if hit is None:
        hit = towers[key] = _rep_new(e, lo, hi, limit, towers)
    return hit


def _rep_new(e: Expr, lo: int, hi: int | None, limit: int, towers: _Towers) -> Expr:
    if hi is not None and hi < lo:
        raise ValueError(f"repetition {lo}..{hi}")
    if e.literal == "" or hi == 0:
        return EMPTY
    if lo == hi == 1:
        return e
    if lo > limit or (hi is not None and hi > limit):
        return _big_rep(e, lo, hi, limit, towers)
    atom = _wrap(e, _ATOM)
    if (lo, hi) == (0, None):
        suffix = "*"
    elif (lo, hi) == (1, None):
        suffix = "+"
    elif (lo, hi) == (0, 1):
        suffix = "?"
    elif hi is None:
        suffix = f"{{{lo},}}"
    elif lo == hi:
        suffix = f"{{{lo}}}"
    else:
        suffix = f"{{{lo},{hi}}}"
    return Expr(atom + suffix, _ATOM, e.refs, ast=_g.Repeat(_atom_node(e), lo, hi))


def _big_rep(e: Expr, lo: int, hi: int | None, k: int, towers: _Towers) -> Expr:
    """``e{lo,hi}`` with bounds above ``k``, as nested repetitions of
    chunks: ``e{lo}`` is ``(e{k}){lo//k} e{lo%k}`` and ``e{0,n}`` is
    ``(e{k}){0,q-1} e{0,k-1} | (e{k}){q} e{0,r}`` with n = qk + r.

    The chunks' own counts use the smaller radix :data:`CHUNK_RADIX`: a
    bound ``e{0,m}`` lowers to about ``m`` rules, so radix 1000 all the way
    up made ``maxItems: 2**63`` a 9,000-rule grammar (a second to compile);
    radix 16 above the first level keeps it to a few hundred."""
    chunk = _rep(e, k, k, k, towers)
    up = CHUNK_RADIX
    fixed = seq(_rep(chunk, lo // k, lo // k, up, towers), _rep(e, lo % k, lo % k, k, towers))
    if hi is None:
        return seq(fixed, _rep(e, 0, None, k, towers))
    span = hi - lo
    q, r = divmod(span, k)
    if q == 0:
        return seq(fixed, _rep(e, 0, span, k, towers))
    tail = alt(
        seq(_rep(chunk, 0, q - 1, up, towers), _rep(e, 0, k - 1, k, towers)),
        seq(_rep(chunk, q, q, up, towers), _rep(e, 0, r, k, towers)),
    )
    return seq(fixed, tail)


def opt(e: Expr) -> Expr:
    return rep(e, 0, 1)


def sanitize(hint: str) -> str:
    """A valid rule name derived from ``hint``."""
    name = "-".join(_NAME_OK.findall(hint))[:48].strip("-") or "r"
    return "r" + name if name[0].isdigit() or name[0] == "-" else name


class RuleSet:
    """Named rules. Names are unique and deterministic (first come, first
    served, then ``-2``, ``-3``...); :meth:`add` shares one rule among
    identical bodies."""

    def __init__(self) -> None:
        self._bodies: dict[str, Expr | None] = {}
        self._by_body: dict[str, str] = {}

    def reserve(self, hint: str) -> str:
        """A fresh name, to be given its body later with :meth:`define`
        (how recursive rules refer to themselves)."""
        base = sanitize(hint)
        name, n = base, 1
        while name in self._bodies:
            n += 1
            name = f"{base}-{n}"
        self._bodies[name] = None
        return name

    def define(self, name: str, body: Expr) -> None:
        if self._bodies.get(name, EMPTY) is not None:
            raise ValueError(f"rule {name!r} was not reserved or is already defined")
        self._bodies[name] = body
        self._by_body.setdefault(body.text, name)

    def add(self, hint: str, body: Expr) -> Expr:
        """A reference to a rule with ``body``, reusing an identical one."""
        if body.prec == _ATOM and body.refs and body.text in body.refs:
            return body  # already a bare reference
        existing = self._by_body.get(body.text)
        if existing is not None:
            return ref(existing)
        name = self.reserve(hint)
        self.define(name, body)
        return ref(name)

    def render(self, root: str) -> str:
        """The grammar text: ``root`` first, then every rule it reaches, in
        the order they were created."""
        return "".join(_line(n, self._bodies[n]) for n in self._order(root))

    def parsed(self, root: str) -> list[_g.Rule]:
        """The rules as ``gbnf.parse(self.render(root))`` returns them (up to
        source positions), without writing and parsing the text."""
        out = []
        for n in self._order(root):
            body = self._bodies[n]
            assert body is not None
            out.append(_g.Rule(n, rule_body(body), _NO_POS))
        return out

    def _order(self, root: str) -> Sequence[str]:
        reached = {root}
        todo = [root]
        while todo:
            body = self._bodies[todo.pop()]
            if body is None:
                raise ValueError("a reachable rule was never defined")
            for name in body.refs:
                if name not in reached:
                    reached.add(name)
                    todo.append(name)
        return [root] + [n for n in self._bodies if n in reached and n != root]


def _atom_node(e: Expr) -> _g.Node:
    """``e`` as the operand of a postfix operator (parenthesized unless an atom)."""
    if e.prec == _ATOM:
        assert isinstance(e.ast, (_g.Chars, _g.Ref, _g.Repeat, _g.Alternatives))
        return e.ast
    return _g.Alternatives(_alts(e))


def _elements(e: Expr) -> list[_g.Node]:
    """The nodes ``e`` contributes to an enclosing sequence."""
    if e.prec == _ATOM:
        return [_atom_node(e)]
    if e.prec == _SEQ:
        return [n for item in e.items for n in _elements(item)]
    return [_g.Alternatives(_alts(e))]


def _alts(e: Expr) -> list[list[_g.Node]]:
    """``e`` as a rule body or group: its top-level alternatives."""
    if e.prec == _ALT:
        assert isinstance(e.ast, tuple)
        return [_elements(o) for o in e.ast]
    return [_elements(e)]


def rule_body(e: Expr) -> _g.Alternatives:
    """What ``gbnf.parse`` returns as the body of ``name ::= {e.text}``."""
    return _g.Alternatives(_alts(e))


def _line(name: str, body: Expr | None) -> str:
    assert body is not None
    return f"{name} ::= {body.text}\n"
