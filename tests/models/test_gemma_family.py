"""gemma, gemma2 and gemma3 (rust/model/arch/gemma.rs) against llama.cpp:
embedding scale, GeGLU through ggml's f16 GELU table, attention and final
softcaps, sliding-window layers with their own rope base, post-norms and
per-head q/k norms."""

from __future__ import annotations

from tests.models._suite import ArchitectureSuite


class TestGemmaFamily(ArchitectureSuite):
    names = ("gemma", "gemma2", "gemma3")
