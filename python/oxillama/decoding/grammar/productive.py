"""Which rules of a grammar can derive a finite string.

A rule all of whose alternatives need a rule that never finishes (``a ::=
"x" a``, or a required JSON property that refers back to its object) is
unproductive: a matcher that enters it can only generate forever. The
classic fixpoint, computed as a worklist over the syntax tree read as an
and-or graph (a sequence needs all its parts, a choice one of its
alternatives), so it is linear in the grammar's size.
"""

from __future__ import annotations

from oxillama.decoding.grammar.components import strongly_connected
from oxillama.decoding.grammar.gbnf import Alternatives, Chars, Ref, Repeat, Rule, TokenRef

__all__ = ["causes", "unproductive"]


def unproductive(rules: list[Rule]) -> list[str]:
    """Names of the rules that derive no finite string, in definition order
    (references to undefined rules count as unproductive)."""
    index = {r.name: i for i, r in enumerate(rules)}
    # Nodes 0..len(rules)-1 are the rules (a choice among their bodies);
    # need[n] counts the parts a node still waits for.
    need: list[int] = [1] * len(rules)
    parents: list[list[int]] = [[] for _ in rules]
    done: list[int] = []  # nodes whose need has reached zero

    def node(count: int, parent: int) -> int:
        need.append(count)
        parents.append([parent])
        if count == 0:
            done.append(len(need) - 1)
        return len(need) - 1

    def finished(parent: int) -> None:
        need[parent] -= 1
        if need[parent] == 0:
            done.append(parent)

    stack: list[tuple[object, int]] = [(r.body, i) for i, r in enumerate(rules)]
    while stack:
        item, parent = stack.pop()
        if isinstance(item, (Chars, TokenRef)):
            finished(parent)
        elif isinstance(item, Ref):
            target = index.get(item.name)
            if target is not None:
                parents[target].append(parent)
        elif isinstance(item, Repeat):
            if item.min == 0:
                finished(parent)
            else:
                stack.append((item.item, parent))
        else:
            assert isinstance(item, Alternatives)
            choice = node(1, parent)
            for seq in item.alts:
                part = node(len(seq), choice)
                stack.extend((x, part) for x in seq)
    productive = [False] * len(need)
    while done:
        n = done.pop()
        if productive[n]:
            continue
        productive[n] = True
        for p in parents[n]:
            if not productive[p]:
                finished(p)
    return [r.name for i, r in enumerate(rules) if not productive[i]]


def _refs(rule: Rule) -> set[str]:
    out: set[str] = set()
    stack: list[object] = [rule.body]
    while stack:
        item = stack.pop()
        if isinstance(item, Ref):
            out.add(item.name)
        elif isinstance(item, Repeat):
            stack.append(item.item)
        elif isinstance(item, Alternatives):
            for seq in item.alts:
                stack.extend(seq)
    return out


def causes(rules: list[Rule], stuck: list[str]) -> list[str]:
    """The unproductive rules that are so in their own right, in definition
    order: those on a cycle of unproductive rules (the others only refer to
    one). Falls back to ``stuck`` when none is (references to undefined
    rules)."""

    where = {name: i for i, name in enumerate(stuck)}
    by_name = {r.name: r for r in rules}
    adj = [[where[n] for n in _refs(by_name[name]) if n in where] for name in stuck]
    comp = strongly_connected(adj)
    size: dict[int, int] = {}
    for c in comp:
        size[c] = size.get(c, 0) + 1
    out = [name for i, name in enumerate(stuck) if size[comp[i]] > 1 or i in adj[i]]
    return out or stuck
