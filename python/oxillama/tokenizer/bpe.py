"""Byte-level BPE (GGUF model ``gpt2``) as a HuggingFace tokenizer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from ..errors import LoadError
from .gguf_vocab import GgufVocab

__all__ = [
    "BYTE_TO_UNICODE",
    "DROPPED",
    "UNICODE_TO_BYTE",
    "bpe_piece",
    "build_bpe",
    "split_merges",
]

#: A token appended after the GGUF vocabulary as the BPE model's unknown
#: token. Some vocabularies lack a few byte characters (SmolLM2 has no token
#: for the bytes 0x04 or 0xF5); llama.cpp keeps such a character in the word,
#: where it stops merges across it, and then drops it. An unknown token does
#: the same in HF's BPE, and ``Tokenizer.encode`` removes it afterwards.
DROPPED = "<|oxillama:dropped|>"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible table from bytes to printable characters."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_UNICODE: dict[int, str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_UNICODE.items()}


def split_merges(merges: Sequence[str]) -> list[tuple[str, str]]:
    """``"a b"`` merge strings as pairs, split at the first space after the
    first character as llama.cpp does."""
    out: list[tuple[str, str]] = []
    for i, m in enumerate(merges):
        pos = m.find(" ", 1)
        if pos < 0:
            raise LoadError(f"tokenizer merge #{i} {m!r} is not two space-separated parts")
        out.append((m[:pos], m[pos + 1 :]))
    return out


def check_merges(merges: Sequence[tuple[str, str]], vocab: Mapping[str, int]) -> None:
    """Each merge's parts and result must be tokens (in a damaged file the
    vocabulary and the merges no longer match)."""
    for i, (a, b) in enumerate(merges):
        for part, what in ((a, "its first part"), (b, "its second part"), (a + b, "its result")):
            if part not in vocab:
                raise LoadError(
                    f"tokenizer merge #{i} {a + ' ' + b!r}: {what} {part!r} is not in the "
                    "vocabulary (tokenizer.ggml.tokens and tokenizer.ggml.merges do not match)"
                )


def build_bpe(v: GgufVocab) -> Tokenizer:
    """The model, pre-tokenizer and decoder; special tokens are added by the
    caller."""
    assert v.merges is not None  # checked by GgufVocab
    pre = v.pre_tokenizer
    vocab = {tok: i for i, tok in enumerate(v.tokens)}
    vocab.setdefault(DROPPED, len(v.tokens))
    merges = split_merges(v.merges)
    check_merges(merges, vocab)
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=DROPPED,
            fuse_unk=False,
            ignore_merges=pre.ignore_merges,
        )
    )
    splits: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False) for rx in pre.regexes
    ]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def bpe_piece(token: str) -> bytes:
    """Raw bytes of a byte-level BPE token (characters outside GPT-2's table
    are kept as their UTF-8)."""
    out = bytearray()
    for c in token:
        b = UNICODE_TO_BYTE.get(c)
        if b is None:
            out += c.encode()
        else:
            out.append(b)
    return bytes(out)
