"""Lowers a GBNF syntax tree to the flat program the Rust matcher runs.

The program knows only three element kinds: a code point set, a rule
reference and a whole-token reference. Groups become rules, literals become
sequences of one-code-point sets, and repetitions become tail-recursive
rules (``x*``), copies (``x{3}``) or chains of optionals (``x{0,3}`` is
``(x (x (x)?)?)?``), so no construct expands exponentially.

Program layout (a flat list of u32, validated again by the matcher)::

    n_rules root_rule { n_alts { n_elems { elem } } }
    elem := 0 n_ranges { lo hi }      code point in one of the ranges
          | 1 rule                    rule reference
          | 2 negated token           a whole token (negated: any other)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from oxillama.decoding.grammar import gbnf
from oxillama.decoding.grammar.components import strongly_connected
from oxillama.decoding.grammar.gbnf import Alternatives, Chars, Ref, Repeat, TokenRef
from oxillama.decoding.grammar.productive import causes, unproductive
from oxillama.errors import GrammarError

#: Elements a compiled grammar may hold; bounded so that nested repetition
#: bounds cannot multiply into gigabytes.
MAX_ELEMENTS = 1_000_000
#: Elements of a repetition's copies above which its body becomes a rule.
SHARE_OVER = 4096
#: Deepest group nesting the lowering accepts (it recurses once per level).
MAX_DEPTH = 100

Elem = tuple[str, object]


@dataclass
class _Rule:
    alts: list[list[Elem]]
    origin: str  # the named rule it came from, for messages


@dataclass(frozen=True)
class Compiled:
    """A checked grammar: its rules (id 0 is the root) and the token texts
    that ``<token>`` references still need resolved against a vocabulary."""

    rules: tuple[tuple[tuple[Elem, ...], ...], ...]
    names: tuple[str, ...]
    token_texts: frozenset[str]

    def program(self, token_id: Callable[[str], int]) -> list[int]:
        out = [len(self.rules), 0]
        for alts in self.rules:
            out.append(len(alts))
            for seq in alts:
                out.append(len(seq))
                for kind, arg in seq:
                    if kind == "c":
                        ranges = arg
                        assert isinstance(ranges, list)
                        out += [0, len(ranges)]
                        for lo, hi in ranges:
                            out += [lo, hi]
                    elif kind == "r":
                        assert isinstance(arg, int)
                        out += [1, arg]
                    else:
                        assert isinstance(arg, tuple)
                        negated, tok = arg
                        out += [2, int(negated), tok if isinstance(tok, int) else token_id(tok)]
        return out


class _Lowering:
    def __init__(self, rules: list[gbnf.Rule], root: str) -> None:
        self.defs: dict[str, gbnf.Rule] = {}
        for r in rules:
            if r.name in self.defs:
                first = self.defs[r.name].pos
                raise GrammarError(
                    f"rule {r.name!r} is defined twice (first at line {first.line})",
                    line=r.pos.line,
                    column=r.pos.column,
                )
            self.defs[r.name] = r
        if root not in self.defs:
            raise GrammarError(
                f"missing root rule {root!r}"
                + (f" (rules defined: {', '.join(sorted(self.defs))})" if self.defs else "")
            )
        self.ids: dict[str, int] = {root: 0}
        self.out: list[_Rule | None] = [None]
        self.names: list[str] = [root]
        self.elements = 0
        self.token_texts: set[str] = set()
        self.repeats: dict[Hashable, list[Elem]] = {}
        self.shapes: dict[int, tuple[gbnf.Node, Hashable]] = {}
        self.current = root
        # Every rule is lowered, used or not, so its mistakes are reported.
        for r in rules:
            self.rule_id(Ref(r.name, r.pos))

    def rule_id(self, ref: Ref) -> int:
        if ref.name not in self.defs:
            raise GrammarError(
                f"undefined rule {ref.name!r}", line=ref.pos.line, column=ref.pos.column
            )
        if ref.name not in self.ids:
            self.ids[ref.name] = len(self.out)
            self.out.append(None)
            self.names.append(ref.name)
        return self.ids[ref.name]

    def fresh(self, alts: list[list[Elem]], suffix: str) -> int:
        self.out.append(_Rule(alts, self.current))
        self.names.append(f"{self.current}-{suffix}{len(self.out)}")
        return len(self.out) - 1

    def count(self, n: int) -> None:
        self.elements += n
        if self.elements > MAX_ELEMENTS:
            raise GrammarError(
                f"grammar expands to more than {MAX_ELEMENTS:,} elements "
                f"(rule {self.current!r}: nested repetition bounds multiply)"
            )

    def run(self) -> Compiled:
        done = 0
        while done < len(self.out):
            if self.out[done] is None:
                name = self.names[done]
                self.current = name
                self.out[done] = _Rule(self.alts(self.defs[name].body, 0), name)
            done += 1
        rules = [r for r in self.out if r is not None]
        assert len(rules) == len(self.out)
        _check_left_recursion(rules, self.names, self.defs)
        return Compiled(
            tuple(tuple(tuple(seq) for seq in r.alts) for r in rules),
            tuple(self.names),
            frozenset(self.token_texts),
        )

    def alts(self, node: Alternatives, depth: int) -> list[list[Elem]]:
        return [self.seq(seq, depth) for seq in node.alts]

    def seq(self, seq: list[gbnf.Node], depth: int) -> list[Elem]:
        out: list[Elem] = []
        for node in seq:
            out += self.node(node, depth)
        return out

    def node(self, node: gbnf.Node, depth: int) -> list[Elem]:
        if depth > MAX_DEPTH:
            raise GrammarError(f"rule {self.current!r} nests groups deeper than {MAX_DEPTH}")
        if isinstance(node, Chars):
            self.count(1)
            return [("c", node.ranges)]
        if isinstance(node, Ref):
            self.count(1)
            return [("r", self.rule_id(node))]
        if isinstance(node, TokenRef):
            self.count(1)
            if isinstance(node.token, str):
                self.token_texts.add(node.token)
            return [("t", (node.negated, node.token))]
        if isinstance(node, Alternatives):
            if len(node.alts) == 1:
                return self.seq(node.alts[0], depth + 1)
            self.count(1)
            return [("r", self.fresh(self.alts(node, depth + 1), "alt"))]
        assert isinstance(node, Repeat)
        key = self.shape(node)
        seen = self.repeats.get(key)
        if seen is not None:
            # The same repetition again (JSON Schema's big bounds repeat
            # their chunk towers in every branch): its rules exist, and a
            # second use shares its elements as one rule.
            if len(seen) > 1:
                seen = self.repeats[key] = [("r", self.fresh([seen], "rep"))]
            self.count(len(seen))
            return list(seen)
        out = self.repeat(node, depth)
        self.repeats[key] = out
        return list(out)

    def shape(self, node: gbnf.Node) -> Hashable:
        """A key equal for structurally equal nodes (positions aside)."""
        hit = self.shapes.get(id(node))
        if hit is not None:
            return hit[1]
        key: Hashable
        if isinstance(node, Chars):
            key = ("c", tuple(node.ranges))
        elif isinstance(node, Ref):
            key = ("r", node.name)
        elif isinstance(node, TokenRef):
            key = ("t", node.negated, node.token)
        elif isinstance(node, Repeat):
            key = ("*", self.shape(node.item), node.min, node.max)
        else:
            assert isinstance(node, Alternatives)
            key = ("|", tuple(tuple(self.shape(x) for x in seq) for seq in node.alts))
        # The node is kept beside its key so that its id is not reused.
        self.shapes[id(node)] = (node, key)
        return key

    def repeat(self, node: Repeat, depth: int) -> list[Elem]:
        body = self.node(node.item, depth + 1)
        copies = node.min + (1 if node.max is None else node.max - node.min)
        if len(body) > 1 and len(body) * copies > SHARE_OVER:
            # Copied many times, a long body is shared as one rule: nested
            # counts (`(x{1000}){1000}`, what JSON Schema's big bounds
            # become) then cost their sum, not their product.
            body = [("r", self.fresh([body], "rep"))]
        self.count(len(body) * max(node.min, 1))
        out = body * node.min
        if node.max is None:
            star = self.fresh([], "star")
            rule = self.out[star]
            assert rule is not None
            rule.alts = [[*body, ("r", star)], []]
            out.append(("r", star))
        elif node.max > node.min:
            self.count(len(body) * (node.max - node.min))
            # Innermost optional first, so each one refers to the next.
            inner = self.fresh([body, []], "opt")
            for _ in range(node.max - node.min - 1):
                inner = self.fresh([[*body, ("r", inner)], []], "opt")
            out.append(("r", inner))
        return out


def _nullable(rules: list[_Rule]) -> list[bool]:
    """Which rules can match the empty string: a worklist over alternatives
    made only of rule references, each waiting on its references (linear,
    where a fixpoint sweep was quadratic on long chains like `x{0,40}`)."""
    null = [False] * len(rules)
    # Per candidate alternative: its rule, and how many references are not
    # yet known to be nullable; per rule, the candidates that reference it.
    owner: list[int] = []
    waiting: list[int] = []
    users: list[list[int]] = [[] for _ in rules]
    ready: list[int] = []
    for i, r in enumerate(rules):
        for seq in r.alts:
            if seq and seq[0][0] != "r":
                continue  # most alternatives start with a terminal
            if not all(k == "r" and isinstance(a, int) for k, a in seq):
                continue
            c = len(owner)
            owner.append(i)
            waiting.append(len(seq))
            for _, a in seq:
                assert isinstance(a, int)
                users[a].append(c)
            if not seq:
                ready.append(c)
    while ready:
        i = owner[ready.pop()]
        if null[i]:
            continue
        null[i] = True
        for c in users[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.append(c)
    return null


def _check_left_recursion(rules: list[_Rule], names: list[str], defs: dict[str, gbnf.Rule]) -> None:
    """Rejects a rule that can reach itself without consuming input through
    a reference that is not in tail position: each round would push another
    return address. (Tail references do not push, so cycles through them
    only, as in ``("a"*)*``, are fine: the matcher's closure sees them.)"""
    null = _nullable(rules)
    # edges[u]: (v, pushes) for each v that u can start with.
    edges: list[list[tuple[int, bool]]] = []
    for r in rules:
        e: list[tuple[int, bool]] = []
        for seq in r.alts:
            for i, (kind, arg) in enumerate(seq):
                if kind != "r":
                    break
                assert isinstance(arg, int)
                e.append((arg, i + 1 < len(seq)))
                if not null[arg]:
                    break
        edges.append(e)
    comp = strongly_connected([[v for v, _ in e] for e in edges])
    for u, e in enumerate(edges):
        for v, pushes in e:
            if pushes and comp[u] == comp[v]:
                origin = rules[v].origin
                pos = defs[origin].pos
                raise GrammarError(
                    f"rule {origin!r} is left-recursive: it can reach itself without "
                    'consuming input (rewrite it with repetition, e.g. `x ::= y ("+" y)*`)',
                    line=pos.line,
                    column=pos.column,
                )


def compile_gbnf(text: str, root: str = "root") -> Compiled:
    """Parses and checks a GBNF grammar."""
    return compile_rules(gbnf.parse(text), root)


def compile_rules(rules: list[gbnf.Rule], root: str = "root") -> Compiled:
    """Checks and lowers already parsed rules."""
    compiled = _Lowering(rules, root).run()
    check_productive(rules)
    return compiled


def check_productive(rules: list[gbnf.Rule]) -> None:
    """Rejects a rule that can derive no finite string. llama.cpp accepts
    one, and a generation that enters it can never end; no grammar that can
    finish needs such a rule (a rule that is never used is checked too, as
    every other mistake is)."""
    stuck = unproductive(rules)
    if stuck:
        first_causes = causes(rules, stuck)
        stuck = first_causes + [n for n in stuck if n not in first_causes]
        first = next(r for r in rules if r.name == stuck[0])
        others = f" (also: {', '.join(stuck[1:6])}{'...' if len(stuck) > 6 else ''})"
        raise GrammarError(
            f"rule {first.name!r} can never finish: every alternative needs a rule "
            "that never finishes" + (others if len(stuck) > 1 else ""),
            line=first.pos.line,
            column=first.pos.column,
        )
