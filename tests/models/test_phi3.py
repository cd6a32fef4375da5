"""phi3 (rust/model/arch/phi3.rs) against llama.cpp: fused qkv and gate|up,
partial rotary, and LongRoPE, with the short factors at n_ctx 256 (the
original context) and the long ones at n_ctx 512."""

from __future__ import annotations

from tests.models._suite import ArchitectureSuite


class TestPhi3(ArchitectureSuite):
    names = ("phi3", "phi3_long")
