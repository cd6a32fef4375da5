"""lfm2 (rust/model/arch/lfm2.rs), a hybrid: the common checks against
llama.cpp, then what carrying a convolution state beside the KV cache
changes: the cache holds only the attention layer, a snapshot holds both
(taken halfway, from a synchronous engine and from an AsyncSession while
other requests run, restored in another process), forks keep their states
apart, and rollback goes only to kept states."""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from oxillama import AsyncEngine, Engine, Model, _native
from oxillama.errors import LoadError, ParameterError
from tests.models import _checks as c
from tests.models._archs import LFM2_KV_HEADS, LFM2_L_CACHE, N_EMBD, N_VOCAB
from tests.models._suite import ArchitectureSuite


class TestLfm2(ArchitectureSuite):
    names = ("lfm2",)


@pytest.fixture(scope="module")
def ref() -> c.Reference:
    return c.reference("lfm2")


@pytest.fixture(scope="module")
def model(ref: c.Reference) -> Model:
    return Model(ref.path)


def test_the_cache_holds_the_attention_layer_and_the_state_the_conv_layers(
    model: Model, ref: c.Reference
) -> None:
    cfg = model.config
    conv = [i for i, kv in enumerate(LFM2_KV_HEADS) if kv == 0]
    assert (cfg["recurrent"], cfg["hybrid"], cfg["recurrent_layers"]) == (True, True, conv)
    assert cfg["kv_layers"] == len(LFM2_KV_HEADS) - len(conv)
    # The state: the last l_cache - 1 inputs of every channel, each layer.
    state = (LFM2_L_CACHE - 1) * N_EMBD * 4 * len(LFM2_KV_HEADS)
    assert cfg["ssm"]["state_bytes"] == state
    kv = _native.Session(model.native, ref.n_ctx, c.THREADS, "f32")
    kv.eval(np.asarray(ref.tokens[:10], dtype=np.uint32), False)
    n_kv, dim = cfg["n_head_kv"], cfg["dim_k"]
    assert kv.export_kv_len() == 10 * cfg["kv_layers"] * n_kv * 2 * dim * 4 + state


def test_rolling_the_state_back_where_none_was_kept_is_a_typed_error(
    model: Model, ref: c.Reference
) -> None:
    kv = _native.Session(model.native, ref.n_ctx, c.THREADS)
    kv.eval(np.asarray(ref.tokens[:40], dtype=np.uint32), False)
    assert kv.can_truncate(0) and kv.can_truncate(40) and not kv.can_truncate(17)
    with pytest.raises(ParameterError, match=r"recurrent .*keeps its state only at positions"):
        kv.truncate(17)
    assert kv.n_past == 40


def test_generating_after_a_rewind_equals_a_fresh_run(ref: c.Reference) -> None:
    """Truncating to a position with no kept state evaluates again from the
    nearest kept one: both the state and the KV rows are those of a
    session that never went past it."""
    e = c.engine(ref.path, ref)
    e.generate(ref.tokens[:40], 8, ignore_eos=True)
    e.truncate(17)
    rewound = e.generate("", 12, ignore_eos=True).tokens
    more = e.eval(ref.tokens[40:50], all_logits=True)
    fresh = c.engine(ref.path, ref)
    assert fresh.generate(ref.tokens[:17], 12, ignore_eos=True).tokens == rewound
    assert np.array_equal(fresh.eval(ref.tokens[40:50], all_logits=True), more)


def test_forks_keep_their_states_apart(model: Model, ref: c.Reference) -> None:
    """Two forks of one session, fed different tokens, each give the
    logits of a session that only ever saw its own tokens; the parent is
    untouched."""
    toks = np.asarray(ref.tokens, dtype=np.uint32)
    parent = _native.Session(model.native, ref.n_ctx, c.THREADS)
    parent.eval(toks[:20], False)
    a, b = parent.fork(20), parent.fork(20)
    got_a = a.eval(toks[20:30], True)
    got_b = b.eval(toks[40:50], True)
    got_parent = parent.eval(toks[50:55], True)
    for tail, got in ((toks[20:30], got_a), (toks[40:50], got_b), (toks[50:55], got_parent)):
        lone = _native.Session(model.native, ref.n_ctx, c.THREADS)
        lone.eval(toks[:20], False)
        assert np.array_equal(lone.eval(tail, True), got)


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


_CONTINUE = """
import json, sys
from oxillama import Engine
e = Engine.restore(sys.argv[1])
print(json.dumps([e.tokens, e.generate("", int(sys.argv[2]), ignore_eos=True).tokens]))
"""


def test_async_session_snapshot_with_requests_in_flight_continues_in_another_process(
    ref: c.Reference, tmp_path: Path
) -> None:
    """An AsyncSession snapshotted halfway, while three other requests
    decode in the same batches, continues in a fresh process exactly as a
    lone engine does."""
    before, after = 8, 12
    lone = c.engine(ref.path, ref)
    whole = lone.generate(ref.greedy_prompt, before + after, ignore_eos=True).tokens
    others = c.async_prompts(ref)[1:]

    async def run() -> tuple[list[int], bytes]:
        ae = AsyncEngine(
            ref.path, context_size=ref.n_ctx, threads=c.THREADS, max_batch=4, prefill_chunk=8
        )
        try:
            s = ae.session(sampler=c.GREEDY)
            busy = [
                asyncio.ensure_future(ae.generate(p, 40, sampler=c.GREEDY, ignore_eos=True))
                for p in others
            ]
            first = await s.generate(ref.greedy_prompt, before, ignore_eos=True)
            assert not all(t.done() for t in busy)
            snap = await s.snapshot_bytes()
            await asyncio.gather(*busy)
            return first.tokens, snap
        finally:
            await ae.close()

    first, snap = asyncio.run(run())
    assert first == whole[:before]
    path = tmp_path / "lfm2-async.oxisnap"
    path.write_bytes(snap)
    out = subprocess.run(
        [sys.executable, "-c", _CONTINUE, str(path), str(after)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    history, rest = json.loads(out.stdout)
    assert history == ref.greedy_prompt + first
    assert rest == whole[before:]


def test_a_snapshot_converts_its_rows_and_keeps_its_state(ref: c.Reference) -> None:
    """Converting a snapshot's KV type touches only the attention rows; the
    convolution state after them travels as it is. f16 rows widen to f32
    exactly and narrow back exactly, so f16 -> f32 -> f16 continues as the
    original session does."""
    e = c.engine(ref.path, ref)
    e.generate(ref.greedy_prompt, 8, ignore_eos=True)
    snap = e.snapshot_bytes()
    wide = Engine.restore_bytes(snap, kv_dtype="f32")
    wide_snap = wide.snapshot_bytes()
    # Twice the row bytes; the state's bytes are the same.
    assert len(wide_snap) > len(snap)
    back = Engine.restore_bytes(wide_snap, kv_dtype="f16")
    assert back.tokens == e.tokens
    want = e.generate("", 12, ignore_eos=True).tokens
    assert back.generate("", 12, ignore_eos=True).tokens == want
