"""The checks against llama.cpp that every architecture family runs: a
family's test file subclasses :class:`ArchitectureSuite` and lists its
references in ``names`` (conftest.py turns each into a ``name`` parameter)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from tests.models import _checks as c


class ArchitectureSuite:
    names: ClassVar[tuple[str, ...]]

    def test_f32_logits_match_llama_cpp(self, name: str, f32_cache: Path) -> None:
        c.check_f32_logits(c.reference(name), f32_cache)

    def test_quantized_logits_match_llama_cpp(self, name: str) -> None:
        c.check_quantized_logits(c.reference(name))

    def test_f32_greedy_is_llama_cpp_s(self, name: str, f32_cache: Path) -> None:
        c.check_greedy_f32(c.reference(name), f32_cache)

    def test_quantized_greedy_is_llama_cpp_s(self, name: str) -> None:
        c.check_greedy_quantized(c.reference(name))

    def test_snapshot_continues_exactly_in_a_fresh_process(self, name: str, tmp_path: Path) -> None:
        c.check_snapshot_round_trip(c.reference(name), tmp_path)

    def test_async_engine_matches_a_lone_engine(self, name: str) -> None:
        c.check_async_matches_engine(c.reference(name))
