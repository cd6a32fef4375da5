"""gemma3n (rust/model/arch/gemma3n.rs) against llama.cpp: AltUp's four
streams (router, predict, correct), LAuReL, per-layer embeddings, the
Gaussian top-k FFN gate on layers 0-9, q/k norms and the weightless v norm,
sliding and global layers, and layers 20-21 reading layers 18's and 19's KV
cache. Beside the common suite: the cache holds the first 20 layers only
(and a snapshot says so), a quantized rotated cache round-trips, an
AsyncSession snapshotted with other requests in flight continues in
another process, a server session keeps its rows between turns, rejected
drafts roll the cache back, and keys whose values llama.cpp does not run
are refused by name."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from oxillama import AsyncEngine, Engine, Model, SpeculativeEngine, _native
from oxillama.errors import LoadError, LoraError
from oxillama.serving.http import build_app
from oxillama.sessions import format as fmt
from tests.lora import adapters
from tests.models import _checks as c
from tests.models._archs import GEMMA3N_LAYERS, GEMMA3N_SPARSE_LAYERS, GEMMA3N_STD_MUL
from tests.models._rewrite import rewrite
from tests.models._suite import ArchitectureSuite

KV_LAYERS = 20  # llama.cpp's n_layer_kv_from_start for gemma3n

_CONTINUE = """
import json, sys
from oxillama import Engine
e = Engine.restore(sys.argv[1])
print(json.dumps([e.tokens, e.generate("", int(sys.argv[2]), ignore_eos=True).tokens]))
"""


class TestGemma3n(ArchitectureSuite):
    names = ("gemma3n",)


REF = "gemma3n"


def test_the_cache_holds_only_the_layers_that_keep_keys_and_values() -> None:
    ref = c.reference(REF)
    model = Model(ref.path)
    cfg = model.config
    assert cfg["n_layer"] == GEMMA3N_LAYERS
    assert cfg["kv_layers"] == KV_LAYERS
    kv = _native.Session(model.native, ref.n_ctx, c.THREADS, "f32")
    kv.eval(np.asarray(ref.tokens[:10], dtype=np.uint32), False)
    per_position = KV_LAYERS * cfg["n_head_kv"] * (cfg["dim_k"] + cfg["dim_v"]) * 4
    assert kv.export_kv_len() == 10 * per_position
    e = c.engine(ref.path, ref)
    e.generate(ref.greedy_prompt, 4, ignore_eos=True)
    assert _snapshot_meta(e.snapshot_bytes())["kv_layout"]["kv_layers"] == KV_LAYERS


def _snapshot_meta(blob: bytes) -> dict[str, Any]:
    """The JSON of an OXISNAP1 snapshot's ``meta`` section (tag 1)."""
    view = memoryview(blob)
    fmt.read_header(view)
    meta = dict(fmt._sections(view[fmt.HEADER.size :]))[1]
    doc: dict[str, Any] = json.loads(bytes(meta))
    return doc


def test_a_quantized_rotated_cache_round_trips() -> None:
    """q8_0 rows, Hadamard-rotated: the sharing layers rotate their queries
    as the rows they read were rotated."""
    ref = c.reference(REF)
    e = c.engine(ref.path, ref, kv_dtype="q8_0")
    e.generate(ref.greedy_prompt, 8, ignore_eos=True)
    back = Engine.restore_bytes(e.snapshot_bytes())
    want = e.generate("", 12, ignore_eos=True).tokens
    assert back.generate("", 12, ignore_eos=True).tokens == want


def test_async_session_snapshot_with_requests_in_flight_continues_elsewhere(
    tmp_path: Path,
) -> None:
    ref = c.reference(REF)
    before, after = 8, 12
    whole = c.engine(ref.path, ref).generate(ref.greedy_prompt, before + after, ignore_eos=True)
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
    assert first == whole.tokens[:before]
    path = tmp_path / "gemma3n-async.oxisnap"
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
    assert rest == whole.tokens[before:]


def test_a_server_session_continues_as_an_engine_does() -> None:
    ref = c.reference(REF)
    turns = ["the quick brown fox", " and then"]
    lone = c.engine(ref.path, ref)
    want = [lone.generate(t, 8, ignore_eos=True).text for t in turns]
    ae = AsyncEngine(ref.path, context_size=ref.n_ctx, threads=c.THREADS, max_batch=2)
    try:
        with TestClient(build_app(ae)) as client:
            got = []
            for t in turns:
                body = {"prompt": t, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
                r = client.post("/v1/completions", json={**body, "session": "s"})
                assert r.status_code == 200, r.text
                got.append(r.json()["choices"][0]["text"])
    finally:
        asyncio.run(ae.close())
    assert got == want


def test_rejected_drafts_roll_the_cache_back() -> None:
    """The llama fixture (same vocabulary) drafts for gemma3n: what it gets
    wrong is dropped from the 20 cached layers, which the sharing layers
    then read."""
    ref, llama = c.reference(REF), c.reference("llama")
    spec = SpeculativeEngine(
        c.engine(ref.path, ref), c.engine(llama.path, llama), num_speculative=4
    )
    got = spec.generate(ref.greedy_prompt, 24, sampler=c.GREEDY, ignore_eos=True).tokens
    lone = c.engine(ref.path, ref).generate(ref.greedy_prompt, 24, ignore_eos=True)
    assert got == lone.tokens
    assert spec.stats.rejected > 0, spec.stats


SPARSITY = [GEMMA3N_STD_MUL] * GEMMA3N_SPARSE_LAYERS + [-math.inf] * (
    GEMMA3N_LAYERS - GEMMA3N_SPARSE_LAYERS
)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("gemma3n.attention.shared_kv_layers", 5),
        ("gemma3n.altup.num_inputs", 2),
        ("gemma3n.altup.active_idx", 1),
        ("gemma3n.embedding_length_per_layer_input", 128),
        ("gemma3n.final_logit_softcapping", 20.0),
        ("gemma3n.activation_sparsity_scale", [*SPARSITY[:-1], GEMMA3N_STD_MUL]),
        ("gemma3n.activation_sparsity_scale", [1.0, *SPARSITY[1:]]),
        # One width per layer is read only when they agree; a width of 1
        # leaves the Gaussian top-k no standard deviation.
        ("gemma3n.feed_forward_length", [256] * (GEMMA3N_LAYERS - 1) + [128]),
        ("gemma3n.feed_forward_length", [1] * GEMMA3N_LAYERS),
    ],
)
def test_keys_llama_cpp_does_not_run_are_refused_by_name(
    key: str, value: Any, tmp_path: Path
) -> None:
    """llama.cpp fixes these in its code; a file saying otherwise could not
    run as its metadata describes."""
    ref = c.reference(REF)
    dst = tmp_path / "changed.gguf"
    rewrite(ref.path, dst, values={key: value})
    with pytest.raises(LoadError, match=key.replace(".", r"\.")):
        Model(dst)


def test_lora_on_a_sharing_layers_keys_is_refused_and_elsewhere_applies(tmp_path: Path) -> None:
    """Layers 20-21 never multiply by their own attn_k / attn_v: an adapter
    for them is refused by name rather than dropped; one on layer 20's
    queries and layer 19's keys (which layer 21 reads) moves the logits."""
    ref = c.reference(REF)
    arch, shapes = adapters.base_shapes(ref.path)
    e = c.engine(ref.path, ref, kv_dtype="f32")
    base = np.asarray(e.eval(ref.tokens[:24], all_logits=True))
    for name in ("blk.20.attn_k.weight", "blk.21.attn_v.weight"):
        dst = tmp_path / "shared.gguf"
        ab = adapters.pairs(shapes, [name], rank=4, seed=3, b_std=0.5)
        adapters.write(dst, arch, ab, alpha=4.0)
        with pytest.raises(LoraError, match=name.replace(".", "[.]")):
            e.load_lora(dst)
    dst = tmp_path / "own.gguf"
    names = ["blk.20.attn_q.weight", "blk.19.attn_k.weight"]
    adapters.write(dst, arch, adapters.pairs(shapes, names, rank=4, seed=3, b_std=0.5), alpha=4.0)
    e.load_lora(dst)
    e.reset()
    moved = np.asarray(e.eval(ref.tokens[:24], all_logits=True))
    assert np.abs(moved - base).max() > 0.1


def test_a_transposed_altup_coefficient_matrix_is_refused(tmp_path: Path) -> None:
    """[16, 4] holds as many values as llama.cpp's [4, 16], in another
    layout: refused naming the tensor, not read."""
    ref = c.reference(REF)
    name = "blk.3.altup_predict_coef.weight"
    dst = tmp_path / "transposed.gguf"
    rewrite(ref.path, dst, tensors={name: np.zeros((4, 16), dtype=np.float32)})
    with pytest.raises(LoadError, match=name.replace(".", r"\.")):
        Model(dst)
