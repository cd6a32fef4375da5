"""lfm2 (rust/model/arch/lfm2.rs), a hybrid of short convolutions and
attention: the common and the hybrid checks against llama.cpp
(``_hybrid.HybridSuite``), then LFM2's own: the size of its convolution
state, and each layer's kind picked by its KV head count."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from oxillama import Model, _native
from oxillama.errors import LoadError
from tests.models import _checks as c
from tests.models._archs import LFM2_KV_HEADS, LFM2_L_CACHE, N_EMBD, N_VOCAB
from tests.models._hybrid import HybridSuite


class TestLfm2(HybridSuite):
    names = ("lfm2",)


@pytest.fixture(scope="module")
def ref() -> c.Reference:
    return c.reference("lfm2")


def test_the_state_is_the_last_inputs_of_each_conv_layer(ref: c.Reference) -> None:
    cfg = Model(ref.path).config
    assert cfg["recurrent_layers"] == [i for i, kv in enumerate(LFM2_KV_HEADS) if kv == 0]
    # l_cache - 1 inputs of every channel, f32, each layer (the attention
    # layer's stays zero: one layout for every layer, as Mamba-2's).
    assert cfg["ssm"]["state_bytes"] == (LFM2_L_CACHE - 1) * N_EMBD * 4 * len(LFM2_KV_HEADS)
    assert (cfg["ssm"]["d_conv"], cfg["ssm"]["d_state"]) == (LFM2_L_CACHE, 0)


def _with_kv_heads(path: Path, heads: tuple[int, ...]) -> bytes:
    """The fixture with its per-layer KV head counts (an int32 array, one
    per layer) overwritten in place."""
    data = bytearray(path.read_bytes())
    key = b"lfm2.attention.head_count_kv"
    at = data.find(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    assert struct.unpack_from("<IIQ", data, at) == (9, 5, len(heads))  # array of int32
    struct.pack_into(f"<{len(heads)}i", data, at + 16, *heads)
    return bytes(data)


@pytest.mark.parametrize(
    ("heads", "error"),
    [
        (LFM2_KV_HEADS, None),
        ((0, 1, 0), r"blk.1.attn_k.weight has shape \[256, 64\], expected \[256, 32\]"),
        # Each layer is the kind its count says: a layer made attention (or
        # convolution) misses that kind's tensors, named.
        ((2, 2, 2), "blk.0.attn_q.weight is missing"),
        ((0, 0, 0), "blk.1.shortconv.in_proj.weight is missing"),
        ((0, 2, 4), "differs between attention layers"),
        ((0, 3, 0), "not a multiple"),
        ((0, -1, 0), "non-negative integers"),
        ((0, 1 << 30, 0), "non-negative integers"),
    ],
)
def test_the_per_layer_kv_heads_pick_each_layer_s_kind(
    ref: c.Reference, heads: tuple[int, ...], error: str | None
) -> None:
    """Any head counts load, each layer the kind its count says, or fail
    with a LoadError naming the problem; a model that loads evaluates."""
    data = _with_kv_heads(ref.path, heads)
    if error is not None:
        with pytest.raises(LoadError, match=error):
            _native.Model(_native.GgufFile.from_bytes(data))
        return
    m = _native.Model(_native.GgufFile.from_bytes(data))
    assert m.config()["recurrent_layers"] == [i for i, h in enumerate(heads) if h == 0]
    assert m.config()["n_head_kv"] == max(heads)
    kv = _native.Session(m, 32, c.THREADS, "f32")
    assert kv.eval(np.asarray(ref.tokens[:5], dtype=np.uint32), False).shape == (N_VOCAB,)
