"""BPE over raw UTF-8 with SentencePiece's conventions (GGUF model
``gemma4``) as a HuggingFace tokenizer.

Unlike byte-level BPE there is no GPT-2 byte alphabet: the merges join
Unicode characters, spaces are ``▁`` (U+2581) and a piece without a token
becomes ``<0xXX>`` byte tokens. llama.cpp splits the text only at runs of
newlines (a run that is itself a token stays whole; plain BPE merges
produce those same tokens) and adds no space prefix.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers

import oxillama._native as _native
from oxillama.text.tokenizer.bpe import bpe_model, split_merges
from oxillama.text.tokenizer.gguf_vocab import GgufVocab
from oxillama.text.tokenizer.spm import SPACE

__all__ = ["build_spm_bpe"]


def build_spm_bpe(v: GgufVocab, file: _native.GgufFile | None = None) -> Tokenizer:
    """The model, normalizer, pre-tokenizer and decoder; special tokens are
    added by the caller. ``file``: see :func:`~.bpe.split_merges`."""
    assert v.merges is not None  # checked by GgufVocab
    vocab = dict(v.token_ids)
    model = bpe_model(
        vocab, split_merges(v.merges, v.tokens, file), byte_fallback=True, fuse_unk=False
    )
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("\n+"), behavior="isolated")
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tok
