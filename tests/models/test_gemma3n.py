"""gemma3n (rust/model/arch/gemma3n.rs) against llama.cpp: AltUp's four
streams (router, predict, correct), LAuReL, per-layer embeddings, the
Gaussian top-k FFN gate on layers 0-9, q/k norms and the weightless v norm,
sliding and global layers, and layers 20-21 reading layers 18's and 19's KV
cache."""

from __future__ import annotations

from tests.models._suite import ArchitectureSuite


class TestGemma3n(ArchitectureSuite):
    names = ("gemma3n",)
