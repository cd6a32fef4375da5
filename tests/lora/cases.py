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

#: Prompt for the llama fixture (vocabulary of 304).
FIXTURE_TOKENS = [1, 17, 88, 203, 45, 12, 260, 301, 7, 99, 150, 3]
#: Every projection, the separate embedding and output head of the fixture.
FIXTURE_TARGETS = [f"blk.{il}.{p}.weight" for il in range(64) for p in adapters.SEVEN] + [
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
    """Rank 4 on every target of a tests/models fixture (those it has)."""
    arch, shapes = adapters.base_shapes(base)
    names = [n for n in FIXTURE_TARGETS if n in shapes]
    if arch == "phi3":
        names = [
            f"blk.{il}.{p}.weight"
            for il in range(64)
            for p in ("attn_qkv", "attn_output", "ffn_up", "ffn_down")
            if f"blk.{il}.{p}.weight" in shapes
        ]
    ab = {}
    for name, (a, b) in adapters.pairs(
        shapes, [n for n in names if n != "token_embd.weight"], rank=4, seed=seed, b_std=0.05
    ).items():
        ab[name] = (a, b)
    if "token_embd.weight" in names:
        # llama.cpp's flipped layout: lora_a [rank, n_vocab], lora_b [rank, n_embd].
        import numpy as np

        rng = np.random.default_rng(seed + 100)
        n_vocab, n_embd = shapes["token_embd.weight"]
        a = rng.standard_normal((n_vocab, 4)).astype(np.float32) * 0.5
        b = rng.standard_normal((n_embd, 4)).astype(np.float32) * 0.1
        ab["token_embd.weight"] = (a, b)
    return adapters.write(dst, arch, ab, alpha=8.0, dtype=dtype)
