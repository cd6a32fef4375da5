"""jamba (rust/model/arch/jamba.rs): Mamba-1 layers (rust/model/blocks/mamba1.rs)
and attention layers without RoPE, dense and routed MLPs. The common and
the hybrid checks against llama.cpp (``_hybrid.HybridSuite``), then the
state's shape."""

from __future__ import annotations

from oxillama import Model
from tests.models import _checks as c
from tests.models._archs import JAMBA_D_CONV, JAMBA_D_INNER, JAMBA_D_STATE, JAMBA_KV_HEADS
from tests.models._hybrid import HybridSuite


class TestJamba(HybridSuite):
    names = ("jamba",)


def test_the_state_is_mamba1_s() -> None:
    """Mamba-1 convolves x alone (no B and C in its convolution state) and
    keeps one SSM state row per channel."""
    cfg = Model(c.reference("jamba").path).config
    assert cfg["recurrent_layers"] == [i for i, kv in enumerate(JAMBA_KV_HEADS) if kv == 0]
    per_layer = (JAMBA_D_CONV - 1) * JAMBA_D_INNER + JAMBA_D_INNER * JAMBA_D_STATE
    assert cfg["ssm"]["state_bytes"] == per_layer * 4 * len(JAMBA_KV_HEADS)
