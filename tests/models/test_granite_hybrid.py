"""granitehybrid (rust/model/arch/granite_hybrid.rs), Granite-4.0-H:
Mamba-2 and attention layers with Granite's multipliers, one fixture with
routed and shared experts and NoPE, one with dense MLPs and RoPE. The
common and the hybrid checks against llama.cpp (``_hybrid.HybridSuite``),
then what the loader refuses by name."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from oxillama import Model, _native
from oxillama.errors import LoadError
from tests.models import _checks as c
from tests.models._archs import (
    GH_D_CONV,
    GH_D_INNER,
    GH_D_STATE,
    GH_KV_HEADS,
    GH_N_GROUP,
    N_EMBD,
)
from tests.models._hybrid import HybridSuite
from tests.models._rewrite import rewrite


class TestGraniteHybrid(HybridSuite):
    names = ("granitehybrid", "granitehybrid_dense")


def test_the_state_is_mamba2_s_for_each_mamba_layer() -> None:
    cfg = Model(c.reference("granitehybrid").path).config
    assert cfg["recurrent_layers"] == [i for i, kv in enumerate(GH_KV_HEADS) if kv == 0]
    conv = (GH_D_CONV - 1) * (GH_D_INNER + 2 * GH_N_GROUP * GH_D_STATE)
    assert cfg["ssm"]["state_bytes"] == (conv + GH_D_INNER * GH_D_STATE) * 4 * GH_KV_HEADS.count(0)


def _set_bool(data: bytearray, key: str, value: int) -> None:
    raw = key.encode()
    at = data.find(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)
    assert struct.unpack_from("<I", data, at) == (7,)  # a GGUF bool: one byte
    data[at + 4] = value


def _logits(data: bytes, tokens: list[int]) -> np.ndarray:
    m = _native.Model(_native.GgufFile.from_bytes(data))
    kv = _native.Session(m, 32, c.THREADS, "f32")
    return kv.eval(np.asarray(tokens, dtype=np.uint32), False)


def test_rope_finetuned_false_is_nope() -> None:
    """The MoE fixture is NoPE (rope.scaling.finetuned false, as
    Granite-4.0-H ships, and llama.cpp's logits are of it); the flag
    turned on rotates q and k, which changes the logits."""
    ref = c.reference("granitehybrid")
    data = bytearray(ref.path.read_bytes())
    nope = _logits(bytes(data), ref.tokens[:12])
    _set_bool(data, "granitehybrid.rope.scaling.finetuned", 1)
    assert not np.array_equal(_logits(bytes(data), ref.tokens[:12]), nope)


@pytest.mark.parametrize("name", ["ffn_gate", "ffn_up", "ffn_down"])
def test_dense_mlp_biases_are_refused_by_name(tmp_path: Path, name: str) -> None:
    """llama.cpp reads optional MLP biases in a dense granitehybrid; we do
    not run them, and say so rather than drop them."""
    ref = c.reference("granitehybrid_dense")
    n = 128 if name != "ffn_down" else N_EMBD
    dst = tmp_path / "biased.gguf"
    rewrite(ref.path, dst, extra={f"blk.1.{name}.bias": np.zeros(n)})
    with pytest.raises(LoadError, match=rf"blk\.1\.{name}\.bias \(an MLP bias\) is not supported"):
        _native.Model(_native.GgufFile.from_bytes(dst.read_bytes()))
