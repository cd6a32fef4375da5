"""jamba (rust/model/arch/jamba.rs): Mamba-1 layers (rust/model/blocks/mamba1.rs)
and attention layers without RoPE, dense and routed MLPs; a second fixture
with a fused, biased ``attn_qkv`` and the embedding as the head. The common
and the hybrid checks against llama.cpp (``_hybrid.HybridSuite``), then the
state's shape and what the loader refuses."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from oxillama import Model, _native
from oxillama.errors import LoadError
from tests.models import _checks as c
from tests.models._archs import JAMBA_D_CONV, JAMBA_D_INNER, JAMBA_D_STATE, JAMBA_KV_HEADS
from tests.models._hybrid import HybridSuite


class TestJamba(HybridSuite):
    names = ("jamba", "jamba_fused")


def test_the_state_is_mamba1_s() -> None:
    """Mamba-1 convolves x alone (no B and C in its convolution state) and
    keeps one SSM state row per channel."""
    cfg = Model(c.reference("jamba").path).config
    assert cfg["recurrent_layers"] == [i for i, kv in enumerate(JAMBA_KV_HEADS) if kv == 0]
    per_layer = (JAMBA_D_CONV - 1) * JAMBA_D_INNER + JAMBA_D_INNER * JAMBA_D_STATE
    assert cfg["ssm"]["state_bytes"] == per_layer * 4 * JAMBA_KV_HEADS.count(0)


def test_a_router_without_an_expert_count_is_refused_by_name() -> None:
    """llama.cpp tells a MoE layer by its router tensor; one whose file
    says it has no experts is refused naming both, not run as dense."""
    data = bytearray(c.reference("jamba").path.read_bytes())
    raw = b"jamba.expert_count"
    at = data.find(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)
    assert struct.unpack_from("<II", data, at) == (4, 4)  # a GGUF u32: 4 experts
    struct.pack_into("<I", data, at + 4, 0)
    with pytest.raises(
        LoadError, match=r"blk\.1\.ffn_gate_inp\.weight routes to experts, .*jamba\.expert_count"
    ):
        _native.Model(_native.GgufFile.from_bytes(bytes(data)))


def test_the_scan_split_over_threads_gives_the_serial_scan_s_bits() -> None:
    """A 64-token prefill has enough channels times states to split the
    Mamba-1 scan over the pool (by channel, every row in order per block);
    one thread scans serially. The logits are the same bits."""
    ref = c.reference("jamba")
    m = Model(ref.path).native
    toks = np.asarray(ref.tokens, dtype=np.uint32)
    serial = _native.Session(m, ref.n_ctx, 1, "f32").eval(toks, True)
    for threads in (2, 3):
        split = _native.Session(m, ref.n_ctx, threads, "f32").eval(toks, True)
        assert np.array_equal(split, serial), threads
