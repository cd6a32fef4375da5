"""Mixture-of-experts models against llama.cpp: synthetic slices of the MoE
models people run on CPUs, pp512 and tg128 at 2 threads, one table.

No MoE model of a useful size can be downloaded here, so each slice is
written with llama.cpp's ``gguf`` package: the real model's widths, expert
count, active experts and vocabulary, with a few of its layers, random but
valid weights laid out as llama.cpp's quantizer lays them out, and
SmolLM2-135M's tokenizer padded to the vocabulary. Random weights route
tokens to random experts, which is what a real model's prefill looks like
to the kernels (every expert busy) and to decode (eight matrices of 128
per layer read per token).

- ``qwen3moe``: Qwen3-30B-A3B's shape: width 2048, 32 heads of 128 (4 KV
  heads), q/k norms, 128 experts with 8 active, expert FFN 768,
  vocabulary 151,936, 4 layers; Q4_K_M's types (Q4_K, Q6_K for the output
  matrix and for attn_v / ffn_down_exps on the layers llama.cpp gives more
  bits).

Each slice is timed by ``bench_vs_llamacpp.py`` exactly as the real models
are: each engine in a fresh process, warmed with a full prefill and a full
decode, alternating, medians of ``--reps``. The table also gives the bytes
one decode step reads when it reads only the routed experts, and that
figure over the machine's read bandwidth (``bench_bandwidth.py``'s
measure) as the bound on tg. Nothing else may run on the machine
meanwhile.

  python benches/bench_moe.py                 # every slice, --reps 3
  python benches/bench_moe.py --slices qwen3moe --reps 5
  python benches/bench_moe.py --write-only    # just write the files
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _cpu import describe as describe_cpu
from bench_bandwidth import DEFAULT, QK_K, _more_bits, _q4_k, _q6_k, read_bandwidth

HERE = Path(__file__).resolve().parent
RATIO = re.compile(r"threads=\d+: pp ([\d.]+)x\s+tg ([\d.]+)x")
ROW = re.compile(r"^\s+\d+\s+(oxillama|llama\.cpp)\s+([\d.]+)\s+([\d.]+)", re.M)


@dataclass(frozen=True)
class MoeShape:
    name: str
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_vocab: int
    rope_base: float


SLICES = {
    "qwen3moe": MoeShape(
        "Qwen3-30B-A3B, 4-layer slice", "qwen3moe", 4, 2048, 32, 4, 128, 128, 8, 768, 151936, 1e6
    ),
}


def path_for(slice_name: str) -> Path:
    return DEFAULT.with_name(f"synthetic-{slice_name}-slice-q4_k_m.gguf")


def _experts(rng: np.random.Generator, six: bool, n: int, rows: int, cols: int) -> np.ndarray:
    """n experts' matrices (rows x cols each) stacked, as one 3-D tensor's
    bytes (numpy shape n, rows, row bytes)."""
    make = _q6_k if six else _q4_k
    return np.stack([make(rng, rows, cols) for _ in range(n)])


def write_slice(path: Path, s: MoeShape) -> None:
    import gguf

    sys.path.insert(0, str(HERE.parent))
    from tests._gguf_meta import read_metadata, smollm2_path

    meta = read_metadata(smollm2_path())
    rng = np.random.default_rng(0)
    q4, q6 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), s.arch)
    w.add_name(f"synthetic {s.name}, Q4_K_M layout, random weights")
    w.add_context_length(8192)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff_exp * 8)
    w.add_expert_feed_forward_length(s.n_ff_exp)
    w.add_expert_count(s.n_expert)
    w.add_expert_used_count(s.n_expert_used)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(s.n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in meta.items():
        if not key.startswith("tokenizer.") or key == "tokenizer.chat_template":
            continue
        if key == "tokenizer.ggml.model":
            w.add_tokenizer_model(value)
        elif key == "tokenizer.ggml.pre":
            w.add_tokenizer_pre(value)
        elif key == "tokenizer.ggml.tokens":
            pad = s.n_vocab - len(value)
            w.add_token_list(list(value) + [f"<|synthetic_{i}|>" for i in range(pad)])
        elif key == "tokenizer.ggml.token_type":
            w.add_token_types(list(value) + [1] * (s.n_vocab - len(value)))
        elif key == "tokenizer.ggml.merges":
            w.add_token_merges(value)
        elif key.endswith("_token_id"):
            w.add_uint32(key, int(value))
        elif isinstance(value, bool):
            w.add_bool(key, value)
    ones = np.ones(s.n_embd, dtype=np.float32)
    w.add_tensor("token_embd.weight", _q4_k(rng, s.n_vocab, s.n_embd), raw_dtype=q4)
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", _q6_k(rng, s.n_vocab, s.n_embd), raw_dtype=q6)
    q_rows, kv_rows = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    for i in range(s.n_layer):
        more = _more_bits(i, s.n_layer)
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(s.head_dim, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(s.head_dim, dtype=np.float32))
        for name, rows, cols, six in (
            ("attn_q", q_rows, s.n_embd, False),
            ("attn_k", kv_rows, s.n_embd, False),
            ("attn_v", kv_rows, s.n_embd, more),
            ("attn_output", s.n_embd, q_rows, False),
        ):
            data = _q6_k(rng, rows, cols) if six else _q4_k(rng, rows, cols)
            w.add_tensor(f"blk.{i}.{name}.weight", data, raw_dtype=q6 if six else q4)
        router = rng.normal(0, 0.02, size=(s.n_expert, s.n_embd)).astype(np.float32)
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", router)
        for name, rows, cols, six in (
            ("ffn_gate_exps", s.n_ff_exp, s.n_embd, False),
            ("ffn_up_exps", s.n_ff_exp, s.n_embd, False),
            ("ffn_down_exps", s.n_embd, s.n_ff_exp, more),
        ):
            data = _experts(rng, six, s.n_expert, rows, cols)
            w.add_tensor(f"blk.{i}.{name}.weight", data, raw_dtype=q6 if six else q4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()
    os.replace(tmp, path)


def active_bytes(s: MoeShape) -> int:
    """Bytes one decode step reads when only the routed experts are read:
    the attention matrices, the router, n_expert_used experts' three
    matrices per layer, one embedding row and the output matrix."""
    q4 = 144 / QK_K
    q6 = 210 / QK_K
    total = 0.0
    q_rows, kv_rows = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    for i in range(s.n_layer):
        v = q6 if _more_bits(i, s.n_layer) else q4
        total += s.n_embd * (q_rows * q4 + kv_rows * q4 + kv_rows * v) + q_rows * s.n_embd * q4
        total += s.n_expert * s.n_embd * 4  # the f32 router
        down = q6 if _more_bits(i, s.n_layer) else q4
        total += s.n_expert_used * s.n_ff_exp * s.n_embd * (2 * q4 + down)
    total += s.n_embd * q4 + s.n_vocab * s.n_embd * q6
    return int(total)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--slices", default=",".join(SLICES), help="comma list (default: all)")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--write-only", action="store_true", help="write the files and stop")
    a = ap.parse_args()
    names = a.slices.split(",")
    for name in names:
        p = path_for(name)
        if not p.exists():
            print(f"writing {p}", flush=True)
            p.parent.mkdir(parents=True, exist_ok=True)
            write_slice(p, SLICES[name])
        if a.write_only:
            print(p)
    if a.write_only:
        return
    print(f"cpu: {describe_cpu()}")
    bw = read_bandwidth(int(a.threads))
    print(f"read bandwidth, {a.threads} threads: {bw:.1f} GB/s")
    table = []
    for name in names:
        s = SLICES[name]
        out = subprocess.run(
            [
                sys.executable,
                str(HERE / "bench_vs_llamacpp.py"),
                *("--model", str(path_for(name)), "--threads", a.threads),
                *("--reps", str(a.reps), "--pp", str(a.pp), "--tg", str(a.tg), "--inner", "1"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"== {name}\n{out.stdout}", flush=True)
        rows = {m[1]: (float(m[2]), float(m[3])) for m in ROW.finditer(out.stdout)}
        ratio = RATIO.search(out.stdout)
        assert ratio is not None and len(rows) == 2, out.stdout
        table.append((s, rows["oxillama"], rows["llama.cpp"], ratio.groups()))
    print(f"\n{a.threads} threads, medians of {a.reps} (tok/s)\n")
    pp, tg = f"pp{a.pp}", f"tg{a.tg}"
    print(
        f"| slice | {pp} ours | {pp} llama.cpp | ratio | {tg} ours | {tg} llama.cpp | ratio "
        "| MB read / token | tg bound |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s, ours, theirs, (rp, rt) in table:
        b = active_bytes(s)
        print(
            f"| {s.name} | {ours[0]:.1f} | {theirs[0]:.1f} | {rp}x | {ours[1]:.1f} "
            f"| {theirs[1]:.1f} | {rt}x | {b / 1e6:.0f} | {bw * 1e9 / b:.0f} |"
        )


if __name__ == "__main__":
    main()
