"""SentencePiece-style vocabularies (GGUF model ``llama``) as a HuggingFace
tokenizer.

llama.cpp's SPM tokenizer splits text into characters and repeatedly merges
the adjacent pair whose concatenation is the highest-scoring vocabulary
piece; characters left without a piece become ``<0xXX>`` byte tokens. A BPE
model whose merge list holds every such pair, ranked by the score of the
piece it makes, does the same, so that is what we build (the way HF converts
SentencePiece BPE models). Spaces are ``▁`` (U+2581); ``add_space_prefix``
prepends one to each run of text.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers

from oxillama.errors import LoadError
from oxillama.text.tokenizer.gguf_vocab import (
    A_BYTE,
    A_CONTROL,
    A_NORMAL,
    A_UNKNOWN,
    A_USER_DEFINED,
    GgufVocab,
)

__all__ = ["SPACE", "build_spm", "spm_merges", "spm_piece"]

SPACE = "\u2581"


def spm_merges(v: GgufVocab) -> list[tuple[str, str]]:
    """Every pair of pieces whose concatenation is a piece, best score first
    (ties: lower token id, then shorter left part). llama.cpp breaks score
    ties by position instead; no two of Gemma-3's normal pieces share a
    score."""
    if v.scores is None:
        raise LoadError("SentencePiece vocabulary has no tokenizer.ggml.scores")
    scores = v.scores
    tokens = v.tokens
    vocab = v.token_ids
    merges: list[tuple[str, str]] = []
    for i in sorted(range(len(tokens)), key=lambda i: (-scores[i], i)):
        merged = tokens[i]
        for k in range(1, len(merged)):
            a = merged[:k]
            if a in vocab:
                b = merged[k:]
                if b in vocab:
                    merges.append((a, b))
    return merges


def build_spm(v: GgufVocab) -> Tokenizer:
    """The model, normalizer and decoder; special tokens are added by the
    caller."""
    vocab = dict(v.token_ids)
    unk = v.tokens[v.unk_id] if v.unk_id is not None else None
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=spm_merges(v),
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    norm: list[normalizers.Normalizer] = []
    if v.add_space_prefix:
        norm.append(normalizers.Prepend(SPACE))
    norm.append(normalizers.Replace(" ", SPACE))
    tok.normalizer = normalizers.Sequence(norm)
    dec: list[decoders.Decoder] = [
        decoders.Replace(SPACE, " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
    ]
    if v.add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(dec)
    return tok


def byte_token_value(token: str) -> int | None:
    """The byte a ``<0xXX>`` token stands for, or ``None``."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


def spm_piece(token: str, attr: int) -> bytes:
    """Raw bytes of an SPM piece, as llama.cpp's token_to_piece gives them."""
    if attr & (A_UNKNOWN | A_CONTROL | A_USER_DEFINED):
        return token.encode()
    if attr & A_NORMAL:
        return token.replace(SPACE, " ").encode()
    if attr & A_BYTE:
        b = byte_token_value(token)
        return bytes([b]) if b is not None else token.encode()
    return b""  # unused / undefined tokens render as nothing
