"""JSON Schema keywords with huge bounds compile in time and memory that do
not grow with the bound (or fail fast naming the keyword), $ref cycles that
admit no finite document are refused (and GBNF rules that can never finish),
and hostile nesting ends in a JsonSchemaError, never a RecursionError."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oxillama import _native
from oxillama.decoding.grammar import Grammar
from oxillama.decoding.grammar.compile import compile_gbnf
from oxillama.decoding.grammar.json_schema import schema_to_gbnf
from oxillama.errors import GrammarError, JsonSchemaError

BYTES = _native.VocabTrie([bytes([i]) for i in range(256)] + [b""], [False] * 256 + [True], [256])
# Generous bounds: without the fixes these cases take minutes, gigabytes or
# a RecursionError.
WALL = 20.0
PEAK = 64 << 20


def _matcher(g: Grammar) -> _native.GrammarMatcher:
    prog = _native.GrammarProgram(compile_gbnf(g.source).program(lambda t: 0))
    return _native.GrammarMatcher(prog, BYTES)


def complete(g: Grammar, text: str) -> bool:
    m = _matcher(g)
    return m.accept_bytes(text.encode()) and m.is_accepting()


def viable(g: Grammar, text: str) -> bool:
    return _matcher(g).accept_bytes(text.encode())


HUGE = {
    "maxLength": {"type": "string", "maxLength": 10**9},
    "minLength": {"type": "string", "minLength": 10**9},
    "min-maxLength": {"type": "string", "minLength": 3, "maxLength": 10**9},
    "maxItems": {"type": "array", "maxItems": 10**7},
    "minItems": {"type": "array", "minItems": 10**7},
    "min-maxItems": {"type": "array", "items": {"type": "integer"}, "maxItems": 10**9},
    "maxProperties": {"type": "object", "maxProperties": 10**7},
    "maxProperties+properties": {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": True,
        "maxProperties": 10**7,
    },
    "pattern+maxLength": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 10**9},
    "number-range": {"type": "number", "minimum": -1e300, "maximum": 1e300},
    "integer-range": {"type": "integer", "minimum": -(10**300), "maximum": 10**300},
    "nested-huge": {
        "type": "array",
        "items": {"type": "array", "items": {"type": "string", "maxLength": 10**9}},
        "maxItems": 10**9,
    },
}
REFUSED = {
    # (schema, keyword)
    "minProperties": ({"type": "object", "minProperties": 10**7}, "minProperties"),
    "pattern-count": ({"type": "string", "pattern": "^a{1,1000000000}$"}, "pattern"),
    "minimum-1e300": ({"type": "number", "minimum": 1e300}, "minimum"),
    "maximum-neg-1e300": ({"type": "number", "maximum": -1e300}, "maximum"),
    "integer-minimum-10^100": ({"type": "integer", "minimum": 10**100}, "minimum"),
}


def _measured(f: Any) -> tuple[Any, float, int]:
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        out = f()
        return out, time.monotonic() - t0, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", sorted(HUGE))
def test_huge_bounds_compile_without_growing_with_the_bound(name: str) -> None:
    g, seconds, peak = _measured(lambda: Grammar.from_json_schema(HUGE[name]))
    assert seconds < WALL and peak < PEAK, (seconds, peak)
    assert g.n_rules < 20_000


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_bounds_that_cannot_be_compiled_fail_fast_naming_the_keyword(name: str) -> None:
    schema, keyword = REFUSED[name]
    with pytest.raises(JsonSchemaError) as info:
        _measured(lambda: Grammar.from_json_schema(schema))
    assert info.value.keyword == keyword and info.value.path == "#"


def test_huge_bounds_match_exactly() -> None:
    g = Grammar.from_json_schema({"type": "string", "maxLength": 10**9})
    assert complete(g, '"' + "x" * 5000 + '"') and complete(g, '""')
    g = Grammar.from_json_schema({"type": "string", "minLength": 10**9})
    assert viable(g, '"' + "x" * 5000) and not complete(g, '"' + "x" * 5000 + '"')
    g = Grammar.from_json_schema({"type": "array", "minItems": 10**7})
    assert viable(g, "[1, 2, 3") and not complete(g, "[1, 2, 3]")
    # Exact at sizes a test can feed, through the shared (compact) bodies.
    g = Grammar.from_json_schema({"type": "string", "minLength": 9000, "maxLength": 10_000})
    for n, ok in ((8999, False), (9000, True), (10_000, True), (10_001, False)):
        assert complete(g, '"' + "é" * n + '"') == ok, n
    g = Grammar.from_json_schema({"type": "number", "minimum": -1e300, "maximum": 1e300})
    assert complete(g, "-12.5") and complete(g, "123456789")
    # Past 16 chunks of 1,000 the chunk counts split again (radix 16).
    g = Grammar.from_json_schema({"type": "string", "minLength": 20_001, "maxLength": 60_003})
    for n, ok in ((20_000, False), (20_001, True), (36_999, True), (60_003, True), (60_004, False)):
        assert complete(g, '"' + "x" * n + '"') == ok, n
    g = Grammar.from_json_schema(
        {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 2**63}
    )
    assert complete(g, "[1,2,3]") and not complete(g, "[1,2]")
    assert complete(g, "[" + ",".join(["7"] * 2500) + "]")


def test_big_bounds_share_their_chunks() -> None:
    """Every branch of a split bound reuses the same chunk repetitions, and
    the lowering builds each once, also when the GBNF text is read back
    (without it, ``maxItems: 2**63`` passed a million elements)."""
    schema = {"type": "string", "minLength": 1000, "maxLength": 2**64 - 1}
    g = Grammar.from_json_schema(schema)
    reread = compile_gbnf(g.source)
    assert g.n_rules == len(reread.rules) < 3_000
    assert len(reread.program(lambda t: 0)) < 200_000


@pytest.mark.parametrize("key", ["maxLength", "maxItems", "maxProperties"])
def test_upper_counts_of_2_64_or_more_are_no_bound(key: str) -> None:
    """No document a matcher can see holds 2**64 of anything, so the bound
    changes nothing and is compiled as absent (it used to take seconds)."""
    kind = {"maxLength": "string", "maxItems": "array", "maxProperties": "object"}[key]
    unbounded = Grammar.from_json_schema({"type": kind})
    for big in (2**64, 1e43, 1.7976931348623157e308):
        assert Grammar.from_json_schema({"type": kind, key: big}).source == unbounded.source


@pytest.mark.parametrize("key", ["minLength", "minItems", "minProperties"])
def test_lower_counts_of_2_64_or_more_are_unsatisfiable(key: str) -> None:
    kind = {"minLength": "string", "minItems": "array", "minProperties": "object"}[key]
    with pytest.raises(JsonSchemaError) as info:
        Grammar.from_json_schema({"type": kind, key: 1e43})
    assert info.value.keyword == key and "2**64" in str(info.value)
    # In one branch of a choice it drops only that branch.
    g = Grammar.from_json_schema({"anyOf": [{"type": kind, key: 2**64}, {"type": "null"}]})
    opener = {"string": '"', "array": "[", "object": "{"}[kind]
    assert complete(g, "null") and not viable(g, opener)


# ---------------------------------------------------------- productivity

INFINITE = {
    "required-self": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    "array-of-self": {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    "mutual": {
        "$defs": {
            "A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}, "required": ["b"]},
            "B": {"type": "array", "items": {"$ref": "#/$defs/A"}, "minItems": 1},
        },
        "$ref": "#/$defs/A",
    },
    "allOf-cycle": {
        "$defs": {
            "A": {"allOf": [{"$ref": "#/$defs/B"}]},
            "B": {
                "type": "object",
                "properties": {"x": {"$ref": "#/$defs/A"}},
                "required": ["x"],
            },
        },
        "$ref": "#/$defs/A",
    },
    "infinite-branch": {
        "anyOf": [{"type": "null"}, {"$ref": "#/$defs/bad"}],
        "$defs": {
            "bad": {
                "type": "object",
                "properties": {"x": {"$ref": "#/$defs/bad"}},
                "required": ["x"],
            }
        },
    },
}
FINITE = {
    "optional-self": {"type": "object", "properties": {"a": {"$ref": "#"}}},
    "array-may-be-empty": {"type": "array", "items": {"$ref": "#"}},
    "escape-by-null": {
        "anyOf": [
            {"type": "null"},
            {"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]},
        ]
    },
    "linked-list": {
        "type": "object",
        "properties": {
            "v": {"type": "integer"},
            "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
        },
        "required": ["v", "next"],
    },
}


@pytest.mark.parametrize("name", sorted(INFINITE))
def test_ref_cycles_without_a_finite_document_are_refused(name: str) -> None:
    for compile_ in (Grammar.from_json_schema, schema_to_gbnf):
        with pytest.raises(JsonSchemaError, match="no finite document") as info:
            compile_(INFINITE[name])
        assert info.value.keyword == "$ref" and info.value.path.startswith("#")
    if name in ("mutual", "allOf-cycle"):
        assert info.value.path == "#/$defs/A"


@pytest.mark.parametrize("name", sorted(FINITE))
def test_recursive_schemas_with_finite_documents_compile(name: str) -> None:
    g = Grammar.from_json_schema(FINITE[name])
    assert g.n_rules > 0


def test_gbnf_rules_that_never_finish_are_refused_by_name() -> None:
    for src, rule in (
        ('root ::= "a" x\nx ::= "b" x', "x"),
        ('root ::= "a" | x\nx ::= "b" x', "x"),  # reachable: a generation could enter it
        ('root ::= "a"\nunused ::= "(" unused ")"', "unused"),
        ("root ::= x\nx ::= y\ny ::= x", "x"),
        ('root ::= "a" root', "root"),
    ):
        with pytest.raises(GrammarError, match=f"rule '{rule}' can never finish") as info:
            Grammar(src)
        assert info.value.line is not None
    # Recursion with a way out is fine.
    assert Grammar('root ::= "(" root ")" | "x"').n_rules >= 1
    assert Grammar('root ::= x\nx ::= "b" x | "b"').n_rules >= 2


# ------------------------------------------------------------- nesting


def _nested(kind: str, depth: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        if kind == "properties":
            s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
        elif kind == "items":
            s = {"type": "array", "items": s}
        elif kind == "anyOf":
            s = {"anyOf": [s, {"type": "null"}]}
        else:
            s = {"allOf": [s]}
    return s


@pytest.mark.parametrize("kind", ["properties", "items", "anyOf", "allOf"])
def test_deep_schemas_are_a_json_schema_error(kind: str) -> None:
    for depth in (10_000, 300, 129):
        for compile_ in (Grammar.from_json_schema, schema_to_gbnf):
            with pytest.raises(JsonSchemaError):
                compile_(_nested(kind, depth))
    assert Grammar.from_json_schema(_nested(kind, 20)).n_rules > 0


def test_a_schema_that_contains_itself_is_a_json_schema_error() -> None:
    s: dict[str, Any] = {"type": "object", "properties": {}}
    s["properties"]["a"] = s
    with pytest.raises(JsonSchemaError, match="nests deeper"):
        Grammar.from_json_schema(s)


def _anyof_ladder(levels: int) -> dict[str, Any]:
    """d0 -> d1 -> ... in two anyOf branches each, beside a sibling keyword:
    every level is merged and compiled once per path, 2**levels in all."""
    defs: dict[str, Any] = {
        f"d{i}": {
            "type": "object",
            "anyOf": [
                {"$ref": f"#/$defs/d{i + 1}"},
                {"$ref": f"#/$defs/d{i + 1}", "required": ["a"]},
            ],
        }
        for i in range(levels)
    }
    defs[f"d{levels}"] = {"type": "object"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def test_an_anyof_ladder_is_refused_before_it_unfolds_exponentially() -> None:
    # 10 levels (1,024 paths) compile; 40 would take 2**40 merges (16
    # levels took 14 s and 24 would take hours before the merge budget).
    Grammar.from_json_schema(_anyof_ladder(10))
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(JsonSchemaError, match="more than 4096 allOf/anyOf merges"):
            Grammar.from_json_schema(_anyof_ladder(40))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < WALL
    assert peak < PEAK


# ------------------------------------------------------- mutated schemas

_bound = st.one_of(
    st.integers(0, 10), st.integers(10**6, 10**12), st.just(-1), st.floats(allow_nan=True)
)
_ref = st.sampled_from(["#", "#/properties/a", "#/$defs/x", "#/items", "#/nope", "x"])


def _schemas() -> st.SearchStrategy[Any]:
    leaf = st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["string", "integer", "number", "array", "object", "null"]),
            "maxLength": _bound,
            "minLength": _bound,
            "minItems": _bound,
            "maxItems": _bound,
            "minProperties": _bound,
            "maxProperties": _bound,
            "minimum": st.one_of(_bound, st.just(1e300)),
            "maximum": st.one_of(_bound, st.just(-1e300)),
            "pattern": st.sampled_from(["^a{1,3}$", "^[a-z]+$", "a{2000}", "("]),
            "$ref": _ref,
        },
    )
    return st.recursive(
        leaf,
        lambda inner: st.fixed_dictionaries(
            {},
            optional={
                "type": st.just("object"),
                "properties": st.dictionaries(st.sampled_from("ab"), inner, max_size=2),
                "required": st.lists(st.sampled_from("ab"), max_size=2),
                "items": inner,
                "anyOf": st.lists(inner, min_size=1, max_size=2),
                "allOf": st.lists(inner, min_size=1, max_size=2),
                "$defs": st.fixed_dictionaries({"x": inner}),
                "$ref": _ref,
            },
        ),
        max_leaves=8,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schemas())
def test_mutated_schemas_compile_or_raise_json_schema_error(schema: Any) -> None:
    t0 = time.monotonic()
    try:
        Grammar.from_json_schema(schema)
    except JsonSchemaError as e:
        assert e.path.startswith("#")
    except GrammarError as e:  # the lowering's own bounds (nesting, size)
        assert "deeper than" in str(e) or "elements" in str(e), e
    assert time.monotonic() - t0 < WALL
