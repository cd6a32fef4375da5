"""Pre-tokenizers for byte-level BPE vocabularies, keyed by the
``tokenizer.ggml.pre`` name that llama.cpp's converter writes.

Each entry lists the regexes llama.cpp applies in sequence: every regex
splits the pieces the previous one produced, keeping both the matches and
the text between them as pieces (``Split(..., behavior="isolated")`` in
HuggingFace terms). The regexes are written for Oniguruma, the engine of
``tokenizers``. Where llama.cpp rewrote a pattern for its own regex engine
(``(?i:'s|...)`` spelled ``'[sS]|...``), we use its spelling; both match the
same text.
"""

from __future__ import annotations

from dataclasses import dataclass

from oxillama.errors import LoadError

__all__ = ["PRETOKENIZERS", "PreTokenizer", "pretokenizer"]


#: GPT-2's pattern as llama.cpp writes it (no trailing ``|\s+``: whitespace
#: the pattern leaves unmatched still becomes a piece of its own).
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5: combining marks (\p{M}) stay inside words instead of starting a
# punctuation piece.
QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CASED_WORDS = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"{c}"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"{c}"
)
GPT4O = (
    _CASED_WORDS.replace("{c}", _CONTRACTIONS + "?")
    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN = (
    _CASED_WORDS.replace("{c}", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Latin, Greek, Cyrillic... letters, listed range by range in DeepSeek's
# tokenizer.json (llama.cpp copies the list).
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
    "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
    "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943"
)
# llama.cpp matches the regexes that use no \p{...} class against the text
# with every non-ASCII space (U+3000, U+2000-U+200A...) turned into "\v", so
# its explicit ranges never match such a space: ``&&\S`` takes them out here.
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff&&\\S]+"
_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp prepares text for one family of BPE vocabularies."""

    regexes: tuple[str, ...]
    #: A piece that is itself a token is taken whole, without merging.
    ignore_merges: bool = False
    #: The default for ``add_bos_token`` when the GGUF does not say.
    add_bos: bool = False


_GPT2 = PreTokenizer((GPT2,))
_LLAMA3 = PreTokenizer((LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2 = PreTokenizer((QWEN2,))
_STARCODER = PreTokenizer((r"\p{N}", GPT2))
_GPT4O = PreTokenizer((GPT4O,))

# Names from llama.cpp's llama_vocab::impl::load, grouped as it groups them.
PRETOKENIZERS: dict[str, PreTokenizer] = {
    # BPE with no or an unknown-to-the-converter pre-tokenizer.
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    **dict.fromkeys(
        (
            "gpt2",  # our alias for the GPT-2 pattern
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
        ),
        _GPT2,
    ),
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ),
        _LLAMA3,
    ),
    "dbrx": PreTokenizer((LLAMA3,)),
    "smaug-bpe": PreTokenizer((LLAMA3,)),
    "glm4": PreTokenizer((LLAMA3,)),
    "chatglm-bpe": PreTokenizer((LLAMA3,)),
    **dict.fromkeys(
        (
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
        ),
        _QWEN2,
    ),
    "qwen35": PreTokenizer((QWEN35,)),
    # Digits one by one, then the GPT-2 rules (StarCoder's family).
    **dict.fromkeys(
        (
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ),
        _STARCODER,
    ),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]")),
    "deepseek-llm": PreTokenizer(
        (
            "[\r\n]",
            "\\s?[" + _DEEPSEEK_LETTERS + "]+",
            "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002&&\\S]+",
            r"\s+$",
            _CJK,
            r"\p{N}+",
        )
    ),
    "deepseek-coder": PreTokenizer(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
    "poro-chat": PreTokenizer((_PORO,)),
    "bloom": PreTokenizer((_PORO,)),
    "gpt3-finnish": PreTokenizer((_PORO,)),
    "viking": PreTokenizer((_PORO, r"\p{N}")),
    "tekken": PreTokenizer((TEKKEN,), ignore_merges=True, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
}


def pretokenizer(name: str) -> PreTokenizer:
    """The pre-tokenizer llama.cpp uses for ``tokenizer.ggml.pre == name``.

    Raises :class:`~oxillama.errors.LoadError` naming an unknown pre-tokenizer.
    """
    try:
        return PRETOKENIZERS[name]
    except KeyError:
        known = ", ".join(sorted(PRETOKENIZERS))
        raise LoadError(
            f"unsupported pre-tokenizer {name!r} (tokenizer.ggml.pre); known: {known}"
        ) from None
