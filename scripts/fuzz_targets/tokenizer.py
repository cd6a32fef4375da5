"""tokenizer: any Unicode, any bytes and any token ids through SmolLM2's
byte-level BPE tokenizer.

The property, as llama.cpp's tokenizer tests define it (test-tokenizer-1-bpe
checks it for every code point; here it is checked for whole strings): for
text that is valid Unicode, tokenized without BOS/EOS (``add_special=False``)
and with special-token text read as plain text (``parse_special=False``),
detokenizing gives the text back exactly, byte for byte. Byte-level BPE has
no normalizer, so the one exception is the vocabulary's own: SmolLM2 has no
token for 21 byte values (0x04, 0xF5...; see ``tokenizer/bpe.py``), which
llama.cpp drops while tokenizing. So the bytes of the tokens are asserted
to be the text's UTF-8 without exactly those bytes, which is the text
itself whenever every byte has a token (all of ASCII but 0x04, 0x06, 0x13,
0x14, 0x16 and 0x1D, and every code point below U+40000 made of covered
bytes).

Text that is not valid Unicode (lone surrogates, as arbitrary bytes decoded
with ``surrogateescape`` give) has no UTF-8 form: encoding it must fail with
a typed error, never anything else. Any token-id sequence detokenizes to the
concatenation of its tokens' bytes (invalid UTF-8 replaced), and an id
outside the vocabulary is a typed error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from oxillama.text.tokenizer import Tokenizer
from oxillama.text.tokenizer.bpe import UNICODE_TO_BYTE

from . import Target
from .real_model import smollm2

SPECIAL_TEXTS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "Ġ", "Ċ"]

text = st.lists(
    st.one_of(
        st.text(),
        st.text(st.characters(codec="utf-8", max_codepoint=0x7F)),
        st.sampled_from([*SPECIAL_TEXTS, " ", "  ", "\n", "\r\n", "\t", "\u00a0", "\u3000"]),
        st.characters(),
    ),
    max_size=12,
).map("".join)
raw_bytes = st.binary(max_size=200).map(lambda b: b.decode("utf-8", "surrogateescape"))
token_ids = st.lists(st.integers(-2, 49160), max_size=40)

STRATEGY = st.one_of(
    st.tuples(st.just("text"), text),
    st.tuples(st.just("bytes"), raw_bytes),
    st.tuples(st.just("ids"), token_ids),
)


def _has_surrogate(s: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in s)


class TokenizerTarget(Target):
    name = "tokenizer"
    strategy = STRATEGY

    def setup(self, workdir: Path) -> None:
        model = smollm2()
        self.tok: Tokenizer = model.tokenizer
        tokens = set(model.metadata["tokenizer.ggml.tokens"])
        self.uncovered = bytes(b for c, b in UNICODE_TO_BYTE.items() if c not in tokens)

    def encode(self, value: Any) -> bytes:
        kind, x = value
        # JSON escapes keep lone surrogates (\udXXX) intact.
        return json.dumps([kind, x]).encode()

    def decode(self, data: bytes) -> Any:
        kind, x = json.loads(data)
        return kind, x

    def run(self, value: Any) -> None:
        kind, x = value
        if kind == "ids":
            got = self.tok.decode(x)
            pieces = b"".join(self.tok.token_to_piece(t) for t in x)
            if got != pieces.decode("utf-8", errors="replace"):
                raise AssertionError(f"decode({x}) = {got!r}, its pieces say {pieces!r}")
            return
        ids = self.tok.encode(x, add_special=False, parse_special=False)
        if _has_surrogate(x):
            raise AssertionError(f"encoded text that has no UTF-8 form: {x!r} -> {ids}")
        back = b"".join(self.tok.token_to_piece(t) for t in ids)
        want = x.encode().translate(None, self.uncovered)
        if back != want:
            raise AssertionError(f"the tokens of {x!r} ({ids}) detokenize to {back!r}")
        if not set(x.encode()) & set(self.uncovered) and self.tok.decode(ids) != x:
            raise AssertionError(f"decode(encode({x!r})) = {self.tok.decode(ids)!r}")


TARGETS = {"tokenizer": TokenizerTarget}
