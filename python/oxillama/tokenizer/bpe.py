"""Byte-level BPE (GGUF model ``gpt2``) as a HuggingFace tokenizer."""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from ..errors import LoadError
from .gguf_vocab import GgufVocab
from .pretokenizers import pretokenizer_regexes


def build_bpe(v: GgufVocab) -> Tokenizer:
    if v.merges is None:
        raise LoadError("byte-level BPE vocabulary has no tokenizer.ggml.merges")
    vocab = {tok: i for i, tok in enumerate(v.tokens)}
    merges: list[tuple[str, str]] = []
    for i, m in enumerate(v.merges):
        left, sep, right = m.partition(" ")
        if not sep:
            raise LoadError(f"tokenizer merge #{i} {m!r} is not two space-separated parts")
        merges.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=False))
    splits = [
        pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False)
        for rx in pretokenizer_regexes(v.pre)
    ]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def bpe_piece(token: str) -> bytes:
    """Raw bytes of a byte-level BPE token."""
    try:
        return bytes(UNICODE_TO_BYTE[c] for c in token)
    except KeyError:
        return token.encode()
