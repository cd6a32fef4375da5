"""deepseek2 (rust/model/arch/deepseek2.rs, rust/model/blocks/mla.rs):
DeepSeek-V2 / Moonlight with the query's low rank and V2-Lite without,
against llama.cpp; then what MLA caches: the normed latent and the rotated
key part, ``kv_lora_rank + rope`` values per token and layer, not full
per-head keys and values."""

from __future__ import annotations

from tests.models._suite import ArchitectureSuite


class TestDeepseek2(ArchitectureSuite):
    names = ("deepseek2", "deepseek2_lite")
