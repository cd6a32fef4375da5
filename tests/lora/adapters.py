"""Deterministic LoRA adapters for tests, written with the ``gguf`` package
in llama.cpp's adapter format (what ``convert_lora_to_gguf.py`` writes):
``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``,
``<base>.lora_a`` with ggml shape ``[n_in, rank]`` and ``<base>.lora_b``
``[rank, n_out]``. The same seed gives the same bytes, so the llama.cpp
references in this folder (``make_reference.py``) hold for the adapters the
tests rebuild (each test checks the sha256 recorded beside them)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

import gguf
import numpy as np

SEVEN = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@functools.lru_cache(maxsize=8)
def base_shapes(base: Path) -> tuple[str, dict[str, tuple[int, int]]]:
    """The base model's architecture and every 2-D tensor's (n_out, n_in)
    (cached: reading a large model's directory takes seconds)."""
    r = gguf.GGUFReader(str(base))
    arch = str(r.fields["general.architecture"].contents())
    shapes = {}
    for t in r.tensors:
        if len(t.shape) == 2:
            n_in, n_out = (int(d) for d in t.shape)
            shapes[t.name] = (n_out, n_in)
    return arch, shapes


def pairs(
    shapes: dict[str, tuple[int, int]],
    targets: Iterable[str],
    *,
    rank: int,
    seed: int,
    b_std: float,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``name -> (A (rank x n_in), B (n_out x rank))`` in float32, from one
    seeded generator in the order of ``targets``."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in targets:
        n_out, n_in = shapes[name]
        a = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal((n_out, rank)) * b_std).astype(np.float32)
        out[name] = (a, b)
    return out


def write(
    dst: Path,
    arch: str,
    ab: dict[str, tuple[np.ndarray, np.ndarray]],
    *,
    alpha: float | None,
    dtype: str = "f16",
    extra_tensors: dict[str, np.ndarray] | None = None,
    general_type: str = "adapter",
) -> str:
    """Writes the adapter; returns its sha256. ``dtype`` is f16, f32, bf16
    or q8_0 (the types ``convert_lora_to_gguf.py --outtype`` offers)."""
    w = gguf.GGUFWriter(str(dst), arch)
    w.add_string("general.type", general_type)
    w.add_string("general.name", dst.stem)
    w.add_string("adapter.type", "lora")
    if alpha is not None:
        w.add_float32("adapter.lora.alpha", alpha)
    for name, (a, b) in ab.items():
        for suffix, m in ((".lora_a", a), (".lora_b", b)):
            if dtype == "f16":
                w.add_tensor(name + suffix, m.astype(np.float16))
            elif dtype == "f32" or m.shape[-1] % 32:
                # Rows shorter than a quant block (lora_b's rank rows) stay
                # F32, as the converter leaves what it cannot quantize.
                w.add_tensor(name + suffix, m.astype(np.float32))
            else:
                qt = {
                    "bf16": gguf.GGMLQuantizationType.BF16,
                    "q8_0": gguf.GGMLQuantizationType.Q8_0,
                }[dtype]
                q = gguf.quants.quantize(m.astype(np.float32), qt)
                w.add_tensor(name + suffix, q, raw_shape=q.shape, raw_dtype=qt)
    for name, m in (extra_tensors or {}).items():
        w.add_tensor(name, m)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hashlib.sha256(dst.read_bytes()).hexdigest()


def read_pairs(path: Path) -> tuple[float, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """An adapter's alpha and its pairs as float64 (A rank x n_in, B n_out x rank)."""
    from gguf.quants import dequantize

    r = gguf.GGUFReader(str(path))
    alpha = (
        float(r.fields["adapter.lora.alpha"].contents())
        if "adapter.lora.alpha" in r.fields
        else 0.0
    )
    mats = {}
    for t in r.tensors:
        shape = [int(n) for n in reversed(t.shape)]
        mats[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    out = {}
    for name in mats:
        if name.endswith(".lora_a"):
            base = name[: -len(".lora_a")]
            out[base] = (mats[name], mats[base + ".lora_b"])
    return alpha, out


def smollm2_layers(n_layer: int = 30) -> list[str]:
    return [f"blk.{il}.{p}.weight" for il in range(n_layer) for p in SEVEN]


def make_smollm2(base: Path, dst: Path, *, seed: int, rank: int = 8, dtype: str = "f16") -> str:
    """The SmolLM2 test adapter: rank ``rank`` on all seven projections of
    every layer, alpha = 2 rank (so scale 1 multiplies B A by 2)."""
    arch, shapes = base_shapes(base)
    ab = pairs(shapes, smollm2_layers(), rank=rank, seed=seed, b_std=0.02)
    return write(dst, arch, ab, alpha=2.0 * rank, dtype=dtype)
