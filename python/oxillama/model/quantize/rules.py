"""Which type each tensor gets: llama.cpp's rules for each file type
(`llama_tensor_get_type` in `src/llama-quant.cpp`), so a mix such as
Q4_K_M gives every tensor the same type as llama-quantize does.

The rules count tensors as they go (the i-th `attn_v` of the file, the
i-th `ffn_down`), over the tensors in llama.cpp's order: names outside the
layers first, then layer by layer, each sorted by name (`tensor_order`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from oxillama.errors import ParameterError
from oxillama.model.quantize.ftypes import BLOCKS, GGML_TYPES, TYPE_NAMES, is_quantized

_LAYER = re.compile(r"^blk\.(-?\d+)\.")

# Substrings (or whole names) of 2-D weights llama.cpp keeps as they are.
_KEEP_PARTS = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
)
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")


def layer_of(name: str) -> int:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def tensor_order(names: list[str]) -> list[str]:
    """llama.cpp's order: by layer (-1 for tensors outside the layers),
    then by name, bytewise."""
    return sorted(names, key=lambda n: (layer_of(n), n.encode()))


def category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in (
        ("attn_qkv.weight", "attn_qkv"),
        ("attn_kv_b.weight", "attn_kv_b"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if part in name:
            return cat
    return "other"


def _is_attn_v(cat: str) -> bool:
    return cat in ("attn_v", "attn_qkv", "attn_kv_b")


@dataclass
class ModelFacts:
    """The hyperparameters the rules read."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        return self.arch == "llama" and self.n_layer == 80 and self.n_head != self.n_head_kv

    @classmethod
    def from_metadata(cls, values: dict[str, Any]) -> ModelFacts:
        arch = str(values.get("general.architecture", ""))

        def first(key: str, default: int) -> int:
            v = values.get(f"{arch}.{key}", default)
            try:
                return int(v[0]) if hasattr(v, "__len__") and not isinstance(v, str) else int(v)
            except (TypeError, ValueError, IndexError):
                return default

        n_head = first("attention.head_count", 0)
        return cls(
            arch=arch,
            n_layer=first("block_count", 0),
            n_head=n_head,
            n_head_kv=first("attention.head_count_kv", n_head),
            n_expert=first("expert_count", 0),
        )


@dataclass
class Options:
    """llama-quantize's switches that change the choice of types."""

    ftype: str
    output_tensor_type: str | None = None
    token_embedding_type: str | None = None
    pure: bool = False
    quantize_output_tensor: bool = True
    has_imatrix: bool = False


def allows_quantization(name: str, n_dims: int, opts: Options) -> bool:
    if n_dims < 2 or not name.endswith("weight"):
        return False
    if not opts.quantize_output_tensor and name == "output.weight":
        return False
    if name in _KEEP_NAMES:
        return False
    return not any(p in name for p in _KEEP_PARTS)


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return (
        i_layer < n_layers // 8
        or i_layer >= 7 * n_layers // 8
        or (i_layer - n_layers // 8) % 3 == 2
    )


@dataclass(frozen=True)
class Fallback:
    """A tensor whose rows are not whole blocks of the type the rules chose."""

    name: str
    columns: int
    wanted: str
    used: str


def _fallback(name: str, ncols: int, type_name: str, fallbacks: list[Fallback]) -> str:
    blk = BLOCKS[GGML_TYPES[type_name]][0]
    if ncols % blk == 0:
        return type_name
    to = {
        "IQ1_S": "IQ4_NL",
        "IQ1_M": "IQ4_NL",
        "IQ2_XXS": "IQ4_NL",
        "IQ2_XS": "IQ4_NL",
        "IQ2_S": "IQ4_NL",
        "IQ3_XXS": "IQ4_NL",
        "IQ3_S": "IQ4_NL",
        "IQ4_XS": "IQ4_NL",
        "Q2_K": "Q4_0",
        "Q3_K": "Q4_0",
        "TQ1_0": "Q4_0",
        "TQ2_0": "Q4_0",
        "Q4_K": "Q5_0",
        "Q5_K": "Q5_1",
        "Q6_K": "Q8_0",
    }.get(type_name)
    if to is None:
        raise ParameterError(f"{name}: {ncols} columns do not fill {type_name} blocks of {blk}")
    if ncols % BLOCKS[GGML_TYPES[to]][0] != 0:
        to = "F16"
    fallbacks.append(Fallback(name, ncols, type_name, to))
    return to


@dataclass
class _Counters:
    n_attention_wv: int = 0
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0
    tied: bool = True


@dataclass
class TypePlan:
    """The type each tensor will have, and why some fell back."""

    types: dict[str, str] = field(default_factory=dict)
    fallbacks: list[Fallback] = field(default_factory=list)


def _mix_type(
    name: str,
    cat: str,
    shape: tuple[int, ...],
    new_type: str,
    facts: ModelFacts,
    opts: Options,
    c: _Counters,
) -> str:
    """llama.cpp's per-category choice for the mixes."""
    ft = opts.ftype
    arch = facts.arch
    n_expert = max(1, facts.n_expert)

    def layer(counter: int) -> tuple[int, int]:
        if n_expert > 1:
            i = layer_of(name)
            if i < 0 or i >= facts.n_layer:
                raise ParameterError(f"cannot tell the layer of tensor {name}")
            return i, facts.n_layer
        return counter, facts.n_layer

    iq_low = ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M")
    if cat == "output" or (c.tied and cat == "token_embd"):
        if opts.output_tensor_type is not None:
            return opts.output_tensor_type
        if ft == "MXFP4_MOE":
            return "Q8_0"
        if arch == "falcon" or shape[0] % BLOCKS[GGML_TYPES[new_type]][0] != 0:
            return "Q8_0"
        if ft in (*iq_low, "IQ3_XXS"):
            return "Q5_K"
        return new_type if new_type == "Q8_0" else "Q6_K"
    if ft == "MXFP4_MOE":
        return "MXFP4" if len(shape) > 2 and shape[2] > 1 else "Q8_0"
    if cat == "token_embd":
        if opts.token_embedding_type is not None:
            return opts.token_embedding_type
        if ft in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            return "Q2_K"
        if ft in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            return "IQ3_S"
        if ft in ("TQ1_0", "TQ2_0"):
            return "Q4_K"
        return new_type
    if ft in iq_low:
        two_s = ft in ("IQ2_S", "IQ2_M")
        if _is_attn_v(cat):
            if facts.n_gqa >= 4 or facts.n_expert >= 4:
                new_type = "Q4_K"
            else:
                new_type = "IQ3_S" if two_s else "Q2_K"
            c.i_attention_wv += 1
        elif facts.n_expert == 8 and cat == "attn_k":
            new_type = "Q4_K"
        elif cat == "ffn_down":
            if c.i_ffn_down < facts.n_layer // 8:
                new_type = "IQ3_S" if two_s else "Q2_K"
            c.i_ffn_down += 1
        elif cat == "attn_output":
            if facts.n_expert == 8:
                new_type = "Q5_K"
            elif ft in ("IQ1_S", "IQ1_M"):
                new_type = "IQ2_XXS"
            elif two_s:
                new_type = "IQ3_S"
        return new_type
    if _is_attn_v(cat):
        gqa4 = facts.n_gqa >= 4
        if ft == "Q2_K":
            new_type = "Q4_K" if gqa4 else "Q3_K"
        elif ft == "Q2_K_S" and gqa4:
            new_type = "Q4_K"
        elif ft == "IQ3_XXS":
            new_type = "Q4_K" if gqa4 else ("IQ3_S" if not opts.has_imatrix else "IQ3_XXS")
        elif ft in ("IQ3_XS", "IQ3_S") and gqa4:
            new_type = "Q4_K"
        elif ft == "IQ3_M":
            new_type = "Q4_K"
        elif ft == "Q3_K_M":
            new_type = "Q5_K" if c.i_attention_wv < 2 else "Q4_K"
        elif ft == "Q3_K_L":
            new_type = "Q5_K"
        elif ft in ("IQ4_NL", "IQ4_XS") and gqa4:
            new_type = "Q5_K"
        elif ft in ("Q4_K_M", "Q5_K_M") and _use_more_bits(c.i_attention_wv, c.n_attention_wv):
            new_type = "Q6_K"
        elif ft == "Q4_K_S" and c.i_attention_wv < 4:
            new_type = "Q5_K"
        if facts.is_70b and new_type in ("Q3_K", "Q4_K"):
            new_type = "Q5_K"
        if facts.n_expert == 8:
            new_type = "Q8_0"
        c.i_attention_wv += 1
        return new_type
    if cat == "attn_k":
        if facts.n_expert == 8:
            return "Q8_0"
        if ft == "IQ3_XS":
            return "IQ3_XXS"
        if ft == "IQ3_XXS":
            return "IQ2_S"
        return new_type
    if cat == "attn_q":
        if ft == "IQ3_XS":
            return "IQ3_XXS"
        if ft == "IQ3_XXS":
            return "IQ2_S"
        return new_type
    if cat == "ffn_down":
        i_layer, n_layer = layer(c.i_ffn_down)
        falcon = arch == "falcon"
        if ft == "Q2_K":
            new_type = "Q3_K"
        elif ft == "Q2_K_S":
            if i_layer < n_layer // 8:
                new_type = "Q4_K"
        elif ft == "IQ3_XXS" and not opts.has_imatrix:
            new_type = "Q4_K" if i_layer < n_layer // 8 else "Q3_K"
        elif ft == "Q3_K_M":
            if i_layer < n_layer // 16:
                new_type = "Q5_K"
            elif not falcon or _use_more_bits(i_layer, n_layer):
                new_type = "Q4_K"
            else:
                new_type = "Q3_K"
        elif ft == "IQ3_M" and (
            i_layer < n_layer // 8 or (facts.n_expert == 8 and _use_more_bits(i_layer, n_layer))
        ):
            new_type = "Q4_K"
        elif ft == "Q3_K_L":
            new_type = "Q4_K" if falcon else "Q5_K"
        elif ft == "Q4_K_M":
            if falcon:
                if i_layer < n_layer // 16:
                    new_type = "Q6_K"
                elif _use_more_bits(i_layer, n_layer):
                    new_type = "Q5_K"
                else:
                    new_type = "Q4_K"
            elif _use_more_bits(i_layer, n_layer):
                new_type = "Q6_K"
        elif i_layer < n_layer // 8 and ft in ("IQ4_NL", "IQ4_XS") and not opts.has_imatrix:
            new_type = "Q5_K"
        elif ft == "Q5_K_M" and _use_more_bits(i_layer, n_layer):
            new_type = "Q6_K"
        elif ft == "Q4_K_S" and not falcon and i_layer < n_layer // 8:
            new_type = "Q5_K"
        elif ft in ("Q4_0", "Q5_0") and opts.has_imatrix and i_layer < n_layer // 8:
            new_type = "Q4_1" if ft == "Q4_0" else "Q5_1"
        c.i_ffn_down += 1
        return new_type
    if cat == "attn_output":
        if arch != "falcon":
            if facts.n_expert == 8:
                if ft in (
                    "Q2_K",
                    "IQ3_XS",
                    "IQ3_XXS",
                    "Q3_K_S",
                    "Q3_K_M",
                    "IQ4_NL",
                    "Q4_K_S",
                    "Q4_K_M",
                    "IQ3_S",
                    "IQ3_M",
                    "IQ4_XS",
                ):
                    new_type = "Q5_K"
            else:
                new_type = {
                    "Q2_K": "Q3_K",
                    "IQ3_XXS": "IQ3_S",
                    "Q3_K_M": "Q4_K",
                    "Q3_K_L": "Q5_K",
                    "IQ3_M": "Q4_K",
                }.get(ft, new_type)
        elif ft == "Q3_K_L":
            new_type = "Q4_K"
        return new_type
    if cat == "attn_qkv":
        if ft in ("Q3_K_M", "Q3_K_L", "IQ3_M"):
            return "Q4_K"
        if ft == "Q4_K_M":
            return "Q5_K"
        if ft == "Q5_K_M":
            return "Q6_K"
        return new_type
    if cat in ("ffn_gate", "ffn_up"):
        counter = c.i_ffn_gate if cat == "ffn_gate" else c.i_ffn_up
        i_layer, n_layer = layer(counter)
        if ft == "IQ3_XS" and n_layer // 8 <= i_layer < 7 * n_layer // 8:
            new_type = "IQ3_XXS"
        if cat == "ffn_gate":
            c.i_ffn_gate += 1
        else:
            c.i_ffn_up += 1
        return new_type
    return new_type


def plan_types(
    tensors: list[tuple[str, tuple[int, ...], int]],
    facts: ModelFacts,
    opts: Options,
    default_type: str,
) -> TypePlan:
    """Each tensor's output type; `tensors` are (name, shape, type id) in
    llama.cpp's order (`tensor_order`)."""
    c = _Counters()
    for name, _, _ in tensors:
        cat = category(name)
        if _is_attn_v(cat):
            c.n_attention_wv += 1
        if cat == "output":
            c.tied = False
    plan = TypePlan()
    for name, shape, type_id in tensors:
        current = TYPE_NAMES.get(type_id, str(type_id))
        if not allows_quantization(name, len(shape), opts):
            plan.types[name] = current
            continue
        cat = category(name)
        if opts.token_embedding_type is not None and cat == "token_embd":
            plan.types[name] = opts.token_embedding_type
            continue
        if opts.output_tensor_type is not None and cat == "output":
            plan.types[name] = opts.output_tensor_type
            continue
        new_type = default_type
        if is_quantized(GGML_TYPES[default_type]):
            if not opts.pure:
                new_type = _mix_type(name, cat, shape, new_type, facts, opts, c)
            new_type = _fallback(name, shape[0], new_type, plan.fallbacks)
        plan.types[name] = new_type
    return plan
