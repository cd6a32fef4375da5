"""phi3 (rust/model/arch/phi3.rs) against llama.cpp: fused qkv and gate|up,
partial rotary, and LongRoPE, with the short factors at n_ctx 256 (the
original context) and the long ones at n_ctx 512."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oxillama import _native
from oxillama.errors import LoadError
from tests.models import _checks as c
from tests.models._rewrite import rewrite
from tests.models._suite import ArchitectureSuite


class TestPhi3(ArchitectureSuite):
    names = ("phi3", "phi3_long")


@pytest.mark.parametrize("name", ["attn_q", "attn_k", "attn_v"])
def test_separate_biases_beside_a_fused_qkv_are_refused_by_name(tmp_path: Path, name: str) -> None:
    """llama.cpp adds separate q/k/v biases after a fused qkv product; we
    read only a fused bias, and say so rather than drop them."""
    dst = tmp_path / "biased.gguf"
    rewrite(c.reference("phi3").path, dst, extra={f"blk.0.{name}.bias": np.zeros(128)})
    with pytest.raises(LoadError, match=rf"blk\.0\.{name}\.bias beside a fused attn_qkv"):
        _native.Model(_native.GgufFile.from_bytes(dst.read_bytes()))
