"""lfm2 and lfm2moe (rust/model/arch/lfm2.rs), hybrids of short
convolutions and attention: the common and the hybrid checks against
llama.cpp (``_hybrid.HybridSuite``), then LFM2's own: the size of its
convolution state, each layer's kind picked by its KV head count, and the
expert gating functions LFM2-MoE may name."""

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
    names = ("lfm2", "lfm2_swa", "lfm2moe")


@pytest.fixture(scope="module")
def ref() -> c.Reference:
    return c.reference("lfm2")


def test_the_state_is_the_last_inputs_of_each_conv_layer(ref: c.Reference) -> None:
    cfg = Model(ref.path).config
    assert cfg["recurrent_layers"] == [i for i, kv in enumerate(LFM2_KV_HEADS) if kv == 0]
    # l_cache - 1 inputs of every channel, f32, for the convolution layers
    # only (the attention layer keeps none).
    assert cfg["ssm"]["state_bytes"] == (LFM2_L_CACHE - 1) * N_EMBD * 4 * LFM2_KV_HEADS.count(0)
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


def _with_u32(path: Path, key: str, value: int) -> bytes:
    data = bytearray(path.read_bytes())
    raw = key.encode()
    at = data.find(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)
    assert struct.unpack_from("<I", data, at) == (4,)  # uint32
    struct.pack_into("<I", data, at + 4, value)
    return bytes(data)


@pytest.mark.parametrize("func", [0, 3, 4])
def test_lfm2moe_refuses_a_gating_function_it_does_not_run(func: int) -> None:
    """llama.cpp's softmax (1) and sigmoid (2) run; the softmax of the
    chosen weights (3), sqrt-softplus (4) and unknown values are refused
    naming the value."""
    path = c.reference("lfm2moe").path
    data = _with_u32(path, "lfm2moe.expert_gating_func", func)
    with pytest.raises(LoadError, match=rf"expert_gating_func {func} is not supported"):
        _native.Model(_native.GgufFile.from_bytes(data))


def test_lfm2moe_routes_by_its_gating_function() -> None:
    """The fixture's sigmoid scores, read as a softmax instead, choose and
    weight the experts otherwise: the key is read, not assumed."""
    ref = c.reference("lfm2moe")
    toks = np.asarray(ref.tokens[:16], dtype=np.uint32)

    def logits(data: bytes) -> np.ndarray:
        kv = _native.Session(_native.Model(_native.GgufFile.from_bytes(data)), 32, c.THREADS)
        return kv.eval(toks, True)

    sigmoid = logits(ref.path.read_bytes())
    softmax = logits(_with_u32(ref.path, "lfm2moe.expert_gating_func", 1))
    assert not np.array_equal(sigmoid, softmax)
