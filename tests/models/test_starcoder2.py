"""starcoder2 (rust/model/arch/starcoder2.rs) against llama.cpp: LayerNorm
with bias, a GELU MLP, biases on every projection and the output norm."""

from __future__ import annotations

from tests.models._suite import ArchitectureSuite


class TestStarcoder2(ArchitectureSuite):
    names = ("starcoder2",)
