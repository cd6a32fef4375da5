"""llama, mistral3, granite, qwen2, qwen3 and qwen3moe (rust/model/arch/llama.rs)
against llama.cpp: GQA, Llama-3 rope factors with linear scaling; YaRN with
its betas, log multiplier and the Llama-4 attention temperature; granite's
four multipliers; q/k/v biases; per-head q/k norms; routed experts."""

from __future__ import annotations

from tests.models._suite import ArchitectureSuite


class TestLlamaFamily(ArchitectureSuite):
    names = ("llama", "mistral3", "granite", "qwen2", "qwen3", "qwen3moe")
