"""deepseek2 (rust/model/arch/deepseek2.rs, rust/model/blocks/mla.rs):
DeepSeek-V2 / Moonlight with the query's low rank and V2-Lite without,
against llama.cpp; then what MLA caches: the normed latent and the rotated
key part, ``kv_lora_rank + rope`` values per token and layer, not full
per-head keys and values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oxillama import Engine, _native
from oxillama.errors import LoadError, OxiLlamaError
from oxillama.model.summary import summarize
from tests.models import _checks as c
from tests.models._suite import ArchitectureSuite


class TestDeepseek2(ArchitectureSuite):
    names = ("deepseek2", "deepseek2_lite")


# The fixtures' MLA widths (tests/models/_archs.py): latent, rope dims,
# nope part of each query, value width per head, heads, layers.
LATENT, ROPE, NOPE, V, HEADS, LAYERS = 64, 32, 32, 32, 4, 3


@pytest.fixture(scope="module")
def ref() -> c.Reference:
    return c.reference("deepseek2")


def test_the_cache_holds_the_latent_and_the_rope_part_per_token(ref: c.Reference) -> None:
    """A session's KV bytes per token are ``n_layer x (kv_lora_rank +
    rope) x 2`` in f16 (x 4 in f32): one row per token and layer, not the
    per-head keys and values that expanding through k_b / v_b would give."""
    m = _native.Model(_native.GgufFile.open(str(ref.path)))
    cfg = m.config()
    assert (cfg["n_head_kv"], cfg["dim_k"], cfg["dim_v"]) == (1, LATENT + ROPE, 0)
    assert (cfg["kv_v_in_k"], cfg["kv_value_width"]) == (True, LATENT)
    toks = np.asarray(ref.tokens[:21], dtype=np.uint32)
    expanded = LAYERS * HEADS * (NOPE + ROPE + V)
    for kv_dtype, unit in (("f16", 2), ("f32", 4)):
        s = _native.Session(m, 64, c.THREADS, kv_dtype)
        s.eval(toks, False)
        per_token = len(s.export_kv()) / len(toks)
        assert per_token == LAYERS * (LATENT + ROPE) * unit
        assert per_token < expanded * unit
    assert summarize(str(ref.path)).kv_values_per_token() == (
        LAYERS * (LATENT + ROPE),
        f"{LAYERS} layers x (kv_lora_rank {LATENT} + rope {ROPE})",
    )


def test_a_quantized_latent_cache_is_refused_by_name(ref: c.Reference) -> None:
    m = _native.Model(_native.GgufFile.open(str(ref.path)))
    for kv_dtype in ("q8_0", "q4_0", "f16/f32"):
        with pytest.raises(OxiLlamaError, match="latent \\(MLA\\) cache"):
            _native.Session(m, 64, c.THREADS, kv_dtype)


def _renamed(path: Path, old: bytes, new: bytes) -> bytes:
    """The fixture with every occurrence of a (same-length) name replaced."""
    assert len(old) == len(new)
    data = path.read_bytes()
    assert old in data
    return data.replace(old, new)


def test_the_pre_split_kv_b_layout_is_refused_by_name(ref: c.Reference) -> None:
    """Files converted before llama.cpp split attn_kv_b carry no
    key_length_mla; they are refused naming what is missing."""
    data = _renamed(ref.path, b"attention.key_length_mla", b"attention.key_length_xyz")
    with pytest.raises(LoadError, match="key_length_mla is missing"):
        _native.Model(_native.GgufFile.from_bytes(data))


def test_a_context_shift_keeps_the_latent_and_rotates_only_the_rope_part(
    ref: c.Reference,
) -> None:
    """After a shift the latent of every kept row is unchanged and only its
    last ``rope`` values move (rotated for the new position)."""
    m = _native.Model(_native.GgufFile.open(str(ref.path)))
    s = _native.Session(m, 64, c.THREADS, "f32")
    toks = np.asarray(ref.tokens[:40], dtype=np.uint32)
    s.eval(toks, False)
    row = LATENT + ROPE
    before = np.frombuffer(s.export_kv(), dtype=np.float32).reshape(LAYERS, 40, row)
    keep, discard = 4, 10
    s.shift(keep, discard)
    after = np.frombuffer(s.export_kv(), dtype=np.float32).reshape(LAYERS, 30, row)
    moved = before[:, keep + discard :]
    np.testing.assert_array_equal(after[:, :keep], before[:, :keep])
    np.testing.assert_array_equal(after[:, keep:, :LATENT], moved[:, :, :LATENT])
    assert not np.allclose(after[:, keep:, LATENT:], moved[:, :, LATENT:])

    # A rotation: each pair of rope values keeps its length.
    def pairs(x: np.ndarray) -> np.ndarray:
        lengths: np.ndarray = np.hypot(x[..., LATENT::2], x[..., LATENT + 1 :: 2])
        return lengths

    np.testing.assert_allclose(pairs(after[:, keep:]), pairs(moved), rtol=1e-5)


def test_a_snapshot_converts_to_f32_and_refuses_a_quantized_latent(ref: c.Reference) -> None:
    """An f16 snapshot's latent rows restore into an f32 cache (row by row,
    keys only: there are no value rows), and into a quantized one they are
    refused naming the type."""
    e = c.engine(ref.path, ref)
    e.generate(ref.greedy_prompt, 4, ignore_eos=True)
    blob = e.snapshot_bytes()
    f32 = Engine.restore_bytes(blob, kv_dtype="f32")
    assert len(f32.generate([int(ref.greedy_tokens[0])], 3, ignore_eos=True).tokens) == 3
    with pytest.raises(OxiLlamaError, match='"q8_0" is not supported for a latent'):
        Engine.restore_bytes(blob, kv_dtype="q8_0")
