"""olmo2 (rust/model/arch/olmo2.rs) against llama.cpp: no pre-norms, q/k
RMSNorm over all heads at once, post-attention and post-FFN norms."""

from __future__ import annotations

from tests.models._suite import ArchitectureSuite


class TestOlmo2(ArchitectureSuite):
    names = ("olmo2",)
