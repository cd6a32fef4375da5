"""The JSON Schema keywords the compiler knows, by role."""

from __future__ import annotations

__all__ = [
    "ANNOTATIONS",
    "ARRAY_WORDS",
    "DEFINITIONS",
    "NUMBER_WORDS",
    "OBJECT_WORDS",
    "STRING_WORDS",
    "SUPPORTED",
]

#: Keywords that never constrain a value, always ignored. ``discriminator``
#: (OpenAPI, emitted by pydantic) only names the property a ``oneOf``
#: already tells apart.
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "examples",
        "default",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "discriminator",
    }
)
#: Containers of definitions: read through ``$ref``, never compiled in place.
DEFINITIONS = frozenset({"$defs", "definitions"})

OBJECT_WORDS = frozenset(
    {"properties", "required", "additionalProperties", "minProperties", "maxProperties"}
)
ARRAY_WORDS = frozenset({"items", "prefixItems", "additionalItems", "minItems", "maxItems"})
STRING_WORDS = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER_WORDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})

SUPPORTED = (
    frozenset({"type", "nullable", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"})
    | OBJECT_WORDS
    | ARRAY_WORDS
    | STRING_WORDS
    | NUMBER_WORDS
)
