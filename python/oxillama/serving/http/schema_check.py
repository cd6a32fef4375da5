"""Checks a decoded JSON value against the subset of JSON Schema the
server's request schemas use, so that what ``/openapi.json`` publishes and
what the routes accept are one and the same thing.

Supported keywords: ``type`` (a name or a list), ``enum``, ``const``,
``minimum``, ``maximum``, ``exclusiveMinimum``, ``minLength``,
``maxLength``, ``pattern``, ``items``, ``minItems``, ``maxItems``,
``properties``, ``required``, ``additionalProperties``, ``maxProperties``,
``propertyNames``, ``anyOf``, ``$ref`` (to ``#/components/schemas/...``).
An integer-valued float (``2.0``) is an integer, as JSON Schema says, and
comes back as an ``int``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from oxillama.serving.http.api_error import ApiError

__all__ = ["SchemaViolation", "check"]

Schema = Mapping[str, Any]

_ARTICLE = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
    "object": "an object",
    "array": "an array",
}


class SchemaViolation(ApiError):
    """A request field that does not match its schema (a 400 naming it)."""

    def __init__(self, path: str, problem: str) -> None:
        top = re.split(r"[.\[]", path, maxsplit=1)[0]
        super().__init__(400, f"'{path}' {problem}", param=top or None)
        self.path = path


@lru_cache(maxsize=64)
def _pattern(p: str) -> re.Pattern[str]:
    # In JSON Schema (ECMA 262) a final "$" is the end of the string; in
    # Python it also matches before a final newline.
    if p.endswith("$") and not p.endswith("\\$"):
        p = p[:-1] + r"\Z"
    return re.compile(p)


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _is_type(v: Any, t: str) -> bool:
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if isinstance(v, bool):
        return False
    if t == "integer":
        return isinstance(v, int) or (isinstance(v, float) and v.is_integer())
    if t == "number":
        return isinstance(v, (int, float)) and math.isfinite(v)
    if t == "string":
        return isinstance(v, str)
    if t == "object":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    raise AssertionError(f"unsupported schema type {t}")


def check(value: Any, schema: Schema, path: str, defs: Mapping[str, Schema]) -> Any:
    """``value`` if it matches ``schema`` (integers normalized), else a
    :class:`SchemaViolation` naming ``path``."""
    if "$ref" in schema:
        schema = defs[str(schema["$ref"]).rsplit("/", 1)[-1]]
    if "anyOf" in schema:
        near: list[SchemaViolation] = []
        for option in schema["anyOf"]:
            try:
                return check(value, option, path, defs)
            except SchemaViolation as e:
                if _same_kind(value, option, defs):
                    near.append(e)
        if len(near) == 1:
            # One form has the value's type: its complaint is the useful one.
            raise near[0]
        raise SchemaViolation(path, f"must be {schema.get('description', 'another kind of value')}")
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        kind = next((t for t in names if _is_type(value, t)), None)
        if kind is None:
            want = " or ".join(_ARTICLE[t] for t in names)
            raise SchemaViolation(path, f"must be {want}, got {_short(value)}")
        if kind == "integer" and isinstance(value, float):
            value = int(value)
    if "const" in schema and not _equal(value, schema["const"]):
        raise SchemaViolation(path, f"must be {json.dumps(schema['const'])}, got {_short(value)}")
    if "enum" in schema and not any(_equal(value, e) for e in schema["enum"]):
        choices = ", ".join(json.dumps(e) for e in schema["enum"])
        raise SchemaViolation(path, f"must be one of {choices}, got {_short(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_number(value, schema, path)
    elif isinstance(value, str):
        _check_string(value, schema, path)
    elif isinstance(value, list):
        value = _check_array(value, schema, path, defs)
    elif isinstance(value, dict):
        value = _check_object(value, schema, path, defs)
    return value


def _same_kind(value: Any, schema: Schema, defs: Mapping[str, Schema]) -> bool:
    if "$ref" in schema:
        schema = defs[str(schema["$ref"]).rsplit("/", 1)[-1]]
    types = schema.get("type")
    if types is None:
        return False
    names = [types] if isinstance(types, str) else list(types)
    return any(_is_type(value, t) for t in names if t != "null")


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _check_number(v: float, schema: Schema, path: str) -> None:
    if "minimum" in schema and v < schema["minimum"]:
        raise SchemaViolation(path, f"must be at least {schema['minimum']}, got {_short(v)}")
    if "exclusiveMinimum" in schema and v <= schema["exclusiveMinimum"]:
        raise SchemaViolation(
            path, f"must be greater than {schema['exclusiveMinimum']}, got {_short(v)}"
        )
    if "maximum" in schema and v > schema["maximum"]:
        raise SchemaViolation(path, f"must be at most {schema['maximum']}, got {_short(v)}")


def _check_string(s: str, schema: Schema, path: str) -> None:
    if "minLength" in schema and len(s) < schema["minLength"]:
        raise SchemaViolation(path, f"must have at least {schema['minLength']} characters")
    if "maxLength" in schema and len(s) > schema["maxLength"]:
        raise SchemaViolation(
            path, f"has {len(s)} characters; at most {schema['maxLength']} are accepted"
        )
    if "pattern" in schema and not _pattern(schema["pattern"]).search(s):
        raise SchemaViolation(path, f"must match {schema['pattern']}, got {_short(s)}")


def _check_array(a: list[Any], schema: Schema, path: str, defs: Mapping[str, Schema]) -> list[Any]:
    if "minItems" in schema and len(a) < schema["minItems"]:
        raise SchemaViolation(path, f"must have at least {schema['minItems']} items")
    if "maxItems" in schema and len(a) > schema["maxItems"]:
        raise SchemaViolation(
            path, f"has {len(a)} items; at most {schema['maxItems']} are accepted"
        )
    items = schema.get("items")
    if items is None:
        return a
    return [check(v, items, f"{path}[{i}]", defs) for i, v in enumerate(a)]


def _check_object(
    d: dict[str, Any], schema: Schema, path: str, defs: Mapping[str, Schema]
) -> dict[str, Any]:
    if "maxProperties" in schema and len(d) > schema["maxProperties"]:
        raise SchemaViolation(
            path, f"has {len(d)} entries; at most {schema['maxProperties']} are accepted"
        )
    props: Mapping[str, Schema] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in d:
            raise SchemaViolation(f"{path}.{name}" if path else name, "is required")
    extra = schema.get("additionalProperties", True)
    names = schema.get("propertyNames")
    out: dict[str, Any] = {}
    for k, v in d.items():
        sub = f"{path}.{k}" if path else k
        if names is not None:
            check(k, names, f"{sub} (a key)", defs)
        if k in props:
            out[k] = check(v, props[k], sub, defs)
        elif extra is False:
            known = ", ".join(props)
            raise SchemaViolation(
                sub,
                f"is not a field this server accepts (unknown or unsupported); accepted: {known}",
            )
        elif isinstance(extra, Mapping):
            out[k] = check(v, extra, sub, defs)
        else:
            out[k] = v
    return out
