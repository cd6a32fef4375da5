"""command-r (rust/model/arch/command_r.rs) against llama.cpp: LayerNorm,
attention and FFN in parallel from one norm, logit scale, tied output."""

from __future__ import annotations

from tests.models._suite import ArchitectureSuite


class TestCommandR(ArchitectureSuite):
    names = ("command-r",)
