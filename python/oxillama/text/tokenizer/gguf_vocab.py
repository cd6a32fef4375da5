"""The vocabulary description stored under ``tokenizer.ggml.*``, read the way
llama.cpp's ``llama_vocab::impl::load`` reads it: the same defaults, the same
special-token detection by text, the same end-of-generation set."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from functools import cached_property
from typing import Any

import numpy as np

import oxillama._native as _native
from oxillama.errors import LoadError
from oxillama.text.tokenizer.pretokenizers import PreTokenizer, pretokenizer

__all__ = [
    "EOG_TEXTS",
    "GgufVocab",
    "TokenAttr",
    "TokenType",
]

PREFIX = "tokenizer.ggml."


class TokenType(IntEnum):
    """``tokenizer.ggml.token_type`` values (llama.cpp's llama_token_type)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr(IntFlag):
    """llama.cpp's per-token attributes (llama_token_attr)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# Plain ints for the hot loops (IntFlag arithmetic is slow on 262k tokens).
A_UNKNOWN = int(TokenAttr.UNKNOWN)
A_UNUSED = int(TokenAttr.UNUSED)
A_NORMAL = int(TokenAttr.NORMAL)
A_CONTROL = int(TokenAttr.CONTROL)
A_USER_DEFINED = int(TokenAttr.USER_DEFINED)
A_BYTE = int(TokenAttr.BYTE)
A_LSTRIP = int(TokenAttr.LSTRIP)
A_RSTRIP = int(TokenAttr.RSTRIP)
A_SPECIAL = A_CONTROL | A_UNKNOWN

_TYPE_ATTR: dict[int, int] = {
    TokenType.NORMAL: A_NORMAL,
    TokenType.UNKNOWN: A_UNKNOWN,
    TokenType.CONTROL: A_CONTROL,
    TokenType.USER_DEFINED: A_USER_DEFINED,
    TokenType.UNUSED: A_UNUSED,
    TokenType.BYTE: A_BYTE,
}

#: Tokens that end a generation, recognised by their text (llama.cpp keeps
#: the same list; the ids in the GGUF's eos/eot/eom keys are added to it).
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
        "[e~[",
    }
)

# Special tokens found by their text when the GGUF does not give their id.
_EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<end_of_utterance>",
)
_DETECT: dict[str, tuple[str, ...]] = {
    "eot": _EOT_TEXTS,
    "eom": ("<|eom_id|>",),
    "fim_pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<\uff5cfim\u2581begin\uff5c>",
        "<PRE>",
        "\u2581<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<\uff5cfim\u2581hole\uff5c>",
        "<SUF>",
        "\u2581<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<\uff5cfim\u2581end\uff5c>",
        "<MID>",
        "\u2581<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}

# GGUF key (after "tokenizer.ggml.") of each special id; later keys in a
# group are deprecated spellings that fill the same slot.
_ID_KEYS: dict[str, tuple[str, ...]] = {
    "bos": ("bos_token_id",),
    "eos": ("eos_token_id",),
    "eot": ("eot_token_id",),
    "eom": ("eom_token_id",),
    "unk": ("unknown_token_id",),
    "sep": ("seperator_token_id",),
    "pad": ("padding_token_id",),
    "mask": ("mask_token_id",),
    "fim_pre": ("fim_pre_token_id", "prefix_token_id"),
    "fim_suf": ("fim_suf_token_id", "suffix_token_id"),
    "fim_mid": ("fim_mid_token_id", "middle_token_id"),
    "fim_pad": ("fim_pad_token_id",),
    "fim_rep": ("fim_rep_token_id",),
    "fim_sep": ("fim_sep_token_id",),
}

#: Tokenizer models we build: GGUF name -> kind.
MODELS = {"gpt2": "bpe", "llama": "spm", "gemma4": "spm_bpe", "bert": "wpm"}


@dataclass(frozen=True)
class GgufVocab:
    """A typed view of the ``tokenizer.ggml.*`` metadata."""

    model: str
    pre: str
    tokens: Sequence[str]
    #: Effective :class:`TokenAttr` bits per token (types from the file plus
    #: llama.cpp's fix-ups, e.g. CONTROL on an end-of-turn token).
    attrs: Sequence[int]
    scores: Sequence[float] | None
    merges: Sequence[str] | None
    special: Mapping[str, int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    #: ``add_sep_token`` as llama.cpp reads it for WordPiece (default on);
    #: always false for other models, whose tokenizers never add it. Like
    #: add_bos/add_eos it is the file's word only: llama.cpp's WordPiece
    #: add_special is always [BOS] text [SEP] (Tokenizer.from_gguf_metadata).
    add_sep: bool
    eog_ids: frozenset[int]

    # ---------------------------------------------------------- accessors

    @property
    def kind(self) -> str:
        """``"bpe"`` (byte-level BPE), ``"spm"`` (SentencePiece) or
        ``"spm_bpe"`` (BPE merges over raw UTF-8 with SentencePiece's ``▁``
        and byte tokens: Gemma 4)."""
        return MODELS[self.model]

    @property
    def bos_id(self) -> int | None:
        return self.special.get("bos")

    @property
    def eos_id(self) -> int | None:
        return self.special.get("eos")

    @property
    def eot_id(self) -> int | None:
        return self.special.get("eot")

    @property
    def unk_id(self) -> int | None:
        return self.special.get("unk")

    @property
    def sep_id(self) -> int | None:
        return self.special.get("sep")

    @property
    def pad_id(self) -> int | None:
        return self.special.get("pad")

    @property
    def pre_tokenizer(self) -> PreTokenizer:
        return pretokenizer(self.pre)

    @cached_property
    def token_ids(self) -> Mapping[str, int]:
        """Each token's id by its text."""
        return dict(zip(self.tokens, range(len(self.tokens)), strict=True))

    @cached_property
    def _attr_array(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        # Scanned several times per load; the list is final once built.
        return np.asarray(self.attrs, dtype=np.int64)

    def has(self, token: int, attr: int) -> bool:
        return bool(self.attrs[token] & attr)

    def control_ids(self) -> list[int]:
        """Tokens matched in text only when special-token parsing is on:
        control and unknown tokens."""
        return _having(self._attr_array, A_SPECIAL)

    def strip_ids(self, attr: int) -> list[int]:
        """Tokens after (``A_RSTRIP``) or before (``A_LSTRIP``) which
        llama.cpp drops the ASCII whitespace when it matches them in text."""
        return _having(self._attr_array, attr)

    def user_defined_ids(self) -> list[int]:
        """Tokens always matched whole in text, even with special-token
        parsing off (llama.cpp and HF both pre-split on them)."""
        return _having(self._attr_array, A_USER_DEFINED, without=A_SPECIAL)

    # ------------------------------------------------------------ loading

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> GgufVocab:
        def get(key: str, default: Any = None) -> Any:
            return meta.get(PREFIX + key, default)

        model = get("model")
        if not isinstance(model, str):
            raise LoadError("metadata tokenizer.ggml.model is missing: the file has no tokenizer")
        if model not in MODELS:
            raise LoadError(
                f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); "
                "supported: gpt2 (byte-level BPE), llama (SentencePiece), "
                "gemma4 (SentencePiece-style BPE), bert (WordPiece)"
            )
        kind = MODELS[model]
        raw_tokens = get("tokens")
        if not isinstance(raw_tokens, Sequence) or isinstance(raw_tokens, str) or not raw_tokens:
            raise LoadError("metadata tokenizer.ggml.tokens is missing or empty")
        n = len(raw_tokens)
        # Natively: this runs on every load (list(map(str, ...)) semantics).
        tokens = _native.str_list(raw_tokens)
        # The id of each text; it also finds duplicates (fewer entries).
        ids = dict(zip(tokens, range(n), strict=True))
        if "" in ids:
            tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
            ids = dict(zip(tokens, range(n), strict=True))
        if len(ids) != n:
            seen: dict[str, int] = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise LoadError(
                        f"duplicate token in vocabulary: {t!r} has ids {seen[t]} and {i}"
                    )
                seen[t] = i

        types = get("token_type")
        scores = get("scores")
        if types is not None and len(types) < n:
            raise LoadError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        if scores is not None and len(scores) < n:
            raise LoadError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
        attrs: list[int] = _type_attrs(types, n) if types is not None else [A_NORMAL] * n

        merges = get("merges")
        if kind in ("bpe", "spm_bpe") and merges is None:
            raise LoadError(f"{model!r} BPE vocabulary has no tokenizer.ggml.merges")

        pre_name = str(get("pre") or "default")
        if kind == "bpe":
            pre = pretokenizer(pre_name)  # raises LoadError for unknown names
            special: dict[str, int | None] = {"bos": 11, "eos": 11}
            add_bos, add_space_prefix = pre.add_bos, False
        elif kind == "spm_bpe":
            # llama.cpp ignores the file's pre-tokenizer name here and has no
            # default special ids.
            pre_name = "gemma4"
            special = {}
            add_bos, add_space_prefix = True, False
        elif kind == "wpm":
            # llama.cpp's defaults for BERT: [CLS] is BOS, [SEP] is appended.
            pre_name = "default"
            special = {"bos": 101, "sep": 102, "unk": 100, "pad": 0, "mask": 103}
            add_bos, add_space_prefix = True, False
        else:
            pre_name = "default"  # SPM has no pre-tokenizer
            special = {"bos": 1, "eos": 2, "unk": 0}
            add_bos, add_space_prefix = True, True
        add_eos = False

        for slot, keys in _ID_KEYS.items():
            default = special.get(slot)
            if default is not None and not 0 <= default < n:
                special[slot] = None
            for key in keys:
                v = get(key)
                if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n:
                    special[slot] = v
                    break

        def flag(key: str, default: bool) -> bool:
            v = get(key)
            return bool(v) if v is not None else default

        add_bos = flag("add_bos_token", add_bos)
        add_eos = flag("add_eos_token", add_eos)
        # llama.cpp's defaults for WordPiece: BOS and separator on, EOS off.
        add_sep = kind == "wpm" and flag("add_sep_token", True)
        if add_sep and special.get("sep") is None:
            raise LoadError("tokenizer.ggml.add_sep_token is true but there is no separator token")
        add_space_prefix = flag("add_space_prefix", add_space_prefix)
        if kind == "spm_bpe":
            add_bos = True  # llama.cpp overrides a false add_bos_token for Gemma 4
        if add_bos and special.get("bos") is None:
            raise LoadError("tokenizer.ggml.add_bos_token is true but there is no BOS token")
        if add_eos and special.get("eos") is None:
            raise LoadError("tokenizer.ggml.add_eos_token is true but there is no EOS token")

        control = A_CONTROL

        # Special tokens the converter did not record, found by their text.
        for slot, texts in _DETECT.items():
            if special.get(slot) is not None:
                continue
            found = [ids[t] for t in texts if t in ids]
            if found:
                special[slot] = min(found)
                attrs[min(found)] |= control

        # Control tokens named "unused..." are unused.
        for i in _having(attrs, control):
            if "unused" in tokens[i]:
                attrs[i] |= A_UNUSED

        eog: set[int] = set()
        for slot in ("fim_pad", "fim_rep", "fim_sep"):
            s = special.get(slot)
            if s is not None:
                eog.add(s)
        for text in EOG_TEXTS:
            i_eog = ids.get(text)
            if i_eog is not None:
                eog.add(i_eog)
                attrs[i_eog] |= control
        # gpt-oss: these always render, as user-defined tokens.
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            if text in ids:
                attrs[ids[text]] = A_USER_DEFINED
        for slot in ("eos", "eot", "eom"):
            s = special.get(slot)
            if s is not None:
                eog.add(s)
        eog_texts = {tokens[i] for i in eog}
        # Harmony / solar-open: "<|end|>" ends a message, not the generation.
        if "<|end|>" in eog_texts and (
            ("<|return|>" in eog_texts and ("<|call|>" in eog_texts or "<|calls|>" in eog_texts))
            or ("<|flush|>" in eog_texts and ("<|call|>" in eog_texts or "<|calls|>" in eog_texts))
        ):
            eog.discard(ids["<|end|>"])
            attrs[ids["<|end|>"]] = A_USER_DEFINED
        # Gemma 4 / PaddleOCR: "</s>" is ordinary text there.
        if "<|tool_response>" in eog_texts and "</s>" in eog_texts:
            eog.discard(ids["</s>"])
            attrs[ids["</s>"]] = A_NORMAL
        _set_strip_attrs(meta, ids, attrs)

        vocab = cls(
            model=model,
            pre=pre_name,
            tokens=tokens,
            attrs=attrs,
            scores=[float(s) for s in scores[:n]] if scores is not None else None,
            merges=_native.str_list(merges) if merges is not None else None,
            special={k: v for k, v in special.items() if v is not None},
            add_bos=add_bos,
            add_eos=add_eos,
            add_space_prefix=add_space_prefix,
            add_sep=add_sep,
            eog_ids=frozenset(eog),
        )
        # Already built: the BPE builders want the same table.
        vocab.__dict__["token_ids"] = ids
        return vocab


#: ``_TYPE_ATTR`` as a table indexed by type, for the native pass.
_TYPE_TABLE = [_TYPE_ATTR.get(t, 0) for t in range(max(_TYPE_ATTR) + 1)]


def _type_attrs(types: Sequence[Any], n: int) -> list[int]:
    """Attribute bits of the first ``n`` token types."""
    fast = _native.token_type_attrs(types, n, _TYPE_TABLE)
    if fast is not None:
        return fast
    # Types that are not plain ints (a hand-built mapping): int() each.
    return list(map(_TYPE_ATTR.get, map(int, types[:n]), itertools.repeat(0)))


def _having(
    attrs: Sequence[int] | np.ndarray[Any, np.dtype[np.int64]], attr: int, *, without: int = 0
) -> list[int]:
    """Ids whose attributes have ``attr`` and none of ``without`` (numpy:
    a whole vocabulary is scanned several times per load)."""
    a = np.asarray(attrs, dtype=np.int64)
    hit = np.flatnonzero((a & attr != 0) & (a & without == 0))
    ids: list[int] = hit.tolist()
    return ids


def _set_strip_attrs(meta: Mapping[str, Any], ids: Mapping[str, int], attrs: list[int]) -> None:
    """llama.cpp's whitespace stripping around some tokens, which no GGUF key
    records: it decides by the model's name, pre-tokenizer and architecture.
    Phi-3 drops the whitespace after each special token (so
    ``"<|user|>\\nHi"`` is ``<|user|>`` then ``Hi``); Jina and ModernBERT
    drop it before their mask token."""
    name = str(meta.get("general.name") or "").lower()
    pre = str(meta.get(PREFIX + "pre") or "")
    arch = str(meta.get("general.architecture") or "")

    def set_attr(text: str, attr: int, on: bool) -> None:
        i = ids.get(text)
        if i is not None:
            attrs[i] = attrs[i] | attr if on else attrs[i] & ~attr

    if any(k in pre for k in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        k in arch for k in ("nomic-bert-moe", "jina-bert-v3")
    ):
        set_attr("<mask>", A_LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for i, a in enumerate(attrs):
            if a & (A_SPECIAL | A_USER_DEFINED):
                attrs[i] = a | A_RSTRIP
        set_attr("</s>", A_RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, A_RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", A_LSTRIP, True)
