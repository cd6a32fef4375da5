"""Tokenizers built from GGUF metadata (byte-level BPE, SentencePiece and
Gemma 4's SentencePiece-style BPE), token for token equal to llama.cpp's."""

from oxillama.text.tokenizer.gguf_vocab import GgufVocab, TokenAttr, TokenType
from oxillama.text.tokenizer.pretokenizers import PRETOKENIZERS, PreTokenizer, pretokenizer
from oxillama.text.tokenizer.tokenizer import Tokenizer

__all__ = [
    "PRETOKENIZERS",
    "GgufVocab",
    "PreTokenizer",
    "TokenAttr",
    "TokenType",
    "Tokenizer",
    "pretokenizer",
]
