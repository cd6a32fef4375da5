"""json-schema: the JSON Schema compiler on generated schemas (every type
and keyword it knows and some it does not, nesting up to a few hundred
levels, `$ref` into `$defs` and back to the root, huge bounds such as
`maxLength: 1000000000`), then the matcher on SmolLM2's vocabulary over a
JSON document's bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from oxillama import Grammar

from . import JsonTarget
from .real_model import smollm2

_bound = st.one_of(
    st.integers(0, 5), st.sampled_from([10**4, 10**6, 10**9, 10**7, 2**63, -1]), st.floats()
)
_leaf = st.one_of(
    st.sampled_from(
        [
            {},
            True,
            False,
            {"type": "string"},
            {"type": "integer"},
            {"type": "number"},
            {"type": "boolean"},
            {"type": "null"},
            {"$ref": "#"},
            {"$ref": "#/$defs/node"},
            {"$ref": "#/$defs/missing"},
            {"$ref": "http://example.com/x"},
            {"type": "string", "format": "date-time"},
            {"type": "string", "format": "uuid"},
            {"type": "string", "pattern": "^[a-z]{2,5}(-[0-9]+)*$"},
            {"type": "string", "pattern": "(a|b)*c{1000000}"},
            {"enum": ["a", 1, None, [1], {"k": 2}]},
            {"const": {"x": [1, 2]}},
            {"type": ["string", "null"]},
            {"not": {"type": "string"}},
        ]
    ),
    st.fixed_dictionaries(
        {"type": st.just("string")},
        optional={"minLength": _bound, "maxLength": _bound, "pattern": st.text(max_size=8)},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["integer", "number"])},
        optional={
            "minimum": _bound,
            "maximum": _bound,
            "exclusiveMinimum": _bound,
            "multipleOf": _bound,
        },
    ),
)


def _extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    props = st.dictionaries(st.text(max_size=6), inner, max_size=4)
    return st.one_of(
        st.builds(
            lambda p, req, extra: {
                "type": "object",
                "properties": p,
                "required": sorted(p)[:req],
                "additionalProperties": extra,
            },
            props,
            st.integers(0, 4),
            st.one_of(st.booleans(), inner),
        ),
        st.fixed_dictionaries(
            {"type": st.just("array"), "items": inner},
            optional={"minItems": _bound, "maxItems": _bound, "uniqueItems": st.booleans()},
        ),
        st.builds(lambda xs: {"type": "array", "prefixItems": xs}, st.lists(inner, max_size=3)),
        st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, max_size=3)),
        st.builds(lambda xs: {"oneOf": xs}, st.lists(inner, max_size=3)),
        st.builds(lambda xs: {"allOf": xs}, st.lists(inner, max_size=3)),
        st.builds(
            lambda d, s: {"$defs": {"node": d}, **s},
            inner,
            inner.filter(lambda s: isinstance(s, dict)),
        ),
    )


_schema = st.recursive(_leaf, _extend, max_leaves=12)
# Nested hundreds deep (arrays of arrays, objects of objects): kept as
# [depth, kind] and built at run time, so the saved input stays small and
# encodable.
_deep = st.tuples(st.sampled_from([50, 300, 3000]), st.sampled_from(["a", "o"]))


def _nest(n: int, kind: str) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer"}
    for _ in range(n):
        if kind == "a":
            s = {"type": "array", "items": s}
        else:
            s = {"type": "object", "properties": {"k": s}, "required": ["k"]}
    return s


_doc = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
STRATEGY = st.fixed_dictionaries(
    {
        "schema": st.one_of(_schema, _schema, _schema),
        "deep": st.none() | st.none() | _deep,
        "strict": st.booleans(),
        "document": _doc.map(json.dumps),
    }
)


class JsonSchemaTarget(JsonTarget):
    name = "json-schema"
    strategy = STRATEGY

    def setup(self, workdir: Path) -> None:
        self.tokenizer = smollm2().tokenizer

    def run(self, value: Any) -> None:
        schema = value["schema"] if value["deep"] is None else _nest(*value["deep"])
        grammar = Grammar.from_json_schema(schema, strict=value["strict"])
        matcher = grammar.matcher(self.tokenizer)
        matcher.mask()
        matcher.accept_bytes(value["document"].encode())
        matcher.is_accepting()


TARGETS = {"json-schema": JsonSchemaTarget}
