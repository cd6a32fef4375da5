"""Decode where it is bound by memory: a synthetic SmolLM2-1.7B in Q4_K_M's
mix of types, against llama.cpp and against this machine's read bandwidth.

Our two real models are small enough that much of their weights sit in the
caches; users run 1-8B models, whose decode reads every weight from memory
for each token. The model is written with llama.cpp's ``gguf`` package:
SmolLM2-1.7B's shapes (llama, 24 layers, width 2048, FFN 8192, 32 heads,
vocabulary 49,152; 1.71 B parameters) and SmolLM2-135M's tokenizer, random
weights laid out as llama.cpp's Q4_K_M lays out a real one (Q4_K
everywhere, Q6_K for the output matrix and for attn_v and ffn_down on the
layers llama.cpp gives more bits). Random weights give meaningless text at
exactly the speed of real ones.

The bound: bytes of weights one decode step reads (every matrix, one row
of the embedding) / the machine's read bandwidth, measured here by summing
a 2 GiB array with numpy on every core.

  python benches/bench_bandwidth.py [--reps 3] [--threads 2]
  python benches/bench_bandwidth.py --shape llama3-8b-slice --write-only
  python benches/bench_bandwidth.py --kind iq4_xs --write-only

``--kind`` writes the same model in another type instead of Q4_K_M's mix:
every layer matrix and the token embedding in IQ4_XS, IQ3_S, IQ2_XXS,
TQ2_0 or MXFP4 (random but valid blocks, scales set for weights of a real
model's size), the output matrix in Q6_K as llama.cpp's quantizer leaves it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _cpu import describe as describe_cpu

HERE = Path(__file__).resolve().parent
DEFAULT = Path.home() / ".cache" / "oxillama" / "synthetic-smollm2-1.7b-q4_k_m.gguf"

#: SmolLM2-1.7B.
N_LAYER, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_VOCAB = 24, 2048, 8192, 32, 32, 49152


@dataclass(frozen=True)
class Shape:
    """A llama-architecture model's widths, for a synthetic GGUF."""

    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    rope_base: float


SHAPES = {
    "smollm2-1.7b": Shape(
        "SmolLM2-1.7B", N_LAYER, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_VOCAB, 130000.0
    ),
    # Llama-3-8B's widths (GQA 32/8, FFN 14336, vocabulary 128,256) with 4 of
    # its 32 layers: every matrix of the real model at full size, in 1.2 GB.
    "llama3-8b-slice": Shape("Llama-3-8B, 4-layer slice", 4, 4096, 14336, 32, 8, 128256, 500000.0),
}


#: The kinds ``write_model`` writes besides Q4_K_M: (bytes per block,
#: elements per block, llama.cpp's file type).
KINDS = {
    "iq4_xs": (136, 256, "MOSTLY_IQ4_XS"),
    "iq3_s": (110, 256, "MOSTLY_IQ3_S"),
    "iq2_xxs": (66, 256, "MOSTLY_IQ2_XXS"),
    "tq2_0": (66, 256, "MOSTLY_TQ2_0"),
    "mxfp4": (17, 32, "MOSTLY_MXFP4_MOE"),
}


def model_path(shape: str, kind: str = "q4_k_m") -> Path:
    """Where the synthetic model of ``shape`` in ``kind`` is kept."""
    if shape == "smollm2-1.7b" and kind == "q4_k_m":
        return DEFAULT
    return DEFAULT.with_name(f"synthetic-{shape}-{kind}.gguf")


QK_K = 256
#: Bytes per 256-element block.
Q4_K_BYTES, Q6_K_BYTES = 144, 210


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v / ffn_down get Q6_K
    under Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _f16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8).reshape(*v.shape, 2)


def _q4_k(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q4_K rows: d, dmin small and positive, random 6-bit scales and
    mins, random nibbles."""
    nb = rows * cols // QK_K
    b = rng.integers(0, 256, size=(nb, Q4_K_BYTES), dtype=np.uint8)
    b[:, 0:2] = _f16(rng.uniform(2e-4, 6e-4, nb))
    b[:, 2:4] = _f16(rng.uniform(1e-4, 3e-4, nb))
    return b.reshape(rows, cols // QK_K * Q4_K_BYTES)


def _q6_k(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q6_K rows: random 6-bit quants, small signed 8-bit scales, a
    small d."""
    nb = rows * cols // QK_K
    b = rng.integers(0, 256, size=(nb, Q6_K_BYTES), dtype=np.uint8)
    b[:, 192:208] = rng.integers(-32, 32, size=(nb, 16), dtype=np.int8).view(np.uint8)
    b[:, 208:210] = _f16(rng.uniform(1e-4, 3e-4, nb))
    return b.reshape(rows, cols // QK_K * Q6_K_BYTES)


def _kind_blocks(rng: np.random.Generator, kind: str, rows: int, cols: int) -> np.ndarray:
    """Random valid rows of ``kind``: random bits under a scale that gives
    weights of about 0.02, as a real model's."""
    size, qk, _ = KINDS[kind]
    nb = rows * cols // qk
    b = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    if kind == "mxfp4":
        b[:, 0] = rng.integers(119, 122, nb, dtype=np.uint8)  # 2^-9 .. 2^-7, doubled values
    elif kind == "tq2_0":
        b[:, 64:66] = _f16(rng.uniform(0.015, 0.025, nb))
    else:
        # d times the codebook's magnitudes (up to 127 for IQ4_XS's levels,
        # 62 for the IQ3 grids, 43 for IQ2's) and the sub-block scales.
        d = {"iq4_xs": 1e-4 / 3, "iq3_s": 2e-4, "iq2_xxs": 4e-4}[kind]
        b[:, 0:2] = _f16(rng.uniform(0.5 * d, 1.5 * d, nb))
    return b.reshape(rows, cols // qk * size)


def write_model(path: Path, shape: Shape = SHAPES["smollm2-1.7b"], kind: str = "q4_k_m") -> None:
    """Writes the synthetic model of ``shape`` in ``kind`` to ``path``.
    Vocabularies larger than SmolLM2's 49,152 tokens are padded with tokens
    no merge reaches, so the tokenizer loads and every id has an embedding
    row."""
    import gguf

    sys.path.insert(0, str(HERE.parent))
    from tests._gguf_meta import read_metadata, smollm2_path

    meta = read_metadata(smollm2_path())
    rng = np.random.default_rng(0)
    q4, q6 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    layout = "Q4_K_M layout" if kind == "q4_k_m" else f"{kind.upper()}"
    w.add_name(f"synthetic {shape.name}, {layout}, random weights")
    w.add_context_length(8192)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(shape.n_embd // shape.n_head)
    w.add_vocab_size(shape.n_vocab)
    ftype = "MOSTLY_Q4_K_M" if kind == "q4_k_m" else KINDS[kind][2]
    w.add_file_type(getattr(gguf.LlamaFileType, ftype))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in meta.items():
        if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
            if key == "tokenizer.ggml.model":
                w.add_tokenizer_model(value)
            elif key == "tokenizer.ggml.pre":
                w.add_tokenizer_pre(value)
            elif key == "tokenizer.ggml.tokens":
                pad = shape.n_vocab - len(value)
                w.add_token_list(list(value) + [f"<|synthetic_{i}|>" for i in range(pad)])
            elif key == "tokenizer.ggml.token_type":
                w.add_token_types(list(value) + [1] * (shape.n_vocab - len(value)))
            elif key == "tokenizer.ggml.merges":
                w.add_token_merges(value)
            elif key.endswith("_token_id"):
                w.add_uint32(key, int(value))
            elif isinstance(value, bool):
                w.add_bool(key, value)
    norm = np.ones(shape.n_embd, dtype=np.float32)
    kt = None if kind == "q4_k_m" else getattr(gguf.GGMLQuantizationType, kind.upper())
    if kt is None:
        w.add_tensor("token_embd.weight", _q4_k(rng, shape.n_vocab, shape.n_embd), raw_dtype=q4)
    else:
        w.add_tensor(
            "token_embd.weight", _kind_blocks(rng, kind, shape.n_vocab, shape.n_embd), raw_dtype=kt
        )
    w.add_tensor("output_norm.weight", norm)
    w.add_tensor("output.weight", _q6_k(rng, shape.n_vocab, shape.n_embd), raw_dtype=q6)
    for i in range(shape.n_layer):
        more = _more_bits(i, shape.n_layer)
        for name, rows, cols, six in (
            ("attn_q", shape.n_embd, shape.n_embd, False),
            ("attn_k", shape.n_embd * shape.n_head_kv // shape.n_head, shape.n_embd, False),
            ("attn_v", shape.n_embd * shape.n_head_kv // shape.n_head, shape.n_embd, more),
            ("attn_output", shape.n_embd, shape.n_embd, False),
            ("ffn_gate", shape.n_ff, shape.n_embd, False),
            ("ffn_up", shape.n_ff, shape.n_embd, False),
            ("ffn_down", shape.n_embd, shape.n_ff, more),
        ):
            if kt is not None:
                data = _kind_blocks(rng, kind, rows, cols)
                w.add_tensor(f"blk.{i}.{name}.weight", data, raw_dtype=kt)
                continue
            data = _q6_k(rng, rows, cols) if six else _q4_k(rng, rows, cols)
            w.add_tensor(f"blk.{i}.{name}.weight", data, raw_dtype=q6 if six else q4)
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()
    os.replace(tmp, path)


def bytes_per_token(path: Path) -> int:
    """Weights one decode step reads: every tensor, but one row of the
    embedding table."""
    import gguf

    r = gguf.GGUFReader(str(path))
    total = 0
    for t in r.tensors:
        if t.name == "token_embd.weight":
            total += int(t.n_bytes) // int(t.shape[1])
        else:
            total += int(t.n_bytes)
    return total


def read_bandwidth(threads: int, gib: float = 2.0, reps: int = 5) -> float:
    """GB/s of a streaming read on ``threads`` cores (numpy's sum releases
    the GIL), median of ``reps``."""
    a = np.ones(int(gib * (1 << 30)) // 4, dtype=np.float32)
    parts = np.array_split(a, threads)
    speeds = []
    for _ in range(reps + 1):
        ts = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        speeds.append(a.nbytes / (time.perf_counter() - t0) / 1e9)
    return statistics.median(speeds[1:])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        help="the synthetic model's widths (default: smollm2-1.7b)",
    )
    ap.add_argument(
        "--model",
        type=Path,
        help="a GGUF to measure (default: the synthetic model of --shape, written if missing); "
        "written only when --shape is also given",
    )
    ap.add_argument(
        "--write-only",
        action="store_true",
        help="write the model (if missing), print its path and stop: for llama-bench and "
        "benches/bench_llamabench.py",
    )
    ap.add_argument(
        "--kind",
        choices=["q4_k_m", *KINDS],
        default="q4_k_m",
        help="the synthetic model's types: Q4_K_M's mix (default) or one type throughout",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=32)
    a = ap.parse_args()
    if a.model is not None and not a.model.is_file() and a.shape is None:
        # A mistyped path must not quietly become a fresh 1.7B-shaped file.
        raise SystemExit(f"{a.model} does not exist; add --shape to write a synthetic model there")
    a.model = a.model or model_path(a.shape or "smollm2-1.7b", a.kind)
    if not a.model.is_file():
        a.model.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {a.model} ...", flush=True)
        write_model(a.model, SHAPES[a.shape or "smollm2-1.7b"], a.kind)
    if a.write_only:
        print(a.model)
        return
    per_token = bytes_per_token(a.model)
    print(f"cpu: {describe_cpu()}")
    print(
        f"model: {a.model.name}, {a.model.stat().st_size / 1e9:.2f} GB; one decode step reads "
        f"{per_token / 1e9:.3f} GB of weights"
    )
    before = read_bandwidth(a.threads)
    out = subprocess.run(
        [
            sys.executable,
            str(HERE / "bench_vs_llamacpp.py"),
            *("--model", str(a.model), "--threads", str(a.threads), "--reps", str(a.reps)),
            *("--pp", str(a.pp), "--tg", str(a.tg), "--inner", "2"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    print(out.stdout)
    # Measured before and after the engines; the higher figure is the bound
    # (a busy moment only lowers it).
    bw = max(before, read_bandwidth(a.threads))
    bound = bw * 1e9 / per_token
    print(
        f"read bandwidth ({a.threads} threads, numpy sum of 2 GiB; best of before/after): "
        f"{bw:.1f} GB/s (before {before:.1f}) -> bound {bound:.1f} tok/s"
    )
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[1] in ("oxillama", "llama.cpp"):
            tg = float(parts[3])
            print(f"{parts[1]:>10}: tg {tg:.2f} tok/s = {tg / bound:.0%} of the bandwidth bound")


if __name__ == "__main__":
    main()
