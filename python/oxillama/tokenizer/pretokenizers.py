"""Pre-tokenizer regexes for byte-level BPE vocabularies, keyed by the
``tokenizer.ggml.pre`` name that llama.cpp's converter writes."""

from __future__ import annotations

from ..errors import LoadError

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Each entry is the list of regexes applied in sequence (each splits the
# pieces the previous one produced, keeping the matches as pieces).
PRETOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": (GPT2,),
    "gpt2": (GPT2,),
    "gpt-2": (GPT2,),
    "llama3": (LLAMA3,),
    "llama-bpe": (LLAMA3,),
    "dbrx": (LLAMA3,),
    "smaug-bpe": (LLAMA3,),
    "qwen2": (QWEN2,),
    "deepseek-r1-qwen": (QWEN2,),
    # Digits one by one, then GPT-2 rules (StarCoder family, SmolLM).
    "smollm": (r"\p{N}", GPT2),
    "starcoder": (r"\p{N}", GPT2),
    "refact": (r"\p{N}", GPT2),
    "codeshell": (r"\p{N}", GPT2),
    "exaone": (r"\p{N}", GPT2),
    "minerva-7b": (r"\p{N}", GPT2),
    "command-r": (r"\p{N}", GPT2),
}


def pretokenizer_regexes(name: str) -> tuple[str, ...]:
    try:
        return PRETOKENIZERS[name]
    except KeyError:
        known = ", ".join(sorted(PRETOKENIZERS))
        raise LoadError(
            f"unsupported pre-tokenizer {name!r} (tokenizer.ggml.pre); known: {known}"
        ) from None
