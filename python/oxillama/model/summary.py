"""What a GGUF file holds, read from its header alone (no weights loaded):
the model as llama.cpp describes it (``llama 256M Q4_1``), its parameter
count and size, hyper-parameters, tensors, tokenizer and chat template.
``oxillama info`` prints it and ``oxillama bench`` names its models by it."""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import oxillama._native as _native
from oxillama.errors import LoadError

__all__ = [
    "GgufSummary",
    "TensorInfo",
    "TokenizerInfo",
    "format_params",
    "format_size",
    "summarize",
]

# llama.cpp's names of ``general.file_type`` values (its llama_ftype enum).
_FILE_TYPES: dict[int, str] = {
    0: "all F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K - Medium",
    11: "Q3_K - Small",
    12: "Q3_K - Medium",
    13: "Q3_K - Large",
    14: "Q4_K - Small",
    15: "Q4_K - Medium",
    16: "Q5_K - Small",
    17: "Q5_K - Medium",
    18: "Q6_K",
    19: "IQ2_XXS - 2.0625 bpw",
    20: "IQ2_XS - 2.3125 bpw",
    21: "Q2_K - Small",
    22: "IQ3_XS - 3.3 bpw",
    23: "IQ3_XXS - 3.0625 bpw",
    24: "IQ1_S - 1.5625 bpw",
    25: "IQ4_NL - 4.5 bpw",
    26: "IQ3_S - 3.4375 bpw",
    27: "IQ3_S mix - 3.66 bpw",
    28: "IQ2_S - 2.5 bpw",
    29: "IQ2_M - 2.7 bpw",
    30: "IQ4_XS - 4.25 bpw",
    31: "IQ1_M - 1.75 bpw",
    32: "BF16",
    36: "TQ1_0 - 1.69 bpw ternary",
    37: "TQ2_0 - 2.06 bpw ternary",
    38: "MXFP4 MoE",
    # Types we do not run yet, named so ``oxillama info`` still describes
    # the file as llama.cpp does.
    39: "NVFP4",
    40: "Q1_0",
    41: "Q2_0",
}

# Without ``general.file_type`` llama.cpp guesses the file type from the
# tensor type most tensors have; a k-quant reads as its medium mix.
_GUESS_FROM_TENSOR: dict[str, int] = {
    "F32": 0,
    "F16": 1,
    "BF16": 32,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 8,
    "Q5_1": 9,
    "Q8_0": 7,
    "Q2_K": 10,
    "Q3_K": 12,
    "Q4_K": 15,
    "Q5_K": 17,
    "Q6_K": 18,
    "IQ2_XXS": 19,
    "IQ2_XS": 20,
    "IQ2_S": 28,
    "IQ3_XXS": 23,
    "IQ3_S": 26,
    "IQ1_S": 24,
    "IQ1_M": 31,
    "IQ4_NL": 25,
    "IQ4_XS": 30,
    "TQ1_0": 36,
    "TQ2_0": 37,
}


def _llama_size_label(h: Mapping[str, Any]) -> str | None:
    n_layer = h["n_layer"]
    if h.get("n_expert") == 8:
        return {32: "8x7B", 56: "8x22B"}.get(n_layer)
    if n_layer == 32:
        vocab = h.get("n_vocab") or 0
        return "3B" if vocab == 49152 else ("7B" if vocab < 40000 else "8B")
    if n_layer == 80:
        return "65B" if h.get("n_head") == h.get("n_head_kv") else "70B"
    fixed = {16: "1B", 22: "1B", 26: "3B", 28: "3B", 30: "256M", 36: "8B", 40: "13B", 48: "34B"}
    return {**fixed, 60: "30B"}.get(n_layer)


def _by_layers(table: Mapping[int, str]) -> Any:
    return lambda h: table.get(h["n_layer"])


def _by_layers_and_width(table: Mapping[tuple[int, int | None], str]) -> Any:
    return lambda h: table.get((h["n_layer"], h["n_embd"]), table.get((h["n_layer"], None)))


# The size class llama.cpp gives each architecture oxillama runs (its
# ``llm_type`` names, from the layer count and sometimes the width): the
# middle word of ``model_type`` in llama-bench's tables. "?B" when unknown.
_SIZE_LABELS: dict[str, Any] = {
    "llama": _llama_size_label,
    "mistral3": _by_layers({26: "3B", 34: "8B", 40: "14B"}),
    "granite": _by_layers_and_width(
        {(32, None): "3B", (40, 2048): "2B", (40, 2560): "3B", (40, 4096): "8B", (64, None): "30B"}
    ),
    "qwen2": lambda h: {
        24: "0.5B" if h["n_embd"] == 1024 else "1B",
        28: "1.5B" if h["n_embd"] == 1536 else "7B",
        32: "7B",
        36: "3B",
        40: "4B" if h.get("n_head") == 20 else "13B",
        48: "14B",
        64: "32B",
        80: "70B",
    }.get(h["n_layer"]),
    "qwen3": lambda h: {
        28: "0.6B" if h["n_embd"] == 1024 else "1.7B",
        36: "4B" if h["n_embd"] == 2560 else "8B",
        40: "14B",
        64: "32B",
    }.get(h["n_layer"]),
    "qwen3moe": _by_layers({48: "30B.A3B", 94: "235B.A22B"}),
    "olmo2": _by_layers({16: "1B", 32: "7B", 40: "13B", 64: "32B"}),
    "gemma": _by_layers({18: "2B", 28: "7B"}),
    "gemma2": _by_layers({26: "2B", 42: "9B", 46: "27B"}),
    "gemma3": _by_layers({18: "270M", 26: "1B", 32: "8B", 34: "4B", 48: "12B", 62: "27B"}),
    "phi3": _by_layers({24: "1B", 32: "3B", 40: "14B"}),
    "command-r": _by_layers({40: "35B"}),
    "starcoder2": _by_layers({30: "3B", 32: "7B", 40: "15B", 52: "20B", 88: "34B"}),
    "bert": _by_layers_and_width(
        {
            (3, None): "17M",
            (6, None): "22M",
            (12, 384): "33M",
            (12, 768): "109M",
            (24, None): "335M",
        }
    ),
    "mamba2": _by_layers_and_width(
        {
            (24, 768): "0.1B",
            (48, 1024): "0.4B",
            (48, 1536): "0.8B",
            (48, 2048): "1.5B",
            (64, 2560): "3B",
            (64, 4096): "7B",
        }
    ),
}


def format_size(n_bytes: int) -> str:
    """A size as llama-bench writes it: MiB below 1 GiB, else GiB."""
    if n_bytes < 1 << 30:
        return f"{n_bytes / (1 << 20):.2f} MiB"
    return f"{n_bytes / (1 << 30):.2f} GiB"


def format_params(n: int) -> str:
    """A parameter count as llama-bench writes it: M below a billion, else B."""
    return f"{n / 1e6:.2f} M" if n < 1_000_000_000 else f"{n / 1e9:.2f} B"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: its GGUF type name, its shape in GGUF order
    (the fastest-varying dimension first, as llama.cpp prints it), where its
    data starts (from the data section) and how many bytes it takes."""

    name: str
    type: str
    shape: tuple[int, ...]
    offset: int
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class TokenizerInfo:
    """The vocabulary's kind and special tokens, as the tokenizer reads them
    (llama.cpp's defaults where the file is silent; ``error`` says why the
    file's own keys were used instead)."""

    model: str | None
    pre: str | None
    vocab_size: int
    special: dict[str, tuple[int, str]] = field(default_factory=dict)
    add_bos: bool | None = None
    add_eos: bool | None = None
    eog: tuple[int, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class GgufSummary:
    path: str
    version: int
    alignment: int
    file_size: int
    parse_seconds: float
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]

    # ------------------------------------------------------------ headline

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def name(self) -> str | None:
        v = self.metadata.get("general.name")
        return v if isinstance(v, str) else None

    @cached_property
    def n_params(self) -> int:
        """Every element of every tensor, as llama.cpp counts parameters."""
        return sum(t.n_elements for t in self.tensors)

    @cached_property
    def n_bytes(self) -> int:
        """The tensors' bytes: llama-bench's model size."""
        return sum(t.n_bytes for t in self.tensors)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.n_bytes / self.n_params if self.n_params else 0.0

    @property
    def file_type(self) -> str:
        """``general.file_type`` by llama.cpp's name for it, or its guess
        from the most common tensor type, prefixed "(guessed) "."""
        ft = self.metadata.get("general.file_type")
        if isinstance(ft, int) and not isinstance(ft, bool):
            return _FILE_TYPES.get(ft, "unknown, may not work")
        counts: Counter[str] = Counter(t.type for t in self.tensors)
        best = max(counts, key=lambda ty: counts[ty], default="F32")
        guess = _GUESS_FROM_TENSOR.get(best)
        return "(guessed) " + (_FILE_TYPES[guess] if guess is not None else "all F32")

    @property
    def size_label(self) -> str:
        """llama.cpp's size class for this architecture and shape ("?B"
        when it has none), which is not always ``general.size_label``."""
        h = self.hparams
        rule = _SIZE_LABELS.get(self.arch)
        if rule is None or not isinstance(h.get("n_layer"), int):
            return "?B"
        label = rule(h)
        return label if isinstance(label, str) else "?B"

    @property
    def description(self) -> str:
        """The model as llama.cpp (and llama-bench's ``model`` column)
        describes it: architecture, size class and file type."""
        return f"{self.arch} {self.size_label} {self.file_type}"

    # ------------------------------------------------------------- details

    def _arch_key(self, key: str) -> Any:
        return self.metadata.get(f"{self.arch}.{key}")

    @cached_property
    def hparams(self) -> dict[str, Any]:
        """The architecture's hyper-parameters under plain names; a value
        that differs per layer stays a list."""

        def uniform(v: Any) -> Any:
            if isinstance(v, list) and v and all(x == v[0] for x in v):
                return v[0]
            return v

        n_embd = self._arch_key("embedding_length")
        n_head = uniform(self._arch_key("attention.head_count"))
        head_k = self._arch_key("attention.key_length")
        if head_k is None and isinstance(n_embd, int) and isinstance(n_head, int) and n_head:
            head_k = n_embd // n_head
        head_v = self._arch_key("attention.value_length")
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        n_vocab = self._arch_key("vocab_size")
        if n_vocab is None and isinstance(tokens, list):
            n_vocab = len(tokens)
        h = {
            "context_length": self._arch_key("context_length"),
            "n_layer": self._arch_key("block_count"),
            "n_embd": n_embd,
            "n_ff": uniform(self._arch_key("feed_forward_length")),
            "n_head": n_head,
            "n_head_kv": uniform(self._arch_key("attention.head_count_kv")),
            "head_dim_k": head_k,
            "head_dim_v": head_v if head_v is not None else head_k,
            "n_vocab": n_vocab,
            "n_expert": self._arch_key("expert_count"),
            "n_expert_used": self._arch_key("expert_used_count"),
            "rope_freq_base": self._arch_key("rope.freq_base"),
            "rope_freq_base_swa": self._arch_key("rope.freq_base_swa"),
            "rope_dims": self._arch_key("rope.dimension_count"),
            "rope_scaling": self._arch_key("rope.scaling.type"),
            "rope_scaling_factor": self._arch_key("rope.scaling.factor"),
            "norm_rms_eps": self._arch_key("attention.layer_norm_rms_epsilon"),
            "norm_eps": self._arch_key("attention.layer_norm_epsilon"),
            "sliding_window": self._arch_key("attention.sliding_window"),
            "n_ff_shexp": self._arch_key("expert_shared_feed_forward_length"),
            "ssm_d_conv": self._arch_key("ssm.conv_kernel"),
            "ssm_d_inner": self._arch_key("ssm.inner_size"),
            "ssm_d_state": self._arch_key("ssm.state_size"),
            "ssm_dt_rank": self._arch_key("ssm.time_step_rank"),
            "shortconv_l_cache": self._arch_key("shortconv.l_cache"),
            "rope_finetuned": self._arch_key("rope.scaling.finetuned"),
            "shared_kv_layers": self._arch_key("attention.shared_kv_layers"),
            "altup_num_inputs": self._arch_key("altup.num_inputs"),
            "n_embd_per_layer": self._arch_key("embedding_length_per_layer_input"),
            "kv_lora_rank": self._arch_key("attention.kv_lora_rank"),
            "q_lora_rank": self._arch_key("attention.q_lora_rank"),
            "head_dim_k_mla": self._arch_key("attention.key_length_mla"),
            "head_dim_v_mla": self._arch_key("attention.value_length_mla"),
        }
        return {k: v for k, v in h.items() if v is not None}

    def kv_values_per_token(self) -> tuple[int, str] | None:
        """Values the KV cache holds per token (all layers) and how they
        follow from the header; ``None`` for a model that keeps no keys and
        values, or whose header does not say enough.

        MLA (``attention.key_length_mla`` set, DeepSeek-V2): the latent and
        the rotated key part, ``n_layer x (kv_lora_rank + rope dims)``, read
        as both keys and values. Otherwise each attention layer's
        ``n_head_kv x (head_dim_k + head_dim_v)``."""
        h = self.hparams
        n_layer = h.get("n_layer")
        if not isinstance(n_layer, int):
            return None
        if "kv_lora_rank" in h and "head_dim_k_mla" in h and "rope_dims" in h:
            lat, rope = int(h["kv_lora_rank"]), int(h["rope_dims"])
            return (
                n_layer * (lat + rope),
                f"{n_layer} layers x (kv_lora_rank {lat} + rope {rope})",
            )
        kv, k, v = h.get("n_head_kv"), h.get("head_dim_k"), h.get("head_dim_v")
        if not isinstance(k, int) or not isinstance(v, int):
            return None
        per_layer = kv if isinstance(kv, list) else [kv] * n_layer
        heads = [x for x in per_layer if isinstance(x, int) and x > 0]
        if not heads:
            return None
        return sum(heads) * (k + v), f"{len(heads)} layers x KV heads x ({k} K + {v} V)"

    def type_mix(self) -> list[tuple[str, int, int, int]]:
        """``(type, tensors, elements, bytes)`` per tensor type, most bytes first."""
        mix: dict[str, list[int]] = {}
        for t in self.tensors:
            row = mix.setdefault(t.type, [0, 0, 0])
            row[0] += 1
            row[1] += t.n_elements
            row[2] += t.n_bytes
        rows = [(ty, c, e, b) for ty, (c, e, b) in mix.items()]
        return sorted(rows, key=lambda r: (-r[3], r[0]))

    @property
    def chat_templates(self) -> dict[str, str]:
        """The default chat template under ``"default"`` and each named one
        (``tokenizer.chat_template.<name>``) under its name."""
        out: dict[str, str] = {}
        for k, v in self.metadata.items():
            if not isinstance(v, str):
                continue
            if k == "tokenizer.chat_template":
                out["default"] = v
            elif k.startswith("tokenizer.chat_template."):
                out[k.removeprefix("tokenizer.chat_template.")] = v
        return out

    @cached_property
    def tokenizer(self) -> TokenizerInfo:
        from oxillama.text.tokenizer.gguf_vocab import GgufVocab

        meta = self.metadata
        tokens = meta.get("tokenizer.ggml.tokens")
        toks: Sequence[Any] = tokens if isinstance(tokens, list) else []

        def text(i: int) -> str:
            return str(toks[i]) if 0 <= i < len(toks) else "?"

        try:
            vocab = GgufVocab.from_metadata(meta)
        except LoadError as e:
            # Still worth showing what the file says, e.g. for a vocabulary
            # kind oxillama cannot tokenize with.
            special = {}
            for slot, key in (
                ("bos", "bos_token_id"),
                ("eos", "eos_token_id"),
                ("eot", "eot_token_id"),
                ("pad", "padding_token_id"),
                ("unk", "unknown_token_id"),
                ("sep", "seperator_token_id"),
            ):
                v = meta.get("tokenizer.ggml." + key)
                if isinstance(v, int) and not isinstance(v, bool):
                    special[slot] = (v, text(v))
            flags = [meta.get(f"tokenizer.ggml.add_{w}_token") for w in ("bos", "eos")]
            return TokenizerInfo(
                model=_str_or_none(meta.get("tokenizer.ggml.model")),
                pre=_str_or_none(meta.get("tokenizer.ggml.pre")),
                vocab_size=len(toks),
                special=special,
                add_bos=flags[0] if isinstance(flags[0], bool) else None,
                add_eos=flags[1] if isinstance(flags[1], bool) else None,
                error=str(e),
            )
        order = ("bos", "eos", "eot", "eom", "pad", "unk", "sep", "mask")
        special = {
            s: (vocab.special[s], text(vocab.special[s])) for s in order if s in vocab.special
        }
        return TokenizerInfo(
            model=vocab.model,
            pre=vocab.pre,
            vocab_size=len(vocab.tokens),
            special=special,
            add_bos=vocab.add_bos,
            add_eos=vocab.add_eos,
            eog=tuple(sorted(vocab.eog_ids)),
        )


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def summarize(path: str | os.PathLike[str]) -> GgufSummary:
    """Reads the header of the GGUF file at ``path`` (memory-mapped; the
    tensor data is not touched)."""
    t0 = time.perf_counter()
    f = _native.GgufFile.open(os.fspath(path))
    meta = f.metadata()
    tensors = tuple(
        TensorInfo(name, ty, tuple(int(d) for d in dims), int(off), int(nbytes))
        for name, ty, dims, off, nbytes in f.tensors()
    )
    return GgufSummary(
        path=os.fspath(path),
        version=int(f.version),
        alignment=int(f.alignment),
        file_size=int(f.file_size),
        parse_seconds=time.perf_counter() - t0,
        metadata=dict(meta),
        tensors=tensors,
    )
