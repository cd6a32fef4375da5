"""Embeddings: inputs to token lists, hidden states to pooled vectors.

Shared by :meth:`Engine.embed <oxillama.Engine.embed>`,
:meth:`AsyncEngine.embed <oxillama.AsyncEngine.embed>` and the server's
``/v1/embeddings``. The hidden states come from
``_native.Model.embed_hidden``: scratch passes that batch many sequences
and touch no session. Pooling follows llama.cpp's meaning of each mode
(the hidden state is the output-normed one of a decoder, the last layer's
of an encoder).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

import oxillama._native as _native
from oxillama.errors import GenerateError, LoadError, ParameterError
from oxillama.text.tokenizer import Tokenizer

__all__ = ["EmbedInput", "Pooling", "default_pooling", "pool", "prepare"]

Pooling = Literal["last", "mean", "max", "cls", "none"]
POOLINGS: tuple[str, ...] = get_args(Pooling)
#: What one call embeds: a text, a token-id list, or a list of either.
EmbedInput = str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]]

# `<arch>.pooling_type` as llama.cpp numbers it.
_GGUF_POOLING: dict[int, Pooling] = {0: "none", 1: "mean", 2: "cls", 3: "last"}
#: llama.cpp's RANK: a reranker, whose output is a score, not a vector.
_GGUF_RANK = 4

#: Rows of one native pass; larger passes do not read the weights fewer
#: times per token in a way that pays for their activation memory.
PASS_ROWS = 2048


def default_pooling(metadata: Mapping[str, Any], arch: str, *, reranker: bool = False) -> Pooling:
    """The file's ``<arch>.pooling_type``, else ``"last"``. A reranker
    (``reranker``: the model has a classifier head) whose file names no
    other pooling has none: its output is a score, not a vector."""
    key = f"{arch}.pooling_type"
    v = metadata.get(key)
    if reranker and v in (None, _GGUF_RANK):
        raise ParameterError(
            "this model is a reranker (a classifier head, pooling type "
            f"{'rank' if v is not None else 'not set'}): rerank() scores query-document "
            "pairs; embed() needs an explicit pooling"
        )
    if v is None:
        return "last"
    if isinstance(v, int) and not isinstance(v, bool) and v in _GGUF_POOLING:
        return _GGUF_POOLING[v]
    raise LoadError(f"metadata {key} = {v!r} is not a pooling type we know")


def check_pooling(pooling: object) -> Pooling:
    if pooling not in POOLINGS:
        raise ParameterError(
            f"pooling must be one of {', '.join(map(repr, POOLINGS))}, got {pooling!r}"
        )
    return pooling  # type: ignore[return-value]


def _token_list(x: object, where: str) -> list[int] | None:
    """``x`` as token ids, or None if it is not a sequence of integers."""
    if isinstance(x, (str, bytes)) or not isinstance(x, Sequence | np.ndarray):
        return None
    out = []
    for t in x:
        if isinstance(t, bool) or not isinstance(t, int | np.integer):
            return None
        out.append(operator.index(t))
    if not out:
        raise ParameterError(f"{where} is an empty token list")
    if any(not 0 <= t < 1 << 32 for t in out):
        raise ParameterError(f"{where} has a token id outside [0, 2**32)")
    return out


@dataclass
class Prepared:
    """Token lists ready for the model, and how to shape the answer."""

    seqs: list[list[int]]
    #: One input (a str or one token list): the answer is one vector.
    single: bool


def prepare(inputs: EmbedInput, tokenizer: Tokenizer, max_len: int, *, truncate: bool) -> Prepared:
    """Tokenizes texts (with the model's special tokens) and checks token
    lists (used exactly as given); cuts an input longer than ``max_len``
    when ``truncate``, else raises :class:`GenerateError` naming it."""
    if isinstance(inputs, Sequence | np.ndarray) and not isinstance(inputs, str | bytes):
        if len(inputs) == 0:
            raise ParameterError("input is an empty list")
    if isinstance(inputs, str):
        items: list[object] = [inputs]
        single = True
    else:
        one = _token_list(inputs, "input")
        if one is not None:
            items, single = [one], True
        elif isinstance(inputs, Sequence | np.ndarray) and not isinstance(inputs, bytes):
            items, single = list(inputs), False
        else:
            raise ParameterError(
                "input must be a string, a list of token ids, or a list of either, "
                f"got {type(inputs).__name__}"
            )
    if not items:
        raise ParameterError("input is an empty list")
    seqs: list[list[int]] = []
    for i, x in enumerate(items):
        where = f"input {i}"
        if isinstance(x, str):
            # Control-token text stays text, as in llama.cpp's embed.
            toks = tokenizer.encode(x, add_special=True, parse_special=False)
            if not toks:
                raise ParameterError(f"{where} is an empty text and the model adds no tokens")
            keep_last = tokenizer.adds_closing_token and len(toks) > 1
        else:
            got = _token_list(x, where)
            if got is None:
                raise ParameterError(
                    f"{where} must be a string or a list of token ids, got {type(x).__name__}"
                )
            toks, keep_last = got, False
        if len(toks) > max_len:
            if not truncate:
                raise GenerateError(
                    f"{where} has {len(toks)} tokens, more than the context size of {max_len} "
                    "(pass truncate=True to cut it)"
                )
            # A text keeps its closing special token ([SEP]), as BERT's own
            # truncation does; token ids are cut as given.
            toks = toks[: max_len - 1] + toks[-1:] if keep_last else toks[:max_len]
        seqs.append(toks)
    return Prepared(seqs, single)


def pool(
    hidden: npt.NDArray[np.float32],
    lengths: Sequence[int],
    pooling: Pooling,
    normalize: bool,
) -> npt.NDArray[np.float32] | list[npt.NDArray[np.float32]]:
    """Pools ``hidden`` (``sum(lengths) x dim``, sequence after sequence)."""
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    if pooling == "none":
        rows = [hidden[a:b] for a, b in zip(starts, ends, strict=True)]
        return [_l2(r) if normalize else r.copy() for r in rows]
    h = hidden.astype(np.float64)
    if pooling == "mean":
        out = np.add.reduceat(h, starts, axis=0) / np.asarray(lengths, dtype=np.float64)[:, None]
    elif pooling == "max":
        out = np.maximum.reduceat(h, starts, axis=0)
    elif pooling == "cls":
        out = h[starts]
    else:
        out = h[ends - 1]
    return _l2(out) if normalize else out.astype(np.float32)


def _l2(x: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    x = x.astype(np.float64)
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    # A zero vector stays zero rather than becoming NaN.
    return (x / np.where(n > 0, n, 1.0)).astype(np.float32)


def max_len(native: _native.Model, n_ctx: int) -> int:
    """The longest input: the context size, and for an encoder also the
    position table."""
    return n_ctx if native.causal else min(n_ctx, native.n_ctx_train)


def embed(
    native: _native.Model,
    prepared: Prepared,
    pooling: Pooling,
    normalize: bool,
    threads: int,
    n_ctx: int,
    loras: list[tuple[_native.LoraAdapter, float]],
) -> npt.NDArray[np.float32] | list[npt.NDArray[np.float32]]:
    """Hidden states of every input in passes of up to ``PASS_ROWS`` rows
    (with ``loras`` applied), pooled."""
    hidden = native.embed_hidden(prepared.seqs, threads, n_ctx, PASS_ROWS, loras)
    return finish(hidden, prepared, pooling, normalize)


def finish(
    hidden: npt.NDArray[np.float32], prepared: Prepared, pooling: Pooling, normalize: bool
) -> npt.NDArray[np.float32] | list[npt.NDArray[np.float32]]:
    """Pools the hidden states of ``prepared`` and shapes the answer."""
    out = pool(hidden, [len(s) for s in prepared.seqs], pooling, normalize)
    return out[0] if prepared.single else out


def groups(seqs: list[list[int]], rows: int) -> list[list[list[int]]]:
    """Consecutive runs of ``seqs`` of at most ``rows`` tokens (a longer
    sequence alone)."""
    out: list[list[list[int]]] = []
    n = rows
    for s in seqs:
        if not out or n + len(s) > rows:
            out.append([])
            n = 0
        out[-1].append(s)
        n += len(s)
    return out
