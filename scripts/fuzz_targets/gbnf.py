"""gbnf: the GBNF parser and compiler on generated grammars (rules,
literals with escapes, character classes, groups, alternatives, every
repetition form with small and huge bounds, token references, deep
nesting like llama.cpp's 60,000 parentheses) and on mutations of their
text; then the Rust matcher over SmolLM2's vocabulary, driven by random
token ids, raw bytes, masks, rollbacks and resets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from oxillama import Grammar

from . import JsonTarget
from .real_model import smollm2

RULES = ["root", "a", "b", "c"]

_literal = st.text(max_size=6).map(lambda s: json.dumps(s, ensure_ascii=False))
_escape = st.sampled_from([r'"\x41"', r'"\u00e9"', r'"\U0001F600"', r'"\n\t\\"', r'"\""'])
_class = st.builds(
    lambda neg, parts: "[" + ("^" if neg else "") + "".join(parts) + "]",
    st.booleans(),
    st.lists(
        st.sampled_from(["a-z", "0-9", "_", "\\]", "\\n", "\\x00-\\x1F", "é", "-"]), max_size=4
    ),
)
_token = st.sampled_from(["<|im_end|>", "<|im_start|>", "<[2]>", "!<[2]>", "<[999999]>", "<nope>"])
_small = st.sampled_from(["0", "1", "2", "3", "5"])
_huge = st.sampled_from(["1000", "10001", "100000", "4294967296"])
_plain = st.sampled_from(["", "", "", "", "*", "+", "?"])
_usual = st.one_of(
    _plain,
    _plain,
    _plain,
    st.builds(lambda m: "{" + m + "}", _small),
    st.builds(lambda m, k: "{" + m + "," + str(int(m) + k) + "}", _small, st.integers(0, 3)),
    st.builds(lambda m: "{" + m + ",}", _small),
)
_rare = st.builds(lambda m, n: "{" + m + "," + n + "}", _small | _huge, _huge)
# A grammar has a couple of dozen suffixes: huge bounds stay rare enough
# that most grammars compile and reach the matcher.
_suffix = st.integers(0, 59).flatmap(lambda i: _rare if i == 0 else _usual)
_atom = st.one_of(_literal, _escape, _class, _token, st.just("."), st.sampled_from(RULES))
_expr = st.recursive(
    st.builds(str.__add__, _atom, _suffix),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=4).map(" ".join),
        st.lists(inner, min_size=2, max_size=3).map(" | ".join),
        st.builds(lambda e, s: "(" + e + ")" + s, inner, _suffix),
    ),
    max_leaves=6,
)
# Every rule is defined (an undefined reference is only one error among
# many), root first; the mutations below break the rest.
_rules = st.fixed_dictionaries({name: _expr for name in RULES}).map(
    lambda rs: "".join(f"{name} ::= {body}\n" for name, body in rs.items())
)
_deep = st.builds(
    lambda n, body: "root ::= " + "(" * n + body + ")" * n + "\n",
    st.sampled_from([10, 500, 5000, 60000]),
    st.sampled_from(['"x"', '"x" | "y"', "[a-z]*"]),
)


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    text = draw(_rules)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            text = text[:i] + draw(st.text(max_size=3)) + text[i:]
        else:
            text = text[:i] + text[i + draw(st.integers(1, 5)) :]
    return text


_op = st.one_of(
    st.tuples(st.just("token"), st.integers(-1, 49200)),
    st.tuples(st.just("bytes"), st.binary(max_size=8).map(bytes.hex)),
    st.tuples(st.just("mask"), st.just(0)),
    st.tuples(st.just("rollback"), st.integers(0, 4)),
    st.tuples(st.just("reset"), st.just(0)),
)
STRATEGY = st.fixed_dictionaries(
    {
        "grammar": st.one_of(_rules, _rules, _mutated(), _deep),
        "ops": st.lists(_op, max_size=12),
    }
)
MASKS_PER_INPUT = 2


class GbnfTarget(JsonTarget):
    name = "gbnf"
    strategy = STRATEGY

    def setup(self, workdir: Path) -> None:
        self.tokenizer = smollm2().tokenizer

    def run(self, value: Any) -> None:
        matcher = Grammar(value["grammar"]).matcher(self.tokenizer)
        masks = 0
        for op, arg in value["ops"]:
            if op == "token":
                matcher.accept_token(arg)
            elif op == "bytes":
                matcher.accept_bytes(bytes.fromhex(arg))
            elif op == "mask" and masks < MASKS_PER_INPUT:
                masks += 1
                matcher.mask()
            elif op == "rollback":
                matcher.rollback(min(arg, matcher.n_accepted))
            elif op == "reset":
                matcher.reset()
            matcher.is_accepting()


TARGETS = {"gbnf": GbnfTarget}
