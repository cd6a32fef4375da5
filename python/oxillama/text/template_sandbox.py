"""The Jinja sandbox chat templates run in, with bounded time and memory.

jinja2's ``ImmutableSandboxedEnvironment`` stops attribute escapes but not
a template that burns time or memory. Defences, in layers:

- **Operations that grow a value are checked before they run**, against
  :class:`~oxillama.text.template_limits.TemplateLimits`: the ``+``, ``*``, ``**``
  and ``%`` operators (intercepted by the sandbox), ``~`` and list, tuple and
  dict literals (rewritten into checked calls), string methods with a size
  argument (``center``, ``ljust``, ``replace``, ``join``, ``format``...),
  the constructors that can share one value many times (``dict``,
  ``namespace``, ``dict.fromkeys``), and every filter (size arguments such
  as ``center``'s width, ``indent``, ``wordwrap``, ``batch``, ``round``'s
  precision; inputs of the filters that iterate, ``max_items`` at most).
  A value is measured by its weight (:mod:`oxillama.text.template_weight`), so a
  list that shares itself exponentially is refused before anything prints,
  compares or serialises it.
- **Every string and list built is accounted** against ``max_alloc_bytes``,
  so a loop cannot keep thousands of bounded values alive.
- **Output is bounded**: each printed value, each block's buffer (macros,
  ``{% set %}`` blocks) and the whole prompt.
- **A deadline**: every loop iteration (also of filtered loops whose body
  never runs), every call (macros, recursion through ``loop()``) and every
  filter checks the wall clock, so loops and recursion with no output stop.

Between two checks a template can only run a bounded operation, so a render
ends within ``max_seconds`` plus one such operation.
"""

from __future__ import annotations

import json
import operator
import re
import string
import sys
import types
from collections import abc
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jinja2.nodes as nodes
from jinja2.filters import FILTERS
from jinja2.runtime import Context, markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Cycler, Namespace, generate_lorem_ipsum, pass_eval_context
from jinja2.visitor import NodeTransformer

from oxillama.errors import TemplateError
from oxillama.text.template_limits import MAX_INT_BITS, Budget, current
from oxillama.text.template_weight import WeightedList, weight

__all__ = ["BoundedEnvironment"]

_TEXT = (str, bytes, bytearray)
_PTR = 8  # bytes per list slot


def _text_alloc(b: Budget, rv: Any) -> None:
    if isinstance(rv, _TEXT):
        b.size(len(rv), "a string")
        b.alloc(sys.getsizeof(rv))


def _int_bits(b: Budget, bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise TemplateError(
            f"chat template: a number would have about {bits:,} bits, over {MAX_INT_BITS:,}"
        )


def _arg(args: tuple[Any, ...], kwargs: Mapping[str, Any], i: int, name: str, default: Any) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _int_arg(v: Any) -> int:
    """An argument used as a count or width (anything else fails later, in
    the operation itself)."""
    return v if isinstance(v, int) else 0


# ------------------------------------------------------------ format strings

_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)", re.S)
_DIGITS = re.compile(r"\d+")


def _number(digits: str, cap: int) -> int:
    return int(digits) if len(digits) <= 12 else cap + 1


def _format_bound(
    b: Budget, fmt: str | bytes | bytearray, values: Iterable[Any], widths: Iterable[str]
) -> int:
    """An upper bound on a formatted string's length: its text plus, per
    field, the widest width or precision and the heaviest argument."""
    cap = b.limits.max_output_chars
    vals = list(values)
    widest = 0
    fields = 0
    for w in widths:
        fields += 1
        if w == "*":  # the width comes from the arguments
            widest = max([widest] + [abs(v) for v in vals if isinstance(v, int)])
        else:
            for d in _DIGITS.findall(w):
                widest = max(widest, _number(d, cap))
    heaviest = max((weight(v, b) for v in vals), default=0)
    return len(fmt) + fields * (widest + heaviest)


def _printf_check(b: Budget, fmt: str | bytes | bytearray, args: Any) -> None:
    if isinstance(args, tuple):
        values: Iterable[Any] = args
    elif isinstance(args, Mapping):
        values = args.values()
    else:
        values = (args,)
    text = fmt if isinstance(fmt, str) else fmt.decode("latin-1")
    widths = []
    for m in _PRINTF.finditer(text):
        if m.group(3) == "%":
            continue
        spec = (m.group(1) or "") + "." + (m.group(2) or "")
        widths.append("*" if "*" in spec else spec)
    b.size(_format_bound(b, fmt, values, widths), "a '%' format")


def _str_format_check(b: Budget, fmt: str, args: Any, kwargs: Mapping[str, Any]) -> None:
    widths = []
    for _, field, spec, _ in string.Formatter().parse(fmt):
        if field is not None:
            widths.append("*" if spec and "{" in spec else (spec or ""))
    b.size(_format_bound(b, fmt, [*args, *kwargs.values()], widths), "a str.format")


# --------------------------------------------------------- method pre-checks


def _text_method_check(
    b: Budget, s: Any, name: str, args: tuple[Any, ...], kw: dict[str, Any]
) -> tuple[Any, ...]:
    """Checks a string method's result size before it runs; returns its
    (possibly materialised) arguments."""
    n = len(s)
    if name in ("center", "ljust", "rjust", "zfill"):
        b.size(max(n, _int_arg(_arg(args, kw, 0, "width", 0))), f"str.{name}")
    elif name == "expandtabs":
        tab = _int_arg(_arg(args, kw, 0, "tabsize", 8))
        b.size(n + s.count("\t" if isinstance(s, str) else b"\t") * max(tab, 0), "str.expandtabs")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], _TEXT):
        old, new = args[0], args[1]
        occ = n + 1 if not old else s.count(old)
        count = _arg(args, kw, 2, "count", -1)
        if isinstance(count, int) and count >= 0:
            occ = min(occ, count)
        if isinstance(new, _TEXT):
            b.size(n + occ * max(len(new) - len(old), 0), "str.replace")
    elif name == "join" and args:
        items = _materialize(b, args[0], "str.join")
        total = sum(len(x) for x in items if isinstance(x, _TEXT))
        b.size(total + n * max(len(items) - 1, 0), "str.join")
        return (items, *args[1:])
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, _TEXT)), default=1)
        b.size(n * max(longest, 1), "str.translate")
    return args


def _materialize(b: Budget, iterable: Any, what: str) -> list[Any]:
    if isinstance(iterable, abc.Sized):
        b.items(len(iterable), what)
    items: list[Any] = list(b.bounded(iterable, what))
    return items


_AMPLIFIERS: tuple[Any, ...] = (dict, Namespace, Cycler)


# ----------------------------------------------------------------- filters

# Filters that walk their input item by item (in Python, or keeping
# references to each): at most max_items.
_ITERATING = frozenset(
    "batch dictsort groupby items join list map max min reject rejectattr reverse "
    "select selectattr slice sort sum unique urlencode".split()
)
# Filters that print their input: its weight at most the output bound.
_PRINTING = frozenset(
    "capitalize center e escape forceescape format indent lower pprint replace safe "
    "string striptags title trim truncate upper urlize wordcount wordwrap xmlattr".split()
)


def _filter_check(
    b: Budget, name: str, value: Any, args: tuple[Any, ...], kw: dict[str, Any]
) -> Any:
    """Checks one filter call before it runs; returns its (possibly bounded)
    input."""
    if name in _PRINTING:
        w = weight(value, b)
        b.size(w, f"the input of |{name}")
        if name == "center":
            b.size(max(w, _int_arg(_arg(args, kw, 0, "width", 80))), "|center")
        elif name == "indent":
            width = _arg(args, kw, 0, "width", 4)
            per_line = len(width) if isinstance(width, str) else _int_arg(width)
            lines = (value.count("\n") if isinstance(value, str) else w) + 2
            b.size(w + lines * per_line, "|indent")
        elif name in ("wordwrap", "urlize"):
            b.items(w, f"|{name}")
            if name == "wordwrap":
                wrap = _arg(args, kw, 2, "wrapstring", None)
                b.size(w * (1 + (len(wrap) if isinstance(wrap, str) else 1)), "|wordwrap")
        elif name == "replace":
            old = _arg(args, kw, 0, "old", "")
            new = _arg(args, kw, 1, "new", "")
            b.size(weight(old, b) + weight(new, b), "|replace's arguments")
            occ = w + 1
            if isinstance(value, str) and isinstance(old, str) and old:
                occ = value.count(old)
            count = _arg(args, kw, 2, "count", None)
            if isinstance(count, int) and count >= 0:
                occ = min(occ, count)
            grow = len(new) - len(old) if isinstance(new, str) and isinstance(old, str) else 0
            b.size(w + occ * max(grow, 0), "|replace")
        elif name == "format":
            fmt = value if isinstance(value, str) else str(value)
            _printf_check(b, fmt, kw or args)
    if name in _ITERATING:
        if isinstance(value, abc.Sized):
            b.items(len(value), f"|{name}")
        elif isinstance(value, abc.Iterable):
            value = b.bounded(value, f"|{name}")
    if name in ("batch", "slice"):
        count = _int_arg(args[0] if args else kw.get("linecount", kw.get("slices", 0)))
        b.items(count, f"|{name}")
        fill = _arg(args, kw, 1, "fill_with", None)
        if fill is not None:
            b.size(count * weight(fill, b), f"|{name}'s fill_with")
    elif name == "round":
        precision = _int_arg(_arg(args, kw, 0, "precision", 0))
        if abs(precision) > 400:
            raise TemplateError(f"chat template: |round precision {precision} is out of range")
    elif name == "join":
        items = _materialize(b, value, "|join")
        sep = _arg(args, kw, 0, "d", "")
        total = sum(weight(x, b) for x in items)
        b.size(total + weight(sep, b) * max(len(items) - 1, 0), "|join")
        value = items
    elif name == "sum":
        start = _arg(args, kw, 1, "start", 0)
        if isinstance(start, bool) or not isinstance(start, (int, float)):
            raise TemplateError("chat template: |sum's start must be a number")
    return value


def _guard_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    pass_arg = getattr(f, "jinja_pass_arg", None)
    first = 0 if pass_arg is None else 1

    def guarded(*args: Any, **kwargs: Any) -> Any:
        b = current()
        b.tick()
        if len(args) > first:
            value = _filter_check(b, name, args[first], args[first + 1 :], kwargs)
            args = (*args[:first], value, *args[first + 1 :])
        rv = f(*args, **kwargs)
        _text_alloc(b, rv)
        if isinstance(rv, list):
            b.alloc(_PTR * len(rv))
        return rv

    if pass_arg is not None:
        guarded.jinja_pass_arg = pass_arg  # type: ignore[attr-defined]
    guarded.__name__ = getattr(f, "__name__", name)
    return guarded


# ------------------------------------------------------------- the helpers


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson`` (non-ASCII kept), bounded: the value's
    weight first, and with ``indent`` (whose cost grows with depth) the
    text is produced piece by piece and counted."""
    b = current()
    b.size(weight(value, b), "the input of |tojson")
    if isinstance(indent, str):
        b.size(len(indent), "|tojson's indent")
    elif isinstance(indent, int) and indent > 64:
        raise TemplateError(f"chat template: |tojson indent {indent} is over 64")
    enc = json.JSONEncoder(
        ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    if indent is None:
        text = enc.encode(value)
        _text_alloc(b, text)
        return text
    out: list[str] = []
    total = 0
    for piece in enc.iterencode(value):
        total += len(piece)
        b.size(total, "|tojson's output")
        if len(out) % 1024 == 0:
            b.tick()
        out.append(piece)
    text = "".join(out)
    _text_alloc(b, text)
    return text


def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    if not all(isinstance(v, int) and 0 <= v <= 1000 for v in (n, min, max)):
        raise TemplateError("chat template: lipsum's counts must be integers in 0..1000")
    return generate_lorem_ipsum(n, html, min, max)


# ------------------------------------------------------- the AST rewriting

_HOOK_ITER = "oxi_tick"
_HOOK_CONCAT = "oxi_concat"
_HOOK_BUILD = "oxi_built"


def _hook(name: str, args: list[nodes.Expr], lineno: int) -> nodes.Call:
    # An EnvironmentAttribute compiles to `environment.<name>`: templates
    # cannot name, shadow or reassign it.
    return nodes.Call(nodes.EnvironmentAttribute(name), args, [], None, None, lineno=lineno)


def _constant(node: nodes.Node) -> bool:
    if isinstance(node, nodes.Const):
        return True
    if isinstance(node, (nodes.List, nodes.Tuple)):
        return all(_constant(x) for x in node.items)
    if isinstance(node, nodes.Dict):
        return all(_constant(p.key) and _constant(p.value) for p in node.items)
    return False


class _Rewrite(NodeTransformer):
    """Puts the deadline into every loop iteration and routes ``~`` and
    container literals through checked calls."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        tick = nodes.EnvironmentAttribute(_HOOK_ITER, lineno=node.lineno)
        node.body.insert(0, nodes.ExprStmt(tick, lineno=node.lineno))
        if node.test is not None:
            # A filtered loop skips the body of rejected items: check there too.
            node.test = nodes.And(
                nodes.EnvironmentAttribute(_HOOK_ITER, lineno=node.lineno),
                node.test,
                lineno=node.lineno,
            )
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _hook(_HOOK_CONCAT, list(node.nodes), node.lineno)

    def _built(self, node: nodes.Expr) -> nodes.Node:
        self.generic_visit(node)
        if getattr(node, "ctx", "load") != "load" or _constant(node):
            return node
        return _hook(_HOOK_BUILD, [node], node.lineno)

    visit_List = visit_Tuple = visit_Dict = _built


# ---------------------------------------------------------- the environment


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """An immutable sandbox whose operations are bounded by the budget of
    the render running in the current context (see
    :mod:`oxillama.text.template_limits`)."""

    intercepted_binops = frozenset(["+", "*", "**", "%"])

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=self._finalize, **options)
        self.filters = {k: _guard_filter(k, f) for k, f in FILTERS.items()}
        self.filters["tojson"] = _guard_filter("tojson", tojson)
        self.globals["lipsum"] = lipsum
        self.concat = self._concat  # type: ignore[method-assign]

    # -- compile: rewrite the tree before code generation
    def _generate(
        self,
        source: nodes.Template,
        name: str | None,
        filename: str | None,
        defer_init: bool = False,
    ) -> str:
        rewritten = _Rewrite().visit(source)
        return super()._generate(rewritten, name, filename, defer_init)

    # -- the hooks the rewritten tree calls
    @property
    def oxi_tick(self) -> bool:
        current().tick()
        return True

    @staticmethod
    @pass_eval_context
    def oxi_concat(eval_ctx: Any, *values: Any) -> str:
        b = current()
        b.size(sum(weight(v, b) for v in values), "a '~' concatenation")
        rv: str = (markup_join if eval_ctx.autoescape else str_join)(values)
        _text_alloc(b, rv)
        return rv

    @staticmethod
    def oxi_built(value: Any) -> Any:
        b = current()
        w = weight(value, b)
        b.size(w, "a list, tuple or dict")
        b.alloc(sys.getsizeof(value))
        return WeightedList(value, w) if type(value) is list else value

    # -- output
    def _finalize(self, value: Any) -> Any:
        if not isinstance(value, str):
            b = current()
            b.size(weight(value, b), "a printed value")
        return value

    def _concat(self, parts: Iterable[str]) -> str:
        b = current()
        if not isinstance(parts, list):
            parts = list(parts)
        b.size(sum(map(len, parts)), "a block's output")
        rv = "".join(parts)
        b.alloc(sys.getsizeof(rv))
        return rv

    # -- operators
    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        b = current()
        if operator == "+":
            rv = self._add(b, left, right)
            if rv is not None:
                return rv
        elif operator == "*":
            self._mul_check(b, left, right)
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                _int_bits(b, left.bit_length() * right)
        elif operator == "%" and isinstance(left, _TEXT):
            _printf_check(b, left, right)
        rv = self.binop_table[operator](left, right)
        _text_alloc(b, rv)
        return rv

    @staticmethod
    def _add(b: Budget, left: Any, right: Any) -> Any:
        """``left + right`` when it builds a list, after the checks; None
        when the operator itself is to run (after the checks)."""
        if isinstance(left, _TEXT) and isinstance(right, _TEXT):
            b.size(len(left) + len(right), "a '+' of strings")
        elif isinstance(left, int) and isinstance(right, int):
            _int_bits(b, max(left.bit_length(), right.bit_length()) + 1)
        elif (isinstance(left, list) and isinstance(right, list)) or (
            isinstance(left, tuple) and isinstance(right, tuple)
        ):
            w = weight(left, b) + weight(right, b)
            b.size(w, "a '+' of lists")
            rv: Any = operator.add(left, right)
            b.alloc(_PTR * len(rv))
            return WeightedList(rv, w) if isinstance(rv, list) else rv
        return None

    @staticmethod
    def _mul_check(b: Budget, left: Any, right: Any) -> None:
        if isinstance(left, int) and isinstance(right, int):
            _int_bits(b, left.bit_length() + right.bit_length())
            return
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if not isinstance(n, int) or n <= 1:
            return
        if isinstance(seq, _TEXT):
            b.size(len(seq) * n, "a '*' of a string")
        elif isinstance(seq, (list, tuple)):
            b.items(len(seq) * n, "a '*' of a list")
            b.size(weight(seq, b) * n, "a '*' of a list")
            b.alloc(_PTR * len(seq) * n)

    # -- calls (methods, globals, macros, loop(), caller())
    def call(
        __self,  # as jinja2 names it, so no keyword argument can clash
        __context: Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        b = current()
        b.tick()
        owner = getattr(__obj, "__self__", None)
        if isinstance(__obj, types.BuiltinMethodType) and isinstance(owner, _TEXT):
            args = _text_method_check(b, owner, __obj.__name__, args, kwargs)
        elif isinstance(__obj, types.FunctionType):
            wrapped = getattr(__obj, "__wrapped__", None)
            fmt = getattr(wrapped, "__self__", None)
            if isinstance(fmt, str) and getattr(wrapped, "__name__", "") == "format":
                _str_format_check(b, fmt, args, kwargs)
            elif isinstance(fmt, str) and getattr(wrapped, "__name__", "") == "format_map":
                mapping = args[0] if args and isinstance(args[0], Mapping) else {}
                _str_format_check(b, fmt, (), mapping)
        elif isinstance(owner, int) and getattr(__obj, "__name__", "") == "to_bytes":
            b.size(_int_arg(_arg(args, kwargs, 0, "length", 1)), "int.to_bytes")
        rv = super().call(__context, __obj, *args, **kwargs)
        _text_alloc(b, rv)
        if any(__obj is a for a in _AMPLIFIERS) or getattr(__obj, "__name__", "") == "fromkeys":
            b.size(weight(rv, b), f"the result of {getattr(__obj, '__name__', 'a call')}")
        return rv
