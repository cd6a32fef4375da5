"""``allOf``: merging several JSON Schemas into one that implies them all.

A grammar cannot intersect two arbitrary languages, so ``allOf`` members are
merged keyword by keyword instead: types intersect, bounds take the tighter
value, ``required`` and ``enum`` combine, a property named by several
members must satisfy all of them (through a nested ``allOf``), a member's
``additionalProperties`` constrains the properties only other members
declare, ``items``/``prefixItems`` combine position by position, and
``anyOf``/``oneOf`` lists multiply out into one ``anyOf``. What cannot be
merged exactly (two different ``pattern`` or ``format`` values, or any other
keyword with two different values) raises :class:`JsonSchemaError` naming the
keyword. The result may be stricter than JSON Schema's ``allOf`` (never
looser): a merged object with ``properties`` is closed, as every object with
``properties`` is here.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from oxillama.decoding.grammar.keywords import ANNOTATIONS, DEFINITIONS
from oxillama.errors import JsonSchemaError

__all__ = ["MAX_ALTERNATIVES", "Unsatisfiable", "merge_schemas", "normalize_schema"]

#: Most anyOf branches the product of several anyOf/oneOf lists may have.
MAX_ALTERNATIVES = 256
_MAX_DEPTH = 64

Schema = Mapping[str, Any]


class Unsatisfiable(JsonSchemaError):
    """No JSON value satisfies the schema (or this part of it)."""


def normalize_schema(s: Schema) -> dict[str, Any]:
    """Rewrites older spellings into the forms the compiler handles:
    boolean ``exclusiveMinimum``/``exclusiveMaximum`` (draft 4), array-form
    ``items`` with ``additionalItems`` (before 2020-12), ``const`` (becomes a
    one-value ``enum``) and OpenAPI's ``nullable`` (adds ``"null"`` to
    ``type``, or null to ``enum``; without either it is kept, meaning "or
    null")."""
    out = dict(s)
    if out.get("nullable") is True and ("type" in out or "enum" in out or "const" in out):
        del out["nullable"]
        if "type" in out:
            types = [out["type"]] if isinstance(out["type"], str) else list(out["type"])
            out["type"] = types if "null" in types else [*types, "null"]
        if "enum" in out and isinstance(out["enum"], list):
            out["enum"] = [*out["enum"], None]
        if "const" in out:
            out["enum"] = [*(out.get("enum") or [out["const"]]), None]
            del out["const"]
    elif out.get("nullable") is False:
        del out["nullable"]
    for excl, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        flag = out.get(excl)
        if isinstance(flag, bool):
            del out[excl]
            if flag and bound in out:
                out[excl] = out.pop(bound)
    if isinstance(out.get("items"), list):
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    else:
        out.pop("additionalItems", None)  # meaningless without array-form items
    if "const" in out:
        const = out.pop("const")
        enum = out.get("enum")
        out["enum"] = [const] if enum is None else [v for v in enum if _same(v, const)]
    return out


def _key(v: Any) -> str:
    """A canonical text for JSON equality (1 and 1.0 count as different,
    which only makes merged enums smaller)."""
    return json.dumps(v, sort_keys=True)


def _same(a: Any, b: Any) -> bool:
    return _key(a) == _key(b)


def merge_schemas(
    schemas: Sequence[Any], resolve: Callable[[Any], Any], path: str
) -> dict[str, Any]:
    """One schema implying every schema in ``schemas`` (nested ``allOf``
    flattened, top-level ``$ref`` inlined by ``resolve``)."""
    flat: list[dict[str, Any]] = []

    def add(s: Any, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise JsonSchemaError(
                "allOf/$ref nest too deeply (circular?)", keyword="allOf", path=path
            )
        s = resolve(s)
        if s is True:
            return
        if s is False:
            raise Unsatisfiable("allOf contains a false schema", keyword="allOf", path=path)
        if not isinstance(s, Mapping):
            raise JsonSchemaError("allOf members must be schemas", keyword="allOf", path=path)
        for member in s.get("allOf", ()):
            add(member, depth + 1)
        rest = {k: v for k, v in s.items() if k != "allOf" and k not in ANNOTATIONS}
        flat.append(normalize_schema({k: v for k, v in rest.items() if k not in DEFINITIONS}))

    for s in schemas:
        add(s, 0)
    out: dict[str, Any] = {}
    alternatives: list[list[Any]] = []
    for s in flat:
        for word in ("anyOf", "oneOf"):
            if word in s:
                alternatives.append(list(s.pop(word)))
        out = _merge_two(out, s, path)
    if alternatives:
        count = 1
        for a in alternatives:
            count *= len(a)
        if count > MAX_ALTERNATIVES:
            raise JsonSchemaError(
                f"allOf of anyOf/oneOf lists expands to {count} alternatives "
                f"(more than {MAX_ALTERNATIVES})",
                keyword="allOf",
                path=path,
            )
        if len(alternatives) == 1:
            out["anyOf"] = alternatives[0]
        else:
            out["anyOf"] = [{"allOf": list(c)} for c in itertools.product(*alternatives)]
    return out


_TIGHTER_MIN = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_TIGHTER_MAX = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_OBJECT_WORDS = ("properties", "additionalProperties")
_ARRAY_WORDS = ("prefixItems", "items")
_MISSING = object()


def _conj(a: Any, b: Any) -> Any:
    """The schema requiring both ``a`` and ``b``."""
    if a is True or a is _MISSING:
        return b
    if b is True or b is _MISSING:
        return a
    if a is False or b is False:
        return False
    return {"allOf": [a, b]}


def _merge_two(a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in list(dict.fromkeys([*a, *b])):
        if key in _OBJECT_WORDS or key in _ARRAY_WORDS:
            continue
        if key not in a or key not in b:
            # A lone "or null" is void: the other member has no say on null.
            if key != "nullable":
                out[key] = a[key] if key in a else b[key]
            continue
        x, y = a[key], b[key]
        if key in _TIGHTER_MIN:
            out[key] = max(x, y)
        elif key in _TIGHTER_MAX:
            out[key] = min(x, y)
        elif key == "type":
            out[key] = _merge_types(x, y, path)
        elif key == "required":
            out[key] = list(dict.fromkeys([*x, *y]))
        elif key == "enum":
            keys = {_key(v) for v in y}
            out[key] = [v for v in x if _key(v) in keys]
            if not out[key]:
                raise Unsatisfiable("allOf members share no enum value", keyword="enum", path=path)
        elif key == "nullable":
            out[key] = x  # both True: kept (either False was normalized away)
        elif _same(x, y):
            out[key] = x
        else:
            raise JsonSchemaError(
                f"allOf members give {key!r} different values ({x!r} and {y!r}); "
                "they cannot be merged into one grammar",
                keyword=key,
                path=path,
            )
    if any(k in a or k in b for k in _OBJECT_WORDS):
        _merge_objects(a, b, out, path)
    if any(k in a or k in b for k in _ARRAY_WORDS):
        _merge_arrays(a, b, out)
    return out


def _merge_types(x: Any, y: Any, path: str) -> list[str]:
    xs = [x] if isinstance(x, str) else list(x)
    ys = [y] if isinstance(y, str) else list(y)
    both = [t for t in xs if t in ys]
    # An integer is a number: integer and number meet at integer.
    if "number" in xs and "integer" in ys and "integer" not in both:
        both.append("integer")
    if "integer" in xs and "number" in ys and "integer" not in both:
        both.append("integer")
    if not both:
        raise Unsatisfiable(
            f"allOf members share no type ({x!r} vs {y!r})", keyword="type", path=path
        )
    return both


_FORBIDDEN = object()


def _allowed(s: Mapping[str, Any], name: str) -> Any:
    """What ``s`` requires of property ``name``: a schema, None (nothing) or
    _FORBIDDEN."""
    props = s.get("properties", {})
    if name in props:
        return props[name]
    extra = s.get("additionalProperties", _MISSING)
    if extra is False:
        return _FORBIDDEN
    if extra is True or extra is _MISSING:
        return None
    return extra


def _merge_objects(a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], path: str) -> None:
    if "properties" in a or "properties" in b:
        props: dict[str, Any] = {}
        names = dict.fromkeys([*a.get("properties", {}), *b.get("properties", {})])
        for name in names:
            wants = [_allowed(a, name), _allowed(b, name)]
            if _FORBIDDEN in wants:
                if name in out.get("required", ()):
                    raise Unsatisfiable(
                        f"allOf: property {name!r} is required but another member forbids it",
                        keyword="additionalProperties",
                        path=path,
                    )
                continue
            merged: Any = True
            for w in wants:
                if w is not None:
                    merged = _conj(merged, w)
            props[name] = merged
        out["properties"] = props
    ea = a.get("additionalProperties", _MISSING)
    eb = b.get("additionalProperties", _MISSING)
    extra = _conj(ea, eb)
    if extra is not _MISSING:
        out["additionalProperties"] = extra


def _merge_arrays(a: dict[str, Any], b: dict[str, Any], out: dict[str, Any]) -> None:
    pa, pb = list(a.get("prefixItems", ())), list(b.get("prefixItems", ()))
    ia, ib = a.get("items", True), b.get("items", True)
    prefix: list[Any] = []
    for i in range(max(len(pa), len(pb))):
        both = _conj(pa[i] if i < len(pa) else ia, pb[i] if i < len(pb) else ib)
        if both is False:
            # No value may sit at position i: the array ends before it.
            out["maxItems"] = min(out.get("maxItems", i), i)
            break
        prefix.append(both)
    if prefix:
        out["prefixItems"] = prefix
    items = _conj(ia, ib)
    if items is not True:
        out["items"] = items
