"""The quantizer's comparison cases against llama.cpp: inputs, file types
and options, shared by tests/test_quantize_file.py and the script that
recorded llama.cpp's outputs (scripts/make_quantize_refs.py)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

import numpy as np

from oxillama.model.quantize.gguf_io import (
    ARRAY,
    STRING,
    U32,
    encode_kv,
    header_bytes,
    pad,
    read_layout,
)
from tests._quant_models import float_model
from tests._quant_rows import _uniform

REFS = Path(__file__).parent / "reference" / "quantize_refs.json"

#: (name, input, file type, options). Inputs: (fixture, layers, dtype), or
#: the fixture as committed ("as-is", already quantized, mixed types).
CASES: list[dict[str, Any]] = [
    {"id": "llama-q4_k_m", "input": ["llama", 8, "f16"], "ftype": "Q4_K_M"},
    {"id": "llama-q5_k_m", "input": ["llama", 8, "f16"], "ftype": "Q5_K_M"},
    {"id": "llama-q6_k", "input": ["llama", 8, "f16"], "ftype": "Q6_K"},
    {"id": "llama-q8_0", "input": ["llama", 8, "f16"], "ftype": "Q8_0"},
    {"id": "llama-iq4_xs", "input": ["llama", 8, "f16"], "ftype": "IQ4_XS"},
    {"id": "llama-q3_k_m", "input": ["llama", 8, "f16"], "ftype": "Q3_K_M"},
    {"id": "llama-q2_k", "input": ["llama", 8, "f16"], "ftype": "Q2_K"},
    {"id": "llama-q4_0", "input": ["llama", 8, "f16"], "ftype": "Q4_0"},
    {"id": "moe-mxfp4_moe", "input": ["qwen3moe", 8, "f16"], "ftype": "MXFP4_MOE"},
    {"id": "moe-q4_k_m", "input": ["qwen3moe", 8, "f16"], "ftype": "Q4_K_M"},
    {
        "id": "llama-f32-q5_k_s-pure",
        "input": ["llama", 8, "f32"],
        "ftype": "Q5_K_S",
        "options": {"pure": True},
    },
    {
        "id": "llama-q4_k_m-overrides",
        "input": ["llama", 8, "f16"],
        "ftype": "Q4_K_M",
        "options": {"output_tensor_type": "Q8_0", "token_embedding_type": "Q5_0"},
    },
    {
        "id": "llama-q4_k_s-leave-output",
        "input": ["llama", 8, "f16"],
        "ftype": "Q4_K_S",
        "options": {"leave_output_tensor": True},
    },
    {
        "id": "llama-iq4_xs-imatrix-gguf",
        "input": ["llama", 8, "f16"],
        "ftype": "IQ4_XS",
        "imatrix": "gguf",
    },
    {
        "id": "llama-q4_k_m-imatrix-dat",
        "input": ["llama", 8, "f16"],
        "ftype": "Q4_K_M",
        "imatrix": "dat",
    },
    {
        "id": "moe-q5_k_m-imatrix-gguf",
        "input": ["qwen3moe", 8, "f16"],
        "ftype": "Q5_K_M",
        "imatrix": "gguf",
    },
    # The low-bit i-quants: their mixes (llama.cpp's type rules) with an
    # importance matrix, as llama-quantize needs for most of them.
    {
        "id": "llama-iq2_xxs-imatrix-gguf",
        "input": ["llama", 8, "f16"],
        "ftype": "IQ2_XXS",
        "imatrix": "gguf",
    },
    {
        "id": "llama-iq2_xs-imatrix-dat",
        "input": ["llama", 8, "f16"],
        "ftype": "IQ2_XS",
        "imatrix": "dat",
    },
    {
        "id": "llama-iq2_m-imatrix-gguf",
        "input": ["llama", 8, "f16"],
        "ftype": "IQ2_M",
        "imatrix": "gguf",
    },
    {
        "id": "llama-iq3_xxs-imatrix-gguf",
        "input": ["llama", 8, "f16"],
        "ftype": "IQ3_XXS",
        "imatrix": "gguf",
    },
    {
        "id": "llama-iq3_m-imatrix-gguf",
        "input": ["llama", 8, "f16"],
        "ftype": "IQ3_M",
        "imatrix": "gguf",
    },
    {"id": "llama-iq3_s", "input": ["llama", 8, "f16"], "ftype": "IQ3_S"},
    {
        "id": "llama-iq1_s-imatrix-gguf",
        "input": ["llama", 8, "f16"],
        "ftype": "IQ1_S",
        "imatrix": "gguf",
    },
    {
        "id": "llama-iq1_m-imatrix-dat",
        "input": ["llama", 8, "f16"],
        "ftype": "IQ1_M",
        "imatrix": "dat",
    },
    {
        "id": "moe-iq2_xxs-imatrix-gguf",
        "input": ["qwen3moe", 8, "f16"],
        "ftype": "IQ2_XXS",
        "imatrix": "gguf",
    },
    {
        "id": "llama-q8_0-keep-split",
        "input": ["llama", 8, "f16"],
        "ftype": "Q8_0",
        "options": {"keep_split": True},
    },
    {
        "id": "llama-requantize-q4_k_m",
        "input": ["llama", 0, "as-is"],
        "ftype": "Q4_K_M",
        "options": {"allow_requantize": True},
    },
    # The real SmolLM2-135M (Q4_1, its rows 576 wide: most K-quant tensors
    # fall back), with general.file_type already in its metadata.
    {
        "id": "smollm2-requantize-q4_k_m",
        "input": ["smollm2", 0, "as-is"],
        "ftype": "Q4_K_M",
        "options": {"allow_requantize": True},
    },
    {
        "id": "smollm2-requantize-q6_k",
        "input": ["smollm2", 0, "as-is"],
        "ftype": "Q6_K",
        "options": {"allow_requantize": True},
    },
]


def build_input(spec: list[Any], folder: Path) -> Path:
    fixture, layers, dtype = spec
    if dtype == "as-is":
        if fixture == "smollm2":
            from oxillama.model.paths import default_model_path

            return Path(default_model_path())
        from tests._quant_models import FIXTURES

        return FIXTURES / f"{fixture}.gguf"
    path = folder / f"{fixture}-{layers}-{dtype}.gguf"
    if not path.exists():
        float_model(fixture, path, n_layers=layers, dtype=dtype)
    return path


def _imatrix_values(model: Path) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
    """Per 2-D/3-D weight: (sums, counts, columns) as llama-imatrix would
    collect them: positive sums of squares, a count per expert."""
    layout = read_layout(model)
    out = {}
    for t in layout.tensors:
        if len(t.shape) < 2:
            continue
        ne0 = t.shape[0]
        n_mat = t.shape[2] if len(t.shape) > 2 else 1
        u = _uniform(f"imatrix:{t.name}", ne0 * n_mat)
        sums = (u * u * 400.0 + 0.01).astype(np.float32)
        counts = np.array([64.0 + 8 * j for j in range(n_mat)], dtype=np.float32)
        out[t.name] = (sums, counts, ne0)
    layout.close()
    return out


def write_imatrix(kind: str, model: Path, path: Path) -> Path:
    """An importance matrix for `model` in llama-imatrix's GGUF or .dat form."""
    vals = _imatrix_values(model)
    if kind == "dat":
        with open(path, "wb") as f:
            f.write(struct.pack("<i", len(vals)))
            for name, (sums, counts, _) in vals.items():
                b = name.encode()
                ncall = int(counts[0])
                f.write(struct.pack("<i", len(b)) + b + struct.pack("<ii", ncall, sums.size))
                f.write(sums.astype("<f4").tobytes())
            f.write(struct.pack("<i", 10))
            ds = b"calibration.txt"
            f.write(struct.pack("<i", len(ds)) + ds)
        return path
    kvs = [
        ("general.type", encode_kv("general.type", STRING, "imatrix")),
        ("imatrix.chunk_count", encode_kv("imatrix.chunk_count", U32, 10)),
        ("imatrix.chunk_size", encode_kv("imatrix.chunk_size", U32, 512)),
    ]
    k = b"imatrix.datasets"
    ds = b"calibration.txt"
    raw = struct.pack("<Q", len(k)) + k + struct.pack("<IIQ", ARRAY, STRING, 1)
    kvs.append(("imatrix.datasets", raw + struct.pack("<Q", len(ds)) + ds))
    infos, datas, off = [], [], 0
    for name, (sums, counts, ne0) in vals.items():
        for suffix, arr, shape in (
            (".in_sum2", sums, (ne0, sums.size // ne0)),
            (".counts", counts, (1, counts.size)),
        ):
            data = arr.astype("<f4").tobytes()
            infos.append((name + suffix, shape, 0, off))
            datas.append(data)
            off += pad(len(data), 32)
    with open(path, "wb") as f:
        f.write(header_bytes(kvs, infos, 32))
        for d in datas:
            f.write(d + bytes(pad(len(d), 32) - len(d)))
    return path


def tensor_digests(path: Path) -> list[list[str]]:
    """[name, type, sha256 of the bytes] of each tensor, in file order."""
    from oxillama.model.quantize.ftypes import TYPE_NAMES, row_bytes

    layout = read_layout(path)
    out = []
    for t in layout.tensors:
        n = row_bytes(t.type_id, t.shape[0]) * (t.n_elements // t.shape[0])
        digest = hashlib.sha256(layout.tensor_bytes(t, n)).hexdigest()
        out.append([t.name, TYPE_NAMES[t.type_id], digest])
    layout.close()
    return out


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
