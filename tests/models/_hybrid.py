"""The checks every hybrid family (a recurrent state beside a KV cache of
its attention layers: LFM2, Granite-4.0-H) runs besides the common ones:
the cache holds only the attention layers, rollback goes only to kept
states, a rewind evaluates again from the nearest one, forks keep their
states apart, a snapshot carries both the rows and the state (from an
AsyncSession with other requests in flight, and through a KV-type
conversion), a server session keeps both between requests, and
speculative decoding rolls both back together."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from oxillama import AsyncEngine, Engine, Model, SpeculativeEngine, _native
from oxillama.errors import ParameterError, SnapshotFormatError
from oxillama.serving.http import build_app
from oxillama.sessions import format as F
from oxillama.sessions import sections as S
from tests.models import _checks as c
from tests.models._suite import ArchitectureSuite

_CONTINUE = """
import json, sys
from oxillama import Engine
e = Engine.restore(sys.argv[1])
print(json.dumps([e.tokens, e.generate("", int(sys.argv[2]), ignore_eos=True).tokens]))
"""


def _every_layer_layout(snap: bytes, cfg: dict[str, Any], fill: float = 0.0) -> bytes:
    """``snap`` rewritten as a snapshot of the layout before the state kept
    only recurrent layers: a slot for every layer, an attention layer's
    filled with ``fill`` (zeros, as that layout had them)."""
    version, secs = F.decode(snap)
    ssm, n_layer, recr = cfg["ssm"], cfg["n_layer"], cfg["recurrent_layers"]
    conv = (ssm["d_conv"] - 1) * (ssm["d_inner"] + 2 * ssm["n_group"] * ssm["d_state"])
    rows = len(secs[S.KV]) - ssm["state_bytes"]
    state = np.frombuffer(secs[S.KV][rows:], dtype="<f4")
    convs = np.full((n_layer, conv), fill, dtype="<f4")
    ssms = np.full((n_layer, ssm["d_inner"] * ssm["d_state"]), fill, dtype="<f4")
    convs[recr] = state[: len(recr) * conv].reshape(len(recr), conv)
    ssms[recr] = state[len(recr) * conv :].reshape(len(recr), -1)
    secs[S.KV] = memoryview(bytes(secs[S.KV][:rows]) + convs.tobytes() + ssms.tobytes())
    meta = S.decode_json(secs[S.META], "meta")
    meta["kv_layout"]["recurrent"]["state_bytes"] = (convs.size + ssms.size) * 4
    secs[S.META] = memoryview(S.encode_json(meta))
    return F.encode([F.Section(t, d) for t, d in secs.items()], version=version)


class HybridSuite(ArchitectureSuite):
    def test_the_cache_holds_only_the_attention_layers(self, name: str) -> None:
        ref = c.reference(name)
        cfg = Model(ref.path).config
        assert cfg["recurrent"] and cfg["hybrid"]
        assert 0 < len(cfg["recurrent_layers"]) < cfg["n_layer"]
        assert cfg["kv_layers"] == cfg["n_layer"] - len(cfg["recurrent_layers"])
        kv = _native.Session(Model(ref.path).native, ref.n_ctx, c.THREADS, "f32")
        kv.eval(np.asarray(ref.tokens[:10], dtype=np.uint32), False)
        rows = 10 * cfg["kv_layers"] * cfg["n_head_kv"] * (cfg["dim_k"] + cfg["dim_v"]) * 4
        assert kv.export_kv_len() == rows + cfg["ssm"]["state_bytes"]

    def test_imported_rows_and_state_continue_exactly_and_bad_data_changes_nothing(
        self, name: str
    ) -> None:
        """A session's export imported into a fresh session continues with
        the same logits; data with a non-finite state value, or of the wrong
        length, is refused before anything changes."""
        ref = c.reference(name)
        m = Model(ref.path).native
        toks = np.asarray(ref.tokens, dtype=np.uint32)
        src = _native.Session(m, ref.n_ctx, c.THREADS)
        src.eval(toks[:20], False)
        data = src.export_kv()
        dst = _native.Session(m, ref.n_ctx, c.THREADS)
        dst.eval(toks[30:35], False)
        bad = bytearray(data)
        bad[-4:] = np.float32(np.nan).tobytes()
        for wrong in (bytes(bad), data[:-4], data + b"\0" * 4):
            with pytest.raises(ParameterError):
                dst.import_kv(20, wrong)
            assert dst.n_past == 5
        lone = _native.Session(m, ref.n_ctx, c.THREADS)
        lone.eval(toks[30:35], False)
        assert np.array_equal(dst.eval(toks[35:40], True), lone.eval(toks[35:40], True))
        dst.import_kv(20, data)
        assert np.array_equal(dst.eval(toks[20:30], True), src.eval(toks[20:30], True))

    def test_a_snapshot_with_a_state_for_every_layer_still_restores_exactly(
        self, name: str
    ) -> None:
        """Snapshots written when every layer kept a state (the attention
        layers' zeros) restore into today's slots and continue as the
        original session does; one whose extra slots hold anything but
        zeros, or whose state is a layer short, is refused by name."""
        ref = c.reference(name)
        e = c.engine(ref.path, ref)
        e.generate(ref.greedy_prompt, 8, ignore_eos=True)
        snap = e.snapshot_bytes()
        cfg = Model(ref.path).config
        old = _every_layer_layout(snap, cfg)
        assert len(old) > len(snap)
        back = Engine.restore_bytes(old)
        want = e.generate("", 12, ignore_eos=True).tokens
        assert back.generate("", 12, ignore_eos=True).tokens == want
        assert back.snapshot_bytes() != old  # written again in today's layout
        version, secs = F.decode(snap)
        layer = cfg["ssm"]["state_bytes"] // len(cfg["recurrent_layers"])
        secs[S.KV] = memoryview(bytes(secs[S.KV][:-layer]))
        for bad in (
            _every_layer_layout(snap, cfg, fill=1.0),
            F.encode([F.Section(t, d) for t, d in secs.items()], version=version),
        ):
            with pytest.raises(SnapshotFormatError, match=r"KV section is \d+ bytes, \d+ expected"):
                Engine.restore_bytes(bad)

    def test_rolling_back_where_no_state_was_kept_is_a_typed_error(self, name: str) -> None:
        ref = c.reference(name)
        kv = _native.Session(Model(ref.path).native, ref.n_ctx, c.THREADS)
        kv.eval(np.asarray(ref.tokens[:40], dtype=np.uint32), False)
        assert kv.can_truncate(0) and kv.can_truncate(40) and not kv.can_truncate(17)
        with pytest.raises(ParameterError, match=r"recurrent .*keeps its state only at positions"):
            kv.truncate(17)
        assert kv.n_past == 40

    def test_generating_after_a_rewind_equals_a_fresh_run(self, name: str) -> None:
        """Truncating to a position with no kept state evaluates again from
        the nearest kept one: the state and the KV rows are both those of a
        session that never went past it."""
        ref = c.reference(name)
        e = c.engine(ref.path, ref)
        e.generate(ref.tokens[:40], 8, ignore_eos=True)
        e.truncate(17)
        rewound = e.generate("", 12, ignore_eos=True).tokens
        more = e.eval(ref.tokens[40:50], all_logits=True)
        fresh = c.engine(ref.path, ref)
        assert fresh.generate(ref.tokens[:17], 12, ignore_eos=True).tokens == rewound
        assert np.array_equal(fresh.eval(ref.tokens[40:50], all_logits=True), more)

    def test_forks_keep_their_states_apart(self, name: str) -> None:
        """Two forks of one session, fed different tokens, each give the
        logits of a session that only ever saw its own tokens; the parent
        is untouched."""
        ref = c.reference(name)
        m = Model(ref.path).native
        toks = np.asarray(ref.tokens, dtype=np.uint32)
        parent = _native.Session(m, ref.n_ctx, c.THREADS)
        parent.eval(toks[:20], False)
        a, b = parent.fork(20), parent.fork(20)
        got = [a.eval(toks[20:30], True), b.eval(toks[40:50], True), parent.eval(toks[50:55], True)]
        for tail, g in zip((toks[20:30], toks[40:50], toks[50:55]), got, strict=True):
            lone = _native.Session(m, ref.n_ctx, c.THREADS)
            lone.eval(toks[:20], False)
            assert np.array_equal(lone.eval(tail, True), g)

    def test_engine_forks_continue_apart_as_copies_would(self, name: str) -> None:
        """Engine.fork shares the KV rows copy on write and copies the
        recurrent state: the original and its fork, given different
        continuations, each give a lone engine's tokens."""
        ref = c.reference(name)
        e = Engine(
            ref.path,
            context_size=ref.n_ctx,
            threads=c.THREADS,
            sampler=c.GREEDY,
            kv_positions=2 * ref.n_ctx,
        )
        e.generate(ref.greedy_prompt, 6, ignore_eos=True)
        f = e.fork()
        a = e.generate(ref.tokens[30:34], 10, ignore_eos=True).tokens
        b = f.generate(ref.tokens[40:44], 10, ignore_eos=True).tokens
        for tail, got in ((ref.tokens[30:34], a), (ref.tokens[40:44], b)):
            lone = c.engine(ref.path, ref)
            lone.generate(ref.greedy_prompt, 6, ignore_eos=True)
            assert lone.generate(tail, 10, ignore_eos=True).tokens == got

    def test_async_session_snapshot_with_requests_in_flight_continues_elsewhere(
        self, name: str, tmp_path: Path
    ) -> None:
        """An AsyncSession snapshotted halfway, while three other requests
        decode in the same batches, continues in a fresh process exactly as
        a lone engine does."""
        ref = c.reference(name)
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
        path = tmp_path / f"{name}-async.oxisnap"
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

    def test_a_quantized_rotated_cache_round_trips(self, name: str) -> None:
        """q8_0 rows (Hadamard-rotated, as a quantized side is by default)
        and the f32 state restore as they were: the restored engine
        continues as the original does."""
        ref = c.reference(name)
        e = c.engine(ref.path, ref, kv_dtype="q8_0")
        e.generate(ref.greedy_prompt, 8, ignore_eos=True)
        back = Engine.restore_bytes(e.snapshot_bytes())
        want = e.generate("", 12, ignore_eos=True).tokens
        assert back.generate("", 12, ignore_eos=True).tokens == want

    def test_a_snapshot_converts_its_rows_and_keeps_its_state(self, name: str) -> None:
        """Converting a snapshot's KV type touches only the attention rows;
        the state after them travels as it is. f16 rows widen to f32 and
        narrow back exactly, so f16 -> f32 -> f16 continues as the original
        session does."""
        ref = c.reference(name)
        e = c.engine(ref.path, ref)
        e.generate(ref.greedy_prompt, 8, ignore_eos=True)
        snap = e.snapshot_bytes()
        wide = Engine.restore_bytes(snap, kv_dtype="f32")
        wide_snap = wide.snapshot_bytes()
        assert len(wide_snap) > len(snap)  # twice the row bytes, the same state
        back = Engine.restore_bytes(wide_snap, kv_dtype="f16")
        assert back.tokens == e.tokens
        want = e.generate("", 12, ignore_eos=True).tokens
        assert back.generate("", 12, ignore_eos=True).tokens == want

    def test_a_server_session_continues_as_an_engine_does(self, name: str) -> None:
        """Two turns of a server session (the state and the rows kept
        between requests) give a lone engine's two generations."""
        ref = c.reference(name)
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

    @pytest.mark.parametrize("role", ["target", "draft"])
    def test_speculative_decoding_is_exact(self, name: str, role: str) -> None:
        """The llama fixture (same vocabulary) drafts for the hybrid and the
        other way round; rejected drafts roll the hybrid's state and rows
        back together."""
        ref, llama = c.reference(name), c.reference("llama")
        target, draft = (ref, llama) if role == "target" else (llama, ref)
        spec = SpeculativeEngine(
            c.engine(target.path, target), c.engine(draft.path, draft), num_speculative=4
        )
        got = spec.generate(ref.greedy_prompt, 24, sampler=c.GREEDY, ignore_eos=True).tokens
        lone = c.engine(target.path, target).generate(ref.greedy_prompt, 24, ignore_eos=True)
        assert got == lone.tokens
        assert spec.stats.rejected > 0, spec.stats

    def test_idle_sessions_hibernate_and_come_back_exactly(self, name: str) -> None:
        """Six AsyncSessions in a pool with room for about three: the idle
        ones are copied out (rows and state) and back, and each continues
        as a lone engine does."""
        ref = c.reference(name)
        bos = ref.tokens[0]
        prompts = [[bos, *ref.tokens[1 + 7 * i : 1 + 7 * i + 12]] for i in range(6)]
        more = ref.tokens[50:53]

        def lone(p: list[int]) -> list[list[int]]:
            e = c.engine(ref.path, ref)
            return [e.generate(p, 12, ignore_eos=True).tokens, e.generate(more, 12).tokens]

        want = [lone(p) for p in prompts]
        # 8 pages of 16 positions, a session's 2 turns need 3 (40 positions).
        ae = AsyncEngine(
            ref.path, context_size=64, threads=c.THREADS, kv_pages=8, prefix_cache_bytes=0
        )

        async def main() -> list[list[list[int]]]:
            sessions = [ae.session(sampler=c.GREEDY) for _ in prompts]
            turns = zip(sessions, prompts, strict=True)
            first = await asyncio.gather(*(s.generate(p, 12, ignore_eos=True) for s, p in turns))
            second = await asyncio.gather(*(s.generate(more, 12) for s in sessions))
            return [[a.tokens, b.tokens] for a, b in zip(first, second, strict=True)]

        try:
            got = asyncio.run(main())
            m = ae.metrics()
        finally:
            asyncio.run(ae.close())
        assert got == want
        assert m["session_hibernations"] > 0 and m["session_wakes"] > 0
