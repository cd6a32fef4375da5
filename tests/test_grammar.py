"""GBNF: every feature of llama.cpp's dialect accepted and rejected on text,
typed errors with line and column, pathological grammars that must stay
bounded, and a differential test of the Rust matcher against an independent
backtracking acceptor (tests/_gbnf_reference.py)."""

from __future__ import annotations

import time
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oxillama import _native
from oxillama.decoding.grammar import Grammar
from oxillama.decoding.grammar.compile import compile_gbnf
from oxillama.errors import GrammarError
from tests._gbnf_reference import accepts as reference_accepts

# A byte vocabulary: token i is byte i, so text is matched byte by byte
# exactly as a model's tokens would spell it.
BYTES = _native.VocabTrie([bytes([i]) for i in range(256)] + [b""], [False] * 256 + [True], [256])


@lru_cache(maxsize=256)
def program(source: str, root: str = "root") -> _native.GrammarProgram:
    return _native.GrammarProgram(compile_gbnf(source, root).program(lambda t: 0))


def matches(source: str, text: str, root: str = "root") -> bool:
    """Whether the whole of ``text`` is a sentence of the grammar."""
    m = _native.GrammarMatcher(program(source, root), BYTES)
    return m.accept_bytes(text.encode()) and m.is_accepting()


def prefix_ok(source: str, text: str) -> bool:
    m = _native.GrammarMatcher(program(source), BYTES)
    return m.accept_bytes(text.encode())


FEATURES: list[tuple[str, list[str], list[str]]] = [
    # (grammar, accepted, rejected)
    ('root ::= "ab" | "c"', ["ab", "c"], ["", "a", "abc", "b"]),
    ('root ::= "a" | ', ["a", ""], ["aa", "b"]),  # empty alternative
    ('root ::= ("a" | "b") "c"', ["ac", "bc"], ["c", "abc"]),
    (r'root ::= "\x41\u00e9\U0001F600\t\r\n\\\"\[\]"', ['Aé😀\t\r\n\\"[]'], ["Ae😀"]),
    ("root ::= [a-c0-9_]", ["a", "c", "5", "_"], ["d", "A", "", "ab"]),
    ("root ::= [^a-z\\n]", ["A", "é", "😀", " "], ["a", "\n", ""]),
    (r"root ::= [\-\]x]", ["-", "]", "x"], ["\\", "y"]),
    ("root ::= .", ["a", "é", "中", "😀", "\n"], ["", "ab"]),
    ('root ::= "a"*', ["", "a", "aaaa"], ["b", "ab"]),
    ('root ::= "a"+', ["a", "aaa"], ["", "b"]),
    ('root ::= "a"? "b"', ["b", "ab"], ["aab", "a"]),
    ('root ::= "a"{3}', ["aaa"], ["aa", "aaaa"]),
    ('root ::= "a"{2,}', ["aa", "aaaaa"], ["a", ""]),
    ('root ::= "a"{1,3}', ["a", "aa", "aaa"], ["", "aaaa"]),
    ('root ::= "a"{0,2} "b"', ["b", "ab", "aab"], ["aaab"]),
    ('root ::= ( "x" "y"? ){2}', ["xx", "xyx", "xyxy"], ["x", "xyy", "xxx"]),
    (
        'root ::= item ("," item)*  # a comment\nitem ::= [0-9]+ # another\n',
        ["1", "1,22,333"],
        ["", "1,", ",1", "1,,2"],
    ),
    (
        'root ::=\n  "a"\n  | "b"\n  | (\n    "c"\n    "d"\n  )',
        ["a", "b", "cd"],
        ["c", "ab"],
    ),  # rules spanning lines
    ('start ::= "s"\nroot ::= "r"', ["r"], ["s"]),
    ("root ::= [一-龥]+", ["中文", "字"], ["abc", ""]),  # non-Latin scripts
    ('root ::= "Привет" | "مرحبا" | "こんにちは"', ["Привет", "مرحبا", "こんにちは"], ["Привет!"]),
]


@pytest.mark.parametrize(("source", "good", "bad"), FEATURES)
def test_features_accept_and_reject(source: str, good: list[str], bad: list[str]) -> None:
    for text in good:
        assert matches(source, text), (source, text)
        assert reference_accepts(source, text), (source, text)
    for text in bad:
        assert not matches(source, text), (source, text)
        assert not reference_accepts(source, text), (source, text)


def test_configurable_root() -> None:
    src = 'greeting ::= "hi" | "yo"\nroot ::= "x"'
    assert matches(src, "hi", root="greeting") and not matches(src, "x", root="greeting")
    assert Grammar(src, root="greeting").root == "greeting"
    with pytest.raises(GrammarError, match="missing root rule 'nope'"):
        Grammar(src, root="nope")


def test_prefixes_are_accepted_and_dead_ends_cut_at_once() -> None:
    src = 'root ::= "hello" " world"?'
    assert prefix_ok(src, "hel") and not matches(src, "hel")
    assert not prefix_ok(src, "help")
    # A multi-byte character is followed byte by byte.
    m = _native.GrammarMatcher(program('root ::= "é!"'), BYTES)
    assert m.accept_token(0xC3) and not m.is_accepting()
    assert not m.accept_token(0xC3)  # 0xC3 0xC3 is not UTF-8
    assert m.accept_token(0xA9) and m.accept_token(ord("!")) and m.is_terminated()


ERRORS = [
    ("root ::= foo", "undefined rule 'foo'", (1, 10)),
    ('x ::= "a"', "missing root rule 'root'", None),
    ('root ::= root "a" | "a"', "left-recursive", (1, 1)),
    ('root ::= a "z"\na ::= "x"? root', "left-recursive", None),
    ('root ::= ("a" | "b"', "unbalanced '\\('", (1, 10)),
    ('root ::= "a")', "unbalanced '\\)'", (1, 13)),
    ("root ::= [a-z", "unbalanced '\\['", (1, 10)),
    ('root ::= "abc', "unterminated string", (1, 10)),
    (r'root ::= "\q"', "unknown escape", (1, 11)),
    (r'root ::= "\x4"', "needs exactly 2 hex digits", (1, 11)),
    ('root ::= "a"{20001}', "repetition bound over", (1, 13)),
    ('root ::= "a"{3,2}', "maximum is below the minimum", None),
    ("root ::= [z-a]", "reversed", None),
    ('root ::= "a"\nroot ::= "b"', "defined twice", (2, 1)),
    ('root "a"', "expected '::='", (1, 6)),
    ('root ::= *"a"', "nothing to repeat", (1, 10)),
    ("root ::= <>", "empty token reference", (1, 10)),
]


@pytest.mark.parametrize(("source", "message", "where"), ERRORS)
def test_bad_grammars_raise_grammar_error_with_position(
    source: str, message: str, where: tuple[int, int] | None
) -> None:
    with pytest.raises(GrammarError, match=message) as info:
        Grammar(source)
    if where is not None:
        assert (info.value.line, info.value.column) == where
        assert str(info.value).startswith(f"line {where[0]}, column {where[1]}")


def test_pathological_grammars_are_bounded() -> None:
    t = time.perf_counter()
    # Nested nullable repetition: must work, not loop.
    src = 'root ::= ("a"*)* "b"'
    assert matches(src, "aaaab") and matches(src, "b") and not matches(src, "aac")
    assert matches('root ::= (("a"?)*)* ("b"*)*', "aabb")
    # 10,000 nested parentheses: a bounded error.
    with pytest.raises(GrammarError, match="nested deeper"):
        Grammar("root ::= " + "(" * 10_000 + '"a"' + ")" * 10_000)
    # Nesting the parser accepts but the lowering does not.
    with pytest.raises(GrammarError, match="deeper than"):
        Grammar("root ::= " + "(" * 500 + '"a"' + ")" * 500)
    # Repetition bounds that multiply share their bodies: 10^9 "a"s in a
    # few thousand elements; exact counts at a size the test can feed.
    assert Grammar('root ::= (("a"{1000}){1000}){1000}').n_rules < 5000
    src = 'root ::= (("ab"{50}){50}){2}'
    assert matches(src, "ab" * 5000)
    assert not matches(src, "ab" * 4999) and not matches(src, "ab" * 5001)
    # Distinct big bodies still add up, and are refused before expanding.
    many = " | ".join(f'"{i:03d}"{{1000}}' for i in range(400))
    with pytest.raises(GrammarError, match="more than 1,000,000 elements"):
        Grammar(f"root ::= {many}")
    # A huge alternation works.
    words = [f"w{i}" for i in range(5000)]
    src = "root ::= " + " | ".join(f'"{w}"' for w in words)
    assert matches(src, "w4999") and not matches(src, "w5000")
    # Deep input nesting: the matcher's stacks live on the heap.
    src = 'root ::= "(" root ")" | "x"'
    assert matches(src, "(" * 3000 + "x" + ")" * 3000)
    assert time.perf_counter() - t < 60


TOKENS = _native.VocabTrie(
    [b"a", b"b", b"<think>", b"</think>", b"", b"ab"], [False, False, True, True, True, False], [4]
)


def test_token_references() -> None:
    g = compile_gbnf('root ::= <think> "a"+ </think> !<[1]>*')
    ids = {"think": 2, "/think": 3}
    prog = _native.GrammarProgram(g.program(ids.__getitem__))
    m = _native.GrammarMatcher(prog, TOKENS)
    assert not m.accept_token(0)  # "a" before <think>
    assert m.accept_token(2) and m.accept_token(5) is False  # "ab": b is not allowed here
    assert m.accept_token(0) and m.accept_token(3)
    assert m.is_accepting()
    assert not m.accept_token(1)  # !<[1]> refuses token 1
    assert m.accept_token(5) and m.accept_token(0)  # any other token
    assert m.accept_token(4)  # EOS where the grammar can end
    assert sorted(g.token_texts) == ["/think", "think"]
    with pytest.raises(GrammarError, match="needs a numeric id"):
        Grammar("root ::= <[12a]>")


def test_state_exports_and_imports_exactly() -> None:
    src = 'root ::= ("ab" | "é")+ "!"'
    m = _native.GrammarMatcher(program(src), BYTES)
    assert m.accept_bytes("abé".encode()[:-1])  # stop mid-character
    state = m.export_state()
    other = _native.GrammarMatcher(program(src), BYTES)
    other.import_state(state)
    assert other.mask() == m.mask()
    assert other.accept_bytes("\xa9".encode("latin-1") + b"!") and other.is_accepting()
    for bad in ([], [1], [1, 10**6, 0, 0], [*state, 7], [2, *state[1:]]):
        with pytest.raises(Exception, match="bad grammar state"):
            other.import_state(bad)
    with pytest.raises(Exception, match="grammar program"):
        _native.GrammarProgram([1, 0, 1, 5])


def test_rollback_restores_the_exact_state() -> None:
    m = _native.GrammarMatcher(program('root ::= [a-c]+ "."'), BYTES)
    masks = [m.mask()]
    for ch in b"abca":
        assert m.accept_token(ch)
        masks.append(m.mask())
    m.rollback(3)
    assert m.mask() == masks[1] and m.n_accepted == 1
    with pytest.raises(Exception, match="cannot roll back"):
        m.rollback(2)


# ------------------------------------------------------- differential test

DIFF_GRAMMARS = [
    'root ::= ("a" | "b" "c"?)* "d"',
    'root ::= x{1,3} y?\nx ::= "a" | "ab"\ny ::= "b"+',
    "root ::= [a-c]+ ([^a-c] [a]?){0,2}",
    'root ::= "(" root ")" root | ',
    'root ::= ("é" | [a-b])+ "."?',
    'root ::= ("a"*)* ("b" | "ab")',
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    source=st.sampled_from(DIFF_GRAMMARS),
    text=st.text(alphabet="abcdé().x", max_size=8),
)
def test_matcher_agrees_with_a_backtracking_reference(source: str, text: str) -> None:
    assert matches(source, text) == reference_accepts(source, text), (source, text)


@settings(max_examples=400, deadline=None)
@given(
    base=st.sampled_from([src for src, _, _ in FEATURES] + DIFF_GRAMMARS),
    cuts=st.lists(st.tuples(st.integers(0, 200), st.text(max_size=3)), max_size=4),
)
def test_mutated_grammars_fail_only_with_grammar_error(
    base: str, cuts: list[tuple[int, str]]
) -> None:
    """Random edits of valid grammars: either a working grammar or a
    GrammarError, never another exception or a hang."""
    src = base
    for at, junk in cuts:
        at = min(at, len(src))
        src = src[:at] + junk + src[at + 1 :]
    try:
        g = Grammar(src)
    except GrammarError as e:
        assert e.line is None or e.line >= 1
        return
    m = _native.GrammarMatcher(program(g.source), BYTES)
    m.accept_bytes(b"abc")
    m.mask()
