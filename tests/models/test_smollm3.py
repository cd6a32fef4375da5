"""smollm3 (rust/model/arch/llama.rs) against llama.cpp: a llama whose every
fourth layer attends without RoPE (NoPE), here layer 3 of 4."""

from __future__ import annotations

from tests.models._suite import ArchitectureSuite


class TestSmolLM3(ArchitectureSuite):
    names = ("smollm3",)
