"""Sessions on shared weights (issue 24), on the real SmolLM2.

One model per process; an `AsyncSession` continues exactly as one
uninterrupted synchronous `Engine` would — through turns batched with other
requests, through a snapshot restored into the scheduler, and after adopting
a synchronous engine halfway — for a greedy, a DRY-sampled and a
grammar-constrained conversation. Idle sessions hibernate under pressure
and come back exactly; the server's sessions cost their KV pages."""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxillama import AsyncEngine, AsyncSession, Engine, Grammar, Model, SamplerConfig
from oxillama.errors import GenerateError, ParameterError
from oxillama.snapshot import ModelMismatchError, SnapshotError, SnapshotFormatError
from tests._serve import serving

CTX = 512
N = 12  # tokens per turn

GBNF = r"""root ::= item+
item ::= "- " [a-z]+ (" " [a-z]+)? "\n"
"""

CASES: dict[str, tuple[SamplerConfig, str | None, list[str]]] = {
    "greedy": (
        SamplerConfig.greedy(),
        None,
        ["The three primary colors are", " Now name three animals:", " And three rivers:"],
    ),
    "dry": (
        SamplerConfig(temperature=0.9, seed=11, top_k=40, dry_multiplier=0.8),
        None,
        ["Write a short story about a cat.", " Then the cat met a dog.", " The end came"],
    ),
    # Turns 2 and 3 continue the constrained text with an empty prompt: the
    # live matcher carries over (and through snapshots and adoption).
    "grammar": (
        SamplerConfig(temperature=0.7, seed=5),
        GBNF,
        ["A shopping list of fruits:\n", "", ""],
    ),
}

OTHERS = ["Once upon a time", "def fibonacci(n):", "In 1969, astronauts"]


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _grammar(g: str | None) -> Grammar | None:
    return None if g is None else Grammar(g)


def reference(model: Model, case: str) -> list[list[int]]:
    """The tokens of each turn from one uninterrupted synchronous engine."""
    sampler, g, turns = CASES[case]
    e = Engine(model, context_size=CTX, threads=2, sampler=sampler)
    return [e.generate(t, N, grammar=_grammar(g)).tokens for t in turns]


@pytest.fixture(scope="module")
def model(model_path: Path) -> Model:
    return Model(model_path)


@pytest.fixture(scope="module")
def aengine(model: Model) -> Iterator[AsyncEngine]:
    e = AsyncEngine(model, context_size=CTX, threads=2, max_batch=8, prefill_chunk=32)
    yield e
    asyncio.run(e.close())


@pytest.fixture(scope="module")
def refs(model: Model) -> dict[str, list[list[int]]]:
    return {case: reference(model, case) for case in CASES}


def test_a_second_engine_on_the_same_file_loads_nothing(model_path: Path) -> None:
    # A fresh process: this one already holds the model.
    code = f"""
import json, time
from oxillama import Engine
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
r0, t0 = rss(), time.perf_counter()
a = Engine({str(model_path)!r}, context_size=1024, threads=2)
t1, r1 = time.perf_counter(), rss()
b = Engine({str(model_path)!r}, context_size=1024, threads=2)
t2, r2 = time.perf_counter(), rss()
print(json.dumps({{"first_s": t1 - t0, "first_rss": r1 - r0, "second_s": t2 - t1,
                  "second_rss": r2 - r1, "same": a.model is b.model}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    m = json.loads(out.stdout)
    print(
        f"first Engine: {m['first_s'] * 1e3:.1f} ms, +{m['first_rss'] / 2**20:.1f} MiB RSS; "
        f"second: {m['second_s'] * 1e3:.2f} ms, +{m['second_rss'] / 2**20:.2f} MiB RSS"
    )
    assert m["same"]
    assert m["second_s"] < 0.05 * m["first_s"]
    assert m["second_rss"] < 0.05 * m["first_rss"]


def test_model_cache_is_keyed_by_the_file_and_held_weakly(model_path: Path, tmp_path: Path) -> None:
    a = Model(model_path)
    assert Model(str(model_path)) is a
    assert Engine(a, context_size=16).model is a
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(model_path, copy)
    other = Model(copy)
    assert other is not a  # another file (inode), another model
    assert other.fingerprint().matches(a.fingerprint())
    import weakref

    ref = weakref.ref(other)
    del other
    gc.collect()
    assert ref() is None  # nothing holds it: the weights are gone


@pytest.mark.parametrize("case", list(CASES))
def test_turns_batch_with_other_requests_and_match_a_lone_engine(
    aengine: AsyncEngine, refs: dict[str, list[list[int]]], case: str
) -> None:
    sampler, g, turns = CASES[case]

    async def main() -> list[list[int]]:
        s = aengine.session(sampler=sampler)
        others = [
            asyncio.create_task(aengine.generate(p, 80, ignore_eos=True, sampler=sampler))
            for p in OTHERS
        ]
        got = [(await s.generate(t, N, grammar=_grammar(g))).tokens for t in turns]
        assert s.n_past == len(s.tokens) and s.n_past > 0
        await asyncio.gather(*others)
        await s.close()
        return got

    before = aengine.metrics()
    got = asyncio.run(main())
    after = aengine.metrics()
    assert got == refs[case]
    turns_run = after["session_turns"] - before["session_turns"]
    session_rows = after["session_decode_tokens"] - before["session_decode_tokens"]
    mixed = after["mixed_decode_steps"] - before["mixed_decode_steps"]
    print(f"{case}: {turns_run} turns, {session_rows} session decode rows, {mixed} mixed steps")
    assert turns_run == 3
    # Every session token after each turn's first was decoded in a forward
    # pass shared with the other requests.
    assert session_rows >= sum(len(t) for t in got) - 3
    assert mixed >= session_rows * 0.9
    assert after["sessions"] == before["sessions"]  # closed: its pages are back


@pytest.mark.parametrize("case", list(CASES))
def test_restore_session_continues_a_sync_engines_snapshot(
    model: Model, aengine: AsyncEngine, refs: dict[str, list[list[int]]], case: str, tmp_path: Path
) -> None:
    sampler, g, turns = CASES[case]
    e = Engine(model, context_size=CTX, threads=2, sampler=sampler)
    assert e.generate(turns[0], N, grammar=_grammar(g)).tokens == refs[case][0]
    blob = e.snapshot_bytes()
    e.snapshot(tmp_path / "s.oxisnap")

    async def main() -> tuple[list[list[int]], list[list[int]]]:
        from_bytes = await aengine.restore_session(blob)
        from_file = await aengine.restore_session(tmp_path / "s.oxisnap")
        a = [(await from_bytes.generate(t, N, grammar=_grammar(g))).tokens for t in turns[1:]]
        b = [(await from_file.generate(t, N, grammar=_grammar(g))).tokens for t in turns[1:]]
        return a, b

    a, b = asyncio.run(main())
    assert a == refs[case][1:]
    assert b == refs[case][1:]


@pytest.mark.parametrize("case", list(CASES))
def test_a_sessions_snapshot_is_an_ordinary_oxisnap1(
    model: Model, aengine: AsyncEngine, refs: dict[str, list[list[int]]], case: str, tmp_path: Path
) -> None:
    sampler, g, turns = CASES[case]
    path = tmp_path / "s.oxisnap"

    async def main() -> list[list[int]]:
        s = aengine.session(sampler=sampler)
        got = [(await s.generate(t, N, grammar=_grammar(g))).tokens for t in turns[:2]]
        await s.snapshot(path)
        return got

    got = asyncio.run(main())
    assert got == refs[case][:2]
    e = Engine.restore(path)
    assert e.model is model  # the process's copy: nothing loaded
    assert e.generate(turns[2], N, grammar=_grammar(g)).tokens == refs[case][2]


@pytest.mark.parametrize("case", list(CASES))
def test_adopt_takes_a_sync_engine_halfway(
    model: Model, aengine: AsyncEngine, refs: dict[str, list[list[int]]], case: str
) -> None:
    sampler, g, turns = CASES[case]
    e = Engine(model, context_size=CTX, threads=2, sampler=sampler)
    assert e.generate(turns[0], N, grammar=_grammar(g)).tokens == refs[case][0]
    n = e.n_past

    async def main() -> tuple[AsyncSession, list[list[int]], int]:
        used = aengine.metrics()["kv_pages_used"]
        s = await aengine.adopt(e)
        moved = aengine.metrics()["kv_pages_used"] - used
        got = [(await s.generate(t, N, grammar=_grammar(g))).tokens for t in turns[1:]]
        return s, got, moved

    s, got, moved = asyncio.run(main())
    assert got == refs[case][1:]
    # Same model, same KV dtype: the session kept its pages (no copy).
    assert moved == 0 and not s._conv.pooled
    assert e.n_past == 0 and e.tokens == []  # moved out, not shared
    assert s.tokens[:n] != [] and len(s.tokens) == s.n_past


@pytest.mark.parametrize("max_batch", [8, 2])
def test_idle_sessions_hibernate_under_pressure_and_come_back_exactly(
    model: Model, max_batch: int
) -> None:
    # With max_batch=2 most turns wait in the queue while their sessions
    # hold pages: those sessions count as idle and may hibernate.
    sampler = SamplerConfig(temperature=0.8, seed=3, dry_multiplier=0.5)
    texts = [f"Story number {i}: " + "the river ran on and on, " * 10 for i in range(6)]

    def lone(text: str) -> list[list[int]]:
        e = Engine(model, context_size=256, threads=2, sampler=sampler)
        return [e.generate(text, 16).tokens, e.generate(" And then", 16).tokens]

    want = [lone(t) for t in texts]
    # 24 pages of 16 positions: room for three of these sessions at a time.
    ae = AsyncEngine(
        model,
        context_size=256,
        threads=2,
        kv_pages=24,
        prefix_cache_bytes=0,
        max_batch=max_batch,
    )

    async def main() -> list[list[list[int]]]:
        sessions = [ae.session(sampler=sampler) for _ in texts]
        first = await asyncio.gather(
            *(s.generate(t, 16) for s, t in zip(sessions, texts, strict=True))
        )
        second = await asyncio.gather(*(s.generate(" And then", 16) for s in sessions))
        return [[a.tokens, b.tokens] for a, b in zip(first, second, strict=True)]

    try:
        got = asyncio.run(main())
        m = ae.metrics()
    finally:
        asyncio.run(ae.close())
    print({k: m[k] for k in ("session_hibernations", "session_wakes", "session_swaps")})
    assert got == want
    assert m["session_hibernations"] > 0 and m["session_wakes"] > 0


def test_session_errors_are_typed_and_lose_nothing(
    aengine: AsyncEngine, model_path: Path, tmp_path: Path
) -> None:
    async def main() -> None:
        s = aengine.session(sampler=SamplerConfig.greedy())
        with pytest.raises(GenerateError, match="nothing to continue"):
            await s.generate("", 4)
        await s.generate("Hello there", 4)
        held = s.tokens
        with pytest.raises(GenerateError, match="does not fit"):
            await s.generate(list(range(100, 100 + CTX)), 4)
        assert s.tokens == held and s.n_past == len(held)  # nothing lost
        with pytest.raises(SnapshotFormatError):
            await aengine.restore_session(b"OXISNAP1 but not really")
        await s.close()
        with pytest.raises(GenerateError, match="closed"):
            await s.generate("more", 4)

    asyncio.run(main())

    # A snapshot of another model file (same bytes plus a tail) is refused.
    other = tmp_path / "other.gguf"
    shutil.copyfile(model_path, other)
    with other.open("ab") as f:
        f.write(b"\0" * 64)
    e = Engine(other, context_size=64, threads=1)
    e.eval(e.tokenize("Hi"))

    async def mismatch() -> None:
        with pytest.raises(ModelMismatchError):
            await aengine.restore_session(e.snapshot_bytes())

    asyncio.run(mismatch())


def test_server_sessions_cost_their_kv_pages(model: Model) -> None:
    ae = AsyncEngine(model, context_size=1024, threads=2, max_batch=8)

    def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            url, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out

    with serving(ae, "smol") as url:
        turn = {"prompt": "Hello, my name is", "max_tokens": 4, "temperature": 0}
        post(url + "/v1/completions", {**turn, "session": "warm"})
        gc.collect()
        before, used0 = rss(), ae.metrics()["kv_pages_used"]
        for i in range(40):
            out = post(url + "/v1/completions", {**turn, "session": f"s{i}"})
            assert out["choices"][0]["text"]
        gc.collect()
        m = ae.metrics()
        grown = rss() - before
        kv = (m["kv_pages_used"] - used0) * m["kv_page_bytes"]
    print(f"40 sessions: RSS +{grown / 2**20:.1f} MiB, KV held {kv / 2**20:.1f} MiB")
    assert m["sessions"] >= 40
    assert grown < kv + (64 << 20)


def test_server_session_streams_decode_as_one_batch(model: Model) -> None:
    from concurrent.futures import ThreadPoolExecutor

    ae = AsyncEngine(model, context_size=512, threads=2, max_batch=8)

    def turn(url: str, sid: str) -> str:
        body = {
            "prompt": f"Session {sid} says:",
            "max_tokens": 24,
            "temperature": 0,
            "ignore_eos": True,
            "session": sid,
            "stream": True,
        }
        req = urllib.request.Request(
            url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.read().decode()

    with serving(ae, "smol") as url:
        before = ae.metrics()
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda i: turn(url, f"b{i}"), range(4)))
        after = ae.metrics()
    assert all(o.rstrip().endswith("data: [DONE]") for o in outs)
    steps = after["decode_steps"] - before["decode_steps"]
    rows = after["session_decode_tokens"] - before["session_decode_tokens"]
    print(f"4 server session streams: {rows} session tokens in {steps} forward passes")
    assert rows >= 4 * 23
    assert steps < rows / 2  # batched, not one pass per token


def test_snapshot_into_a_buffer_and_load_snapshot_in_place(model: Model, tmp_path: Path) -> None:
    sampler = SamplerConfig(temperature=0.8, seed=9, dry_multiplier=0.5)
    a = Engine(model, context_size=CTX, threads=2, sampler=sampler)
    a.generate("The weather today", 10)
    n = a.snapshot_size()
    buf = bytearray(n + 100)  # larger than needed, as llama_state_get_data allows
    assert a.snapshot_into(buf) == n
    a.snapshot(tmp_path / "a.oxisnap")
    assert (tmp_path / "a.oxisnap").stat().st_size == n
    want = a.generate(" and tomorrow", 10).tokens

    b = Engine(model, context_size=CTX, threads=2)
    b.generate("Something else entirely", 5)
    own = b._session
    b.load_snapshot(memoryview(buf)[:n])
    assert b._session is own  # same context size and dtype: its own memory
    assert b.generate(" and tomorrow", 10).tokens == want

    # A different context size gets a new context; a path works too.
    c = Engine(model, context_size=64, threads=1)
    c.load_snapshot(tmp_path / "a.oxisnap")
    assert c.n_ctx == CTX and c.threads == 1
    assert c.generate(" and tomorrow", 10).tokens == want

    # Bad input: a typed error, and the engine is unchanged.
    held = b.tokens
    bad = bytearray(buf[:n])
    bad[-1] ^= 1
    with pytest.raises(SnapshotFormatError):
        b.load_snapshot(bytes(bad))
    assert b.tokens == held and b.n_past == len(held)
    assert b.generate(" more", 3).tokens  # and still usable
    with pytest.raises(ParameterError, match="needs"):
        a.snapshot_into(bytearray(10))
    with pytest.raises(ParameterError, match="writable"):
        a.snapshot_into(b"x" * (2 * n))


def test_a_batched_step_leaves_each_session_a_hidden_state_that_gives_its_logits(
    model: Model, aengine: AsyncEngine
) -> None:
    import numpy as np

    from oxillama import _native

    pool = _native.KvPool(model.native, 64)
    kvs = [_native.Session(model.native, 256, 2, "f16", pool=pool) for _ in range(5)]
    toks = model.tokenizer.encode("Hello there, how are you today?", add_special=True)
    for i, kv in enumerate(kvs):
        kv.eval(np.asarray(toks[: 4 + i], dtype=np.uint32))
    for step in range(3):
        logits = _native.eval_batch(kvs, [[100 + step + i] for i in range(5)])
        for i, kv in enumerate(kvs):
            hidden = kv.last_hidden()
            assert hidden is not None and kv.logits_from_head
            # The same bits as the batched head's row: a waiting session
            # keeps 2 KiB of hidden state instead of 192 KiB of logits.
            assert kv.head_logits(hidden).tobytes() == logits[i].tobytes()

    async def turn() -> AsyncSession:
        s = aengine.session(sampler=SamplerConfig.greedy())
        await asyncio.gather(s.generate("The sky is", 8), aengine.generate("Grass is", 8))
        return s

    s = asyncio.run(turn())
    assert s._conv.state.hidden is not None and s._conv.state.logits is None


def test_a_batched_step_gives_each_row_its_lone_bits_at_any_depth(model: Model) -> None:
    """Decode attention lays its units out by the batch: one unit per (row,
    KV head) where those give every thread one, split units otherwise (a
    lone SmolLM2 row, three KV heads, on four threads). Past 64 keys a row
    is split either way, and each row's logits in a batch are the bits it
    gets decoded alone."""
    import numpy as np

    from oxillama import _native

    depths = (10, 100, 300)
    for threads in (2, 4):
        pool = _native.KvPool(model.native, 256)

        def fresh(
            depth: int, threads: int = threads, pool: _native.KvPool = pool
        ) -> _native.Session:
            s = _native.Session(model.native, 512, threads, "f16", pool=pool)
            s.eval(np.arange(100, 100 + depth, dtype=np.uint32))
            return s

        batch = [fresh(d) for d in depths]
        lone = [fresh(d) for d in depths]
        for step in range(3):
            toks = [[500 + 7 * step + i] for i in range(len(depths))]
            logits = _native.eval_batch(batch, toks)
            for i, s in enumerate(lone):
                alone = s.eval(np.asarray(toks[i], dtype=np.uint32))
                assert alone.tobytes() == logits[i].tobytes(), (threads, depths[i], step)


_BLOB: list[bytes] = []


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_mutated_snapshots_never_change_a_loaded_engine(model: Model, data: st.DataObject) -> None:
    """Any mutation (flipped bytes, truncation, appended bytes) of a session
    snapshot is a typed error from load_snapshot (restore_session and
    Engine.restore share its reader), and the engine keeps its session."""
    if not _BLOB:
        src = Engine(model, context_size=64, threads=1)
        src.generate("Mutations", 4)
        _BLOB.append(src.snapshot_bytes())
    blob = bytearray(_BLOB[0])
    kind = data.draw(st.sampled_from(["flip", "truncate", "append"]))
    if kind == "flip":
        spots = st.lists(st.integers(0, len(blob) - 1), min_size=1, max_size=4, unique=True)
        for i in data.draw(spots):
            blob[i] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        del blob[data.draw(st.integers(0, len(blob) - 1)) :]
    else:
        blob += data.draw(st.binary(min_size=1, max_size=64))
    e = Engine(model, context_size=64, threads=1)
    e.eval(e.tokenize("Hello"))
    held = e.tokens
    with pytest.raises(SnapshotError):
        e.load_snapshot(bytes(blob))
    assert e.tokens == held and e.n_past == len(held)


def test_leaving_a_session_stream_early_stops_the_turn_and_keeps_its_tokens(
    model: Model, aengine: AsyncEngine
) -> None:
    greedy = SamplerConfig.greedy()
    lone = Engine(model, context_size=CTX, threads=2, sampler=greedy)
    want = lone.generate("Count from one to fifty:", 40, ignore_eos=True).tokens

    async def main() -> tuple[int, list[int], int]:
        s = aengine.session(sampler=greedy)
        pieces = 0
        stream = s.stream("Count from one to fifty:", 40, ignore_eos=True)
        async for _ in stream:
            pieces += 1
            if pieces == 5:
                break
        await stream.aclose()
        # The turn is over at once: the next call runs without waiting.
        more = await s.generate("", 3, ignore_eos=True)
        return s.n_past, s.tokens, len(more.tokens)

    n_past, tokens, extra = asyncio.run(main())
    prompt = model.tokenizer.encode("Count from one to fifty:", add_special=True)
    kept = tokens[len(prompt) :]
    # What was generated before leaving stays in the context, in order, and
    # is what a lone engine generates.
    assert n_past == len(tokens) and extra == 3
    assert 5 <= len(kept) - 3 < 40
    assert kept == want[: len(kept)]  # and it continues exactly
