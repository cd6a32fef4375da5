"""BERT's WordPiece (GGUF model ``bert``) as a HuggingFace tokenizer.

llama.cpp's converters store WordPiece vocabularies with a phantom space:
a word-initial piece is ``▁word``, a continuation is bare (``##ing``
becomes ``ing``), and bracketed specials such as ``[CLS]`` are kept as they
are. This undoes that rewrite to get BERT's own vocabulary back, then
normalizes (lower case, accents stripped, control characters dropped, CJK
characters split) and splits at whitespace and punctuation as BERT does,
which is what llama.cpp's WordPiece tokenizer reproduces.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from oxillama.text.tokenizer.gguf_vocab import GgufVocab

__all__ = ["PHANTOM_SPACE", "build_wordpiece", "prenormalize", "wordpiece_piece"]

PHANTOM_SPACE = "\u2581"
#: BERT leaves a word longer than this as one unknown token.
MAX_WORD_CHARS = 100


# llama.cpp's WordPiece differs from BERT's own normalizer in two places,
# and its ids are the reference: a precomposed Hangul syllable keeps only
# its leading consonant (its decomposition stops there), and upper case
# maps code point by code point (a final capital sigma becomes U+03C3, not
# the final form U+03C2).
_QUIRKS = {s: 0x1100 + (s - 0xAC00) // 588 for s in range(0xAC00, 0xD7A4)}
_QUIRKS[ord("\u03a3")] = ord("\u03c3")


def prenormalize(text: str) -> str:
    """The part of llama.cpp's normalization done before the HF pipeline."""
    return text if text.isascii() else text.translate(_QUIRKS)


def _bert_token(token: str) -> str:
    if token.startswith(PHANTOM_SPACE):
        return token[len(PHANTOM_SPACE) :]
    if token.startswith("[") and token.endswith("]"):
        return token
    return "##" + token


def wordpiece_piece(token: str) -> bytes:
    """A normal token's text as llama.cpp's token_to_piece renders it (the
    phantom space becomes a real one)."""
    return token.replace(PHANTOM_SPACE, " ").encode()


def build_wordpiece(v: GgufVocab) -> Tokenizer:
    """The model, normalizer, pre-tokenizer and decoder; special tokens are
    added by the caller."""
    unk = v.unk_id
    if unk is None:
        from oxillama.errors import LoadError

        raise LoadError("a bert (WordPiece) vocabulary needs tokenizer.ggml.unknown_token_id")
    vocab: dict[str, int] = {}
    for i, t in enumerate(v.tokens):
        # Two GGUF pieces can map to one BERT token only in a damaged
        # vocabulary; the first id wins, as BERT's own loader does.
        vocab.setdefault(_bert_token(t), i)
    unk_token = _bert_token(v.tokens[unk])
    tok = Tokenizer(
        models.WordPiece(
            vocab=vocab,
            unk_token=unk_token,
            continuing_subword_prefix="##",
            max_input_chars_per_word=MAX_WORD_CHARS,
        )
    )
    tok.normalizer = normalizers.Sequence(
        [
            normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True
            ),
            # llama.cpp drops every combining mark (spacing and enclosing
            # ones too), BERT only the nonspacing ones.
            normalizers.Replace(Regex(r"\p{M}"), ""),
        ]
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok
