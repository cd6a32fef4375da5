"""JSON Schema to GBNF: the grammar of JSON texts valid against a schema.

>>> schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
>>> print(schema_to_gbnf(schema), end="")
root ::= "{" ws from0 "}"
ws ::= (" " | "\\n" [\\t ]{0,20})?
boolean ::= "true" | "false"
from0 ::= "\\"ok\\"" ws ":" ws boolean ws

The grammar's start rule is ``root``; the output is deterministic. Every
text it accepts is JSON that ``json.loads`` parses and that validates
against the schema (given the notes below); it accepts the usual ways of
writing such documents, including ``json.dumps`` output with its default
separators and ``ensure_ascii`` escapes.

Supported: ``type`` (one or a list), ``enum``, ``const``, ``anyOf``, ``oneOf``,
``allOf``, local ``$ref`` into the document (``$defs``, ``definitions`` or any
JSON pointer; one rule per target, so recursive schemas work), ``properties``,
``required``, ``additionalProperties``, ``minProperties``, ``maxProperties``,
``items``, ``prefixItems`` (and the older array ``items`` with
``additionalItems``), ``minItems``, ``maxItems``, ``minLength``, ``maxLength``,
``pattern`` (see :mod:`.regex`), ``format`` (date, time, date-time, duration,
uuid, email, ipv4, ipv6, hostname, uri; see :mod:`.formats`), ``minimum``,
``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum`` (also draft 4's boolean
forms) and OpenAPI's ``nullable``. Annotations (``title``, ``description``,
``examples``, ``default``, ``$schema``, ``$id``, ``$comment``, ``deprecated``,
``readOnly``, ``writeOnly``, ``discriminator``) are ignored. Any other
keyword raises :class:`~oxillama.errors.JsonSchemaError` naming it, or with
``strict=False`` warns and is ignored (the grammar is then looser than the
schema).

Choices a grammar forces (all but the ``oneOf`` one on the side of accepting
less):

* Objects that list ``properties`` are closed unless
  ``additionalProperties`` explicitly allows more (JSON Schema's default is
  open; a model should not invent keys). An object schema without
  ``properties`` (e.g. ``{"type": "object"}``) allows any members.
* Properties appear in the schema's order, required ones always, optional
  ones possibly not; extra properties (when allowed) come after them.
  A repeated extra key collapses into one when parsed, so extra properties
  count at most once towards ``minProperties``; a minimum that would need
  more is reported as unsupported.
* ``oneOf`` is an alternation: a value matching several branches is accepted
  although ``oneOf`` rejects it. Give the branches disjoint shapes (different
  types, or a ``const`` discriminator), as generated schemas do.
* ``allOf`` is merged into one schema (see :mod:`.schema_merge`); members
  that cannot be merged exactly raise an error naming the keyword.
  Branches and optional properties that no value can satisfy are dropped.
* Whitespace between tokens is bounded: nothing, one space, or a newline
  then at most :data:`MAX_INDENT` spaces or tabs, so a model cannot emit
  whitespace forever. No whitespace precedes or follows the document.
* Numbers: see :mod:`.numeric` (bounded numbers are written without an
  exponent; unbounded digit runs are capped). Integers are written without
  a fraction or exponent.
* Strings never contain escapes of lone surrogates. A ``pattern`` or
  ``format`` combined with ``minLength``/``maxLength`` works when the
  lengths can be pushed into the regex (one part of varying length, e.g.
  ``^[a-z]+$``); otherwise it is reported as unsupported. ``pattern`` and
  ``format`` together are unsupported.
* A count bound (``maxLength``, ``maxItems``, ``maxProperties``) of
  :data:`UNREACHABLE_COUNT` (2**64) or more is no bound: no document a
  matcher can ever see is that long, so the unbounded grammar accepts
  exactly the same documents, and is far smaller. A lower count bound that
  large can never be met and is a :class:`JsonSchemaError`.
* Without ``type``, the type follows from the keywords present (``minLength``
  means a string, and so on); with none, any JSON value.
* ``enum``/``const`` values are checked against the other keywords of their
  schema and left out when they fail; keywords that cannot be checked there
  (``properties``, ``items``, ...) are reported as unsupported.
"""

from __future__ import annotations

import functools
import json
import math
import re
import urllib.parse
import warnings
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from oxillama.decoding.grammar import gbnf
from oxillama.decoding.grammar.charset import ALL, Ranges, single, subtract
from oxillama.decoding.grammar.formats import FORMATS
from oxillama.decoding.grammar.gbnf_writer import (
    EMPTY,
    Expr,
    RuleSet,
    alt,
    char_class,
    literal,
    opt,
    ref,
    rep,
    seq,
)
from oxillama.decoding.grammar.json_strings import string_literal, units
from oxillama.decoding.grammar.keywords import (
    ANNOTATIONS,
    ARRAY_WORDS,
    DEFINITIONS,
    NUMBER_WORDS,
    OBJECT_WORDS,
    STRING_WORDS,
    SUPPORTED,
)
from oxillama.decoding.grammar.numeric import (
    INT_DIGITS,
    bounded_number,
    integer_range,
    unbounded_integer,
    unbounded_number,
)
from oxillama.decoding.grammar.productive import causes, unproductive
from oxillama.decoding.grammar.regex import LengthUnsupported, RegexError, compile_regex
from oxillama.decoding.grammar.schema_merge import Unsatisfiable, merge_schemas, normalize_schema
from oxillama.errors import JsonSchemaError

__all__ = ["MAX_INDENT", "schema_to_gbnf"]

#: Most spaces or tabs after a newline between two tokens.
MAX_INDENT = 20
#: Most digits a numeric bound may force a numeral to have (each digit of
#: a bound is one level of the digit grammar).
MAX_BOUND_DIGITS = 60
#: Deepest nesting of the schema document (objects and arrays); schemas
#: compile recursively, and real ones nest a few dozen levels.
MAX_SCHEMA_DEPTH = 128
#: Most allOf/anyOf merges one schema may take to compile. A merge per
#: anyOf branch beside sibling keywords, and per allOf: real schemas take
#: tens to a few hundred (an allOf of anyOf lists expands to at most
#: MAX_ALTERNATIVES at one level).
MAX_MERGES = 4096

_TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")
_MISSING = object()


def schema_to_gbnf(schema: Mapping[str, Any] | Any, *, strict: bool = True) -> str:
    """GBNF (llama.cpp dialect, start rule ``root``) for JSON texts valid
    against ``schema``: a dict, a boolean, or anything with
    ``model_json_schema()`` (a pydantic v2 model). Raises
    :class:`~oxillama.errors.JsonSchemaError`; with ``strict=False``,
    unsupported keywords warn and are ignored instead."""
    rules, _ = _build(schema, strict)
    return rules.render("root")


def schema_to_rules(
    schema: Mapping[str, Any] | Any, *, strict: bool = True
) -> tuple[str, list[gbnf.Rule]]:
    """:func:`schema_to_gbnf`'s text together with the syntax tree
    ``gbnf.parse`` would read from it, built directly (parsing the text back
    was half of a schema's compile time)."""
    rules, parsed = _build(schema, strict)
    return rules.render("root"), parsed


def as_schema(schema: Mapping[str, Any] | Any) -> Any:
    """``schema`` itself, or the JSON Schema of a pydantic model; refused
    when it nests deeper than :data:`MAX_SCHEMA_DEPTH`."""
    if not isinstance(schema, (Mapping, bool)) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    _check_depth(schema)
    return schema


def _check_depth(document: Any) -> None:
    """Walks the document without recursion (it may nest 100,000 deep, or,
    built in Python, contain itself), so the recursive compile never meets
    more than MAX_SCHEMA_DEPTH levels."""
    deepest: dict[int, int] = {}
    stack: list[tuple[Any, int, str]] = [(document, 0, "#")]
    while stack:
        node, depth, path = stack.pop()
        if not isinstance(node, (Mapping, list)):
            continue
        if depth >= MAX_SCHEMA_DEPTH:
            raise JsonSchemaError(
                f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels", path=path
            )
        if deepest.get(id(node), -1) >= depth:
            continue  # a part shared by reference, already walked as deep
        deepest[id(node)] = depth
        if isinstance(node, Mapping):
            for k, v in node.items():
                stack.append((v, depth + 1, f"{path}/{_escape_pointer(str(k))}"))
        else:
            for i, v in enumerate(node):
                stack.append((v, depth + 1, f"{path}/{i}"))


def _build(schema: Mapping[str, Any] | Any, strict: bool) -> tuple[RuleSet, list[gbnf.Rule]]:
    schema = as_schema(schema)
    compiler = _Compiler(schema, strict)
    try:
        body = compiler.compile(schema, "#", "")
    except RecursionError as e:
        # The depth check bounds the document; $ref and allOf chains can
        # still nest the walk (each has its own bound, this is the net).
        raise JsonSchemaError("the schema nests too deeply to compile") from e
    compiler.rules.define("root", body)
    parsed = compiler.rules.parsed("root")
    stuck = unproductive(parsed)
    if stuck:
        # Name the referenced schema that recurses without end: a rule made
        # for a $ref target if one is stuck, else the root.
        first = causes(parsed, stuck)
        pointer = next((compiler.ref_pointers[n] for n in first if n in compiler.ref_pointers), "#")
        raise JsonSchemaError(
            f"$ref {pointer!r} admits no finite document: every value of it must contain "
            "another (a required property, a non-empty array or an allOf that refers back)",
            keyword="$ref",
            path=pointer,
        )
    for message in compiler.warnings:
        warnings.warn(message, stacklevel=3)
    return compiler.rules, parsed


# Parts of every compiled schema that depend on nothing but this module are
# built once, at import: the JSON primitives and the `format` grammars. A
# first schema then compiles in a few milliseconds instead of paying for
# them (measured on bench_grammar's schema: ~40% of a cold compile).


@functools.cache
def _prim_body(name: str) -> Expr:
    """The body of a primitive rule that refers to no other rule."""
    if name == "ws":
        return opt(
            alt(
                literal(" "),
                seq(literal("\n"), rep(char_class(((9, 9), (32, 32))), 0, MAX_INDENT)),
            )
        )
    if name == "char":
        everything = units(ALL, every_form=True)
        assert everything is not None
        return everything
    if name == "number":
        return unbounded_number()
    if name == "integer":
        return unbounded_integer()
    if name == "boolean":
        return alt(literal("true"), literal("false"))
    if name == "null":
        return literal("null")
    raise AssertionError(name)


class _Impure(Exception):
    """A format grammar needs a shared rule, so it is built per schema."""


def _rule_free_units(ranges: Ranges) -> Expr | None:
    # What `_Compiler.units` returns when it creates no rule.
    if ranges == ALL:
        raise _Impure
    found = units(ranges)
    if found is not None and len(found.text) > 40:
        raise _Impure
    return found


@functools.cache
def _format_expr(fmt: str | None) -> Expr | None:
    """The grammar of a string's content for ``format`` without length
    bounds, when it needs no shared rule (else None: built per schema)."""
    regex = FORMATS.get(fmt) if isinstance(fmt, str) else None
    if regex is None:
        return None
    try:
        return compile_regex(regex, _rule_free_units)
    except (_Impure, RegexError, LengthUnsupported):
        return None


for _name in ("ws", "char", "number", "integer", "boolean", "null"):
    _prim_body(_name)
for _fmt in FORMATS:
    _format_expr(_fmt)


def _escape_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _child(hint: str, name: str) -> str:
    return f"{hint}-{name}" if hint else name


#: Counts no document can reach (see the module's notes): 2**64 bytes,
#: items or properties is more than any address space holds.
UNREACHABLE_COUNT = 2**64


def _nonneg_int(s: Mapping[str, Any], key: str, path: str, default: int | None) -> int | None:
    value = s.get(key, default)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise JsonSchemaError(
            f"{key} must be a non-negative integer, got {value!r}", keyword=key, path=path
        )
    if value >= UNREACHABLE_COUNT:
        if key.startswith("max"):
            return None  # the same documents as no bound, and a far smaller grammar
        raise Unsatisfiable(
            f"{key} {value} is at least 2**64: no document can be that long",
            keyword=key,
            path=path,
        )
    return value


def _is_type(v: Any, t: str) -> bool:
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "string":
        return isinstance(v, str)
    if t == "array":
        return isinstance(v, list)
    if t == "object":
        return isinstance(v, dict)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return t == "number" or isinstance(v, int) or v.is_integer()


class _Compiler:
    def __init__(self, document: Any, strict: bool) -> None:
        self.document = document
        self.strict = strict
        self.rules = RuleSet()
        self.rules.reserve("root")
        self.refs: dict[str, Expr] = {}
        #: The $ref target each reference rule was made for, by rule name.
        self.ref_pointers: dict[str, str] = {}
        self.prims: dict[str, Expr] = {}
        self.unit_cache: dict[Ranges, Expr | None] = {}
        self.warnings: list[str] = []
        #: allOf/anyOf merges so far (see :meth:`merge`).
        self.merges = 0

    # ----------------------------------------------------------- diagnostics

    def unsupported(self, keyword: str, path: str, detail: str = "") -> None:
        """Raises for an unsupported keyword, or (not strict) records a
        warning so the caller ignores it."""
        message = f"unsupported keyword {keyword!r}" + (f" ({detail})" if detail else "")
        if self.strict:
            raise JsonSchemaError(message, keyword=keyword, path=path)
        warning = f"{path}: {message}; ignored"
        if warning not in self.warnings:
            self.warnings.append(warning)

    def merge(self, schemas: list[Any], path: str) -> dict[str, Any]:
        """``merge_schemas`` under a budget for the whole document. Merging
        inlines top-level ``$ref``s, so an ``anyOf`` whose branches refer
        back to a schema with sibling keywords unfolds a fresh copy at every
        level, two or more per level: without a bound a 200-byte schema
        takes gigabytes (found by the mutated-schema property test)."""
        self.merges += 1
        if self.merges > MAX_MERGES:
            raise JsonSchemaError(
                f"the schema unfolds into more than {MAX_MERGES} allOf/anyOf merges "
                "(an anyOf or allOf that refers back to itself through $ref beside "
                "other keywords?)",
                keyword="$ref",
                path=path,
            )
        return merge_schemas(schemas, self.inline, path)

    # ------------------------------------------------------------ primitives

    def prim(self, name: str) -> Expr:
        """A shared rule of the JSON syntax, defined on first use."""
        found = self.prims.get(name)
        if found is not None:
            return found
        if name in ("value", "object", "array"):
            # Mutually recursive: name all three before building any.
            for n in ("value", "object", "array"):
                self.prims[n] = ref(self.rules.reserve(n))
            ws = self.prim("ws")
            value, obj, arr = self.prims["value"], self.prims["object"], self.prims["array"]
            member = seq(self.prim("string"), ws, literal(":"), ws, value, ws)
            comma = seq(literal(","), ws)
            self.rules.define(
                obj.text,
                seq(
                    literal("{"),
                    ws,
                    opt(seq(member, rep(seq(comma, member), 0, None))),
                    literal("}"),
                ),
            )
            item = seq(value, ws)
            self.rules.define(
                arr.text,
                seq(literal("["), ws, opt(seq(item, rep(seq(comma, item), 0, None))), literal("]")),
            )
            scalars = [self.prim(n) for n in ("string", "number", "boolean", "null")]
            self.rules.define(value.text, alt(obj, arr, *scalars))
            return self.prims[name]
        if name == "string":
            body = seq(literal('"'), rep(self.prim("char"), 0, None), literal('"'))
        else:
            body = _prim_body(name)
        rule = ref(self.rules.reserve(name))
        self.rules.define(rule.text, body)
        self.prims[name] = rule
        return rule

    def units(self, ranges: Ranges) -> Expr | None:
        """One string character from ``ranges``, shared as a rule when big."""
        if ranges not in self.unit_cache:
            if ranges == ALL:
                found: Expr | None = self.prim("char")
            else:
                found = units(ranges)
                if found is not None and len(found.text) > 40:
                    found = self.rules.add("char-set", found)
            self.unit_cache[ranges] = found
        return self.unit_cache[ranges]

    def sub_rule(self, hint: str, expr: Expr) -> Expr:
        """``expr`` as a named rule unless it is already small."""
        if not hint or (expr.prec == 2 and len(expr.text) <= 40):
            return expr  # the root rule holds top-level expressions itself
        return self.rules.add(hint, expr)

    # ------------------------------------------------------------- the walk

    def compile(self, schema: Any, path: str, hint: str) -> Expr:
        """The grammar of values valid against ``schema``."""
        if schema is True:
            return self.prim("value")
        if schema is False:
            raise Unsatisfiable("the schema 'false' admits no value", path=path)
        if not isinstance(schema, Mapping):
            raise JsonSchemaError(
                f"a schema must be an object or a boolean, not {type(schema).__name__}", path=path
            )
        s = self.checked(schema, path)
        if "$ref" in s:
            target = s.pop("$ref")
            if not s:
                return self.reference(target, path)
            return self.compile({"allOf": [{"$ref": target}, s]}, path, hint)
        if "allOf" in s:
            members = s.pop("allOf")
            if not isinstance(members, list):
                raise JsonSchemaError("allOf must be a list", keyword="allOf", path=path)
            merged = self.merge([s, *members], path + "/allOf")
            return self.compile(merged, path + "/allOf", hint)
        s = normalize_schema(s)
        if "anyOf" in s or "oneOf" in s:
            return self.alternatives(s, path, hint)
        if "enum" in s:
            return self.sub_rule(hint, self.enum(s, path))
        if s.get("nullable") is True:
            del s["nullable"]
            return self.sub_rule(hint, alt(self.compile(s, path, hint), self.prim("null")))
        s.pop("nullable", None)
        return self.typed(s, path, hint)

    def checked(self, schema: Mapping[str, Any], path: str) -> dict[str, Any]:
        """The schema's constraint keywords; annotations dropped, unsupported
        ones reported."""
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key in ANNOTATIONS or key in DEFINITIONS:
                continue
            if key in SUPPORTED:
                out[key] = value
            elif key == "uniqueItems" and value is False:
                continue  # asks for nothing
            else:
                self.unsupported(key, path)
        fmt = out.get("format")
        if fmt is not None and fmt not in FORMATS:
            self.unsupported("format", path, f"format {fmt!r}")
            del out["format"]
        return out

    def alternatives(self, s: dict[str, Any], path: str, hint: str) -> Expr:
        if "anyOf" in s and "oneOf" in s:
            merged = self.merge([s], path)
            return self.compile(merged, path, hint)
        word = "anyOf" if "anyOf" in s else "oneOf"
        branches = s.pop(word)
        if not isinstance(branches, list) or not branches:
            raise JsonSchemaError(f"{word} must be a non-empty list", keyword=word, path=path)
        options: list[Expr] = []
        failures: list[Unsatisfiable] = []
        for i, branch in enumerate(branches):
            where = f"{path}/{word}/{i}"
            try:
                if s:
                    merged = self.merge([s, branch], where)
                    options.append(self.compile(merged, where, hint))
                else:
                    options.append(self.compile(branch, where, hint))
            except Unsatisfiable as e:
                failures.append(e)  # this branch can never match: drop it
        if not options:
            raise failures[0]
        return self.sub_rule(hint, alt(*options))

    # ------------------------------------------------------------- $ref

    def resolve(self, pointer: Any, path: str) -> Any:
        if not isinstance(pointer, str):
            raise JsonSchemaError("$ref must be a string", keyword="$ref", path=path)
        if not pointer.startswith("#"):
            raise JsonSchemaError(
                f"$ref {pointer!r}: only references within the schema ('#...') are supported",
                keyword="$ref",
                path=path,
            )
        target: Any = self.document
        fragment = urllib.parse.unquote(pointer[1:])
        if fragment and not fragment.startswith("/"):
            raise JsonSchemaError(
                f"$ref {pointer!r}: anchors are not supported, use a JSON pointer",
                keyword="$ref",
                path=path,
            )
        for token in fragment.split("/")[1:] if fragment else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(target, Mapping) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise JsonSchemaError(
                    f"$ref {pointer!r} does not resolve (no {token!r})", keyword="$ref", path=path
                )
        return target

    def reference(self, pointer: Any, path: str) -> Expr:
        """One rule per referenced schema, so recursion terminates."""
        if pointer in self.refs:
            return self.refs[pointer]
        target = self.resolve(pointer, path)
        last = pointer.rsplit("/", 1)[-1] if "/" in pointer else "root"
        name = self.rules.reserve(urllib.parse.unquote(last))
        self.ref_pointers[name] = pointer
        before = set(self.refs)
        self.refs[pointer] = ref(name)
        try:
            body = self.compile(target, pointer, name)
        except Unsatisfiable:
            for key in set(self.refs) - before:
                del self.refs[key]
            raise
        if body.text == name:
            raise JsonSchemaError(
                f"$ref {pointer!r} refers only to itself", keyword="$ref", path=path
            )
        self.rules.define(name, body)
        return self.refs[pointer]

    def inline(self, schema: Any, depth: int = 0) -> Any:
        """``schema`` with a top-level ``$ref`` replaced by its target (for
        merging; nested references stay references)."""
        if not isinstance(schema, Mapping) or "$ref" not in schema:
            return schema
        if depth > 64:
            raise JsonSchemaError("$ref chain is circular", keyword="$ref")
        target = self.inline(self.resolve(schema["$ref"], "#"), depth + 1)
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        if not rest:
            return target
        return {"allOf": [target, rest]}

    # ----------------------------------------------------------- enum/const

    def enum(self, s: dict[str, Any], path: str) -> Expr:
        values = s.pop("enum")
        if not isinstance(values, list):
            raise JsonSchemaError("enum must be a list", keyword="enum", path=path)
        kept = [v for v in values if self.value_fits(v, s, path)]
        if not kept:
            raise Unsatisfiable(
                "no enum/const value satisfies the schema", keyword="enum", path=path
            )
        return alt(*(self.value_literal(v, path) for v in kept))

    def value_fits(self, v: Any, s: Mapping[str, Any], path: str) -> bool:
        """Whether the enum value ``v`` meets the schema's other keywords."""
        checks: dict[str, Callable[[Any], bool]] = {
            "type": lambda want: any(
                _is_type(v, t) for t in ([want] if isinstance(want, str) else want)
            ),
            "nullable": lambda want: True,
            "minLength": lambda n: not isinstance(v, str) or len(v) >= n,
            "maxLength": lambda n: not isinstance(v, str) or len(v) <= n,
            "pattern": lambda p: not isinstance(v, str) or self.search(p, v, path),
            "format": lambda f: not isinstance(v, str) or re.fullmatch(FORMATS[f], v) is not None,
            "minItems": lambda n: not isinstance(v, list) or len(v) >= n,
            "maxItems": lambda n: not isinstance(v, list) or len(v) <= n,
            "minProperties": lambda n: not isinstance(v, dict) or len(v) >= n,
            "maxProperties": lambda n: not isinstance(v, dict) or len(v) <= n,
            "required": lambda names: not isinstance(v, dict) or all(k in v for k in names),
        }
        for key, want in s.items():
            if key in NUMBER_WORDS:
                continue
            check = checks.get(key)
            if check is None:
                self.unsupported(key, path, "cannot be checked together with enum/const")
            elif not check(want):
                return False
        if _is_type(v, "number") and any(k in s for k in NUMBER_WORDS):
            lo, lo_strict, hi, hi_strict = self.bounds(s, path)
            x = Fraction(v)
            if lo is not None and (x < lo or (lo_strict and x == lo)):
                return False
            if hi is not None and (x > hi or (hi_strict and x == hi)):
                return False
        return True

    def search(self, pattern: Any, text: str, path: str) -> bool:
        try:
            return re.search(pattern, text) is not None
        except (re.error, TypeError) as e:
            raise JsonSchemaError(f"invalid pattern: {e}", keyword="pattern", path=path) from None

    def value_literal(self, v: Any, path: str) -> Expr:
        """Exactly the JSON value ``v``, with the usual whitespace freedom."""
        ws = self.prim("ws")
        if v is None or isinstance(v, bool):
            return literal(json.dumps(v))
        if isinstance(v, int):
            return literal(str(v))
        if isinstance(v, float):
            if not math.isfinite(v):
                raise JsonSchemaError(
                    f"enum/const value {v!r} is not JSON", keyword="enum", path=path
                )
            forms = [literal(json.dumps(v))]
            if v.is_integer():
                forms.append(literal(str(int(v))))
            return alt(*forms)
        if isinstance(v, str):
            text = string_literal(v)
            if text is None:
                raise JsonSchemaError(
                    f"enum/const string {v!r} holds a lone surrogate", keyword="enum", path=path
                )
            return text
        comma = seq(literal(","), ws)
        if isinstance(v, list):
            items = [seq(self.value_literal(x, path), ws) for x in v]
            return seq(literal("["), ws, *_joined(items, comma), literal("]"))
        if isinstance(v, dict):
            members = []
            for key, x in v.items():
                k = self.value_literal(key, path) if isinstance(key, str) else None
                if k is None:
                    raise JsonSchemaError("object keys must be strings", keyword="enum", path=path)
                members.append(seq(k, ws, literal(":"), ws, self.value_literal(x, path), ws))
            return seq(literal("{"), ws, *_joined(members, comma), literal("}"))
        raise JsonSchemaError(f"enum/const value {v!r} is not JSON", keyword="enum", path=path)

    # ---------------------------------------------------------------- types

    def typed(self, s: dict[str, Any], path: str, hint: str) -> Expr:
        given = s.get("type")
        if given is None:
            inferred = [
                t
                for t, words in (
                    ("object", OBJECT_WORDS),
                    ("array", ARRAY_WORDS),
                    ("string", STRING_WORDS),
                    ("number", NUMBER_WORDS),
                )
                if any(w in s for w in words)
            ]
            if not inferred:
                return self.prim("value")
            types = inferred
        else:
            types = [given] if isinstance(given, str) else given
            if not isinstance(types, list) or not types:
                raise JsonSchemaError(
                    "type must be a name or a list of names", keyword="type", path=path
                )
            for t in types:
                if t not in _TYPES:
                    raise JsonSchemaError(f"unknown type {t!r}", keyword="type", path=path)
            types = list(dict.fromkeys(types))
            if "number" in types and "integer" in types:
                types.remove("integer")  # every integer is a number
        options: list[Expr] = []
        failure: Unsatisfiable | None = None
        for t in types:
            try:
                options.append(self.of_type(t, s, path, hint))
            except Unsatisfiable as e:
                failure = failure or e
        if not options:
            assert failure is not None
            raise failure
        return self.sub_rule(hint, alt(*options))

    def of_type(self, t: str, s: dict[str, Any], path: str, hint: str) -> Expr:
        if t in ("null", "boolean"):
            return self.prim(t)
        if t == "string":
            return self.string(s, path)
        if t in ("number", "integer"):
            return self.number(t, s, path)
        if t == "array":
            return self.array(s, path, hint)
        return self.object(s, path, hint)

    def bounds(
        self, s: Mapping[str, Any], path: str
    ) -> tuple[Fraction | None, bool, Fraction | None, bool]:
        """The tightest lower and upper bounds, each with its strictness."""
        found: dict[str, Fraction] = {}
        for key in NUMBER_WORDS:
            if key in s:
                v = s[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise JsonSchemaError(f"{key} must be a finite number", keyword=key, path=path)
                found[key] = Fraction(v)
        lows = [
            (found[k], k == "exclusiveMinimum")
            for k in ("minimum", "exclusiveMinimum")
            if k in found
        ]
        highs = [
            (found[k], k == "exclusiveMaximum")
            for k in ("maximum", "exclusiveMaximum")
            if k in found
        ]
        lo = max(lows) if lows else None  # on a tie, the strict bound wins
        hi = min(highs, key=lambda b: (b[0], not b[1])) if highs else None
        return (
            None if lo is None else lo[0],
            lo is not None and lo[1],
            None if hi is None else hi[0],
            hi is not None and hi[1],
        )

    def number(self, t: str, s: Mapping[str, Any], path: str) -> Expr:
        lo, lo_strict, hi, hi_strict = self.bounds(s, path)
        # A bound of MAX_BOUND_DIGITS digits or more would need a digit
        # grammar as deep as the bound is long. On the open side of a range
        # whose other end is short, it bounds nothing the grammar can write
        # (unbounded numerals have at most INT_DIGITS integer digits), so it
        # is dropped, which accepts no more; otherwise it is refused.
        cap, huge = Fraction(10) ** INT_DIGITS, Fraction(10) ** MAX_BOUND_DIGITS
        if hi is not None and hi >= huge and (lo is None or lo < cap):
            hi, hi_strict = None, False
        if lo is not None and lo <= -huge and (hi is None or hi > -cap):
            lo, lo_strict = None, False
        for value, side in (
            (lo, ("minimum", "exclusiveMinimum")),
            (hi, ("maximum", "exclusiveMaximum")),
        ):
            if value is not None and abs(value) >= huge:
                key = next(k for k in side if k in s)
                raise JsonSchemaError(
                    f"{key} {s[key]!r} would need numerals of {MAX_BOUND_DIGITS} digits or more",
                    keyword=key,
                    path=path,
                )
        if lo is None and hi is None:
            return self.prim(t)
        if t == "integer":
            int_lo = None if lo is None else (math.floor(lo) + 1 if lo_strict else math.ceil(lo))
            int_hi = None if hi is None else (math.ceil(hi) - 1 if hi_strict else math.floor(hi))
            expr = integer_range(int_lo, int_hi)
        else:
            expr = bounded_number(lo, lo_strict, hi, hi_strict)
        if expr is None:
            raise Unsatisfiable(f"no {t} lies within the bounds", keyword="minimum", path=path)
        return expr

    def string(self, s: Mapping[str, Any], path: str) -> Expr:
        lo = _nonneg_int(s, "minLength", path, 0)
        hi = _nonneg_int(s, "maxLength", path, None)
        assert lo is not None
        pattern, fmt = s.get("pattern"), s.get("format")
        if pattern is not None and fmt is not None:
            self.unsupported("pattern", path, "together with format")
            pattern = None
        if pattern is not None and not isinstance(pattern, str):
            raise JsonSchemaError("pattern must be a string", keyword="pattern", path=path)
        regex = pattern if pattern is not None else (FORMATS[fmt] if fmt is not None else None)
        if regex is None:
            if hi is not None and hi < lo:
                raise Unsatisfiable("maxLength is below minLength", keyword="maxLength", path=path)
            body: Expr | None = rep(self.prim("char"), lo, hi)
        else:
            keyword = "pattern" if pattern is not None else "format"
            known = _format_expr(fmt) if pattern is None and lo == 0 and hi is None else None
            if known is not None:
                return seq(literal('"'), known, literal('"'))
            try:
                try:
                    body = compile_regex(regex, self.units, lo, hi)
                except LengthUnsupported:
                    which = "maxLength" if hi is not None else "minLength"
                    self.unsupported(which, path, f"cannot be combined with this {keyword}")
                    body = compile_regex(regex, self.units)
            except RegexError as e:
                raise JsonSchemaError(str(e), keyword=keyword, path=path) from None
        if body is None:
            raise Unsatisfiable(
                "no string matches the pattern/format and length", keyword="pattern", path=path
            )
        return seq(literal('"'), body, literal('"'))

    def array(self, s: Mapping[str, Any], path: str, hint: str) -> Expr:
        lo = _nonneg_int(s, "minItems", path, 0)
        hi = _nonneg_int(s, "maxItems", path, None)
        assert lo is not None
        prefix_schemas = s.get("prefixItems", [])
        if not isinstance(prefix_schemas, list):
            raise JsonSchemaError("prefixItems must be a list", keyword="prefixItems", path=path)
        prefix: list[Expr] = []
        for i, sub in enumerate(prefix_schemas):
            try:
                prefix.append(
                    self.sub_rule(
                        _child(hint, str(i)),
                        self.compile(sub, f"{path}/prefixItems/{i}", _child(hint, str(i))),
                    )
                )
            except Unsatisfiable:
                hi = i if hi is None else min(hi, i)  # nothing can sit at position i
                break
        item: Expr | None = None
        try:
            item = self.sub_rule(
                _child(hint, "item"),
                self.compile(s.get("items", True), f"{path}/items", _child(hint, "item")),
            )
        except Unsatisfiable:
            item = None
        ws = self.prim("ws")
        comma = seq(literal(","), ws)

        def tail(j: int) -> Expr | None:
            """Elements from index j on, after j elements."""
            sep = comma if j > 0 else EMPTY
            if j >= len(prefix):
                more_lo = max(lo - j, 0)
                more_hi = None if hi is None else hi - j
                if item is None or more_hi == 0:
                    return EMPTY if more_lo == 0 and (more_hi is None or more_hi >= 0) else None
                if more_hi is not None and more_hi < more_lo:
                    return None
                element = seq(item, ws)
                if j > 0:
                    return rep(seq(comma, element), more_lo, more_hi)
                rest = rep(
                    seq(comma, element),
                    max(more_lo - 1, 0),
                    None if more_hi is None else more_hi - 1,
                )
                body = seq(element, rest)
                return body if more_lo > 0 else opt(body)
            options: list[Expr] = []
            if j >= lo:
                options.append(EMPTY)
            if hi is None or j < hi:
                following = tail(j + 1)
                if following is not None:
                    options.append(seq(sep, prefix[j], ws, following))
            return alt(*options) if options else None

        elements = tail(0)
        if elements is None:
            raise Unsatisfiable("no array satisfies the item counts", keyword="minItems", path=path)
        return seq(literal("["), ws, elements, literal("]"))

    def object(self, s: Mapping[str, Any], path: str, hint: str) -> Expr:
        props = s.get("properties", {})
        if not isinstance(props, Mapping):
            raise JsonSchemaError("properties must be an object", keyword="properties", path=path)
        required = s.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise JsonSchemaError("required must be a list of names", keyword="required", path=path)
        extra_schema = s.get("additionalProperties", _MISSING)
        if extra_schema is _MISSING:
            extra_schema = "properties" not in s  # listed properties close the object
        min_props = _nonneg_int(s, "minProperties", path, 0)
        max_props = _nonneg_int(s, "maxProperties", path, None)
        assert min_props is not None
        ws = self.prim("ws")
        comma = seq(literal(","), ws)

        # Declared members, in schema order, then required names not listed.
        names = list(props) + [r for r in dict.fromkeys(required) if r not in props]
        members: list[tuple[Expr, bool]] = []
        for name in names:
            where = f"{path}/properties/{_escape_pointer(name)}"
            sub = props[name] if name in props else extra_schema
            is_required = name in required
            if sub is False and is_required:
                raise Unsatisfiable(
                    f"required property {name!r} is not allowed "
                    "(not in properties, and additionalProperties does not allow it)",
                    keyword="required",
                    path=path,
                )
            try:
                value = self.compile(sub, where, _child(hint, name))
            except Unsatisfiable:
                if is_required:
                    raise
                continue  # this property can never be present
            key = string_literal(name)
            if key is None:
                raise JsonSchemaError(f"property name {name!r} holds a lone surrogate", path=where)
            value = self.sub_rule(_child(hint, name), value)
            members.append((seq(key, ws, literal(":"), ws, value, ws), is_required))

        extra: Expr | None = None
        if extra_schema is not False:
            try:
                value = self.compile(
                    extra_schema, f"{path}/additionalProperties", _child(hint, "extra")
                )
                value = self.sub_rule(_child(hint, "extra"), value)
                extra = seq(self.key_not_in(names, hint), ws, literal(":"), ws, value, ws)
            except Unsatisfiable:
                extra = None

        n = len(members)
        if extra is not None and min_props > n + 1:
            # Repeated extra keys collapse when parsed, and a grammar cannot
            # keep keys distinct: extras can only be counted once.
            self.unsupported(
                "minProperties",
                path,
                f"{min_props} members would need several additional properties, "
                "whose keys a grammar cannot keep distinct",
            )
            min_props = 0
        states: dict[tuple[int, int], Expr | None] = {}

        def extras_after(k: int) -> Expr | None:
            """Extra members after k declared ones; a repeated extra key
            counts once, so extras count at most 1 towards minProperties."""
            more_hi = None if max_props is None else max_props - k
            if k >= min_props:
                more_lo = 0
            elif k + 1 == min_props and extra is not None:
                more_lo = 1
            else:
                return None
            if extra is None or more_hi == 0:
                return EMPTY if more_lo == 0 else None
            assert more_hi is None or more_hi >= more_lo
            if k > 0:
                return rep(seq(comma, extra), more_lo, more_hi)
            body = seq(extra, rep(seq(comma, extra), 0, None if more_hi is None else more_hi - 1))
            return body if more_lo > 0 else opt(body)

        def state(i: int, k: int) -> Expr | None:
            """Members from declared index i on, after k members."""
            if max_props is None:
                k = min(k, max(min_props, 1))  # beyond that only "some before" matters
            if (i, k) in states:
                return states[(i, k)]
            if i == n:
                result = extras_after(k)
            else:
                member, is_required = members[i]
                options: list[Expr] = []
                if max_props is None or k < max_props:
                    following = state(i + 1, k + 1)
                    if following is not None:
                        options.append(seq(comma if k > 0 else EMPTY, member, following))
                if not is_required:
                    skipped = state(i + 1, k)
                    if skipped is not None:
                        options.append(skipped)
                result = alt(*options) if options else None
                if result is not None:
                    result = self.sub_rule(_child(hint, f"tail{i}" if k else f"from{i}"), result)
            states[(i, k)] = result
            return result

        body = state(0, 0)
        if body is None:
            raise Unsatisfiable(
                "no object satisfies required/minProperties/maxProperties",
                keyword="minProperties",
                path=path,
            )
        return seq(literal("{"), ws, body, literal("}"))

    def key_not_in(self, names: list[str], hint: str) -> Expr:
        """A JSON string that decodes to none of ``names`` (for extra keys),
        following a trie of the names until the text leaves it."""
        if not names:
            return self.prim("string")
        chars = rep(self.prim("char"), 0, None)
        quote = literal('"')

        def node(prefix: str) -> Expr:
            nxt = sorted({n[len(prefix)] for n in names if n.startswith(prefix) and n != prefix})
            options = [] if prefix in names else [quote]
            other = self.units(subtract(ALL, tuple((ord(c), ord(c)) for c in nxt)))
            if other is not None:
                options.append(seq(other, chars, quote))
            for c in nxt:
                unit = self.units(single(ord(c)))
                if unit is not None:
                    options.append(seq(unit, node(prefix + c)))
            return alt(*options)

        return self.sub_rule(_child(hint, "key"), seq(quote, node("")))


def _joined(items: list[Expr], separator: Expr) -> list[Expr]:
    out: list[Expr] = []
    for i, item in enumerate(items):
        if i:
            out.append(separator)
        out.append(item)
    return out
