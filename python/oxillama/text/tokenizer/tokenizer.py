"""The public tokenizer: a HuggingFace ``tokenizers.Tokenizer`` built from GGUF
metadata so that its token ids equal llama.cpp's."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as HFTokenizer

import oxillama._native as _native
from oxillama.errors import LoadError, OxiLlamaError, ParameterError, TokenizeError
from oxillama.text.tokenizer.bpe import DROPPED, UNICODE_TO_BYTE, bpe_piece, build_bpe
from oxillama.text.tokenizer.gguf_vocab import (
    A_BYTE,
    A_LSTRIP,
    A_NORMAL,
    A_RSTRIP,
    A_SPECIAL,
    A_USER_DEFINED,
    EOG_TEXTS,
    GgufVocab,
)
from oxillama.text.tokenizer.spm import SPACE, build_spm, byte_token_value, spm_piece
from oxillama.text.tokenizer.spm_bpe import build_spm_bpe
from oxillama.text.tokenizer.strip import strip_around
from oxillama.text.tokenizer.wordpiece import build_wordpiece, prenormalize, wordpiece_piece

__all__ = ["Tokenizer"]

# Used by from_file when no GGUF metadata says which tokens are BOS / EOS.
_SURROGATE = re.compile("[\ud800-\udfff]")
_BOS_TEXTS = ("<|begin_of_text|>", "<bos>", "<s>", "<|startoftext|>")
_EOS_TEXTS = ("<|end_of_text|>", "<eos>", "</s>", "<|endoftext|>", "<|im_end|>")


class Tokenizer:
    """Text <-> token ids, matching llama.cpp's tokenization of the model.

    Build one with :meth:`from_gguf_metadata` (the usual way) or
    :meth:`from_file` (a ``tokenizer.json`` that overrides the GGUF's
    vocabulary).

    ``encode(..., parse_special=True)`` turns the text of a control token
    such as ``<|im_start|>`` into its single id; with ``parse_special=False``
    the same text is tokenized as ordinary characters. User-defined tokens
    (GGUF token type 4) are matched whole either way, as llama.cpp does.
    """

    def __init__(
        self,
        hf: HFTokenizer,
        *,
        pieces: Sequence[bytes],
        special_ids: Iterable[int],
        fragment_ids: Iterable[int] = (),
        lstrip_ids: Iterable[int] = (),
        rstrip_ids: Iterable[int] = (),
        eog_ids: Iterable[int],
        bos_id: int | None,
        eos_id: int | None,
        eot_id: int | None = None,
        add_bos: bool,
        add_eos: bool,
        add_space_prefix: bool = False,
        manual_special: bool = True,
        prenormalize: Callable[[str], str] | None = None,
        sep_id: int | None = None,
    ) -> None:
        self._hf = hf
        self._pieces = list(pieces)
        self._special = frozenset(special_ids)
        # Tokens matched whole before the model runs (special and
        # user-defined): text after them starts a new run.
        self._fragments = self._special | frozenset(fragment_ids)
        # Whitespace llama.cpp drops before / after these tokens (strip.py).
        self._lstrip = frozenset(lstrip_ids) & self._fragments
        self._rstrip = frozenset(rstrip_ids) & self._fragments
        self._strips = self._lstrip | self._rstrip
        self._eog = frozenset(eog_ids)
        self._bos = bos_id
        self._eos = eos_id
        self._eot = eot_id
        self._add_bos = add_bos
        self._add_eos = add_eos
        self._add_space_prefix = add_space_prefix
        # True: BOS/EOS come from the GGUF flags; False: the tokenizer.json's
        # own post-processor adds them.
        self._manual_special = manual_special
        # Applied to the text before the HF pipeline (WordPiece's quirks).
        self._prenormalize = prenormalize
        # WordPiece's closing [SEP], appended after EOS (None: not added).
        self._sep = sep_id
        # encode_special_tokens is a switch on the shared HF object.
        self._lock = threading.Lock()
        self._dropped = hf.token_to_id(DROPPED)

    # ------------------------------------------------------------ building

    @classmethod
    def from_gguf_metadata(
        cls, metadata: Mapping[str, Any], *, _file: _native.GgufFile | None = None
    ) -> Tokenizer:
        """The tokenizer a GGUF file describes (keys ``tokenizer.ggml.*``).

        Raises :class:`~oxillama.errors.LoadError` for a missing vocabulary, an
        unsupported model or an unknown pre-tokenizer name.

        ``_file`` (the model's load only): the parsed file ``metadata`` was
        just read from, unchanged, whose merge rules are then split natively.
        """
        try:
            return cls._from_gguf(metadata, _file)
        except OxiLlamaError:
            raise
        except Exception as e:  # the tokenizers library raises bare Exceptions
            raise LoadError(
                f"cannot build the tokenizer from GGUF metadata: {type(e).__name__}: {e}"
            ) from e

    @classmethod
    def _from_gguf(cls, metadata: Mapping[str, Any], file: _native.GgufFile | None) -> Tokenizer:
        v = GgufVocab.from_metadata(metadata)
        builders: dict[str, Callable[[], HFTokenizer]] = {
            "bpe": lambda: build_bpe(v, file),
            "spm": lambda: build_spm(v),
            "spm_bpe": lambda: build_spm_bpe(v, file),
            "wpm": lambda: build_wordpiece(v),
        }
        hf = builders[v.kind]()
        # Control tokens are "special" (split as text when parse_special is
        # off); user-defined ones are always matched whole.
        control = v.control_ids()
        added = [AddedToken(v.tokens[i], special=True, normalized=False) for i in control]
        added += [
            AddedToken(v.tokens[i], special=False, normalized=False) for i in v.user_defined_ids()
        ]
        hf.add_tokens(added)
        if v.kind == "wpm":
            # llama.cpp's WordPiece add_special is always [BOS] text [SEP]:
            # it reads add_bos/add_eos/add_sep from the file (its reranking
            # prompts use them) but its tokenizer never consults them.
            add_bos, add_eos, sep = True, False, v.sep_id
        else:
            add_bos, add_eos, sep = v.add_bos, v.add_eos, None
        before = [v.bos_id] if add_bos and v.bos_id is not None else []
        after = [v.eos_id] if add_eos and v.eos_id is not None else []
        after += [sep] if sep is not None else []
        _set_post_processor(hf, v.tokens, before, after)
        pieces = _gguf_pieces(v.tokens, v.attrs, v.kind)
        return cls(
            hf,
            pieces=pieces,
            special_ids=control,
            fragment_ids=v.user_defined_ids(),
            lstrip_ids=v.strip_ids(A_LSTRIP),
            rstrip_ids=v.strip_ids(A_RSTRIP),
            eog_ids=v.eog_ids,
            bos_id=v.bos_id,
            eos_id=v.eos_id,
            eot_id=v.eot_id,
            add_bos=add_bos,
            add_eos=add_eos,
            add_space_prefix=v.add_space_prefix,
            prenormalize=prenormalize if v.kind == "wpm" else None,
            sep_id=sep,
        )

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None
    ) -> Tokenizer:
        """A ``tokenizer.json`` that overrides the GGUF vocabulary. BOS, EOS,
        end-of-generation tokens and ``add_bos`` come from ``metadata`` (the
        GGUF's) when given, else from the file's own special tokens."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise LoadError(f"cannot load tokenizer {path}: {e}") from e
        return cls.from_json_str(text, metadata, _origin=str(path))

    @classmethod
    def from_json_str(
        cls,
        text: str,
        metadata: Mapping[str, Any] | None = None,
        *,
        _origin: str = "JSON",
    ) -> Tokenizer:
        """Like :meth:`from_file`, from the text of a ``tokenizer.json``."""
        try:
            hf = HFTokenizer.from_str(text)
            spec = json.loads(text)
        except Exception as e:  # tokenizers raises a bare Exception
            raise LoadError(f"cannot load tokenizer {_origin}: {e}") from e
        n = hf.get_vocab_size(with_added_tokens=True)
        if hf.token_to_id(DROPPED) == n - 1:
            n -= 1  # our own placeholder (see bpe.DROPPED), not a real token
        added = hf.get_added_tokens_decoder()
        pieces = _hf_pieces(hf, spec, n)
        special = {i for i, t in added.items() if t.special}
        fragments = set(added)
        space_prefix = _json_space_prefix(spec)
        ids = hf.get_vocab(with_added_tokens=True)
        if metadata is not None:
            v = GgufVocab.from_metadata(metadata)
            return cls(
                hf,
                pieces=pieces,
                special_ids=special,
                fragment_ids=fragments,
                eog_ids={i for i in v.eog_ids if i < n},
                bos_id=v.bos_id,
                eos_id=v.eos_id,
                eot_id=v.eot_id,
                add_bos=v.add_bos,
                add_eos=v.add_eos,
                add_space_prefix=space_prefix,
            )
        bos = next((ids[t] for t in _BOS_TEXTS if t in ids), None)
        eos = next((ids[t] for t in _EOS_TEXTS if t in ids), None)
        eog = {ids[t] for t in EOG_TEXTS if t in ids and ids[t] in special}
        if eos is not None:
            eog.add(eos)
        probe = hf.encode("", add_special_tokens=True).ids
        return cls(
            hf,
            pieces=pieces,
            special_ids=special,
            fragment_ids=fragments,
            eog_ids=eog,
            bos_id=bos,
            eos_id=eos,
            add_bos=bos is not None and bos in probe[:1],
            add_eos=eos is not None and eos in probe[-1:],
            add_space_prefix=space_prefix,
            manual_special=False,
        )

    # -------------------------------------------------------------- queries

    @property
    def hf(self) -> HFTokenizer:
        """The underlying HuggingFace tokenizer."""
        return self._hf

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_id(self) -> int | None:
        return self._eos

    @property
    def eot_id(self) -> int | None:
        return self._eot

    @property
    def add_bos(self) -> bool:
        """Whether ``encode(..., add_special=True)`` starts with BOS."""
        return self._add_bos

    @property
    def add_eos(self) -> bool:
        return self._add_eos

    @property
    def adds_closing_token(self) -> bool:
        """Whether ``encode(..., add_special=True)`` ends with a token of
        its own (EOS or WordPiece's [SEP]) that truncation should keep."""
        return (self._add_eos and self._eos is not None) or self._sep is not None

    @property
    def eog_ids(self) -> frozenset[int]:
        """Every end-of-generation token id."""
        return self._eog

    def is_eog(self, token: int) -> bool:
        """End of generation: EOS, EOT, ``<|im_end|>``, ``<end_of_turn>``...
        (the set llama.cpp computes)."""
        return token in self._eog

    def is_special(self, token: int) -> bool:
        """Control (or unknown) token: rendered only when asked for."""
        return token in self._special

    # ------------------------------------------------------------ transform

    def encode(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        """Token ids of ``text``. ``add_special`` adds BOS (and EOS) when the
        model's tokenizer does; ``parse_special`` turns control-token text
        into control tokens."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        if not text.isascii():
            bad = _SURROGATE.search(text)
            if bad is not None:
                raise TokenizeError(
                    f"text holds a lone UTF-16 surrogate {bad.group()!r} at position "
                    f"{bad.start()}: it is not Unicode text and has no UTF-8 bytes",
                    position=bad.start(),
                )
        if self._prenormalize is not None:
            text = self._prenormalize(text)
        auto = add_special and not self._manual_special
        with self._lock:
            self._hf.encode_special_tokens = not parse_special
            try:
                enc = self._hf.encode(text, add_special_tokens=auto)
                if self._strips and not self._strips.isdisjoint(enc.ids):
                    kept = strip_around(
                        text,
                        enc.ids,
                        enc.offsets,
                        lstrip=self._lstrip,
                        rstrip=self._rstrip,
                        whole=self._fragments,
                    )
                    if kept != text:
                        enc = self._hf.encode(kept, add_special_tokens=auto)
                ids: list[int] = enc.ids
            finally:
                self._hf.encode_special_tokens = False
        if self._dropped is not None and self._dropped in ids:
            ids = [i for i in ids if i != self._dropped]
        if add_special and self._manual_special:
            if self._add_bos and self._bos is not None:
                ids.insert(0, self._bos)
            if self._add_eos and self._eos is not None:
                ids.append(self._eos)
            if self._sep is not None:
                ids.append(self._sep)
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """The text of ``ids``: the tokens' bytes joined and read as UTF-8
        (invalid sequences become U+FFFD). ``skip_special`` leaves control
        tokens out (user-defined ones stay).

        With SentencePiece's ``add_space_prefix``, encoding puts a space
        before the text at the start and after every special token; decoding
        removes exactly those, so ``decode(encode(text)) == text``.
        (llama.cpp's detokenizer removes only the first, and none after a
        BOS.) Encoding loses what llama.cpp's tokenizer loses too: the
        whitespace after Phi-3's special tokens, bytes a byte-level
        vocabulary has no token for, and a ``▁`` typed in SentencePiece text,
        which decodes as a space.
        """
        toks = [int(t) for t in ids]
        n = len(self._pieces)
        for t in toks:
            if not 0 <= t < n:
                raise ParameterError(f"token id {t} is outside the vocabulary of {n}")
        strip = self._add_space_prefix
        out = bytearray()
        for t in toks:
            if t in self._fragments:
                if not (skip_special and t in self._special):
                    out += self._pieces[t]
                strip = self._add_space_prefix
                continue
            piece = self._pieces[t]
            if strip and piece.startswith(b" "):
                piece = piece[1:]
            strip = False
            out += piece
        return out.decode("utf-8", errors="replace")

    def token_to_piece(self, token: int) -> bytes:
        """The raw bytes a token contributes to the text (control tokens give
        their text), so a stream can assemble UTF-8 across tokens."""
        if not 0 <= token < len(self._pieces):
            raise ParameterError(
                f"token id {token} is outside the vocabulary of {len(self._pieces)}"
            )
        return self._pieces[token]


def _set_post_processor(
    hf: HFTokenizer, tokens: Sequence[str], before: Sequence[int], after: Sequence[int]
) -> None:
    """The tokens add_special puts before and after the text, as the HF
    post-processor, so that ``hf.encode(text)`` alone (and a tokenizer.json
    saved from it) behaves like llama.cpp's add_special."""
    if not before and not after:
        return

    def template(seq: str) -> str:
        return " ".join([*(tokens[i] for i in before), seq, *(tokens[i] for i in after)])

    single = template("$A")
    # HF wants every token of the template listed, each once, however many
    # roles (BOS, EOS, separator) it plays.
    specials = [(tokens[i], i) for i in dict.fromkeys([*before, *after])]
    hf.post_processor = processors.TemplateProcessing(
        single=single, pair=f"{single} {template('$B')}", special_tokens=specials
    )


def _gguf_pieces(tokens: Sequence[str], attrs: Sequence[int], kind: str) -> list[bytes]:
    """Every token's bytes; byte-level BPE's plain tokens (nearly all of a
    vocabulary, on every load) in one pass."""
    if kind != "bpe":
        return [_gguf_piece(t, a, kind) for t, a in zip(tokens, attrs, strict=True)]
    out, rest = _native.bpe_token_pieces(_list(tokens), _list(attrs))
    for i in rest:
        out[i] = _gguf_piece(tokens[i], attrs[i], kind)
    return out


def _list(items: Sequence[Any]) -> list[Any]:
    return items if isinstance(items, list) else list(items)


def _gguf_piece(token: str, attr: int, kind: str) -> bytes:
    """A token's bytes as llama.cpp's token_to_piece (special=true) gives them."""
    if kind in ("spm", "spm_bpe"):
        return spm_piece(token, attr)
    if attr & (A_SPECIAL | A_USER_DEFINED):
        return token.encode()
    if kind == "wpm":
        return wordpiece_piece(token) if attr & A_NORMAL else b""
    if attr & A_NORMAL:
        return bpe_piece(token)
    if attr & A_BYTE:
        b = byte_token_value(token)
        return bytes([b]) if b is not None else token.encode()
    return b""


def _decoder_types(dec: Any) -> set[str]:
    if not isinstance(dec, dict):
        return set()
    types = {str(dec.get("type"))}
    for sub in dec.get("decoders") or []:
        types |= _decoder_types(sub)
    return types


def _components(node: Any, key: str) -> list[dict[str, Any]]:
    """A normalizer / pre-tokenizer and, for a Sequence, its members."""
    if not isinstance(node, dict):
        return []
    out = [node]
    for sub in node.get(key) or []:
        out += _components(sub, key)
    return out


def _json_space_prefix(spec: Any) -> bool:
    """Whether a tokenizer.json prefixes text with ``▁`` (SentencePiece's
    add_space_prefix), by a Prepend normalizer or a Metaspace pre-tokenizer."""
    if not isinstance(spec, dict):
        return False
    for n in _components(spec.get("normalizer"), "normalizers"):
        if n.get("type") == "Prepend" and n.get("prepend") == SPACE:
            return True
    for p in _components(spec.get("pre_tokenizer"), "pretokenizers"):
        if p.get("type") == "Metaspace":
            scheme = p.get("prepend_scheme", "always" if p.get("add_prefix_space") else "never")
            return scheme in ("always", "first")
    return False


def _hf_pieces(hf: HFTokenizer, spec: Any, n: int) -> list[bytes]:
    """Raw bytes of every token of a tokenizer.json, judged by its decoder:
    GPT-2 byte-level, or SentencePiece-style ``▁`` and ``<0xXX>``."""
    decoders = _decoder_types(spec.get("decoder") if isinstance(spec, dict) else None)
    byte_level = "ByteLevel" in decoders
    added = hf.get_added_tokens_decoder()
    pieces: list[bytes] = []
    for i in range(n):
        tok = hf.id_to_token(i)
        if tok is None:
            pieces.append(b"")
        elif i in added:
            pieces.append(tok.encode())
        elif byte_level and all(c in UNICODE_TO_BYTE for c in tok):
            pieces.append(bpe_piece(tok))
        else:
            b = byte_token_value(tok) if "ByteFallback" in decoders else None
            if b is not None:
                pieces.append(bytes([b]))
            else:
                pieces.append(tok.replace(SPACE, " ").encode())
    return pieces
