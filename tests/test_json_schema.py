"""JSON Schema -> GBNF: every keyword accepted and rejected, checked with the
independent GBNF reference (tests/_gbnf_reference.py) and cross-checked with
``jsonschema``: whatever a grammar accepts must parse and validate."""

from __future__ import annotations

import datetime
import enum
import functools
import ipaddress
import json
import math
import random
import re
import urllib.parse
import uuid
import warnings
from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Any, Literal

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft4Validator, Draft202012Validator
from pydantic import BaseModel, Field

from oxillama.decoding.grammar import Grammar
from oxillama.decoding.grammar import gbnf as gbnf_syntax
from oxillama.decoding.grammar.json_schema import MAX_INDENT, schema_to_gbnf, schema_to_rules
from oxillama.errors import GrammarError, JsonSchemaError
from tests import _gbnf_reference as ref
from tests._gbnf_reference import accepts

FORMAT_CHECKER = Draft202012Validator.FORMAT_CHECKER
_PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _shape(node: Any) -> Any:
    """A syntax tree without source positions, for comparing trees."""
    if isinstance(node, list):
        return [_shape(n) for n in node]
    if isinstance(node, gbnf_syntax.Rule):
        return ("rule", node.name, _shape(node.body))
    if isinstance(node, gbnf_syntax.Alternatives):
        return ("alts", [[_shape(n) for n in seq] for seq in node.alts])
    if isinstance(node, gbnf_syntax.Repeat):
        return ("rep", _shape(node.item), node.min, node.max)
    if isinstance(node, gbnf_syntax.Ref):
        return ("ref", node.name)
    if isinstance(node, gbnf_syntax.Chars):
        return ("chars", node.ranges)
    raise AssertionError(type(node))


@functools.lru_cache(maxsize=512)
def _compiled(schema_json: str) -> str:
    text = schema_to_gbnf(json.loads(schema_json))
    # Grammar.from_json_schema skips parsing its own text: every schema this
    # module compiles also checks the tree it builds is the parsed text's.
    again, rules = schema_to_rules(json.loads(schema_json))
    assert again == text
    assert _shape(rules) == _shape(gbnf_syntax.parse(text))
    return text


def gbnf(schema: Any) -> str:
    return _compiled(json.dumps(schema))


def valid(schema: Any, value: Any) -> bool:
    return bool(Draft202012Validator(schema, format_checker=FORMAT_CHECKER).is_valid(value))


def check(schema: Any, yes: list[str], no: list[str]) -> None:
    """``yes`` texts are accepted (and validate); ``no`` texts are rejected."""
    grammar = gbnf(schema)
    for text in yes:
        assert accepts(grammar, text), f"should accept {text!r}\n{grammar}"
        assert valid(schema, json.loads(text)), f"accepted but invalid: {text!r}"
    for text in no:
        assert not accepts(grammar, text), f"should reject {text!r}\n{grammar}"


# --------------------------------------------------------------------- sampling


class Sampler:
    """Random texts from a GBNF grammar (through the reference's parse tree),
    to test soundness from the grammar's side: every sample must validate."""

    POOL: tuple[str, ...] = (
        *"azAZ09 _-.:/@+#%!~'\"\\\t\n",
        "é",
        "ß",
        "中",
        "😀",
        "\u2028",
        "\x7f",
        "\x00",
    )

    def __init__(self, grammar_text: str) -> None:
        self.g: ref.Grammar = ref.parse(grammar_text)
        self.cost: dict[int, float] = {}
        self.rule_cost = {name: math.inf for name in self.g.rules}
        changed = True
        while changed:  # least fixpoint of "fewest characters and rule steps"
            changed = False
            self.cost = {}
            for name, body in self.g.rules.items():
                c = self.measure(body)
                if c < self.rule_cost[name]:
                    self.rule_cost[name] = c
                    changed = True

    def measure(self, node: ref.Node) -> float:
        if isinstance(node, ref.Literal):
            return len(node.text)
        if isinstance(node, (ref.CharClass, ref.AnyChar)):
            return 1
        if isinstance(node, ref.Ref):
            return self.rule_cost[node.name] + 1
        if isinstance(node, ref.Seq):
            return sum(self.measure(i) for i in node.items)
        if isinstance(node, ref.Alt):
            return min(self.measure(o) for o in node.options)
        assert isinstance(node, ref.Repeat)
        return node.lo * self.measure(node.node) if node.lo else 0

    def char(self, node: ref.CharClass | ref.AnyChar, rnd: random.Random) -> str:
        if isinstance(node, ref.CharClass) and not node.negated:
            lo, hi = rnd.choice(node.ranges)
            for _ in range(20):
                cp = rnd.randint(lo, min(hi, lo + 300))
                if not 0xD800 <= cp <= 0xDFFF:
                    return chr(cp)
        pool: list[str] = list(self.POOL)
        rnd.shuffle(pool)
        for c in pool:
            if isinstance(node, ref.AnyChar) or node.matches(c):
                return c
        raise AssertionError("no sample character")

    def sample(self, rnd: random.Random, budget: int = 40) -> str:
        out: list[str] = []

        def go(node: ref.Node, depth: int) -> None:
            cheap = depth > budget
            if isinstance(node, ref.Literal):
                out.append(node.text)
            elif isinstance(node, (ref.CharClass, ref.AnyChar)):
                out.append(self.char(node, rnd))
            elif isinstance(node, ref.Ref):
                go(self.g.rules[node.name], depth + 1)
            elif isinstance(node, ref.Seq):
                for item in node.items:
                    go(item, depth)
            elif isinstance(node, ref.Alt):
                finite = [o for o in node.options if self.measure(o) < math.inf]
                pick = min(finite, key=self.measure) if cheap else rnd.choice(finite)
                go(pick, depth + 1)
            else:
                assert isinstance(node, ref.Repeat)
                most = node.lo + 3 if node.hi is None else min(node.hi, node.lo + 3)
                count = node.lo if cheap else rnd.randint(node.lo, most)
                for _ in range(count):
                    go(node.node, depth + 1)

        go(self.g.rules["root"], 0)
        return "".join(out)


def samples(schema: Any, n: int, seed: int = 0) -> list[str]:
    grammar = gbnf(schema)
    sampler = Sampler(grammar)
    rnd = random.Random(seed)
    return [sampler.sample(rnd) for _ in range(n)]


def assert_samples_sound(schema: Any, n: int = 40, seed: int = 0) -> list[Any]:
    """Samples of the grammar: each is accepted, parses, and validates."""
    grammar = gbnf(schema)
    values = []
    for text in samples(schema, n, seed):
        assert accepts(grammar, text), text
        value = json.loads(text)
        assert valid(schema, value), f"{text!r} is invalid against {schema}"
        values.append(value)
    return values


# ----------------------------------------------------------------- basic types


def test_null_and_boolean() -> None:
    check({"type": "null"}, ["null"], ["Null", "nul", "", "0", '"null"'])
    check({"type": "boolean"}, ["true", "false"], ["True", "1", "null", "tru"])


def test_integer_grammar() -> None:
    check(
        {"type": "integer"},
        ["0", "-0", "7", "-12", "1234567890123", "9" * 20, "-" + "9" * 20],
        ["01", "1.0", "1e3", "+1", "", "-", "1 ", " 1", "9" * 21, '"1"'],
    )


def test_number_grammar() -> None:
    check(
        {"type": "number"},
        ["0", "-0.5", "3.25", "1e10", "1E-7", "2.5e+99", "-0.0", "123.456e07"],
        ["01", ".5", "1.", "1e", "--1", "1.5.2", "NaN", "Infinity", "1e400", "1e100", "0x10"],
    )


def test_string_grammar_and_escapes() -> None:
    check(
        {"type": "string"},
        ['""', '"abc"', r'"a\"b"', r'"\\"', r'"\/"', r'"\b\f\n\r\t"', r'"\u00e9\u00C9"', '"é😀"'],
        ['"a', "abc", '"\n"', '"\x01"', r'"\x41"', r'"\u12"', r'"\a"', '"\\"', "'a'"],
    )


def test_strings_never_hold_lone_surrogate_escapes() -> None:
    check({"type": "string"}, [r'"\ud83d\ude00"'], [r'"\ud83d"', r'"\ude00"', r'"\ude00\ud83d"'])


@given(st.text(max_size=20), st.booleans())
@_PROPERTY
def test_json_dumps_of_any_string_is_accepted(text: str, ascii_only: bool) -> None:
    assert accepts(gbnf({"type": "string"}), json.dumps(text, ensure_ascii=ascii_only))


def test_empty_schema_and_true_mean_any_json_value() -> None:
    doc = '{"a": [1, 2.5, "x", null, true, {"b": {}}], "c": []}'
    for schema in ({}, True, {"description": "anything"}):
        check(schema, [doc, "1", '"s"', "null", "[]", "{}"], ["", "{", "[1,]", '{"a" 1}', "nul"])


def test_false_schema_is_an_error() -> None:
    with pytest.raises(JsonSchemaError):
        schema_to_gbnf(False)


# ------------------------------------------------------------------ whitespace


def test_whitespace_is_optional_and_bounded() -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    indent = " " * MAX_INDENT
    check(
        schema,
        ["[1,2]", "[ 1, 2 ]", "[\n  1,\n  2\n]", "[\n\t1]", f"[\n{indent}1]"],
        [f"[\n{indent} 1]", "[  1]", "[1 ,  2]", " [1]", "[1] ", "[\n\n1]", "[\r\n1]"],
    )


def test_json_dumps_indent_is_accepted_when_within_the_bound() -> None:
    schema = {"type": "object", "additionalProperties": True}
    doc = {"a": [1, {"b": [2, 3]}], "c": {"d": None}}
    grammar = gbnf(schema)
    assert accepts(grammar, json.dumps(doc, indent=2))
    assert accepts(grammar, json.dumps(doc, separators=(",", ":")))
    assert not accepts(grammar, json.dumps({"x": doc}, indent=MAX_INDENT))


# ----------------------------------------------------------------- integers


@pytest.mark.parametrize(
    ("bounds", "lo", "hi"),
    [
        ({"minimum": 0, "maximum": 100}, 0, 100),
        ({"minimum": -37, "maximum": 1234}, -37, 1234),
        ({"minimum": -500, "maximum": -17}, -500, -17),
        ({"exclusiveMinimum": -3, "exclusiveMaximum": 99}, -2, 98),
        ({"minimum": 2.5, "maximum": 7.5}, 3, 7),
        ({"exclusiveMinimum": 2.0, "maximum": 1e1}, 3, 10),
        ({"minimum": 5, "exclusiveMinimum": 5}, 6, None),
        ({"maximum": -8}, None, -8),
        ({"minimum": 999}, 999, None),
    ],
)
def test_integer_bounds_are_exact(bounds: dict[str, Any], lo: int | None, hi: int | None) -> None:
    schema = {"type": "integer", **bounds}
    grammar = gbnf(schema)
    for n in range(-1100, 1300):
        want = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert accepts(grammar, str(n)) == want, n
        if want:
            assert valid(schema, n)
    for n in (10**15, -(10**15)):
        want = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert accepts(grammar, str(n)) == want


def test_integer_bounds_beyond_the_digit_cap_are_exact() -> None:
    big = 10**30
    check(
        {"type": "integer", "minimum": big, "maximum": big + 5},
        [str(big), str(big + 5)],
        [str(big - 1), str(big + 6), "0"],
    )


def test_unsatisfiable_integer_bounds_are_an_error() -> None:
    with pytest.raises(JsonSchemaError, match="bounds"):
        schema_to_gbnf({"type": "integer", "minimum": 1.2, "maximum": 1.8})


def test_bounds_must_be_numbers() -> None:
    with pytest.raises(JsonSchemaError) as info:
        schema_to_gbnf({"type": "integer", "minimum": "3"})
    assert info.value.keyword == "minimum"


# ------------------------------------------------------------------ numbers


def test_number_bounds_examples() -> None:
    check(
        {"type": "number", "minimum": -1.5, "exclusiveMaximum": 2},
        ["-1.5", "-1.50", "-1", "0", "-0.0", "1.999999", "1", "0.25"],
        ["-1.6", "-1.5000001", "2", "2.0", "2.0000000001", "1e0", "-2"],
    )
    check(
        {"type": "number", "exclusiveMinimum": 0.1, "maximum": 0.3},
        ["0.2", "0.3", "0.30", "0.100000000000001"],
        ["0.1", "0.10", "0", "0.3000001", "-0.2"],
    )


def test_number_rejects_values_that_round_onto_an_exclusive_bound() -> None:
    # 0.10000000000000000001 parses to the double 0.1, which is not > 0.1.
    check(
        {"type": "number", "exclusiveMinimum": 0.1},
        ["0.1000000000000001"],
        ["0.10000000000000000001"],
    )


_bound = st.one_of(
    st.integers(-1000, 1000),
    st.floats(-1000, 1000, allow_nan=False).map(lambda f: round(f, 3)),
    st.sampled_from([0, 0.1, -0.1, 0.3, 1e-7, 123.456, 2**53 + 1]),
)


@st.composite
def _number_text(draw: st.DrawFn, near: list[float]) -> str:
    kind = draw(st.sampled_from(["float", "int", "near", "digits"]))
    if kind == "float":
        return json.dumps(draw(st.floats(-2000, 2000, allow_nan=False)))
    if kind == "int":
        return str(draw(st.integers(-2000, 2000)))
    if kind == "near" and near:
        x = draw(st.sampled_from(near))
        step = draw(st.sampled_from([0, 1e-15, 1e-9, 1e-3, 1]))
        return repr(x + draw(st.sampled_from([-1, 1])) * step * max(1.0, abs(x)))
    sign = draw(st.sampled_from(["", "-"]))
    whole = draw(st.sampled_from(["0", "1", "2", "99", "123"]))
    frac = draw(st.text("0123456789", min_size=1, max_size=25))
    return f"{sign}{whole}.{frac}"


@given(st.data())
@_PROPERTY
def test_number_bounds_are_sound_and_complete(data: st.DataObject) -> None:
    schema: dict[str, Any] = {"type": data.draw(st.sampled_from(["number", "integer"]))}
    for key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        if data.draw(st.booleans()):
            schema[key] = data.draw(_bound)
    try:
        grammar = schema_to_gbnf(schema)
    except JsonSchemaError:
        return  # no number lies within these bounds
    near = [float(v) for k, v in schema.items() if k != "type"]
    for _ in range(8):
        text = data.draw(_number_text(near))
        value = json.loads(text)
        ok = accepts(grammar, text)
        if ok:
            assert valid(schema, value), (schema, text)
        elif valid(schema, value) and "e" not in text.lower():
            # Complete on canonical texts: ints, and shortest float reprs.
            is_float_text = "." in text
            canonical = text == (repr(float(value)) if is_float_text else str(int(text)))
            if schema["type"] == "number" or not is_float_text:
                assert not canonical, (schema, text)


# ------------------------------------------------------------------ strings


def test_min_and_max_length_count_code_points() -> None:
    schema = {"type": "string", "minLength": 2, "maxLength": 3}
    check(
        schema,
        ['"ab"', '"abc"', '"é😀"', r'"\u00e9\ud83d\ude00"', r'"\n\t"', '"a\\"b"'],
        ['"a"', '"abcd"', '""', '"😀"', r'"\ud83d\ude00"', r'"\u00e9"'],
    )


def test_length_bounds_above_the_repeat_chunk() -> None:
    schema = {"type": "string", "minLength": 1500, "maxLength": 2100}
    grammar = gbnf(schema)
    for n, ok in ((1499, False), (1500, True), (2000, True), (2100, True), (2101, False)):
        assert accepts(grammar, json.dumps("x" * n)) == ok, n


def test_max_length_below_min_length_is_an_error() -> None:
    with pytest.raises(JsonSchemaError):
        schema_to_gbnf({"type": "string", "minLength": 3, "maxLength": 2})


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("abc", ["abc", "xxabcxx", "abc\n", "\nabc"], ["ab", "acb", ""]),
        ("^abc", ["abc", "abcz"], ["zabc"]),
        ("abc$", ["abc", "zabc"], ["abcz", "abc\n"]),
        ("^a|b$", ["a", "az", "b", "zb"], ["za", "bz"]),
        ("^[a-c]+$", ["a", "cab"], ["", "abd", "A"]),
        ("^[^a-c]+$", ["xyz", "é😀", "D"], ["xa", ""]),
        ("^\\d{3}-\\d{2,}$", ["123-45", "123-4567"], ["12-45", "123-4", "١٢٣-45"]),
        ("^\\w+$", ["a_Z9"], ["a-b", "é", ""]),
        ("^\\s$", [" ", "\t", "\n"], ["a", "  "]),
        ("^\\D\\W\\S$", ["a-b", "x b"], ["1-b", "aab", "a- "]),
        ("^[\\d.]+$", ["1.5", "..."], ["1,5"]),
        ("^(ab|cd)*$", ["", "ab", "abcdab"], ["abc", "ba"]),
        ("^(?:x|y){2}(?P<z>z?)$", ["xy", "yyz"], ["x", "xyzz"]),
        ("^a.c$", ["abc", "a😀c", "a c"], ["a\nc", "ac", "a\u2028c"]),
        ("^a*?b+?c??$", ["b", "aabbc"], ["c", "aabca"]),
        ("^colou?r$", ["color", "colour"], ["colouur"]),
        ("^\\$\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\\\/$", ["$.*+?()[]{}|\\/"], ["$"]),
        ("^[\\t\\n\\x41\\u00e9\\-]+$", ["\t\nAé-"], ["B"]),
        ("^a{2}b{1,}c{0,2}$", ["aab", "aabbbcc"], ["ab", "aabccc"]),
        ("^x{$", ["x{"], ["x"]),
        ("", ["", "anything"], []),
        ("^\"'$", ["\"'"], ["'"]),
    ],
)
def test_pattern(pattern: str, yes: list[str], no: list[str]) -> None:
    schema = {"type": "string", "pattern": pattern}
    grammar = gbnf(schema)
    for text in yes:
        for encoded in {json.dumps(text), json.dumps(text, ensure_ascii=False)}:
            assert accepts(grammar, encoded), (pattern, encoded)
        assert re.search(pattern, text) is not None
        assert valid(schema, text)
    for text in no:
        for encoded in {json.dumps(text), json.dumps(text, ensure_ascii=False)}:
            assert not accepts(grammar, encoded), (pattern, encoded)


@pytest.mark.parametrize(
    "pattern",
    [
        "^abc$",
        "^[a-z]{2,5}\\d*$",
        "(foo|ba+r)",
        "^[^\\d\\s]+@\\w+\\.(com|org)$",
        "^\\S{3}$",
        "x.y",
        "^(a|bc)+$",
    ],
)
def test_pattern_samples_validate(pattern: str) -> None:
    assert_samples_sound({"type": "string", "pattern": pattern}, n=30)


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("(?=a)b", "lookaround"),
        ("(?!a)b", "lookaround"),
        ("(?<=a)b", "lookaround"),
        ("(?<!a)b", "lookaround"),
        ("(a)\\1", "backreference"),
        ("(?P<x>a)(?P=x)", "backreference"),
        ("\\bword\\b", "assertion"),
        ("a^b", "'\\^'"),
        ("a$b", "'\\$'"),
        ("(?i)abc", "flags"),
        ("\\p{L}", "property"),
        ("a{2,1}", "maximum"),
        ("(abc", "missing"),
        ("abc)", "unbalanced"),
        ("*a", "nothing to repeat"),
        ("a**", "repeated"),
        ("a{,3}", "different"),
        ("[]a]", "different"),
        ("\\q", "escape"),
    ],
)
def test_unsupported_or_bad_patterns_raise(pattern: str, problem: str) -> None:
    with pytest.raises(JsonSchemaError, match=problem) as info:
        schema_to_gbnf({"type": "string", "pattern": pattern})
    assert info.value.keyword == "pattern"
    assert info.value.path == "#"


def test_pattern_with_lengths_pushed_into_the_regex() -> None:
    # One part of varying length ([a-z]+) takes the bounds: 2..4 letters.
    schema = {"type": "string", "pattern": "^[a-z]+-\\d$", "minLength": 4, "maxLength": 6}
    check(schema, ['"ab-1"', '"abcd-1"'], ['"a-1"', '"abcde-1"', '"ab-"'])
    assert_samples_sound(schema)


def test_pattern_with_lengths_that_cannot_be_pushed_down() -> None:
    schema = {"type": "string", "pattern": "a", "maxLength": 5}
    with pytest.raises(JsonSchemaError, match="maxLength") as info:
        schema_to_gbnf(schema)
    assert info.value.keyword == "maxLength"
    with pytest.warns(UserWarning, match="maxLength"):
        grammar = schema_to_gbnf(schema, strict=False)
    assert accepts(grammar, '"xax"')


def test_pattern_with_implied_lengths_is_fine() -> None:
    check(
        {"type": "string", "pattern": "^\\d{4}$", "minLength": 1, "maxLength": 10},
        ['"1234"'],
        ['"123"'],
    )


# ------------------------------------------------------------------ formats


_FORMAT_CASES: dict[str, tuple[list[str], list[str]]] = {
    "date": (
        ["2024-02-29", "2000-02-29", "1999-12-31", "0001-01-01", "2023-04-30"],
        [
            "2023-02-29",
            "1900-02-29",
            "0000-01-01",
            "2023-04-31",
            "2023-13-01",
            "2023-1-01",
            "20230101",
        ],
    ),
    "time": (
        ["23:59:59Z", "00:00:00+05:30", "12:34:56.789-08:00"],
        ["24:00:00Z", "12:60:00Z", "12:00:00", "12:00:60Z", "12:00:00+2400", "1:00:00Z"],
    ),
    "date-time": (
        ["2024-02-29T23:59:59Z", "1970-01-01T00:00:00.5+01:00"],
        ["2024-02-29 23:59:59Z", "2024-02-30T00:00:00Z", "2024-02-29T23:59:59"],
    ),
    "duration": (
        ["P1Y", "P1Y2M3DT4H5M6S", "PT36H", "P4W", "P1M", "PT1M", "P1DT1S"],
        ["P", "PT", "P1S", "1Y", "P1Y1W", "PT1H1D", "P1.5Y"],
    ),
    "uuid": (
        ["123e4567-e89b-12d3-a456-426614174000", "AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE"],
        ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"],
    ),
    "email": (
        ["a@b.co", "first.last+tag@sub.example.org", "x!#$%&'*+/=?^_`{|}~-@host"],
        ["@b.co", "a@", "a b@c.d", "a..b@c.d", ".a@b.c", "a@-b.c"],
    ),
    "ipv4": (
        ["0.0.0.0", "255.255.255.255", "192.168.1.20"],
        ["256.0.0.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1.2.3.-4"],
    ),
    "ipv6": (
        ["::", "::1", "1::", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8", "::ffff:192.0.2.1"],
        ["1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", ":1", "1:2:3:4:5:6:7", "::ffff:1.2.3.256"],
    ),
    "hostname": (
        ["localhost", "example.com", "a-b.c-d.e", "x" * 30 + ".org"],
        ["-a.com", "a-.com", "a..b", "a_b.com", "", "x" * 31, ".".join("a" * 9)],
    ),
    "uri": (
        [
            "https://example.com/a/b?x=1&y=2#frag",
            "urn:isbn:0451450523",
            "mailto:a@b.c",
            "http://[::1]:8080/",
        ],
        ["example.com", "/relative/path", "http://exa mple.com", "1http://x", "http://x/%zz"],
    ),
}


@pytest.mark.parametrize("fmt", sorted(_FORMAT_CASES))
def test_format(fmt: str) -> None:
    yes, no = _FORMAT_CASES[fmt]
    schema = {"type": "string", "format": fmt}
    check(schema, [json.dumps(t) for t in yes], [json.dumps(t) for t in no])


def _independent_format_check(fmt: str, s: str) -> bool:
    """Checks for the formats jsonschema cannot check here (no extra packages)."""
    if fmt == "hostname":
        labels = s.split(".")
        return (
            len(s) <= 253
            and all(
                0 < len(lb) <= 63 and lb[0] != "-" and lb[-1] != "-" and lb.isascii()
                for lb in labels
            )
            and all(c.isalnum() or c in "-." for c in s)
        )
    if fmt == "uri":
        parts = urllib.parse.urlsplit(s)
        return bool(parts.scheme) and s.isascii() and " " not in s
    if fmt == "duration":
        m = re.fullmatch(
            r"P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?",
            s,
        )
        if m is None or s in ("P", "PT") or s.endswith("T"):
            return False
        return not (m.group(3) and any(m.group(i) for i in (1, 2, 4, 5, 6, 7)))
    if fmt == "ipv6":
        ipaddress.IPv6Address(s)
        return True
    if fmt == "ipv4":
        ipaddress.IPv4Address(s)
        return True
    if fmt == "uuid":
        return str(uuid.UUID(s)) == s.lower()
    if fmt == "date":
        return datetime.date.fromisoformat(s).isoformat() == s
    return True


@pytest.mark.parametrize("fmt", sorted(_FORMAT_CASES))
def test_format_samples_validate(fmt: str) -> None:
    schema = {"type": "string", "format": fmt}
    for value in assert_samples_sound(schema, n=40, seed=7):
        assert _independent_format_check(fmt, value), (fmt, value)


def test_unknown_format_is_unsupported() -> None:
    schema = {"type": "string", "format": "iri"}
    with pytest.raises(JsonSchemaError, match="format") as info:
        schema_to_gbnf(schema)
    assert info.value.keyword == "format"
    with pytest.warns(UserWarning, match="iri"):
        grammar = schema_to_gbnf(schema, strict=False)
    assert accepts(grammar, '"anything"')


def test_format_with_pattern_is_unsupported() -> None:
    with pytest.raises(JsonSchemaError) as info:
        schema_to_gbnf({"type": "string", "format": "date", "pattern": "^2"})
    assert info.value.keyword == "pattern"


def test_fixed_length_format_with_compatible_lengths() -> None:
    check({"type": "string", "format": "date", "maxLength": 10}, ['"2020-01-01"'], ['"2020-1-1"'])
    with pytest.raises(JsonSchemaError):
        schema_to_gbnf({"type": "string", "format": "date", "maxLength": 9})


# --------------------------------------------------------------- enum / const


def test_enum_of_mixed_values() -> None:
    schema = {"enum": ["a", 1, 2.5, None, True, [1, "x"], {"k": [False]}, 'é"\n']}
    check(
        schema,
        [
            '"a"',
            "1",
            "2.5",
            "null",
            "true",
            '[1, "x"]',
            '[1,"x"]',
            '{"k": [false]}',
            r'"\u00e9\"\n"',
            '"é\\"\\n"',
        ],
        ['"b"', "2", "1.0", "false", '["x", 1]', '{"k": []}', '"A"'],
    )


def test_const() -> None:
    check({"const": "fixed"}, ['"fixed"'], ['"fixe"', '"fixedd"', "null"])
    check({"const": 3.0}, ["3.0", "3"], ["3.5"])
    check(
        {"const": {"a": 1, "b": [None]}},
        ['{"a": 1, "b": [null]}', '{ "a":1 ,"b":[ null ] }'],
        ['{"b": [null], "a": 1}'],
    )


def test_enum_values_are_filtered_by_sibling_keywords() -> None:
    check({"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1}, ['"a"'], ['"bb"', "1"])
    check(
        {"type": "integer", "enum": [1, 5, 9, "x"], "minimum": 4, "exclusiveMaximum": 9},
        ["5"],
        ["1", "9", '"x"'],
    )
    check({"enum": ["ab", "cd", "ce"], "pattern": "^c"}, ['"cd"', '"ce"'], ['"ab"'])
    with pytest.raises(JsonSchemaError):
        schema_to_gbnf({"type": "string", "enum": [1, 2]})


def test_enum_with_an_uncheckable_keyword_is_unsupported() -> None:
    schema = {"enum": [{"a": 1}], "properties": {"a": {"type": "string"}}}
    with pytest.raises(JsonSchemaError) as info:
        schema_to_gbnf(schema)
    assert info.value.keyword == "properties"


def test_enum_and_const_together_intersect() -> None:
    check({"enum": [1, 2, 3], "const": 2}, ["2"], ["1", "3"])


def test_enum_must_be_a_list_of_json_values() -> None:
    for schema in ({"enum": "abc"}, {"enum": [float("nan")]}, {"const": "\ud800"}):
        with pytest.raises(JsonSchemaError):
            schema_to_gbnf(schema)


# ------------------------------------------------------------------- objects


_PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
    },
    "required": ["name"],
}


def test_object_properties_in_schema_order() -> None:
    check(
        _PERSON,
        [
            '{"name": "Ann"}',
            '{"name": "Ann", "age": 3}',
            '{"name": "A", "email": "a@b.c"}',
            '{"name":"A","age":1,"email":"a@b.c"}',
        ],
        [
            '{"age": 3, "name": "Ann"}',
            '{"age": 3}',
            "{}",
            '{"name": "A", "name": "B"}',
            '{"name": "A",}',
            '{"name": 1}',
        ],
    )


def test_missing_additional_properties_closes_a_listed_object() -> None:
    check(_PERSON, ['{"name": "A"}'], ['{"name": "A", "x": 1}', '{"x": 1, "name": "A"}'])


def test_object_without_properties_allows_any_members() -> None:
    check({"type": "object"}, ["{}", '{"a": 1, "b": {"c": []}}'], ["[]", '{"a"}', "{1: 2}"])


def test_additional_properties_false_true_and_schema() -> None:
    base = {"type": "object", "properties": {"a": {"type": "integer"}}}
    check({**base, "additionalProperties": False}, ['{"a": 1}', "{}"], ['{"a": 1, "b": 2}'])
    check(
        {**base, "additionalProperties": True},
        ['{"a": 1, "b": [2]}', '{"b": null, "c": 1}'],
        ['{"b": 1, "a": 1}'],
    )
    check(
        {**base, "additionalProperties": {"type": "string"}},
        ['{"a": 1, "b": "x"}', '{"b": "x", "c": "y"}', '{"ab": "x"}', '{"": "x"}'],
        ['{"a": 1, "b": 2}', '{"a": "x"}', '{"a": 1, "a": 2}'],
    )


def test_extra_keys_never_repeat_a_listed_name() -> None:
    schema = {
        "type": "object",
        "properties": {
            "ab": {"type": "integer"},
            "a": {"type": "integer"},
            "é": {"type": "integer"},
        },
        "additionalProperties": {"type": "string"},
    }
    grammar = gbnf(schema)
    for key in ("ab", "a", "é", "\u00e9"):
        for text in (json.dumps(key), json.dumps(key, ensure_ascii=False), '"\\u0061"'):
            if json.loads(text) in ("ab", "a", "é"):
                assert not accepts(grammar, "{" + text + ': "s"}'), text
    for key in ("abc", "b", "", "aé", "éa", "A"):
        assert accepts(grammar, "{" + json.dumps(key) + ': "s"}'), key
    assert_samples_sound(schema)


def test_required_property_not_listed_takes_additional_properties() -> None:
    check(
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["b"],
            "additionalProperties": {"type": "boolean"},
        },
        ['{"b": true}', '{"a": 1, "b": false}'],
        ['{"a": 1}', '{"b": 1}'],
    )
    check(
        {"type": "object", "required": ["x"]}, ['{"x": []}', '{"x": 1, "y": 2}'], ["{}", '{"y": 2}']
    )
    with pytest.raises(JsonSchemaError, match="'b'"):
        schema_to_gbnf({"type": "object", "properties": {"a": {}}, "required": ["b"]})


def test_min_and_max_properties() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "integer"},
            "c": {"type": "integer"},
        },
        "minProperties": 1,
        "maxProperties": 2,
    }
    check(
        schema,
        ['{"a": 1}', '{"c": 1}', '{"a": 1, "c": 2}', '{"b": 1, "c": 2}'],
        ["{}", '{"a": 1, "b": 2, "c": 3}'],
    )
    open_schema = {
        "type": "object",
        "minProperties": 1,
        "maxProperties": 2,
        "additionalProperties": {"type": "integer"},
    }
    check(open_schema, ['{"x": 1}', '{"x": 1, "y": 2}'], ["{}", '{"x": 1, "y": 2, "z": 3}'])
    assert_samples_sound(schema)
    assert_samples_sound(open_schema)


def test_min_properties_that_needs_several_extra_keys_is_unsupported() -> None:
    schema = {"type": "object", "minProperties": 2}
    with pytest.raises(JsonSchemaError) as info:
        schema_to_gbnf(schema)
    assert info.value.keyword == "minProperties"
    with pytest.warns(UserWarning, match="minProperties"):
        schema_to_gbnf(schema, strict=False)


def test_unsatisfiable_optional_property_is_left_out() -> None:
    check(
        {"type": "object", "properties": {"a": {"type": "integer"}, "never": False}},
        ['{"a": 1}', "{}"],
        ['{"never": 1}'],
    )


def test_property_names_needing_escapes() -> None:
    schema = {
        "type": "object",
        "properties": {
            'q"uote': {"type": "integer"},
            "tab\t": {"type": "integer"},
            "ключ": {"type": "integer"},
        },
    }
    doc = {'q"uote': 1, "tab\t": 2, "ключ": 3}
    grammar = gbnf(schema)
    assert accepts(grammar, json.dumps(doc))
    assert accepts(grammar, json.dumps(doc, ensure_ascii=False))
    assert valid(schema, doc)


# -------------------------------------------------------------------- arrays


def test_items_min_and_max() -> None:
    check(
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
        ["[1]", "[1, 2, 3]", "[ 1 ,2 ]"],
        ["[]", "[1, 2, 3, 4]", '[1, "a"]', "[1,]", "[,1]"],
    )
    check({"type": "array"}, ["[]", '[1, "a", [null]]'], ["{}", "[", "[1 2]"])


def test_prefix_items() -> None:
    schema = {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "integer"}],
        "items": {"type": "boolean"},
    }
    check(
        schema,
        ["[]", '["a"]', '["a", 1]', '["a", 1, true, false]'],
        ["[1]", '["a", "b"]', '["a", 1, 2]'],
    )
    closed = {**schema, "items": False, "minItems": 1}
    check(closed, ['["a"]', '["a", 1]'], ["[]", '["a", 1, true]'])
    check(
        {**schema, "minItems": 3, "maxItems": 3},
        ['["a", 1, true]'],
        ['["a", 1]', '["a", 1, true, true]'],
    )


def test_array_form_items_before_2020_12() -> None:
    schema = {
        "type": "array",
        "items": [{"type": "string"}, {"type": "integer"}],
        "additionalItems": False,
    }
    grammar = gbnf(schema)
    assert accepts(grammar, '["a", 1]')
    assert not accepts(grammar, '["a", 1, 2]')
    assert Draft4Validator(schema).is_valid(["a", 1])


def test_unsatisfiable_item_counts() -> None:
    with pytest.raises(JsonSchemaError):
        schema_to_gbnf({"type": "array", "minItems": 3, "maxItems": 2})
    with pytest.raises(JsonSchemaError):
        schema_to_gbnf({"type": "array", "prefixItems": [{}], "items": False, "minItems": 2})
    check({"type": "array", "items": False}, ["[]"], ["[1]"])


# ------------------------------------------------------------ anyOf / oneOf / allOf


def test_any_of_and_one_of_are_alternations() -> None:
    for word in ("anyOf", "oneOf"):
        schema = {word: [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 10}]}
        check(schema, ['"ab"', "10", "99999"], ['"abc"', "9", "null"])


def test_any_of_with_sibling_keywords_merges_into_each_branch() -> None:
    schema = {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "n": {"type": "integer"}},
        "anyOf": [{"required": ["kind"]}, {"required": ["n"]}],
    }
    check(schema, ['{"kind": "x"}', '{"n": 1}', '{"kind": "x", "n": 1}'], ["{}"])


def test_all_of_merges_objects() -> None:
    schema = {
        "allOf": [
            {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0}},
                "required": ["a"],
            },
            {"properties": {"a": {"maximum": 5}, "b": {"type": "string"}}, "required": ["b"]},
        ]
    }
    check(
        schema,
        ['{"a": 3, "b": "x"}', '{"a": 5, "b": ""}'],
        ['{"a": 6, "b": "x"}', '{"a": 3}', '{"b": "x"}'],
    )


def test_all_of_respects_each_members_additional_properties() -> None:
    schema = {
        "allOf": [
            {"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
            {"properties": {"b": {"type": "integer"}}},
        ]
    }
    check(schema, ['{"a": 1}', "{}"], ['{"a": 1, "b": 2}', '{"b": 2}'])
    schema2 = {
        "allOf": [
            {
                "properties": {"a": {"type": "integer"}},
                "additionalProperties": {"type": "integer", "maximum": 3},
            },
            {"properties": {"b": {"type": "integer"}}},
        ]
    }
    check(schema2, ['{"a": 9, "b": 3}'], ['{"a": 9, "b": 4}'])


def test_all_of_combines_bounds_types_and_enums() -> None:
    check(
        {
            "allOf": [
                {"type": ["integer", "string"]},
                {"type": "number", "minimum": 2},
                {"maximum": 4},
            ]
        },
        ["2", "4"],
        ["1", "5", '"a"', "3.5"],
    )
    check({"allOf": [{"enum": [1, 2, 3]}, {"enum": [2, 3, 4]}, {}]}, ["2", "3"], ["1", "4"])
    check(
        {"allOf": [{"type": "string", "minLength": 2}, {"maxLength": 3}, {"pattern": "^a"}]},
        ['"ab"', '"abc"'],
        ['"a"', '"abcd"', '"ba"'],
    )
    check(
        {
            "allOf": [
                {"type": "array", "prefixItems": [{"type": "integer"}]},
                {"items": {"type": "integer", "minimum": 0}},
            ]
        },
        ["[1, 2]", "[]"],
        ["[-1]", '[1, "a"]'],
    )


def test_all_of_with_any_of_members_multiplies_out() -> None:
    schema = {
        "allOf": [
            {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            {"anyOf": [{"type": "integer", "minimum": 5}, {"type": "string", "maxLength": 1}]},
        ]
    }
    # integer x string branches are unsatisfiable and dropped.
    check(schema, ["5", "7", '"a"', '""'], ['"ab"', "3", "null"])
    assert_samples_sound(schema)


def test_all_of_conflicts_are_reported() -> None:
    with pytest.raises(JsonSchemaError) as info:
        schema_to_gbnf({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]})
    assert info.value.keyword == "pattern"
    with pytest.raises(JsonSchemaError) as info:
        schema_to_gbnf({"allOf": [{"type": "string"}, {"type": "integer"}]})
    assert info.value.keyword == "type"
    with pytest.raises(JsonSchemaError):
        schema_to_gbnf({"allOf": [{"enum": [1]}, {"enum": [2]}]})
    with pytest.raises(JsonSchemaError):
        schema_to_gbnf({"allOf": [{"type": "integer"}, False]})


def test_unsatisfiable_branches_are_dropped() -> None:
    check(
        {"anyOf": [{"type": "integer", "minimum": 3, "maximum": 2}, {"type": "null"}]},
        ["null"],
        ["2"],
    )
    with pytest.raises(JsonSchemaError):
        schema_to_gbnf({"anyOf": [False, {"allOf": [{"type": "null"}, {"type": "string"}]}]})


# ---------------------------------------------------------------------- $ref


_TREE: dict[str, Any] = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["value"],
        }
    },
    "$ref": "#/$defs/node",
}


def test_recursive_ref() -> None:
    check(
        _TREE,
        ['{"value": 1}', '{"value": 1, "children": [{"value": 2, "children": []}, {"value": 3}]}'],
        ['{"children": []}', '{"value": 1, "children": [{}]}'],
    )
    assert gbnf(_TREE).count("node ::=") == 1  # one rule per definition
    assert_samples_sound(_TREE)


def test_definitions_pointer_escapes_and_root_ref() -> None:
    schema = {
        "definitions": {
            "a/b": {"type": "integer"},
            "c~d": {"type": "string"},
            "e f": {"type": "null"},
        },
        "type": "array",
        "prefixItems": [
            {"$ref": "#/definitions/a~1b"},
            {"$ref": "#/definitions/c~0d"},
            {"$ref": "#/definitions/e%20f"},
        ],
        "items": {"$ref": "#/prefixItems/0"},
    }
    check(schema, ['[1, "x", null]', '[1, "x", null, 5]'], ['["x"]', '[1, "x", null, "y"]'])
    check(
        {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]},
        ["[1, [2, []]]"],
        ['["a"]'],
    )


def test_ref_with_sibling_keywords() -> None:
    schema = {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 3}
    check(schema, ["3"], ["2"])


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        ("#/$defs/missing", "does not resolve"),
        ("other.json#/a", "only references"),
        ("https://example.com/s.json", "only references"),
        ("#anchor", "anchors"),
    ],
)
def test_bad_refs(ref: str, problem: str) -> None:
    with pytest.raises(JsonSchemaError, match=problem) as info:
        schema_to_gbnf({"$defs": {"x": {}}, "properties": {"a": {"$ref": ref}}})
    assert info.value.keyword == "$ref"
    assert info.value.path == "#/properties/a"


def test_circular_refs_are_errors() -> None:
    with pytest.raises(JsonSchemaError):
        schema_to_gbnf({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})
    with pytest.raises(JsonSchemaError):
        schema_to_gbnf({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"})


# ----------------------------------------------------------- types and nullable


def test_type_lists_and_inferred_types() -> None:
    check({"type": ["string", "null"], "maxLength": 1}, ['"a"', "null"], ['"ab"', "1"])
    check({"type": ["integer", "number"]}, ["1", "1.5"], ['"1"'])
    check({"minLength": 2}, ['"ab"'], ['"a"', "5"])  # a string keyword implies a string
    check({"minimum": 2}, ["2", "2.5"], ["1", '"x"'])
    check({"properties": {"a": {"type": "integer"}}}, ['{"a": 1}'], ['{"a": "x"}', "[]"])
    with pytest.raises(JsonSchemaError, match="unknown type"):
        schema_to_gbnf({"type": "float"})


def test_nullable() -> None:
    grammar = gbnf({"type": "string", "nullable": True, "maxLength": 2})
    for text, ok in (('"ab"', True), ("null", True), ('"abc"', False), ("1", False)):
        assert accepts(grammar, text) == ok
    grammar = gbnf({"enum": ["a"], "nullable": True})
    assert accepts(grammar, "null") and accepts(grammar, '"a"')
    grammar = gbnf({"anyOf": [{"type": "integer"}], "nullable": False})
    assert not accepts(grammar, "null")
    grammar = gbnf({"properties": {"a": {"type": "integer"}}, "nullable": True})
    assert accepts(grammar, "null") and accepts(grammar, '{"a": 1}')


def test_draft4_boolean_exclusive_bounds() -> None:
    schema = {
        "type": "integer",
        "minimum": 1,
        "exclusiveMinimum": True,
        "maximum": 3,
        "exclusiveMaximum": False,
    }
    grammar = gbnf(schema)
    for n in range(-2, 6):
        assert accepts(grammar, str(n)) == (2 <= n <= 3)
        assert Draft4Validator(schema).is_valid(n) == (2 <= n <= 3)


# ------------------------------------------------------------ keyword policy


def test_annotations_are_ignored() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.com/x",
        "$comment": "c",
        "title": "T",
        "description": "D",
        "examples": [1],
        "default": 1,
        "deprecated": True,
        "readOnly": True,
        "writeOnly": False,
        "type": "integer",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert schema_to_gbnf(schema) == schema_to_gbnf({"type": "integer"})


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "integer", "multipleOf": 2}, "multipleOf"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "array", "contains": {"type": "integer"}}, "contains"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties"),
        ({"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames"),
        ({"not": {"type": "string"}}, "not"),
        ({"if": {"type": "string"}}, "if"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
        ({"type": "string", "x-custom": 1}, "x-custom"),
        ({"properties": {"deep": {"items": {"unevaluatedItems": False}}}}, "unevaluatedItems"),
    ],
)
def test_unsupported_keywords(schema: dict[str, Any], keyword: str) -> None:
    with pytest.raises(JsonSchemaError, match=re.escape(keyword)) as info:
        schema_to_gbnf(schema)
    assert info.value.keyword == keyword
    assert isinstance(info.value, GrammarError) and isinstance(info.value, ValueError)
    with pytest.warns(UserWarning, match=re.escape(keyword)):
        grammar = schema_to_gbnf(schema, strict=False)
    assert "root ::=" in grammar


def test_unsupported_keyword_path_points_at_it() -> None:
    with pytest.raises(JsonSchemaError) as info:
        schema_to_gbnf(
            {"type": "object", "properties": {"a/b": {"type": "array", "items": {"multipleOf": 3}}}}
        )
    assert info.value.path == "#/properties/a~1b/items"
    assert str(info.value).startswith("#/properties/a~1b/items:")


def test_ignored_keyword_makes_the_grammar_looser_not_broken() -> None:
    with pytest.warns(UserWarning):
        grammar = schema_to_gbnf({"type": "integer", "multipleOf": 5}, strict=False)
    assert accepts(grammar, "3") and not accepts(grammar, '"3"')


def test_bad_keyword_values() -> None:
    schema: Any
    for schema in (
        {"type": "string", "minLength": -1},
        {"type": "string", "maxLength": "3"},
        {"type": "object", "required": "a"},
        {"type": "object", "properties": []},
        {"anyOf": []},
        {"allOf": {}},
        {"type": "string", "pattern": 5},
        {"type": []},
        {"$ref": 5},
        [1, 2],
    ):
        with pytest.raises(JsonSchemaError):
            schema_to_gbnf(schema)


# ------------------------------------------------------------------- output


def test_output_is_deterministic_and_names_are_valid() -> None:
    schema = {
        "$defs": {**_TREE["$defs"], "weird name/é": {"type": "string", "pattern": "^[^x]+$"}},
        "type": "object",
        "properties": {
            "t": {"$ref": "#/$defs/node"},
            "w": {"$ref": "#/$defs/weird name~1é"},
            "ws": {"type": "string", "format": "hostname"},
        },
    }
    first = schema_to_gbnf(schema)
    assert first == schema_to_gbnf(json.loads(json.dumps(schema)))
    assert first.startswith("root ::= ")
    names = [line.split(" ::= ")[0] for line in first.splitlines()]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[a-zA-Z0-9-]+", n) for n in names)
    assert first.isascii()


def test_identical_sub_rules_are_shared() -> None:
    item = {"type": "string", "pattern": "^[a-z]{3}$"}
    grammar = schema_to_gbnf(
        {
            "type": "object",
            "properties": {"a": item, "b": item, "c": {"type": "array", "items": item}},
        }
    )
    assert grammar.count("[a-z]{3}") == 1


def test_grammars_load_in_the_engine_parser() -> None:
    schemas = [
        {},
        _PERSON,
        _TREE,
        {"type": "string", "format": "uri"},
        {"type": "string", "format": "ipv6"},
        {"type": "string", "pattern": "^[^\\W\\d]+$"},
        {"type": "number", "minimum": -0.5, "maximum": 1e6},
        {"type": "string", "maxLength": 20_000},
        {"enum": ["\x00", "😀", "[]-^\\"]},
    ]
    for schema in schemas:
        text = schema_to_gbnf(schema)
        assert Grammar(text).n_rules > 0
        assert Grammar.from_json_schema(schema).source == text


# ------------------------------------------------------------------ pydantic


class Color(enum.Enum):
    red = "red"
    green = "green"


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool = True


class TreeNode(BaseModel):
    name: str = Field(min_length=1, max_length=20, pattern=r"^[a-z]+$")
    children: list[TreeNode] = []


class Pet(BaseModel):
    id: uuid.UUID
    born: datetime.date
    color: Color
    animal: Annotated[Cat | Dog, Field(discriminator="kind")]
    weight: float | None = Field(default=None, gt=0)
    tags: dict[str, int] = {}
    tree: TreeNode | None = None


def test_pydantic_model_input() -> None:
    grammar = schema_to_gbnf(Pet)
    assert grammar == schema_to_gbnf(Pet.model_json_schema())
    pet = Pet(
        id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
        born=datetime.date(2020, 2, 29),
        color=Color.green,
        animal=Cat(kind="cat", lives=7),
        weight=4.25,
        tags={"a": 1, "é": 2},
        tree=TreeNode(name="root", children=[TreeNode(name="leaf")]),
    )
    for text in (
        pet.model_dump_json(),
        pet.model_dump_json(indent=2),
        json.dumps(json.loads(pet.model_dump_json())),
    ):
        assert accepts(grammar, text), text
        assert Pet.model_validate_json(text) == pet
    minimal = (
        '{"id": "12345678-1234-5678-1234-567812345678", "born": "2021-01-01", '
        '"color": "red", "animal": {"kind": "dog"}}'
    )
    assert accepts(grammar, minimal)
    Pet.model_validate_json(minimal)
    for bad in (
        minimal.replace('"red"', '"blue"'),
        minimal.replace("2021-01-01", "2021-02-29"),
        minimal.replace('{"kind": "dog"}', '{"kind": "cat", "lives": 10}'),
        minimal.replace('"dog"', '"cow"'),
        minimal[:-1] + ', "weight": 0}',
    ):
        assert not accepts(grammar, bad), bad
    schema = Pet.model_json_schema()
    for value in assert_samples_sound(schema, n=25, seed=3):
        Pet.model_validate(value)


# ---------------------------------------------------------- property tests

_PATTERNS = [
    "^[a-z]+$",
    "ab",
    "^x",
    "y$",
    "^(foo|bar)+$",
    "[A-Z][a-z]*",
    "^[^\\s]{2,5}$",
    "colou?r",
    "^.{3}$",
]
_FORMATS = sorted(_FORMAT_CASES)
_NAMES = ["a", "b", "name", "é", "x y"]
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-20, 20),
    st.sampled_from([0.5, -2.25, 1e3]),
    st.text('abé"\\\n', max_size=3),
)


def _leaf_schemas() -> st.SearchStrategy[dict[str, Any]]:
    def bounded(kind: str) -> st.SearchStrategy[dict[str, Any]]:
        bound = (
            st.integers(-30, 30)
            if kind == "integer"
            else st.one_of(st.integers(-30, 30), st.sampled_from([-2.5, 0.1, 7.75]))
        )
        return st.fixed_dictionaries(
            {"type": st.just(kind)},
            optional={
                "minimum": bound,
                "maximum": bound,
                "exclusiveMinimum": bound,
                "exclusiveMaximum": bound,
            },
        )

    return st.one_of(
        st.just({}),
        st.sampled_from([{"type": "null"}, {"type": "boolean"}]),
        bounded("integer"),
        bounded("number"),
        st.fixed_dictionaries(
            {"type": st.just("string")},
            optional={"minLength": st.integers(0, 3), "maxLength": st.integers(0, 6)},
        ),
        st.builds(lambda p: {"type": "string", "pattern": p}, st.sampled_from(_PATTERNS)),
        st.builds(lambda f: {"type": "string", "format": f}, st.sampled_from(_FORMATS)),
        st.builds(lambda v: {"enum": v}, st.lists(_scalar, min_size=1, max_size=4)),
        st.builds(lambda v: {"const": v}, _scalar),
    )


#: One oneOf branch per type, so that oneOf branches never overlap.
_DISJOINT_BRANCHES: list[dict[str, Any]] = [
    {"type": "null"},
    {"type": "boolean"},
    {"type": "string", "maxLength": 2},
    {"type": "array"},
]


def _extend(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def obj(draw: st.DrawFn) -> dict[str, Any]:
        names = draw(st.lists(st.sampled_from(_NAMES), unique=True, max_size=3))
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {n: draw(children) for n in names},
        }
        schema["required"] = [n for n in names if draw(st.booleans())]
        extra = draw(st.sampled_from(["missing", "false", "true", "schema"]))
        if extra != "missing":
            schema["additionalProperties"] = (
                {"false": False, "true": True}.get(extra) if extra != "schema" else draw(children)
            )
        if draw(st.booleans()):
            schema["maxProperties"] = draw(st.integers(1, 3))
        if draw(st.booleans()):
            schema["minProperties"] = draw(st.integers(0, 2))
        return schema

    @st.composite
    def arr(draw: st.DrawFn) -> dict[str, Any]:
        schema: dict[str, Any] = {
            "type": "array",
            "items": draw(st.one_of(children, st.just(False))),
        }
        if draw(st.booleans()):
            schema["prefixItems"] = draw(st.lists(children, max_size=2))
        lo = draw(st.integers(0, 2))
        schema["minItems"] = lo
        if draw(st.booleans()):
            schema["maxItems"] = draw(st.integers(lo, 4))
        return schema

    one_of_disjoint = st.lists(
        st.sampled_from(_DISJOINT_BRANCHES),
        min_size=1,
        max_size=3,
        unique_by=lambda s: str(s["type"]),
    ).map(lambda branches: {"oneOf": branches})
    return st.one_of(
        obj(),
        arr(),
        st.lists(children, min_size=1, max_size=3).map(lambda b: {"anyOf": b}),
        st.lists(children, min_size=2, max_size=2).map(lambda b: {"allOf": b}),
        one_of_disjoint,
    )


_schemas = st.recursive(_leaf_schemas(), _extend, max_leaves=6)
_json_values = st.recursive(
    _scalar,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.dictionaries(st.sampled_from(_NAMES), kids, max_size=3)
    ),
    max_leaves=8,
)


def _compile_or_none(schema: dict[str, Any]) -> str | None:
    try:
        return schema_to_gbnf(schema)
    except JsonSchemaError:
        return None  # e.g. an unsatisfiable or unmergeable allOf


@given(_schemas, st.lists(_json_values, min_size=1, max_size=6))
@_PROPERTY
def test_random_schemas_accept_only_valid_documents(
    schema: dict[str, Any], values: list[Any]
) -> None:
    grammar = _compile_or_none(schema)
    assume(grammar is not None)
    assert grammar is not None
    for value in values:
        for text in (
            json.dumps(value),
            json.dumps(value, separators=(",", ":"), ensure_ascii=False),
        ):
            if accepts(grammar, text):
                assert valid(schema, value), (schema, text)


@given(_schemas, st.integers(0, 2**32))
@_PROPERTY
def test_random_schemas_samples_validate_and_round_trip(schema: dict[str, Any], seed: int) -> None:
    grammar = _compile_or_none(schema)
    assume(grammar is not None)
    assert grammar is not None
    sampler = Sampler(grammar)
    rnd = random.Random(seed)
    for _ in range(4):
        text = sampler.sample(rnd)
        assert accepts(grammar, text), (schema, text)
        value = json.loads(text)
        assert valid(schema, value), (schema, text)
        # The same value written by json.dumps (properties in the same order)
        # is accepted too, unless a bounded number came out with an exponent.
        again = json.dumps(value)
        if not re.search(r"\d[eE]", again):
            assert accepts(grammar, again), (schema, text, again)


# Schemas paired with a strategy for their valid instances (order-compatible).
_PAIRS: list[tuple[dict[str, Any], Callable[[], st.SearchStrategy[Any]]]] = [
    ({"type": "string"}, lambda: st.text(max_size=12)),
    ({"type": "string", "minLength": 2, "maxLength": 4}, lambda: st.text(min_size=2, max_size=4)),
    (
        {"type": "integer", "minimum": -(10**12), "maximum": 10**12},
        lambda: st.integers(-(10**12), 10**12),
    ),
    ({"type": "integer"}, lambda: st.integers(-(10**19), 10**19)),
    (
        {"type": "number", "minimum": -3.5, "exclusiveMaximum": 1000},
        lambda: st.one_of(
            st.integers(-3, 999),
            st.floats(-3.5, 1000, exclude_max=True).filter(lambda f: "e" not in repr(f)),
        ),
    ),
    (
        {"type": "number"},
        # Exponents have at most two digits (numbers stay finite doubles).
        lambda: st.floats(-1e99, 1e99).filter(lambda f: f == 0 or abs(f) >= 1e-99),
    ),
    (
        {"type": "string", "pattern": "^[a-c]{1,3}-[0-9]+$"},
        lambda: st.from_regex(r"\A[a-c]{1,3}-[0-9]+\Z"),
    ),
    ({"type": "string", "pattern": "[é😀]x"}, lambda: st.from_regex("[é😀]x")),
    (
        {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        lambda: st.lists(st.booleans(), max_size=3),
    ),
    (
        {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "null"}},
        lambda: st.tuples(st.text(max_size=3), st.lists(st.none(), max_size=2)).map(
            lambda t: [t[0], *t[1]]
        ),
    ),
    (
        {**_PERSON, "additionalProperties": {"type": "integer"}},
        lambda: st.fixed_dictionaries(
            {"name": st.text(max_size=5)},
            optional={"age": st.integers(0, 200), "email": st.just("a.b@example.org")},
        ).flatmap(
            lambda d: st.dictionaries(
                st.text(min_size=1, max_size=3).filter(lambda k: k not in _PERSON["properties"]),
                st.integers(-(10**18), 10**18),
                max_size=2,
            ).map(lambda extra: {k: d[k] for k in ("name", "age", "email") if k in d} | extra)
        ),
    ),
    ({"type": "string", "format": "date"}, lambda: st.dates().map(lambda d: d.isoformat())),
    ({"type": "string", "format": "uuid"}, lambda: st.uuids().map(str)),
    ({"type": "string", "format": "ipv4"}, lambda: st.ip_addresses(v=4).map(str)),
    ({"type": "string", "format": "ipv6"}, lambda: st.ip_addresses(v=6).map(str)),
    ({}, lambda: _json_values),
    (
        _TREE,
        lambda: st.recursive(
            st.builds(lambda v: {"value": v}, st.integers(-5, 5)),
            lambda kids: st.builds(
                lambda v, c: {"value": v, "children": c},
                st.integers(-5, 5),
                st.lists(kids, max_size=2),
            ),
            max_leaves=5,
        ),
    ),
]


@pytest.mark.parametrize("index", range(len(_PAIRS)))
def test_valid_instances_written_by_json_dumps_are_accepted(index: int) -> None:
    schema, instances = _PAIRS[index]
    grammar = gbnf(schema)

    @given(instances())
    @settings(max_examples=40, deadline=None)
    def run(value: Any) -> None:
        assert valid(schema, value)
        assert accepts(grammar, json.dumps(value)), json.dumps(value)
        assert accepts(grammar, json.dumps(value, ensure_ascii=False, indent=1))

    run()


def test_decimal_texts_near_float_bounds() -> None:
    # The shortest repr of every double in [0.1, 0.3] is accepted; neighbours outside are not.
    schema = {"type": "number", "minimum": 0.1, "maximum": 0.3}
    grammar = gbnf(schema)
    for x in (0.1, 0.3, 0.2, 0.30000000000000004, 0.09999999999999999):
        assert accepts(grammar, repr(x)) == (0.1 <= x <= 0.3), x
    assert accepts(grammar, str(Decimal("0.10000000000000000000001")))  # 23 fraction digits


def test_the_same_schema_shares_one_grammar() -> None:
    from oxillama import Grammar

    a = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string"}}}
    b = {"properties": {"y": {"type": "string"}, "x": {"type": "integer"}}, "type": "object"}
    g = Grammar.from_json_schema(a)
    assert Grammar.from_json_schema(b) is g  # key order does not matter
    assert Grammar.from_json_schema({"type": "integer"}) is not g
    assert Grammar.from_json_schema(a, strict=False) is not g
    # A changed copy is a different schema.
    a["properties"]["x"] = {"type": "number"}
    assert Grammar.from_json_schema(a) is not g
