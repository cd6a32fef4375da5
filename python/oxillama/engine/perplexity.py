"""Perplexity and KL divergence of a model over a text, computed the way
llama.cpp's ``llama-perplexity`` computes them, so that figures from the two
can be compared side by side.

The text is tokenized whole (with BOS when the model adds one) and cut into
non-overlapping chunks of ``n_ctx`` tokens. Each chunk is evaluated on an
empty context, its first token replaced by BOS when the model adds one; only
its second half is scored (the model then always has at least ``n_ctx/2``
tokens of context): for ``j`` in ``[n_ctx/2, n_ctx-1)``, the negative
log-probability of token ``j+1`` under the logits at ``j``. The estimate is
``exp(mean nll)``, its ``±`` the standard error of the mean nll scaled by the
estimate.

``save_logits`` writes the base model's log-probabilities in llama.cpp's
``--kl-divergence-base`` file format (files are interchangeable with
``llama-perplexity``'s); ``kl_base`` reads such a file and compares another
model (a quantization, usually) with it.
"""

from __future__ import annotations

import math
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO, Protocol

import numpy as np
import numpy.typing as npt

from oxillama.errors import LoadError, ParameterError


class Evaluator(Protocol):
    """What the computation needs of an :class:`~oxillama.Engine`: the
    engine's method calls this module, so it names the engine only by
    this shape."""

    @property
    def tokenizer(self) -> Any: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    def reset(self) -> None: ...
    def eval(self, tokens: Any, *, all_logits: bool = False) -> npt.NDArray[np.float32]: ...


__all__ = [
    "DEFAULT_N_CTX",
    "KLDivergence",
    "Perplexity",
    "PerplexityProgress",
    "kl_percentile",
    "read_kl_base_header",
    "run",
]

#: ``llama-perplexity``'s default context (its ``-c``).
DEFAULT_N_CTX = 512
KL_MAGIC = b"_logits_"
# Logits are scored in pieces of at most this many bytes of float32 rows, so
# that a long chunk over a large vocabulary never holds all its logits at once.
_PIECE_BYTES = 64 << 20
# llama.cpp keeps base log-probabilities down to 16 nats below the top one.
_LOG_PROB_RANGE = np.float32(16.0)
_Q_MAX = np.float32(65535.0)


@dataclass(frozen=True)
class KLDivergence:
    """A model (``Q``) against saved base log-probabilities, over ``count``
    scored tokens: llama.cpp's ``--kl-divergence`` statistics. Every ``*_error``
    is the ``±`` llama.cpp prints (0 under 11 tokens)."""

    count: int
    ppl: float
    ppl_error: float
    ppl_base: float
    ppl_base_error: float
    #: Correlation of ``ln PPL(Q)`` and ``ln PPL(base)`` over the tokens.
    cor: float
    #: ``ln(PPL(Q) / PPL(base))``.
    ln_ratio: float
    ln_ratio_error: float
    #: ``PPL(Q) / PPL(base)``.
    ratio: float
    ratio_error: float
    #: ``PPL(Q) - PPL(base)``.
    diff: float
    diff_error: float
    #: Mean KL divergence ``KL(base || Q)`` per token, in nats.
    kld: float
    kld_error: float
    #: Mean of ``p_Q(token) - p_base(token)`` for the actual next tokens.
    dp_mean: float
    dp_mean_error: float
    #: Root mean square of the same difference.
    dp_rms: float
    dp_rms_error: float
    #: Share of tokens where both models rank the same token first.
    same_top: float
    same_top_error: float
    #: Per-token KL divergence and probability difference, in text order.
    kld_values: npt.NDArray[np.float32] = field(repr=False, compare=False)
    dp_values: npt.NDArray[np.float32] = field(repr=False, compare=False)


@dataclass(frozen=True)
class Perplexity:
    """The result of :meth:`Engine.perplexity`."""

    #: ``exp(mean nll)`` over every scored token.
    ppl: float
    #: llama.cpp's ``±``: ``ppl`` times the standard error of the mean nll.
    ppl_error: float
    #: Each chunk's own perplexity.
    chunk_ppl: tuple[float, ...]
    #: The running estimate after each chunk (llama.cpp's ``[1]x,[2]y,...``).
    running_ppl: tuple[float, ...]
    #: Scored tokens: ``n_chunks * (n_ctx - n_ctx // 2 - 1)``.
    n_tokens: int
    n_chunks: int
    n_ctx: int
    #: Tokens of the whole text (of the base file's chunks, comparing).
    n_text_tokens: int
    tokenize_seconds: float
    #: Forward passes only.
    eval_seconds: float
    #: Log-softmax, statistics and the base file.
    score_seconds: float
    total_seconds: float
    #: Set when compared with a base file (``kl_base``).
    kl: KLDivergence | None = None

    @property
    def tokens_per_second(self) -> float:
        """Evaluated tokens (every token of every chunk) per second of
        forward passes."""
        return self.n_chunks * self.n_ctx / self.eval_seconds if self.eval_seconds else 0.0


@dataclass(frozen=True)
class PerplexityProgress:
    """What ``on_chunk`` receives: once before the first chunk (``chunk``
    0, the figures NaN), so that a progress bar knows its length, then
    after each chunk."""

    #: Chunks done and in all.
    chunk: int
    n_chunks: int
    #: The running estimate and its ``±`` over the chunks done.
    ppl: float
    ppl_error: float
    #: This chunk's own perplexity.
    chunk_ppl: float
    #: The statistics so far, when comparing with a base file.
    kl: KLDivergence | None = None


OnChunk = Callable[[PerplexityProgress], object]


# ------------------------------------------------------------- statistics


def _mean_and_error(total: float, total2: float, count: int) -> tuple[float, float]:
    """Mean and standard error of the mean from a sum and a sum of squares,
    as llama.cpp's KL statistics take them (no error under 11 values)."""
    if count < 1:
        return 0.0, 0.0
    mean = total / count
    var = total2 / count - mean * mean
    return mean, math.sqrt(var / (count - 1)) if var > 0 and count > 10 else 0.0


def _ppl_and_error(nll: float, nll2: float, count: int) -> tuple[float, float]:
    """``exp(mean nll)`` and its ``±`` as ``llama-perplexity`` prints them
    (NaN where the variance is not positive: it prints an error instead)."""
    mean = nll / count
    ppl = math.exp(mean)
    var = nll2 / count - mean * mean
    if var <= 0 or count < 2:
        return ppl, math.nan
    return ppl, math.sqrt(var / (count - 1)) * ppl


def kl_percentile(values: npt.NDArray[np.float32], fraction: float) -> float:
    """llama.cpp's percentile of per-token values: linear between the two
    nearest of the sorted values."""
    if values.size == 0:
        return math.nan
    return float(np.quantile(values.astype(np.float64), min(max(fraction, 0.0), 1.0)))


@dataclass
class _KlSums:
    """Running sums over the scored tokens, as llama.cpp keeps them: float32
    per-token terms accumulated in float64."""

    nll: float = 0.0
    nll2: float = 0.0
    nll_base: float = 0.0
    nll_base2: float = 0.0
    nll_nll_base: float = 0.0
    kld: float = 0.0
    kld2: float = 0.0
    dp: float = 0.0
    dp2: float = 0.0
    dp4: float = 0.0
    same_top: int = 0
    count: int = 0
    kld_values: list[npt.NDArray[np.float32]] = field(default_factory=list)
    dp_values: list[npt.NDArray[np.float32]] = field(default_factory=list)

    def add(
        self,
        rows: npt.NDArray[np.float32],
        base: npt.NDArray[np.uint16],
        targets: npt.NDArray[np.int64],
    ) -> None:
        n_vocab = rows.shape[1]
        at = np.arange(rows.shape[0])
        top = rows.argmax(axis=1)
        mx = rows[at, top]
        sum_exp = np.exp(rows - mx[:, None]).sum(axis=1, dtype=np.float64)
        lse = np.log(sum_exp).astype(np.float32)
        nll = (mx + lse) - rows[at, targets]
        head = np.ascontiguousarray(base[:, :4]).view(np.float32)
        scale, min_lp = head[:, 0], head[:, 1]
        q = base[:, 4 : 4 + n_vocab]
        nll_base = -(scale * q[at, targets].astype(np.float32) + min_lp)
        self.nll += float(nll.sum(dtype=np.float64))
        self.nll2 += float((nll * nll).sum(dtype=np.float64))
        self.nll_base += float(nll_base.sum(dtype=np.float64))
        self.nll_base2 += float((nll_base * nll_base).sum(dtype=np.float64))
        self.nll_nll_base += float((nll * nll_base).sum(dtype=np.float64))
        # KL(base || Q) over the tokens the base file kept (within 16 nats).
        lp_base = scale[:, None] * q.astype(np.float32) + min_lp[:, None]
        top_base = lp_base.argmax(axis=1)
        terms = np.exp(lp_base) * (lp_base - rows + (mx + lse)[:, None])
        kld = np.where(lp_base > -_LOG_PROB_RANGE, terms, np.float32(0)).sum(
            axis=1, dtype=np.float64
        )
        self.kld += float(kld.sum())
        self.kld2 += float((kld * kld).sum())
        self.same_top += int((top == top_base).sum())
        self.count += rows.shape[0]
        dp = np.exp(-nll) - np.exp(-nll_base)
        dp2 = (dp * dp).astype(np.float64)
        self.dp += float(dp.sum(dtype=np.float64))
        self.dp2 += float(dp2.sum())
        self.dp4 += float((dp2 * dp2).sum())
        self.kld_values.append(kld.astype(np.float32))
        self.dp_values.append(dp.astype(np.float32))

    def result(self) -> KLDivergence:
        n = self.count
        lp, lp_err = _mean_and_error(self.nll, self.nll2, n)
        lb, lb_err = _mean_and_error(self.nll_base, self.nll_base2, n)
        cov = 0.0
        if n >= 10:
            cov = (self.nll_nll_base / n - (self.nll / n) * (self.nll_base / n)) / (n - 1)
        ppl, ppl_base = math.exp(lp), math.exp(lb)
        ppl_err, ppl_base_err = ppl * lp_err, ppl_base * lb_err
        ln_ratio = lp - lb
        ln_ratio_err = math.sqrt(max(lp_err**2 + lb_err**2 - 2.0 * cov, 0.0))
        diff_err2 = ppl_err**2 + ppl_base_err**2 - 2.0 * ppl * ppl_base * cov
        kld, kld_err = _mean_and_error(self.kld, self.kld2, n)
        dp, dp_err = _mean_and_error(self.dp, self.dp2, n)
        mse, mse_err = _mean_and_error(self.dp2, self.dp4, n)
        rms = math.sqrt(mse)
        same = self.same_top / n if n else 0.0
        same_err = math.sqrt(same * (1 - same) / (n - 1)) if n > 1 else 0.0
        return KLDivergence(
            count=n,
            ppl=ppl,
            ppl_error=ppl_err,
            ppl_base=ppl_base,
            ppl_base_error=ppl_base_err,
            cor=cov / (lp_err * lb_err) if lp_err and lb_err else math.nan,
            ln_ratio=ln_ratio,
            ln_ratio_error=ln_ratio_err,
            ratio=math.exp(ln_ratio),
            ratio_error=math.exp(ln_ratio) * ln_ratio_err,
            diff=ppl - ppl_base,
            diff_error=math.sqrt(max(diff_err2, 0.0)),
            kld=kld,
            kld_error=kld_err,
            dp_mean=dp,
            dp_mean_error=dp_err,
            dp_rms=rms,
            dp_rms_error=0.5 / rms * mse_err if rms else 0.0,
            same_top=same,
            same_top_error=same_err,
            kld_values=_joined(self.kld_values),
            dp_values=_joined(self.dp_values),
        )


def _joined(parts: list[npt.NDArray[np.float32]]) -> npt.NDArray[np.float32]:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


# ---------------------------------------------------------------- scoring


def _nll(rows: npt.NDArray[np.float32], targets: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """``-log softmax(rows)[target]`` per row: float32 exponentials of the
    logits less their maximum, summed and logged in float64."""
    at = np.arange(rows.shape[0])
    mx = rows.max(axis=1)
    sum_exp = np.exp(rows - mx[:, None]).sum(axis=1, dtype=np.float64)
    nll: npt.NDArray[np.float64] = np.log(sum_exp) - (rows[at, targets] - mx).astype(np.float64)
    return nll


def _quantized(
    rows: npt.NDArray[np.float32], targets: npt.NDArray[np.int64], width: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.uint16]]:
    """The nll of each row (as llama.cpp computes it while saving) and the
    row's log-probabilities in the base file's layout: float32 scale and
    minimum log-probability, then one uint16 per token for the logits within
    16 nats of the top one (0 below), padded to ``width`` uint16s."""
    m, n_vocab = rows.shape
    at = np.arange(m)
    mx = rows.max(axis=1)
    mn = np.maximum(rows.min(axis=1), mx - _LOG_PROB_RANGE)
    sum_exp = np.exp(rows - mx[:, None]).sum(axis=1, dtype=np.float64)
    lse = np.log(sum_exp).astype(np.float32)
    min_lp = (mn - mx) - lse
    scale = (mx - mn) / _Q_MAX
    out = np.zeros((m, width), dtype=np.uint16)
    out[:, :4] = np.stack([scale, min_lp], axis=1).astype("<f4").view("<u2")
    live = scale > 0
    if live.any():
        r = rows[live]
        inv = np.float32(1.0) / scale[live]
        low = mn[live][:, None]
        q = np.rint(inv[:, None] * (r - low))
        out[live, 4 : 4 + n_vocab] = np.where(r > low, np.clip(q, 0, _Q_MAX), 0).astype(np.uint16)
    nll = ((mx + lse) - rows[at, targets]).astype(np.float64)
    return nll, out


def _row_width(n_vocab: int) -> int:
    return 2 * ((n_vocab + 1) // 2) + 4


# ------------------------------------------------------------- base files


@dataclass(frozen=True)
class _KlBase:
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: npt.NDArray[np.int32]
    data_offset: int


def read_kl_base_header(path: str | os.PathLike[str]) -> tuple[int, int, int]:
    """``(n_ctx, n_vocab, n_chunks)`` of a ``--kl-divergence-base`` file."""
    b = _read_base(path)
    return b.n_ctx, b.n_vocab, b.n_chunk


def _read_base(path: str | os.PathLike[str]) -> _KlBase:
    try:
        with open(path, "rb") as f:
            head = f.read(20)
            if len(head) < 20 or head[:8] != KL_MAGIC:
                raise LoadError(f"{path} is not a file of base log-probabilities (no _logits_)")
            n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", head[8:])
            if n_ctx < 3 or n_vocab < 1 or n_chunk < 1:
                raise LoadError(
                    f"{path}: impossible header (n_ctx {n_ctx}, n_vocab {n_vocab}, "
                    f"chunks {n_chunk})"
                )
            n_tok = n_ctx * n_chunk
            raw = f.read(4 * n_tok)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise LoadError(f"cannot read {path}: {e}") from e
    rows = n_ctx - 1 - n_ctx // 2
    expected = 20 + 4 * n_tok + 2 * n_chunk * rows * _row_width(n_vocab)
    if len(raw) < 4 * n_tok or size != expected:
        raise LoadError(
            f"{path} holds {size} bytes; {n_chunk} chunks of {n_ctx} tokens over a "
            f"vocabulary of {n_vocab} take {expected} (truncated or not such a file)"
        )
    tokens = np.frombuffer(raw, dtype="<i4").astype(np.int32)
    return _KlBase(n_ctx, n_vocab, n_chunk, tokens, 20 + 4 * n_tok)


# -------------------------------------------------------------------- run


def _check_positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ParameterError(f"{name} must be a positive integer, got {value!r}")
    return value


def run(
    engine: Evaluator,
    text: str | None = None,
    *,
    n_ctx: int | None = None,
    chunks: int | None = None,
    save_logits: str | os.PathLike[str] | None = None,
    kl_base: str | os.PathLike[str] | None = None,
    on_chunk: OnChunk | None = None,
) -> Perplexity:
    """See :meth:`Engine.perplexity`."""
    t_start = time.perf_counter()
    if chunks is not None and chunks != -1:
        _check_positive("chunks", chunks)
    tok = engine.tokenizer
    if tok.add_eos:
        raise ParameterError(
            "perplexity needs a model whose tokenizer does not append EOS "
            "(llama-perplexity refuses it too)"
        )
    base: _KlBase | None = None
    if kl_base is not None:
        if text is not None:
            raise ParameterError("comparing with kl_base, the tokens come from its file: no text")
        if save_logits is not None:
            raise ParameterError("give save_logits or kl_base, not both")
        base = _read_base(kl_base)
        if n_ctx is not None and n_ctx != base.n_ctx:
            raise ParameterError(
                f"{kl_base} was computed with n_ctx={base.n_ctx}, not {n_ctx}: leave n_ctx out"
            )
        if base.n_vocab != engine.vocab_size:
            raise LoadError(
                f"{kl_base} has a vocabulary of {base.n_vocab} tokens, this model "
                f"{engine.vocab_size}: not the same vocabulary"
            )
        n_ctx = base.n_ctx
        tokens = base.tokens
        t_tok = 0.0
        n_chunk = base.n_chunk
    else:
        n_ctx = DEFAULT_N_CTX if n_ctx is None else _check_positive("n_ctx", n_ctx)
        if n_ctx < 3:
            raise ParameterError(f"n_ctx must be at least 3 (a scored half), got {n_ctx}")
        if not isinstance(text, str):
            raise ParameterError(f"text must be a string, got {type(text).__name__}")
        if not text:
            raise ParameterError("the text is empty: perplexity needs at least 2 * n_ctx tokens")
        t0 = time.perf_counter()
        tokens = np.asarray(tok.encode(text, add_special=True, parse_special=False), dtype=np.int32)
        t_tok = time.perf_counter() - t0
        if tokens.size < 2 * n_ctx:
            raise ParameterError(
                f"the text tokenizes to {tokens.size} tokens; perplexity with a context "
                f"of {n_ctx} needs at least {2 * n_ctx}"
            )
        n_chunk = tokens.size // n_ctx
    if chunks is not None and chunks != -1:
        n_chunk = min(n_chunk, chunks)
    if n_ctx > engine.n_ctx:
        raise ParameterError(
            f"n_ctx={n_ctx} exceeds the engine's context of {engine.n_ctx}: "
            f"make it with Engine(..., context_size={n_ctx})"
        )
    bos = tok.bos_id if tok.add_bos else None
    first = n_ctx // 2
    n_vocab = engine.vocab_size
    width = _row_width(n_vocab)
    piece = max(1, _PIECE_BYTES // (4 * n_vocab))

    out: BinaryIO | None = None
    if save_logits is not None:
        try:
            out = open(save_logits, "wb")
        except OSError as e:
            raise ParameterError(f"cannot write {save_logits}: {e}") from e
    src: IO[bytes] | None = None
    if base is not None and kl_base is not None:
        src = open(kl_base, "rb")
        src.seek(base.data_offset)
    try:
        if out is not None:
            out.write(KL_MAGIC + struct.pack("<Iii", n_ctx, n_vocab, n_chunk))
            out.write(tokens[: n_chunk * n_ctx].astype("<i4").tobytes())
        nll_sum = nll2_sum = 0.0
        count = 0
        chunk_ppl: list[float] = []
        running: list[float] = []
        kl = _KlSums() if base is not None else None
        t_eval = t_score = 0.0
        if on_chunk is not None:
            on_chunk(PerplexityProgress(0, n_chunk, math.nan, math.nan, math.nan))
        for c in range(n_chunk):
            chunk = tokens[c * n_ctx : (c + 1) * n_ctx].astype(np.int64)
            inputs = chunk.tolist()
            if bos is not None:
                inputs[0] = bos
            t0 = time.perf_counter()
            engine.reset()
            # The first half only conditions: its logits are never read.
            engine.eval(inputs[:first])
            t_eval += time.perf_counter() - t0
            c_nll = c_nll2 = 0.0
            for lo in range(first, n_ctx, piece):
                hi = min(lo + piece, n_ctx)
                t0 = time.perf_counter()
                rows = engine.eval(inputs[lo:hi], all_logits=True)
                t1 = time.perf_counter()
                t_eval += t1 - t0
                # Logits at j score token j+1; the chunk's last row has none.
                scored = min(hi, n_ctx - 1) - lo
                if scored > 0:
                    r = rows[:scored]
                    targets = chunk[lo + 1 : lo + 1 + scored]
                    if out is not None:
                        nll, q = _quantized(r, targets, width)
                        out.write(q.astype("<u2").tobytes())
                    else:
                        nll = _nll(r, targets)
                    if kl is not None and src is not None:
                        raw = src.read(2 * scored * width)
                        q_base = np.frombuffer(raw, dtype="<u2").reshape(scored, width)
                        kl.add(r, q_base, targets)
                    c_nll += float(nll.sum())
                    c_nll2 += float((nll * nll).sum())
                t_score += time.perf_counter() - t1
            n_scored = n_ctx - 1 - first
            nll_sum += c_nll
            nll2_sum += c_nll2
            count += n_scored
            chunk_ppl.append(math.exp(c_nll / n_scored))
            ppl, err = _ppl_and_error(nll_sum, nll2_sum, count)
            running.append(ppl)
            if on_chunk is not None:
                on_chunk(
                    PerplexityProgress(
                        chunk=c + 1,
                        n_chunks=n_chunk,
                        ppl=ppl,
                        ppl_error=err,
                        chunk_ppl=chunk_ppl[-1],
                        kl=kl.result() if kl is not None else None,
                    )
                )
    finally:
        engine.reset()
        if out is not None:
            out.close()
        if src is not None:
            src.close()
    ppl, err = _ppl_and_error(nll_sum, nll2_sum, count)
    return Perplexity(
        ppl=ppl,
        ppl_error=err,
        chunk_ppl=tuple(chunk_ppl),
        running_ppl=tuple(running),
        n_tokens=count,
        n_chunks=n_chunk,
        n_ctx=n_ctx,
        n_text_tokens=int(tokens.size),
        tokenize_seconds=t_tok,
        eval_seconds=t_eval,
        score_seconds=t_score,
        total_seconds=time.perf_counter() - t_start,
        kl=kl.result() if kl is not None else None,
    )
