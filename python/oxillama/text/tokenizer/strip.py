"""Whitespace that llama.cpp drops around some special tokens (its LSTRIP and
RSTRIP token attributes: Phi-3's special tokens, Jina's mask).

llama.cpp strips C ``isspace`` characters (ASCII space, ``\\t \\n \\v \\f
\\r``) between the token and the next or previous token matched whole;
HuggingFace's own ``AddedToken(rstrip=True)`` would strip every Unicode
space, so the tokenizer cuts the text itself and encodes it again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ["strip_around"]

_SPACE = frozenset(" \t\n\v\f\r")


def strip_around(
    text: str,
    ids: Sequence[int],
    offsets: Sequence[tuple[int, int]],
    *,
    lstrip: Collection[int],
    rstrip: Collection[int],
    whole: Collection[int],
) -> str:
    """``text`` without the whitespace llama.cpp drops, given a first
    encoding of it (``ids`` and their character ``offsets``). ``whole`` are
    the tokens matched whole in text (special and user-defined): stripping
    stops at their edges."""
    starts = {s for t, (s, _) in zip(ids, offsets, strict=True) if t in whole}
    ends = {e for t, (_, e) in zip(ids, offsets, strict=True) if t in whole}
    cut: list[tuple[int, int]] = []
    for t, (s, e) in zip(ids, offsets, strict=True):
        if t in rstrip:
            j = e
            while j < len(text) and text[j] in _SPACE and j not in starts:
                j += 1
            cut.append((e, j))
        if t in lstrip:
            j = s
            while j > 0 and text[j - 1] in _SPACE and j not in ends:
                j -= 1
            cut.append((j, s))
    if not any(a < b for a, b in cut):
        return text
    keep = bytearray(b"\x01") * len(text)
    for a, b in cut:
        keep[a:b] = bytes(b - a)
    return "".join(c for c, k in zip(text, keep, strict=True) if k)
