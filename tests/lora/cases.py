"""The adapters and inputs of the LoRA tests, shared by the tests and by
``make_reference.py`` (which records llama.cpp's logits for them)."""

from __future__ import annotations

from pathlib import Path

from . import adapters

#: Teacher-forced prompt for SmolLM2 (token ids, BOS first).
SMOL_TOKENS = [1, 504, 3458, 282, 4649, 314, 253, 1820, 288, 5248, 30, 216, 504, 1476, 282, 260]
#: Positions whose full logits the reference keeps.
SMOL_POSITIONS = [7, 15]
#: Scales checked against llama.cpp.
SCALES = (1.0, 0.5)

#: The fixture adapter's seed on the tests/models one-type fixtures.
QUANT_BASE_SEED = 31
#: Prompt for the llama fixture (vocabulary of 304).
FIXTURE_TOKENS = [1, 17, 88, 203, 45, 12, 260, 301, 7, 99, 150, 3]
#: What an adapter may target in a fixture: every projection, Mamba-2's
#: two products and Mamba-1's four, LFM2's short-convolution projections,
#: and the embedding and head when the head is separate.
LAYER_TARGETS = (
    *adapters.SEVEN,
    "attn_qkv",
    "ssm_in",
    "ssm_x",
    "ssm_dt",
    "ssm_out",
    "shortconv.in_proj",
    "shortconv.out_proj",
)
FIXTURE_TARGETS = [f"blk.{il}.{p}.weight" for il in range(64) for p in LAYER_TARGETS] + [
    "token_embd.weight",
    "output.weight",
]


def smol_a(base: Path, dst: Path) -> str:
    """Rank 8, F16, alpha 16, all seven projections of every layer."""
    return adapters.make_smollm2(base, dst, seed=1, rank=8)


def smol_b(base: Path, dst: Path) -> str:
    """A second adapter (rank 16, F32, alpha 0) for stacking."""
    arch, shapes = adapters.base_shapes(base)
    ab = adapters.pairs(shapes, adapters.smollm2_layers(), rank=16, seed=2, b_std=0.01)
    return adapters.write(dst, arch, ab, alpha=None, dtype="f32")


def fixture_adapter(base: Path, dst: Path, *, seed: int = 3, dtype: str = "f32") -> str:
    """Rank 4 on every target a tests/models fixture has (Command-R's head
    is its embedding whatever the file holds, so neither is targeted)."""
    import numpy as np

    arch, shapes = adapters.base_shapes(base)
    names = [n for n in FIXTURE_TARGETS if n in shapes]
    if arch == "command-r" or "output.weight" not in shapes:
        names = [n for n in names if n not in ("token_embd.weight", "output.weight")]
    if arch == "gemma3n":
        # Its layers from 20 on read earlier layers' keys and values and
        # never multiply by their own attn_k / attn_v (refused as targets).
        names = [n for n in names if not _gemma3n_shared_kv(n)]
    ab = dict(
        adapters.pairs(
            shapes, [n for n in names if n != "token_embd.weight"], rank=4, seed=seed, b_std=0.05
        )
    )
    if "token_embd.weight" in names:
        # llama.cpp's flipped layout: lora_a [rank, n_vocab], lora_b [rank, n_embd].
        rng = np.random.default_rng(seed + 100)
        n_vocab, n_embd = shapes["token_embd.weight"]
        a = rng.standard_normal((n_vocab, 4)).astype(np.float32) * 0.5
        b = rng.standard_normal((n_embd, 4)).astype(np.float32) * 0.1
        ab["token_embd.weight"] = (a, b)
    return adapters.write(dst, arch, ab, alpha=8.0, dtype=dtype)


def _gemma3n_shared_kv(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "blk" and int(parts[1]) >= 20 and parts[2] in ("attn_k", "attn_v")
