"""The vocabulary description stored under ``tokenizer.ggml.*``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import LoadError

# llama.cpp's token types.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Texts that end a generation turn in the chat formats llama.cpp knows.
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<|return|>",
        "<|call|>",
    }
)


@dataclass(frozen=True)
class GgufVocab:
    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    eom_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> GgufVocab:
        def get(key: str, default: Any = None) -> Any:
            return meta.get(f"tokenizer.ggml.{key}", default)

        model = get("model")
        if not isinstance(model, str):
            raise LoadError("metadata tokenizer.ggml.model is missing: the file has no tokenizer")
        tokens = get("tokens")
        if not isinstance(tokens, list) or not tokens:
            raise LoadError("metadata tokenizer.ggml.tokens is missing or empty")
        n = len(tokens)
        types = get("token_type") or [NORMAL] * n
        scores = get("scores")
        if len(types) != n or (scores is not None and len(scores) != n):
            raise LoadError(
                f"tokenizer arrays disagree: {n} tokens, {len(types)} types, "
                f"{len(scores) if scores is not None else 'no'} scores"
            )

        def tid(key: str) -> int | None:
            v = get(key)
            if v is None:
                return None
            if not isinstance(v, int) or not 0 <= v < n:
                # llama.cpp writes -1 / out-of-range ids for "none".
                return None
            return v

        is_spm = model == "llama"
        return cls(
            model=model,
            pre=str(get("pre", "default")),
            tokens=[str(t) for t in tokens],
            token_types=[int(t) for t in types],
            scores=[float(s) for s in scores] if scores is not None else None,
            merges=[str(m) for m in get("merges")] if get("merges") is not None else None,
            bos_id=tid("bos_token_id"),
            eos_id=tid("eos_token_id"),
            eot_id=tid("eot_token_id"),
            eom_id=tid("eom_token_id"),
            unk_id=tid("unknown_token_id"),
            pad_id=tid("padding_token_id"),
            add_bos=bool(get("add_bos_token", is_spm)),
            add_eos=bool(get("add_eos_token", False)),
            add_space_prefix=bool(get("add_space_prefix", is_spm)),
        )

    def special_ids(self) -> list[int]:
        """Control and user-defined tokens: matched whole in text when
        special-token parsing is on."""
        return [i for i, t in enumerate(self.token_types) if t in (CONTROL, USER_DEFINED)]

    def eog_ids(self) -> frozenset[int]:
        ids = {i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None}
        for i in self.special_ids():
            if self.tokens[i] in EOG_TEXTS:
                ids.add(i)
        return frozenset(ids)
