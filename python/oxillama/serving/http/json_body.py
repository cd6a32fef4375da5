"""Decoding a request body into JSON without letting it cost more than its
size: nesting depth is measured before ``json.loads`` recurses into it,
``NaN``/``Infinity`` are refused, and so are strings holding lone UTF-16
surrogates (which no tokenizer or UTF-8 encoder can take)."""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn

import numpy as np

from oxillama.serving.http.api_error import ApiError

__all__ = ["nesting_depth", "parse_json_object"]

# A JSON string, escapes included; an unterminated one runs to the end of
# the text, so a failed match is never retried from each later quote.
_STRING = re.compile(r'"[^"\\]*(?:\\[\s\S][^"\\]*)*(?:"|\\?\Z)')
_BRACKETS_ONLY = {c: None for c in range(128) if chr(c) not in "[]{}"}
_SURROGATE = re.compile("[\ud800-\udfff]")


def nesting_depth(text: str) -> int:
    """How deeply arrays and objects nest in ``text`` (brackets inside
    strings do not count). Linear in the text, with no recursion."""
    brackets = _STRING.sub("", text)
    if not brackets.isascii():
        # Only brackets matter; other characters never nest.
        brackets = brackets.encode("ascii", "ignore").decode()
    brackets = brackets.translate(_BRACKETS_ONLY)
    if not brackets:
        return 0
    b = np.frombuffer(brackets.encode(), dtype=np.uint8)
    steps = np.where((b == ord("[")) | (b == ord("{")), 1, -1).astype(np.int64)
    return int(np.cumsum(steps).max())


def _no_constant(name: str) -> NoReturn:
    raise ApiError(400, f"request body is not valid JSON: {name} is not a JSON number")


def _bad_surrogate(path: str, s: str) -> ApiError:
    m = _SURROGATE.search(s)
    assert m is not None
    code = f"\\u{ord(m.group()):04x}"
    return ApiError(
        400,
        f"{path} holds a lone UTF-16 surrogate ({code} at character {m.start()}): "
        "strings must be valid Unicode",
        param=path.split("[", 1)[0].split(".", 1)[0] or None,
    )


def check_surrogates(value: Any) -> None:
    """Raises a 400 naming the first string (key or value) that holds a
    lone surrogate. Iterative: the depth was bounded already, but a wide
    body should not cost stack either."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                raise _bad_surrogate(path or "the body", v)
        elif isinstance(v, dict):
            for k, item in v.items():
                sub = f"{path}.{k}" if path else str(k)
                if _SURROGATE.search(k):
                    raise _bad_surrogate(f"a key of {path or 'the body'}", k)
                stack.append((sub, item))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(v))


def parse_json_object(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"request body is not UTF-8: {e.reason} at byte {e.start}") from None
    depth = nesting_depth(text)
    if depth > max_depth:
        raise ApiError(
            400,
            f"request body nests arrays and objects {depth} deep; "
            f"this server accepts at most {max_depth}",
        )
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None
    except (ValueError, RecursionError) as e:
        # ValueError: e.g. an integer of more digits than Python converts.
        raise ApiError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    check_surrogates(body)
    return body
