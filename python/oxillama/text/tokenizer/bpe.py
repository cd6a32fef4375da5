"""Byte-level BPE (GGUF model ``gpt2``) as a HuggingFace tokenizer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

import oxillama._native as _native
from oxillama.errors import LoadError
from oxillama.text.tokenizer.gguf_vocab import GgufVocab

__all__ = [
    "BYTE_TO_UNICODE",
    "DROPPED",
    "UNICODE_TO_BYTE",
    "bpe_model",
    "bpe_piece",
    "bpe_pieces",
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


def split_merges(
    merges: Sequence[str],
    tokens: Sequence[str] | None = None,
    file: _native.GgufFile | None = None,
) -> list[tuple[str, str]]:
    """``"a b"`` merge strings as pairs, split at the first space after the
    first character as llama.cpp does (natively: this runs on every load).
    Parts that are tokens of ``tokens`` share those tokens' strings.
    ``file``: the parsed GGUF whose own merges ``merges`` are, unchanged;
    they are then read from it rather than from the Python strings."""
    split = None
    if file is not None and tokens is not None:
        split = _native.split_file_merges(file, _as_list(tokens))
    if split is None:
        split = _native.split_merges(_as_list(merges), None if tokens is None else _as_list(tokens))
    pairs, bad = split
    if bad >= 0:
        raise LoadError(f"tokenizer merge #{bad} {merges[bad]!r} is not two space-separated parts")
    return pairs


def _as_list(items: Sequence[str]) -> list[str]:
    # The vocabulary's own lists are passed as they are: a copy of ~50k
    # entries costs as much as the native call saves.
    return items if isinstance(items, list) else list(items)


def check_merges(merges: Sequence[tuple[str, str]], vocab: Mapping[str, int]) -> None:
    """Each merge's parts and result must be tokens (in a damaged file the
    vocabulary and the merges no longer match)."""
    known = vocab.keys()
    if all(a in known and b in known and a + b in known for a, b in merges):
        return
    for i, (a, b) in enumerate(merges):
        for part, what in ((a, "its first part"), (b, "its second part"), (a + b, "its result")):
            if part not in vocab:
                raise LoadError(
                    f"tokenizer merge #{i} {a + ' ' + b!r}: {what} {part!r} is not in the "
                    "vocabulary (tokenizer.ggml.tokens and tokenizer.ggml.merges do not match)"
                )


def bpe_model(vocab: dict[str, int], merges: list[tuple[str, str]], **options: Any) -> models.BPE:
    """HF's BPE model over a GGUF vocabulary. HF refuses merges whose parts
    or result are not tokens, naming only the token; only then does
    ``check_merges`` walk the merges (off the load path) for the error that
    names the merge."""
    try:
        return models.BPE(vocab=vocab, merges=merges, **options)
    except Exception:  # the tokenizers library raises bare Exceptions
        check_merges(merges, vocab)
        raise


def build_bpe(v: GgufVocab, file: _native.GgufFile | None = None) -> Tokenizer:
    """The model, pre-tokenizer and decoder; special tokens are added by the
    caller. ``file``: see :func:`split_merges`."""
    assert v.merges is not None  # checked by GgufVocab
    pre = v.pre_tokenizer
    vocab = dict(v.token_ids)
    vocab.setdefault(DROPPED, len(v.tokens))
    model = bpe_model(
        vocab,
        split_merges(v.merges, v.tokens, file),
        unk_token=DROPPED,
        fuse_unk=False,
        ignore_merges=pre.ignore_merges,
    )
    tok = Tokenizer(model)
    splits: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False) for rx in pre.regexes
    ]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _piece_table() -> dict[int, int | str]:
    """``str.translate`` table from GPT-2's characters to the bytes they
    stand for (as code points 0..255). Code points below 256 that are *not*
    in GPT-2's table map to a character that Latin-1 cannot encode, so a
    token holding one (kept as UTF-8, two bytes for U+0080 and up) leaves
    the fast path."""
    table: dict[int, int | str] = {ord(c): b for c, b in UNICODE_TO_BYTE.items()}
    for cp in range(256):
        table.setdefault(cp, "\U0010ffff")
    return table


_PIECE_TABLE = _piece_table()


def bpe_piece(token: str) -> bytes:
    """Raw bytes of a byte-level BPE token (characters outside GPT-2's table
    are kept as their UTF-8)."""
    try:
        # Every token of a whole vocabulary passes here on each load.
        return token.translate(_PIECE_TABLE).encode("latin-1")
    except UnicodeEncodeError:
        pass
    out = bytearray()
    for c in token:
        b = UNICODE_TO_BYTE.get(c)
        if b is None:
            out += c.encode()
        else:
            out.append(b)
    return bytes(out)


def bpe_pieces(tokens: Sequence[str]) -> list[bytes]:
    """``bpe_piece`` of every token, natively (a whole vocabulary, on every
    load)."""
    return _native.byte_level_pieces(list(tokens))
