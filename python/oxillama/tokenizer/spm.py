"""SentencePiece-style vocabularies (GGUF model ``llama``) as a HuggingFace
tokenizer: BPE whose merge order follows the piece scores, with ``▁`` for
spaces and ``<0xXX>`` byte fallback, as llama.cpp's SPM tokenizer does."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers

from ..errors import LoadError
from .gguf_vocab import BYTE, GgufVocab

SPACE = "\u2581"


def build_spm(v: GgufVocab) -> Tokenizer:
    if v.scores is None:
        raise LoadError("SentencePiece vocabulary has no tokenizer.ggml.scores")
    vocab = {tok: i for i, tok in enumerate(v.tokens)}
    # A merge (a, b) exists when a, b and a+b are all pieces; pieces with a
    # higher score merge first, which is what SPM's bigram search does.
    ranked: list[tuple[float, int, str, str]] = []
    for merged, i in vocab.items():
        if v.token_types[i] == BYTE or len(merged) < 2:
            continue
        for k in range(1, len(merged)):
            a, b = merged[:k], merged[k:]
            if a in vocab and b in vocab:
                ranked.append((-v.scores[i], i, a, b))
    ranked.sort()
    merges = [(a, b) for _, _, a, b in ranked]
    unk = v.tokens[v.unk_id] if v.unk_id is not None else None
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
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


def spm_piece(token: str, token_type: int) -> bytes:
    """Raw bytes of an SPM piece: ``<0xXX>`` byte tokens become that byte."""
    if token_type == BYTE and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace(SPACE, " ").encode()
