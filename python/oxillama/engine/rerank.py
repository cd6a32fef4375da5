"""Reranking with a cross-encoder: a query and a document in one sequence,
the encoder's pooled state through the model's classifier head
(:mod:`oxillama.model.rank_head`), one score per document.

The pair's tokens are llama-server's (``format_prompt_rerank``): a
``tokenizer.chat_template.rerank`` with ``{query}`` and ``{document}``
filled in when the file has one, else BOS (when ``add_bos_token``), the
query, EOS (when ``add_eos_token``; [SEP] when there is no EOS), [SEP]
(when ``add_sep_token``), the document, EOS (when ``add_eos_token``).
Every token gets token type 0, as llama.cpp's BERT graph gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from oxillama.errors import GenerateError, ParameterError
from oxillama.model.rank_head import RankHead
from oxillama.text.tokenizer import Tokenizer

__all__ = ["RerankResult", "check_request", "pair_tokens", "prepare", "rank"]


@dataclass(frozen=True)
class RerankResult:
    """One document's place in a rerank: its index in the request's
    ``documents`` and its score (the classifier's raw logit)."""

    index: int
    relevance_score: float


def pair_tokens(head: RankHead, tokenizer: Tokenizer, query: str, document: str) -> list[int]:
    """The token ids llama-server runs for one (query, document) pair."""
    if head.template is not None:
        prompt = head.template.replace("{query}", query).replace("{document}", document)
        return tokenizer.encode(prompt, add_special=False, parse_special=True)
    q = tokenizer.encode(query, add_special=False, parse_special=False)
    d = tokenizer.encode(document, add_special=False, parse_special=False)
    ids: list[int] = []
    if head.add_bos and head.bos is not None:
        ids.append(head.bos)
    ids += q
    if head.add_eos and head.eos is not None:
        ids.append(head.eos)
    if head.add_sep and head.sep is not None:
        ids.append(head.sep)
    ids += d
    if head.add_eos and head.eos is not None:
        ids.append(head.eos)
    return ids


def check_request(query: object, documents: object, top_n: object) -> tuple[str, list[str], int]:
    """The arguments checked: the query, the documents as a list, and how
    many results to return."""
    if not isinstance(query, str):
        raise ParameterError(f"query must be a string, got {type(query).__name__}")
    if isinstance(documents, str | bytes) or not isinstance(documents, Sequence):
        raise ParameterError(f"documents must be a list of strings, got {type(documents).__name__}")
    docs = list(documents)
    if not docs:
        raise ParameterError("documents is an empty list")
    for i, d in enumerate(docs):
        if not isinstance(d, str):
            raise ParameterError(f"documents[{i}] must be a string, got {type(d).__name__}")
    if top_n is None:
        n = len(docs)
    elif isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise ParameterError(f"top_n must be a positive integer, got {top_n!r}")
    else:
        n = min(top_n, len(docs))
    return query, docs, n


def prepare(
    head: RankHead, tokenizer: Tokenizer, query: str, documents: list[str], max_len: int
) -> list[list[int]]:
    """Every pair's token ids; a GenerateError names a pair longer than
    ``max_len`` (the context, or the encoder's position table)."""
    seqs = []
    for i, doc in enumerate(documents):
        ids = pair_tokens(head, tokenizer, query, doc)
        if not ids:
            raise ParameterError(f"documents[{i}]: the query and document give no tokens")
        if len(ids) > max_len:
            raise GenerateError(
                f"documents[{i}]: the query and document are {len(ids)} tokens, more than "
                f"the model's limit of {max_len}"
            )
        seqs.append(ids)
    return seqs


def rank(
    head: RankHead,
    hidden: npt.NDArray[np.float32],
    seqs: list[list[int]],
    top_n: int,
) -> list[RerankResult]:
    """The scores of the pairs whose hidden states are ``hidden`` (their
    rows one sequence after another), best first, the first ``top_n``."""
    lengths = np.asarray([len(s) for s in seqs])
    ends = np.cumsum(lengths)
    starts = ends - lengths
    h = hidden.astype(np.float64)
    if head.pooling == "mean":
        pooled = np.add.reduceat(h, starts, axis=0) / lengths[:, None]
    else:
        pooled = h[starts]
    scores = head.scores(pooled)
    # A stable sort: equal scores keep the documents' order.
    order = sorted(range(len(seqs)), key=lambda i: -scores[i])
    return [RerankResult(i, float(scores[i])) for i in order[:top_n]]
