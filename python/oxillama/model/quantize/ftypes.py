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


#: Every file type llama-quantize offers, in its --help order.
FILE_TYPES: tuple[FileType, ...] = (
    FileType("Q4_0", 2, "Q4_0", "4.34G, +0.4685 ppl @ Llama-3-8B"),
    FileType("Q4_1", 3, "Q4_1", "4.78G, +0.4511 ppl @ Llama-3-8B"),
    FileType("MXFP4_MOE", 38, "MXFP4", "MXFP4 experts, Q8_0 elsewhere"),
    FileType("Q5_0", 8, "Q5_0", "5.21G, +0.1316 ppl @ Llama-3-8B"),
    FileType("Q5_1", 9, "Q5_1", "5.65G, +0.1062 ppl @ Llama-3-8B"),
    FileType("IQ2_XXS", 19, "IQ2_XXS", "2.06 bpw quantization"),
    FileType("IQ2_XS", 20, "IQ2_XS", "2.31 bpw quantization"),
    FileType("IQ2_S", 28, "IQ2_XS", "2.5  bpw quantization"),
    FileType("IQ2_M", 29, "IQ2_S", "2.7  bpw quantization"),
    FileType("IQ1_S", 24, "IQ1_S", "1.56 bpw quantization"),
    FileType("IQ1_M", 31, "IQ1_M", "1.75 bpw quantization"),
    FileType("TQ1_0", 36, "TQ1_0", "1.69 bpw ternarization"),
    FileType("TQ2_0", 37, "TQ2_0", "2.06 bpw ternarization"),
    FileType("Q2_K", 10, "Q2_K", "2.96G, +3.5199 ppl @ Llama-3-8B"),
    FileType("Q2_K_S", 21, "Q2_K", "2.96G, +3.1836 ppl @ Llama-3-8B"),
    FileType("IQ3_XXS", 23, "IQ3_XXS", "3.06 bpw quantization"),
    FileType("IQ3_S", 26, "IQ3_S", "3.44 bpw quantization"),
    FileType("IQ3_M", 27, "IQ3_S", "3.66 bpw quantization mix"),
    FileType("Q3_K_S", 11, "Q3_K", "3.41G, +1.6321 ppl @ Llama-3-8B"),
    FileType("Q3_K_M", 12, "Q3_K", "3.74G, +0.6569 ppl @ Llama-3-8B"),
    FileType("Q3_K_L", 13, "Q3_K", "4.03G, +0.5562 ppl @ Llama-3-8B"),
    FileType("IQ4_NL", 25, "IQ4_NL", "4.50 bpw non-linear quantization"),
    FileType("IQ4_XS", 30, "IQ4_XS", "4.25 bpw non-linear quantization"),
    FileType("Q4_K_S", 14, "Q4_K", "4.37G, +0.2689 ppl @ Llama-3-8B"),
    FileType("Q4_K_M", 15, "Q4_K", "4.58G, +0.1754 ppl @ Llama-3-8B"),
    FileType("Q5_K_S", 16, "Q5_K", "5.21G, +0.1049 ppl @ Llama-3-8B"),
    FileType("Q5_K_M", 17, "Q5_K", "5.33G, +0.0569 ppl @ Llama-3-8B"),
    FileType("Q6_K", 18, "Q6_K", "6.14G, +0.0217 ppl @ Llama-3-8B"),
    FileType("Q8_0", 7, "Q8_0", "7.96G, +0.0026 ppl @ Llama-3-8B"),
    FileType("F16", 1, "F16", "14.00G, +0.0020 ppl @ Mistral-7B"),
    FileType("BF16", 32, "BF16", "14.00G, -0.0050 ppl @ Mistral-7B"),
    FileType("F32", 0, "F32", "26.00G @ 7B"),
)
FILE_TYPE_BY_NAME = {f.name: f for f in FILE_TYPES}
FILE_TYPE_BY_ID = {f.id: f for f in FILE_TYPES}

#: Tensor types whose quantizer needs an importance matrix (llama.cpp's
#: `tensor_requires_imatrix`; Q2_K only inside a Q2_K_S file).
NEEDS_IMATRIX = frozenset({"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"})
