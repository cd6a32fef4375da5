"""llama.cpp's file types (`general.file_type`) and tensor types, by name:
what `oxillama quantize` accepts as TYPE and what each one writes by
default."""

from __future__ import annotations

from dataclasses import dataclass

#: ggml's tensor type ids.
GGML_TYPES: dict[str, int] = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q8_1": 9,
    "Q2_K": 10,
    "Q3_K": 11,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "Q8_K": 15,
    "IQ2_XXS": 16,
    "IQ2_XS": 17,
    "IQ3_XXS": 18,
    "IQ1_S": 19,
    "IQ4_NL": 20,
    "IQ3_S": 21,
    "IQ2_S": 22,
    "IQ4_XS": 23,
    "IQ1_M": 29,
    "BF16": 30,
    "TQ1_0": 34,
    "TQ2_0": 35,
    "MXFP4": 39,
}
TYPE_NAMES = {v: k for k, v in GGML_TYPES.items()}

#: (elements per block, bytes per block) of each tensor type.
BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4),
    1: (1, 2),
    30: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 36),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    29: (256, 56),
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
}

#: Types held as floats rather than blocks (ggml's "not quantized").
FLOAT_TYPES = frozenset({0, 1, 30})


def is_quantized(type_id: int) -> bool:
    return type_id not in FLOAT_TYPES


def row_bytes(type_id: int, n: int) -> int:
    blk, size = BLOCKS[type_id]
    return n // blk * size


@dataclass(frozen=True)
class FileType:
    name: str
    id: int  # general.file_type
    default: str  # the tensor type most tensors get
    about: str  # llama-quantize's one-line description


#: Every file type llama-quantize offers, in its --help order, with what
#: the mix does beyond its base type (our words).
FILE_TYPES: tuple[FileType, ...] = (
    FileType("Q4_0", 2, "Q4_0", "legacy 4-bit, one scale a block"),
    FileType("Q4_1", 3, "Q4_1", "legacy 4-bit, scale and min"),
    FileType("MXFP4_MOE", 38, "MXFP4", "MoE experts in MXFP4, every other matrix Q8_0"),
    FileType("Q5_0", 8, "Q5_0", "legacy 5-bit, one scale a block"),
    FileType("Q5_1", 9, "Q5_1", "legacy 5-bit, scale and min"),
    FileType("IQ2_XXS", 19, "IQ2_XXS", "i-quant mix, needs --imatrix"),
    FileType("IQ2_XS", 20, "IQ2_XS", "i-quant mix, needs --imatrix"),
    FileType("IQ2_S", 28, "IQ2_XS", "i-quant mix, needs --imatrix"),
    FileType("IQ2_M", 29, "IQ2_S", "i-quant mix, needs --imatrix"),
    FileType("IQ1_S", 24, "IQ1_S", "i-quant mix, needs --imatrix"),
    FileType("IQ1_M", 31, "IQ1_M", "i-quant mix, needs --imatrix"),
    FileType("TQ1_0", 36, "TQ1_0", "ternary, token embeddings Q4_K"),
    FileType("TQ2_0", 37, "TQ2_0", "ternary, token embeddings Q4_K"),
    FileType("Q2_K", 10, "Q2_K", "attn_v Q3_K/Q4_K, ffn_down and attn_output Q3_K"),
    FileType("Q2_K_S", 21, "Q2_K", "smaller Q2_K mix, needs --imatrix"),
    FileType("IQ3_XXS", 23, "IQ3_XXS", "i-quant mix, needs --imatrix (attn_k IQ2_S)"),
    FileType("IQ3_S", 26, "IQ3_S", "i-quant mix"),
    FileType("IQ3_M", 27, "IQ3_S", "i-quant mix, attn_v and attn_output Q4_K"),
    FileType("Q3_K_S", 11, "Q3_K", "Q3_K throughout"),
    FileType("Q3_K_M", 12, "Q3_K", "attn_v Q5_K/Q4_K, attn_output and most ffn_down Q4_K"),
    FileType("Q3_K_L", 13, "Q3_K", "attn_v, attn_output and ffn_down Q5_K"),
    FileType("IQ4_NL", 25, "IQ4_NL", "non-linear 4-bit, 32-element blocks"),
    FileType("IQ4_XS", 30, "IQ4_XS", "non-linear 4-bit, 256-element super-blocks"),
    FileType("Q4_K_S", 14, "Q4_K", "first attn_v and first ffn_down layers Q5_K"),
    FileType("Q4_K_M", 15, "Q4_K", "attn_v and ffn_down Q6_K in about half the layers"),
    FileType("Q5_K_S", 16, "Q5_K", "Q5_K throughout"),
    FileType("Q5_K_M", 17, "Q5_K", "attn_v and ffn_down Q6_K in about half the layers"),
    FileType("Q6_K", 18, "Q6_K", "Q6_K throughout"),
    FileType("Q8_0", 7, "Q8_0", "8-bit, near lossless"),
    FileType("F16", 1, "F16", "half precision"),
    FileType("BF16", 32, "BF16", "bfloat16"),
    FileType("F32", 0, "F32", "single precision"),
)


def bits_per_weight(type_name: str) -> float:
    blk, size = BLOCKS[GGML_TYPES[type_name]]
    return 8.0 * size / blk


FILE_TYPE_BY_NAME = {f.name: f for f in FILE_TYPES}
FILE_TYPE_BY_ID = {f.id: f for f in FILE_TYPES}

#: Tensor types whose quantizer needs an importance matrix (llama.cpp's
#: `tensor_requires_imatrix`; Q2_K only inside a Q2_K_S file).
NEEDS_IMATRIX = frozenset({"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"})
