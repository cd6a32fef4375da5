"""The i-quants, the ternary types and MXFP4 in whole models, against
llama.cpp: one llama per type with every matrix in it (token embedding and
output included), and the qwen3moe layout with MXFP4 experts, as gpt-oss
ships them. Every architecture check runs on each (the quantized logits
held to the same bounds), plus the kernels' own: with an F32 KV cache our
logits equal llama.cpp's to 1e-4 until an activation rounds the other way."""

from __future__ import annotations

from tests.models import _checks as c
from tests.models._archs import TYPE_FIXTURES
from tests.models._suite import ArchitectureSuite


class TestQuantTypes(ArchitectureSuite):
    names = tuple(TYPE_FIXTURES)

    def test_kernels_give_llama_cpp_s_logits(self, name: str) -> None:
        c.check_kernels_exact(c.reference(name))
