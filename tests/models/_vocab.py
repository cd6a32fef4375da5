"""The byte-level BPE vocabulary every fixture shares: the 256 byte tokens,
merges learnt from a fixed text, then BOS and EOS, in llama.cpp's ``gpt2``
conventions (``tokenizer.ggml.*``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import pairwise

import gguf

# The merges are learnt from this text, so re-running yields the same vocabulary.
TEXT = (
    "the quick brown fox jumps over the lazy dog. the dog sleeps in the sun, "
    "and the fox runs into the forest. then the other animals in the forest "
    "wake, and the morning starts with the sound of the birds singing there."
)
N_MERGES = 46
BOS_TEXT = "<|startoftext|>"
EOS_TEXT = "<|endoftext|>"


def byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes map
    to themselves, the others to code points from U+0100 on, in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(0x100 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos: int
    eos: int

    @property
    def n_normal(self) -> int:
        """Ids below this are ordinary (byte or merged) tokens."""
        return min(self.bos, self.eos)

    def write(self, w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(self.tokens)
        w.add_token_types(self.types)
        w.add_token_merges(self.merges)
        w.add_bos_token_id(self.bos)
        w.add_eos_token_id(self.eos)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)


def learn_merges(text: str, n: int) -> list[tuple[str, str]]:
    """Greedy BPE on space-prefixed words: the most frequent adjacent pair,
    ties broken by the pair's text, until ``n`` merges."""
    chars = byte_chars()
    words = Counter(
        tuple(chars[b] for b in (w if i == 0 else " " + w).encode())
        for i, w in enumerate(text.split(" "))
    )
    merges: list[tuple[str, str]] = []
    while len(merges) < n:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for a, b in pairwise(word):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def build_vocab() -> Vocab:
    merges = learn_merges(TEXT, N_MERGES)
    tokens = byte_chars() + [a + b for a, b in merges] + [BOS_TEXT, EOS_TEXT]
    normal, control = int(gguf.TokenType.NORMAL), int(gguf.TokenType.CONTROL)
    types = [normal] * (len(tokens) - 2) + [control, control]
    return Vocab(
        tokens=tokens,
        types=types,
        merges=[f"{a} {b}" for a, b in merges],
        bos=len(tokens) - 2,
        eos=len(tokens) - 1,
    )


VOCAB = build_vocab()
