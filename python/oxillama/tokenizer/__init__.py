"""Tokenizers built from GGUF metadata (byte-level BPE and SentencePiece)."""

from .tokenizer import Tokenizer

__all__ = ["Tokenizer"]
