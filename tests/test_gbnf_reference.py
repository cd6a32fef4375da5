"""The GBNF reference acceptor itself: every construct, accepted and rejected."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._gbnf_reference import accepts, parse


def check(grammar: str, yes: list[str], no: list[str]) -> None:
    for text in yes:
        assert accepts(grammar, text), f"should accept {text!r}"
    for text in no:
        assert not accepts(grammar, text), f"should reject {text!r}"


def test_literal_must_match_exactly() -> None:
    check('root ::= "abc"', ["abc"], ["", "ab", "abcd", "abd", "ABC"])


def test_empty_literal_and_empty_grammar_text() -> None:
    check('root ::= ""', [""], ["a"])


def test_sequence_of_literals_and_refs() -> None:
    check('root ::= "a" b "c"\nb ::= "b"', ["abc"], ["ac", "abbc"])


def test_alternation_including_empty_alternatives() -> None:
    check('root ::= "a" | "bc"', ["a", "bc"], ["", "abc", "b"])
    check('root ::= | "x"', ["", "x"], ["xx"])
    check('root ::= "x" |', ["", "x"], ["y"])
    check('root ::= "a" ( | "b") "c"', ["ac", "abc"], ["abbc"])


def test_grouping_binds_alternation() -> None:
    check('root ::= "a" ("b" | "c") "d"', ["abd", "acd"], ["ad", "abcd", "ab"])
    check('root ::= "a" "b" | "c" "d"', ["ab", "cd"], ["abd", "acd"])


def test_rules_span_lines_until_the_next_definition() -> None:
    grammar = """
    root ::= "a"
        item
        | "z"
    item ::= "b"
             "c"
    """
    check(grammar, ["abc", "z"], ["a", "ab", "zbc"])


def test_comments_are_ignored_outside_literals() -> None:
    grammar = 'root ::= "a" # a comment with "quotes" and ::=\n  "#" # another\n'
    check(grammar, ["a#"], ["a"])


def test_string_escapes() -> None:
    check(r'root ::= "\x41\u00e9\U0001F600"', ["Aé😀"], ["A"])
    check(r'root ::= "\t\r\n\\\"\[\]\-"', ['\t\r\n\\"[]-'], ["\t"])


def test_bad_escape_and_malformed_hex_are_errors() -> None:
    for grammar in (
        r'root ::= "\q"',
        r'root ::= "\x4"',
        r'root ::= "\u12"',
        r'root ::= "\U0011000A"',
    ):
        with pytest.raises(ValueError):
            parse(grammar)


def test_character_classes_and_ranges() -> None:
    check("root ::= [a-cx]", ["a", "b", "c", "x"], ["d", "", "ab", "A"])
    check("root ::= [-a]", ["-", "a"], ["b"])
    check("root ::= [a-]", ["-", "a"], ["b"])
    check(r"root ::= [\x30-\x39\-]", ["0", "9", "-"], ["a"])
    check(r"root ::= [\]\[]", ["]", "["], ["a"])
    check(r"root ::= [\u00e0-\u00ff]", ["é", "ÿ"], ["e", "Ā"])


def test_negated_classes() -> None:
    check(r'root ::= [^a-c"]', ["d", "é", "😀", "\n"], ["a", "b", "c", '"', ""])
    check("root ::= [^]", ["a", "\x00"], [""])
    check("root ::= []", [], ["", "a"])


def test_dot_is_any_single_code_point() -> None:
    check("root ::= .", ["a", "\n", "😀", "\x00"], ["", "ab"])
    check('root ::= "<" .* ">"', ["<>", "<a>b>", "<\n>"], ["<", "a<>"])


def test_repetition_operators() -> None:
    check('root ::= "a"*', ["", "a", "aaaa"], ["b", "ab"])
    check('root ::= "a"+', ["a", "aaa"], ["", "b"])
    check('root ::= "a"?', ["", "a"], ["aa"])
    check('root ::= "ab"*', ["", "ab", "abab"], ["aba", "a"])
    check('root ::= ("a" | "b")+ "c"', ["ac", "abbac"], ["c", "abca"])


def test_counted_repetition() -> None:
    check('root ::= "a"{3}', ["aaa"], ["aa", "aaaa", ""])
    check('root ::= "a"{2,}', ["aa", "aaaaaa"], ["a", ""])
    check('root ::= "a"{1,3}', ["a", "aa", "aaa"], ["", "aaaa"])
    check('root ::= "a"{0,2}', ["", "a", "aa"], ["aaa"])
    check('root ::= "a"{0}', [""], ["a"])
    check("root ::= [0-9]{ 2 , 3 }", ["12", "123"], ["1", "1234"])


def test_bad_repetition_bounds_are_errors() -> None:
    for grammar in ('root ::= "a"{3,2}', 'root ::= "a"{x}', 'root ::= "a"{2', "root ::= *"):
        with pytest.raises(ValueError):
            parse(grammar)


def test_recursion_right_and_nested() -> None:
    check('root ::= "(" root ")" | ""', ["", "()", "((()))"], ["(", "())", ")("])
    list_grammar = 'root ::= item ("," item)*\nitem ::= [0-9]+ | "[" root? "]"'
    check(list_grammar, ["1", "1,2", "[1,[2,3]],[]", "[]"], ["", "1,", "[1", "1,,2"])


def test_deep_right_recursion_does_not_hit_the_stack_limit() -> None:
    grammar = 'root ::= "a" root | ""'
    assert accepts(grammar, "a" * 2000)  # twice Python's default recursion limit
    assert not accepts(grammar, "a" * 2000 + "b")


def test_nested_repetitions_of_nullable_things_stay_fast() -> None:
    grammar = 'root ::= (("a"? "b"?)* ("a"* | "c"?)*)* "x"'
    text = "ab" * 150 + "a" * 50
    start = time.perf_counter()
    assert accepts(grammar, text + "x")
    assert not accepts(grammar, text + "y")
    assert time.perf_counter() - start < 5


def test_ambiguous_grammar_is_decided_without_blowup() -> None:
    # Exponentially many parses of "a"*n; a memoized matcher never sees them.
    grammar = 'root ::= x* "b"\nx ::= "a" | "a" "a" | "a"{1,3}'
    assert accepts(grammar, "a" * 300 + "b")
    assert not accepts(grammar, "a" * 300)


def test_left_recursion_is_reported() -> None:
    with pytest.raises(ValueError, match="left recursion"):
        accepts('root ::= root "a" | "a"', "aa")
    with pytest.raises(ValueError, match="left recursion"):
        accepts('root ::= x "a"\nx ::= "b"? root', "ba")


def test_structural_errors() -> None:
    for grammar in (
        'root ::= "a',  # unterminated literal
        "root ::= [a",  # unterminated class
        'root ::= ("a"',  # unbalanced group
        'root ::= "a")',  # unbalanced group
        "root ::= missing",  # undefined rule
        'root ::= "a"\nroot ::= "b"',  # defined twice
        "root = x",  # no ::=
        "root ::= [z-a]",  # reversed range
    ):
        with pytest.raises(ValueError):
            accepts(grammar, "a")
    with pytest.raises(ValueError):
        accepts('x ::= "a"', "a")  # no root
    assert accepts('x ::= "a"', "a", root="x")


def test_rule_names_use_letters_digits_and_dashes() -> None:
    check('root ::= my-rule-2\nmy-rule-2 ::= "ok"', ["ok"], ["no"])


def test_code_points_not_bytes() -> None:
    check("root ::= .{2}", ["é😀"], ["é"])


# Literal-only grammars against Python's own regex engine, as a cross-check.
_ALPHABET = "ab"


@st.composite
def _regex_and_grammar(draw: st.DrawFn, depth: int = 0) -> tuple[str, str]:
    kind = draw(st.sampled_from(["lit", "lit", "alt", "seq", "rep"] if depth < 3 else ["lit"]))
    if kind == "lit":
        s = draw(st.text(_ALPHABET, min_size=0, max_size=2))
        return "(?:" + re.escape(s) + ")", '"' + s + '"'
    if kind in ("alt", "seq"):
        a_re, a_g = draw(_regex_and_grammar(depth + 1))
        b_re, b_g = draw(_regex_and_grammar(depth + 1))
        if kind == "alt":
            return f"(?:{a_re}|{b_re})", f"({a_g} | {b_g})"
        return f"(?:{a_re}{b_re})", f"({a_g} {b_g})"
    inner_re, inner_g = draw(_regex_and_grammar(depth + 1))
    lo = draw(st.integers(0, 2))
    hi = draw(st.one_of(st.none(), st.integers(lo, 3)))
    q = f"{{{lo},}}" if hi is None else f"{{{lo},{hi}}}"
    return f"(?:{inner_re}){q}", f"({inner_g}){q}"


@settings(max_examples=150, deadline=None)
@given(_regex_and_grammar(), st.lists(st.text(_ALPHABET, max_size=6), min_size=1, max_size=8))
def test_agrees_with_python_re(pair: tuple[str, str], texts: list[str]) -> None:
    regex, grammar = pair
    for text in texts:
        want = re.fullmatch(regex, text) is not None
        assert accepts("root ::= " + grammar, text) == want, (regex, grammar, text)
