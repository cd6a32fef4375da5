"""A reranker's classifier head, read from its GGUF.

A reranker GGUF is a BERT with the classifier head llama.cpp's converter
writes for a ``*ForSequenceClassification``: ``cls.weight`` and
``cls.bias`` (a dense layer, tanh after it), then ``cls.output.weight`` and
``cls.output.bias`` (the projection to the labels); either part may be
missing, as in llama.cpp. The converter writes no pooling type for it
(llama-server's ``--reranking`` asks for rank pooling); a file whose
``<arch>.pooling_type`` is 4 (llama.cpp's RANK) is a reranker too, and
must have the head. The score is the first output, the raw logit, as
llama-server's ``/v1/rerank`` returns it. The head is small (at most
``n_embd x n_embd``), so it runs in numpy in float64.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

import oxillama._native as _native
from oxillama.errors import LoadError
from oxillama.model.quantize.ftypes import GGML_TYPES
from oxillama.text.tokenizer.gguf_vocab import GgufVocab

__all__ = ["RANK", "RankHead", "is_reranker", "load_head"]

#: llama.cpp's ``LLAMA_POOLING_TYPE_RANK``.
RANK = 4
#: Architectures whose rank pooling we run: BERT's graph (CLS or mean
#: pooling, tanh head). llama.cpp's others differ (ModernBERT's GELU and
#: head norm, Qwen3's causal last-token softmax).
ARCHS = ("bert",)
_POOLING_CLS = {None: "cls", 1: "mean", 2: "cls"}


@dataclass(frozen=True)
class RankHead:
    """A reranker's classifier head and how its input sequence is made."""

    #: ``cls.weight`` (``n_embd x n_embd``, rows are outputs) and its bias.
    dense: npt.NDArray[np.float64] | None
    dense_bias: npt.NDArray[np.float64] | None
    #: ``cls.output.weight`` (``n_out x n_embd``) and its bias.
    out: npt.NDArray[np.float64] | None
    out_bias: npt.NDArray[np.float64] | None
    #: Which hidden state is pooled: "cls" (the first token) or "mean".
    pooling: str
    #: ``tokenizer.chat_template.rerank``, if the file has one.
    template: str | None
    bos: int | None
    #: EOS, or [SEP] where there is no EOS (llama-server's fallback).
    eos: int | None
    sep: int | None
    add_bos: bool
    add_eos: bool
    add_sep: bool

    def scores(self, pooled: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The first classifier output of each pooled row."""
        x = pooled
        if self.dense is not None:
            x = x @ self.dense.T
            if self.dense_bias is not None:
                x = x + self.dense_bias
            x = np.tanh(x)
        if self.out is not None:
            x = x @ self.out.T
            if self.out_bias is not None:
                x = x + self.out_bias
        return np.asarray(x[:, 0], dtype=np.float64)


#: The tensors of a classifier head (either layer makes one).
HEAD_TENSORS = ("cls.weight", "cls.output.weight")


def is_reranker(gguf: _native.GgufFile, metadata: Mapping[str, Any], arch: str) -> bool:
    """Rank pooling in the metadata, or a classifier head in the tensors."""
    if metadata.get(f"{arch}.pooling_type") == RANK:
        return True
    return any(t[0] in HEAD_TENSORS for t in gguf.tensors())


def _tensor(
    gguf: _native.GgufFile,
    infos: dict[str, tuple[str, list[int]]],
    name: str,
    shape: tuple[int, ...],
) -> npt.NDArray[np.float64] | None:
    """Tensor ``name`` as float64 in numpy's (row, column) order, None when
    the file has none; a LoadError names a shape or type that does not fit."""
    got = infos.get(name)
    if got is None:
        return None
    ty, dims = got
    # GGUF lists the innermost dimension first.
    want = list(reversed(shape))
    if dims != want:
        raise LoadError(f"tensor {name} has shape {dims}, a reranker head needs {want}")
    type_id = GGML_TYPES.get(ty)
    if type_id is None:
        raise LoadError(f"tensor {name} has type {ty}, which the reranker head cannot read")
    n = int(np.prod(shape))
    values = _native.dequantize(type_id, gguf.tensor_bytes(name), n)
    return np.asarray(values, dtype=np.float64).reshape(shape)


def load_head(gguf: _native.GgufFile, metadata: Mapping[str, Any], arch: str) -> RankHead:
    """The classifier head and pair layout of a reranker GGUF; a
    LoadError names what we cannot run."""
    if arch not in ARCHS:
        raise LoadError(
            f"metadata {arch}.pooling_type = {RANK} (rank): reranking is supported for "
            f"{', '.join(ARCHS)} only, not {arch}"
        )
    cls_pooling = metadata.get(f"{arch}.classifier.pooling_type")
    if cls_pooling not in _POOLING_CLS:
        raise LoadError(
            f"metadata {arch}.classifier.pooling_type = {cls_pooling!r} is not supported "
            "(1: mean, 2: cls)"
        )
    n_embd = int(metadata[f"{arch}.embedding_length"])
    labels = metadata.get(f"{arch}.classifier.output_labels")
    n_out = len(labels) if isinstance(labels, list) and labels else 1
    infos = {name: (ty, [int(d) for d in dims]) for name, ty, dims, _, _ in gguf.tensors()}
    if "cls.norm.weight" in infos:
        raise LoadError("tensor cls.norm.weight (a classifier head norm) is not supported")
    vocab = GgufVocab.from_metadata(metadata)
    eos = vocab.eos_id if vocab.eos_id is not None else vocab.sep_id
    head = RankHead(
        dense=_tensor(gguf, infos, "cls.weight", (n_embd, n_embd)),
        dense_bias=_tensor(gguf, infos, "cls.bias", (n_embd,)),
        out=_tensor(gguf, infos, "cls.output.weight", (n_out, n_embd)),
        out_bias=_tensor(gguf, infos, "cls.output.bias", (n_out,)),
        pooling=_POOLING_CLS[cls_pooling],
        template=metadata.get("tokenizer.chat_template.rerank"),
        bos=vocab.bos_id,
        eos=eos,
        sep=vocab.sep_id,
        add_bos=vocab.add_bos,
        add_eos=vocab.add_eos,
        add_sep=vocab.add_sep,
    )
    if head.dense is None and head.out is None:
        raise LoadError(
            "a reranker (pooling type rank) needs a classifier head: the file has neither "
            "cls.weight nor cls.output.weight"
        )
    for flag, tok, what in (
        (head.add_bos, head.bos, "BOS"),
        (head.add_eos, head.eos, "EOS"),
        (head.add_sep, head.sep, "separator"),
    ):
        if flag and tok is None and head.template is None:
            raise LoadError(f"a reranker that adds a {what} token needs one in its vocabulary")
    return head
