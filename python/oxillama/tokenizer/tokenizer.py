"""The public tokenizer: HuggingFace ``tokenizers`` built from GGUF metadata."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from ..errors import LoadError
from .bpe import bpe_piece, build_bpe
from .gguf_vocab import CONTROL, GgufVocab
from .spm import build_spm, spm_piece

__all__ = ["Tokenizer"]


class Tokenizer:
    """Text <-> token ids, matching llama.cpp's tokenization of the model.

    ``encode(..., parse_special=True)`` turns special-token text such as
    ``<|im_start|>`` into its single id; with ``parse_special=False`` the same
    text is tokenized as ordinary characters.
    """

    def __init__(self, hf: HFTokenizer, vocab: GgufVocab) -> None:
        self.hf = hf
        self._vocab = vocab
        specials = [vocab.tokens[i] for i in vocab.special_ids()]
        hf.add_special_tokens(
            [
                AddedToken(s, special=True, normalized=False, lstrip=False, rstrip=False)
                for s in specials
            ]
        )
        # A twin that treats special-token text as plain text.
        self._plain = HFTokenizer.from_str(hf.to_str())
        self._plain.encode_special_tokens = True
        self._eog = vocab.eog_ids()
        self._special = frozenset(vocab.special_ids())
        self._pieces: list[bytes] = [self._piece(i) for i in range(len(vocab.tokens))]

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        v = GgufVocab.from_metadata(metadata)
        if v.model == "gpt2":
            hf = build_bpe(v)
        elif v.model == "llama":
            hf = build_spm(v)
        else:
            raise LoadError(
                f"unsupported tokenizer model {v.model!r} (tokenizer.ggml.model); "
                "supported: gpt2 (byte-level BPE), llama (SentencePiece)"
            )
        return cls(hf, v)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], metadata: Mapping[str, Any]) -> Tokenizer:
        """A tokenizer.json that overrides the GGUF vocabulary; special ids
        (BOS/EOS) still come from the GGUF metadata."""
        try:
            hf = HFTokenizer.from_file(os.fspath(path))
        except Exception as e:  # tokenizers raises a bare Exception
            raise LoadError(f"cannot load tokenizer {path}: {e}") from e
        return cls._with_hf(hf, metadata)

    @classmethod
    def from_json_str(cls, text: str, metadata: Mapping[str, Any]) -> Tokenizer:
        try:
            hf = HFTokenizer.from_str(text)
        except Exception as e:
            raise LoadError(f"cannot parse tokenizer JSON: {e}") from e
        return cls._with_hf(hf, metadata)

    @classmethod
    def _with_hf(cls, hf: HFTokenizer, metadata: Mapping[str, Any]) -> Tokenizer:
        v = GgufVocab.from_metadata(metadata)
        return cls(hf, v)

    # -------------------------------------------------------------- queries

    @property
    def vocab_size(self) -> int:
        return len(self._vocab.tokens)

    @property
    def bos_id(self) -> int | None:
        return self._vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        return self._vocab.eos_id

    @property
    def add_bos(self) -> bool:
        return self._vocab.add_bos

    def is_eog(self, token: int) -> bool:
        """End of generation: EOS, EOT or a chat end-of-turn token."""
        return token in self._eog

    def is_special(self, token: int) -> bool:
        return self._vocab.token_types[token] == CONTROL

    # ------------------------------------------------------------ transform

    def encode(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        tok = self.hf if parse_special else self._plain
        ids: list[int] = tok.encode(text, add_special_tokens=False).ids if text else []
        if add_special:
            if self._vocab.add_bos and self._vocab.bos_id is not None:
                ids.insert(0, self._vocab.bos_id)
            if self._vocab.add_eos and self._vocab.eos_id is not None:
                ids.append(self._vocab.eos_id)
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special))

    def token_to_piece(self, token: int) -> bytes:
        """The raw bytes a token contributes to the text."""
        if not 0 <= token < len(self._pieces):
            raise ValueError(f"token id {token} is outside the vocabulary of {len(self._pieces)}")
        return self._pieces[token]

    def _piece(self, i: int) -> bytes:
        v = self._vocab
        text, ty = v.tokens[i], v.token_types[i]
        if ty == CONTROL or i in self._special:
            return text.encode()
        if v.model == "gpt2":
            return bpe_piece(text)
        return spm_piece(text, ty)
