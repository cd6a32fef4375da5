"""Sessions: oxillama against llama.cpp (llama-cpp-python) on SmolLM2-135M
Q4_1, 2 threads, f16 KV, in one process and one run.

    python benches/sessions.py [--reps 7] [--sessions 20]

Both engines get the same 562 token ids (a long English text tokenized by
oxillama, first 562 ids). llama.cpp: Llama(n_ctx=1024, n_threads=2,
n_batch=512); oxillama: Engine(context_size=1024, threads=2, kv f16).

1. Restore of a 562-token session in a process that holds the model:
   Engine.restore_bytes(blob) (checksum, fingerprint check, KV import into
   a new engine; the next-token logits stay a hidden state) against
   llama_state_set_data into the already loaded context. Bar: ours <= 1.2x
   (issue 57).
   "restore + first logits" adds the output head (llama.cpp's state holds
   the logits already).
   Engine.load_snapshot(blob) restores in place into a loaded engine, as
   set_data does into its context (the like-for-like figure). Bar: <= 1.2x.
   Engine.restore(path) restores from a snapshot file in the page cache
   (mapped, not read), against set_data too. Bar: <= 1.2x.
2. Save: engine.snapshot_into(buffer) against llama_state_get_data, both
   into a preallocated buffer, and engine.snapshot_bytes() (a new bytes
   object: fresh memory, page faults) against the same. Bars: <= 1.2x.
   For both, the parts of our restore and save are timed one by one.
3. RSS per idle session of 100 tokens (a 90-token prompt of distinct text
   plus 10 generated tokens): N AsyncSessions in one AsyncEngine, RSS from
   /proc/self/statm before and after (after gc), next to the KV bytes those
   100 tokens hold (7 pages of 16 positions) and to the RSS growth of one
   more llama.cpp context (llama_init_from_model on the loaded llama_model,
   same parameters) holding the same 100 tokens: a llama.cpp context
   allocates its whole n_ctx KV up front.
4. Aggregate tokens/s of 4 concurrent session streams (fresh sessions,
   first turn; then a second turn on the same sessions) against 4
   stateless streams (AsyncEngine.stream) of the same prompts (64 tokens,
   128 generated, greedy, ignore_eos) in the same AsyncEngine. The prompts
   are new in every rep, so the prefix cache does not serve the stateless
   streams (its hits are printed). Bar: session / stateless >= 0.9.
   The second turn decodes 192 positions further into its context, so it
   is also set against stateless streams whose prompt is that whole
   context (compare decode rates: that prefill is 4x longer, and may hit
   the prefix cache of the first-turn prompt). Scheduler counters show the
   session streams decode as one batch, and a run of 2 session + 2
   stateless streams shows both kinds in one forward pass.

Warm-up: each engine does one full-size run of every measurement before
the timed reps; the two sides alternate which goes first rep by rep;
medians. Needs `pip install llama-cpp-python`.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import llama_cpp
from _cpu import describe as describe_cpu
from llama_cpp._utils import suppress_stdout_stderr

from oxillama import AsyncEngine, AsyncSession, Completion, Engine, SamplerConfig, _native
from oxillama.decoding.sampling import build_sampler
from oxillama.engine.session_state import SessionState
from oxillama.model.paths import default_model_path
from oxillama.sessions import format as F
from oxillama.sessions import sections as S
from oxillama.sessions import session as SS

N_TOKENS = 562
N_CTX = 1024
THREADS = 2
SESSION_PROMPT = 90
SESSION_GEN = 10
STREAMS = 4
STREAM_PROMPT = 64
STREAM_GEN = 128
#: Restores and saves against llama.cpp's state functions (issue 57).
BAR = 1.2

TEXT = (
    "The history of computing is a story of abstraction layered upon abstraction. "
    "Early machines were programmed by rewiring their circuits by hand, a slow and "
    "error-prone process that could take days for a single problem. Later, the idea "
    "of the stored program let the same hardware run many different tasks, simply by "
    "loading new instructions into memory. Assemblers replaced numeric codes with short "
    "mnemonics, and compilers replaced those with languages that read almost like "
    "mathematics. Operating systems arrived to share one expensive machine among many "
    "users, scheduling their jobs, protecting their files and hiding the details of "
    "disks, tapes and printers behind a handful of system calls. Networks connected the "
    "machines to each other, first within a university or a company and then across "
    "continents, and the protocols that carried their messages were themselves built "
    "in layers, each trusting the one below to deliver bytes and offering the one above "
    "a simpler promise. Personal computers put a processor on every desk; graphical "
    "interfaces put windows, icons and a mouse between people and the command line. "
    "The web turned documents into applications, and phones turned applications into "
    "companions that travel in a pocket. Through all of it, each generation of "
    "engineers stood on the work of the previous one, rarely looking at the transistors "
    "underneath, and trusting that the abstractions would hold. When they did not, the "
    "leaks were instructive: a cache miss, a dropped packet, a race between two threads "
    "reminded everyone that the physical machine was still there, counting cycles and "
    "moving electrons, whatever the programmer preferred to believe. Gardeners know a "
    "similar truth. A well planned garden looks effortless in summer, but it rests on "
    "soil prepared in autumn, bulbs planted before the frost, and years of learning "
    "which plants thrive in the shade of the old oak and which need the full southern "
    "sun. Rivers shape valleys over millennia, carrying sand from the mountains to the "
    "sea, and the towns along their banks grew where the water was calm enough to cross "
    "and deep enough to carry boats loaded with grain, timber and wool. "
)


# ------------------------------------------------------------------ helpers


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


_LIBC = ctypes.CDLL(None)


def settled_rss() -> int:
    """RSS after gc, with the C heap's free memory handed back to the OS
    (so memory freed earlier and reused now shows as growth)."""
    gc.collect()
    _LIBC.malloc_trim(0)
    return rss_bytes()


def verdict(ok: bool) -> str:
    return "PASS" if ok else "OVER"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


# ------------------------------------------------- 1 + 2: restore and save


@dataclass
class LlamaSide:
    llm: llama_cpp.Llama
    ctx: Any
    size: int
    buf: Any

    def save(self) -> float:
        t = time.perf_counter()
        n = llama_cpp.llama_state_get_data(self.ctx, self.buf, self.size)
        dt = time.perf_counter() - t
        assert n == self.size, f"llama_state_get_data wrote {n} of {self.size} bytes"
        return dt

    def restore(self) -> float:
        t = time.perf_counter()
        n = llama_cpp.llama_state_set_data(self.ctx, self.buf, self.size)
        dt = time.perf_counter() - t
        assert n == self.size, f"llama_state_set_data read {n} of {self.size} bytes"
        return dt


def ours_restore(blob: bytes, n: int) -> tuple[float, float]:
    """(restore, restore + first logits) of one fresh restore each."""
    gc.collect()
    t = time.perf_counter()
    r = Engine.restore_bytes(blob)
    dt = time.perf_counter() - t
    assert r.n_past == n
    del r
    gc.collect()
    t = time.perf_counter()
    r = Engine.restore_bytes(blob)
    logits = r._last_logits
    dt_logits = time.perf_counter() - t
    assert logits is not None
    del r, logits
    return dt, dt_logits


def ours_file(path: str, n: int) -> float:
    """Engine.restore from a snapshot file in the page cache."""
    gc.collect()
    t = time.perf_counter()
    r = Engine.restore(path)
    dt = time.perf_counter() - t
    assert r.n_past == n
    return dt


def ours_load(target: Engine, blob: bytes, n: int) -> float:
    """Engine.load_snapshot: in place into a loaded engine, like set_data."""
    gc.collect()
    t = time.perf_counter()
    target.load_snapshot(blob)
    dt = time.perf_counter() - t
    assert target.n_past == n
    return dt


def ours_into(e: Engine, buf: bytearray) -> float:
    """Engine.snapshot_into a preallocated buffer, like get_data."""
    gc.collect()
    t = time.perf_counter()
    n = e.snapshot_into(buf)
    dt = time.perf_counter() - t
    assert n == len(buf)
    return dt


def ours_save(e: Engine) -> float:
    gc.collect()
    t = time.perf_counter()
    blob = e.snapshot_bytes()
    dt = time.perf_counter() - t
    del blob
    return dt


def restore_parts(blob: bytes) -> dict[str, float]:
    """Engine.restore_bytes done step by step as snapshot.session.restore
    does it (seconds of each step, one run)."""
    out: dict[str, float] = {}
    view = memoryview(blob)
    out["decode (header, checksum, sections)"], (_, secs) = timed(lambda: F.decode(blob))
    out["  of which the checksum of the payload alone"], _ = timed(
        lambda: _native.checksum(view[F.HEADER.size :])
    )

    def meta_and_model() -> tuple[dict[str, Any], Any]:
        meta = S.decode_json(secs[S.META], "meta")
        return meta, SS._model_for(meta, None, None)

    out["meta JSON + model lookup + fingerprint check"], (meta, m) = timed(meta_and_model)

    def token_ids() -> list[int]:
        tokens = S.decode_u32(secs[S.TOKENS], "tokens")
        assert not any(t >= m.vocab_size for t in tokens)
        return tokens

    out["token ids (decode + vocab check)"], tokens = timed(token_ids)
    eng = meta["engine"]
    n_past = int(meta["n_past"])

    def new_kv() -> _native.Session:
        return _native.Session(
            m.native, int(eng["context_size"]), int(eng["threads"]), str(eng["kv_dtype"])
        )

    out["new native session (private KV)"], kv = timed(new_kv)
    out["import_kv into the new session"], _ = timed(lambda: kv.import_kv(n_past, secs[S.KV]))

    def sampler() -> tuple[SamplerConfig, _native.Sampler]:
        config = SamplerConfig.from_dict(S.decode_json(secs[S.SAMPLER_CONFIG], "sampler"))
        smp = build_sampler(config, m.tokenizer, m.vocab_size)
        smp.set_state(S.decode_sampler_state(secs[S.SAMPLER_STATE]))
        return config, smp

    out["sampler rebuild + state"], (config, smp) = timed(sampler)

    def engine() -> Engine:
        state = SessionState(model=m, kv=kv, sampler_config=config, sampler=smp, tokens=tokens)
        state.hidden = S.decode_f32(secs[S.HIDDEN], int(m.config["n_embd"]), "hidden")
        return Engine.from_state(state)

    out["hidden state + SessionState + Engine"], restored = timed(engine)
    out["(not in restore) first logits: output head"], _ = timed(lambda: restored._last_logits)
    # The same import into a session whose pages are already faulted in,
    # as llama_state_set_data writes into a context allocated long ago.
    kv.truncate(0)
    out["(not in restore) import_kv into a used session"], _ = timed(
        lambda: kv.import_kv(n_past, secs[S.KV])
    )
    return out


def save_parts(e: Engine) -> dict[str, float]:
    """Engine.snapshot_bytes / snapshot_into done step by step."""
    out: dict[str, float] = {}
    state = e._view_state()
    out["section writers (meta, fingerprint, sampler, last position)"], secs = timed(
        lambda: SS.writers(state)
    )
    size = F.encoded_size(secs)
    pre = bytearray(size)
    F.encode_into(secs, memoryview(pre))
    out["fill sections into a used buffer (KV export)"], view = timed(
        lambda: F.fill_payload(secs, pre)
    )
    out["checksum of the payload"], digest = timed(lambda: _native.checksum(view[F.HEADER.size :]))
    out["seal header"], _ = timed(lambda: F.seal(view, digest))
    view.release()
    out["(not in save) the same into one new bytes object (filled_bytes)"], _ = timed(
        lambda: _native.filled_bytes(size, lambda v: F.encode_into(SS.writers(state), v))
    )
    out["(not in save) bytearray(size): a fresh zeroed buffer alone"], _ = timed(
        lambda: bytearray(size)
    )
    return out


@dataclass
class StateResults:
    cold: dict[str, float]  # alternating, gc between: medians (seconds)
    hot: dict[str, float]  # each op right after the same op: medians (seconds)
    sizes: dict[str, float]
    restore_parts: dict[str, float]
    save_parts: dict[str, float]


def bench_state(path: str, tokens: list[int], reps: int) -> tuple[StateResults, LlamaSide]:
    e = Engine(path, context_size=N_CTX, threads=THREADS, kv_dtype="f16")
    e.eval(tokens)
    with suppress_stdout_stderr(disable=False):
        llm = llama_cpp.Llama(path, n_ctx=N_CTX, n_threads=THREADS, n_batch=512, verbose=False)
    llm.eval(tokens)
    ctx = llm._ctx.ctx
    size = int(llama_cpp.llama_state_get_size(ctx))
    ll = LlamaSide(llm, ctx, size, (ctypes.c_uint8 * size)())
    blob = e.snapshot_bytes()
    # The loaded engine a snapshot is set into, as llama.cpp's context is.
    target = Engine(path, context_size=N_CTX, threads=THREADS, kv_dtype="f16")
    target.eval(tokens[::-1])
    out = bytearray(e.snapshot_size())
    snap_dir = tempfile.mkdtemp(prefix="oxi-bench-")
    snap_file = os.path.join(snap_dir, "s.oxisnap")
    e.snapshot(snap_file, durable=False)
    # Warm-up: one full-size save and restore on each side.
    ll.save()
    ll.restore()
    ours_save(e)
    ours_restore(blob, len(tokens))
    ours_file(snap_file, len(tokens))
    ours_load(target, blob, len(tokens))
    ours_into(e, out)
    keys = ("ll_save", "ll_set", "ox_save", "ox_rst", "ox_rl", "ox_load", "ox_into", "ox_file")
    cold: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(reps):
        order = ("ll", "ox") if r % 2 == 0 else ("ox", "ll")
        for side in order:
            if side == "ll":
                gc.collect()
                cold["ll_save"].append(ll.save())
                gc.collect()
                cold["ll_set"].append(ll.restore())
            else:
                cold["ox_save"].append(ours_save(e))
                cold["ox_into"].append(ours_into(e, out))
                cold["ox_load"].append(ours_load(target, blob, len(tokens)))
                a, b = ours_restore(blob, len(tokens))
                cold["ox_rst"].append(a)
                cold["ox_rl"].append(b)
                cold["ox_file"].append(ours_file(snap_file, len(tokens)))
    # The same operations repeated back to back, caches warm from the
    # previous identical call (the timed call is the second of a pair).
    hot: dict[str, list[float]] = {k: [] for k in keys}

    def again(fn: Callable[[], Any]) -> float:
        fn()
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    for _ in range(reps):
        hot["ll_save"].append(again(ll.save))
        hot["ll_set"].append(again(ll.restore))
        hot["ox_save"].append(again(e.snapshot_bytes))
        hot["ox_into"].append(again(functools.partial(e.snapshot_into, out)))
        hot["ox_load"].append(again(lambda: target.load_snapshot(blob)))
        hot["ox_rst"].append(again(lambda: Engine.restore_bytes(blob)))
        hot["ox_rl"].append(again(lambda: Engine.restore_bytes(blob)._last_logits))
        hot["ox_file"].append(again(lambda: Engine.restore(snap_file)))
    shutil.rmtree(snap_dir)
    rparts: dict[str, list[float]] = {}
    sparts: dict[str, list[float]] = {}
    for _ in range(reps):
        gc.collect()
        for k, v in restore_parts(blob).items():
            rparts.setdefault(k, []).append(v)
        gc.collect()
        for k, v in save_parts(e).items():
            sparts.setdefault(k, []).append(v)
    del e
    res = StateResults(
        cold={k: med(v) for k, v in cold.items()},
        hot={k: med(v) for k, v in hot.items()},
        sizes={"ours": float(len(blob)), "llama": float(size)},
        restore_parts={k: med(v) for k, v in rparts.items()},
        save_parts={k: med(v) for k, v in sparts.items()},
    )
    return res, ll


# ------------------------------------------------------- 3: RSS per session


def llama_context_rss(ll: LlamaSide, tokens: list[int], n_extra: int) -> tuple[float, float, int]:
    """RSS growth of one more llama.cpp context on the loaded model, with
    the Llama instance's own context parameters: (after creation, after
    evaluating ``tokens`` in it) in bytes, medians over ``n_extra``
    contexts kept alive together; and the n_ctx they were made with."""
    params = ll.llm.context_params
    created: list[float] = []
    filled: list[float] = []
    ctxs: list[Any] = []
    arr = (llama_cpp.llama_token * len(tokens))(*tokens)
    try:
        for _ in range(n_extra):
            r0 = settled_rss()
            with suppress_stdout_stderr(disable=False):
                c = llama_cpp.llama_init_from_model(ll.llm._model.model, params)
            assert c, "llama_init_from_model failed"
            ctxs.append(c)
            r1 = settled_rss()
            rc = llama_cpp.llama_decode(c, llama_cpp.llama_batch_get_one(arr, len(tokens)))
            assert rc == 0, f"llama_decode returned {rc}"
            r2 = settled_rss()
            created.append(r1 - r0)
            filled.append(r2 - r0)
    finally:
        for c in ctxs:
            llama_cpp.llama_free(c)
    return med(created), med(filled), int(params.n_ctx)


def distinct_prompts(ae: AsyncEngine, tag: str, count: int, length: int) -> list[list[int]]:
    """``count`` prompts of ``length`` ids: a unique tag, then the text from
    a different place for each."""
    body = ae.tokenize(TEXT * 3, add_special=False)
    out = []
    for i in range(count):
        head = ae.tokenize(f"[{tag} {i}] ")
        start = (i * 41) % (len(body) - length)
        out.append((head + body[start:])[:length])
    return out


async def session_turns(ae: AsyncEngine, prompts: list[list[int]]) -> list[AsyncSession]:
    greedy = SamplerConfig.greedy()
    sessions = [ae.session(sampler=greedy) for _ in prompts]
    await asyncio.gather(
        *(
            s.generate(p, SESSION_GEN, ignore_eos=True)
            for s, p in zip(sessions, prompts, strict=True)
        )
    )
    return sessions


async def bench_rss(path: str, n: int) -> dict[str, float]:
    async with AsyncEngine(path, context_size=N_CTX, threads=THREADS, max_batch=8) as ae:
        # Warm-up of the same shape: 8 sessions' turns (a full batch) whose
        # pages stay held, so the measured sessions get pages never touched.
        warm = await session_turns(ae, distinct_prompts(ae, "warm", 8, SESSION_PROMPT))
        m0 = ae.metrics()
        r0 = settled_rss()
        sessions = await session_turns(ae, distinct_prompts(ae, "rss", n, SESSION_PROMPT))
        r1 = settled_rss()
        m1 = ae.metrics()
        n_past = sorted({s.n_past for s in sessions})
        states = [s._conv.state for s in sessions]
        with_logits = sum(1 for x in states if x.logits is not None)
        with_hidden = sum(1 for x in states if x.hidden is not None)
        pool = ae.scheduler._pool
        page_bytes = pool.nbytes / pool.n_pages
        for s in [*sessions, *warm]:
            await s.close()
        return {
            "per_session": (r1 - r0) / n,
            "pages_per_session": (int(m1["kv_pages_used"]) - int(m0["kv_pages_used"])) / n,
            "page_bytes": page_bytes,
            "page_tokens": float(m1["kv_page_tokens"]),
            "n_past": float(n_past[0]) if len(n_past) == 1 else -1.0,
            "sessions": float(int(m1["sessions"]) - int(m0["sessions"])),
            "with_logits": float(with_logits),
            "with_hidden": float(with_hidden),
            "vocab": float(ae.model.vocab_size),
        }


# --------------------------------------------- 4: session vs stateless streams


@dataclass
class Run:
    seconds: float  # submit to the last piece
    decode_seconds: float  # the last stream's first piece to the last piece
    tokens: int
    counters: dict[str, float]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def decode_tok_s(self) -> float:
        return self.tokens / self.decode_seconds


#: Starts one stream; the list it is given receives its Completion.
Stream = Callable[[list[Completion]], AsyncIterator[str]]

COUNTERS = (
    "decode_steps",
    "generated_tokens",
    "session_decode_tokens",
    "mixed_decode_steps",
    "session_turns",
    "prefix_cache_hits",
    "preempted",
    "session_swaps",
)


async def run_streams(ae: AsyncEngine, streams: list[Stream]) -> Run:
    """Consumes the given streams concurrently, timing them."""
    m0 = ae.metrics()
    firsts: list[float] = []
    results: list[Completion] = []

    async def consume(make: Stream) -> None:
        first = True
        async for _ in make(results):
            if first:
                firsts.append(time.perf_counter())
                first = False

    t0 = time.perf_counter()
    await asyncio.gather(*(consume(m) for m in streams))
    t1 = time.perf_counter()
    m1 = ae.metrics()
    tokens = sum(len(c.tokens) for c in results)
    assert tokens == STREAM_GEN * len(streams), f"{tokens} tokens generated"
    counters = {k: float(m1.get(k, 0)) - float(m0.get(k, 0)) for k in COUNTERS}
    return Run(t1 - t0, t1 - max(firsts), tokens, counters)


def session_stream(s: AsyncSession, prompt: list[int]) -> Stream:
    def make(result: list[Completion]) -> AsyncIterator[str]:
        return s.stream(prompt, STREAM_GEN, ignore_eos=True, result=result)

    return make


def stateless_stream(ae: AsyncEngine, prompt: list[int]) -> Stream:
    greedy = SamplerConfig.greedy()

    def make(result: list[Completion]) -> AsyncIterator[str]:
        return ae.stream(prompt, STREAM_GEN, sampler=greedy, ignore_eos=True, result=result)

    return make


async def session_run(
    ae: AsyncEngine, sessions: list[AsyncSession], prompts: list[list[int]]
) -> Run:
    return await run_streams(
        ae, [session_stream(s, p) for s, p in zip(sessions, prompts, strict=True)]
    )


async def stateless_run(ae: AsyncEngine, prompts: list[list[int]]) -> Run:
    return await run_streams(ae, [stateless_stream(ae, p) for p in prompts])


async def one_rep(ae: AsyncEngine, tag: str, sessions_first: bool) -> dict[str, Run]:
    """This rep's runs: "t1" first turns, "t2" second turns, "sl" stateless
    with the first-turn prompts, "sl2" stateless whose prompts are the
    sessions' whole context at their second turn (decoded at the same
    positions; their prefill is 4x longer)."""
    first = distinct_prompts(ae, f"{tag} a", STREAMS, STREAM_PROMPT)
    second = distinct_prompts(ae, f"{tag} b", STREAMS, STREAM_PROMPT)
    out: dict[str, Run] = {}

    async def sessions() -> None:
        greedy = SamplerConfig.greedy()
        ss = [ae.session(sampler=greedy) for _ in range(STREAMS)]
        out["t1"] = await session_run(ae, ss, first)
        whole = [s.tokens + p for s, p in zip(ss, second, strict=True)]
        out["t2"] = await session_run(ae, ss, second)
        for s in ss:
            await s.close()
        out["sl2"] = await stateless_run(ae, whole)

    if sessions_first:
        await sessions()
        out["sl"] = await stateless_run(ae, first)
    else:
        out["sl"] = await stateless_run(ae, first)
        await sessions()
    return out


async def mixed_proof(ae: AsyncEngine) -> dict[str, float]:
    """Two session streams and two stateless streams at once: the steps
    that decode both kinds in one forward pass."""
    greedy = SamplerConfig.greedy()
    prompts = distinct_prompts(ae, "mixed", STREAMS, STREAM_PROMPT)
    ss = [ae.session(sampler=greedy) for _ in range(2)]
    streams = [session_stream(s, p) for s, p in zip(ss, prompts[:2], strict=True)]
    streams += [stateless_stream(ae, p) for p in prompts[2:]]
    run = await run_streams(ae, streams)
    for s in ss:
        await s.close()
    return run.counters


async def bench_streams(path: str, reps: int) -> tuple[list[dict[str, Run]], dict[str, float]]:
    async with AsyncEngine(path, context_size=N_CTX, threads=THREADS, max_batch=8) as ae:
        await one_rep(ae, "warm", True)  # one full run of each kind
        runs = [await one_rep(ae, f"rep {r}", r % 2 == 0) for r in range(reps)]
        mixed = await mixed_proof(ae)
    return runs, mixed


# ---------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sessions", type=int, default=20, help="idle sessions for the RSS figure")
    ap.add_argument(
        "--llama-contexts", type=int, default=3, help="extra llama.cpp contexts for its RSS figure"
    )
    args = ap.parse_args()
    path = str(args.model or default_model_path())
    t_start = time.perf_counter()

    print(f"model: {path}")
    print(f"CPU: {describe_cpu()}")
    print(
        f"oxillama {_native.__version__}, kernels {_native.simd_level()}; llama-cpp-python "
        f"{llama_cpp.__version__}"
    )
    print(f"llama.cpp: {llama_cpp.llama_print_system_info().decode().strip()}")
    print(f"threads {THREADS}, n_ctx {N_CTX}, f16 KV, reps {args.reps} (medians)\n")

    probe = Engine(path, context_size=N_CTX, threads=THREADS)
    tokens = probe.tokenize(TEXT * 3)[:N_TOKENS]
    assert len(tokens) == N_TOKENS
    del probe

    # 1 + 2 -----------------------------------------------------------------
    st, ll = bench_state(path, tokens, args.reps)
    times, hot = st.cold, st.hot
    ms = 1e3
    r_restore = times["ox_rst"] / times["ll_set"]
    r_save = times["ox_save"] / times["ll_save"]
    print(
        f"1-2. state of {N_TOKENS} tokens: ours {st.sizes['ours'] / 1e6:.2f} MB OXISNAP1, "
        f"llama.cpp {st.sizes['llama'] / 1e6:.2f} MB"
    )
    print("   alternating rep by rep, gc before each call (the timed figures):")
    print(f"{'':48}{'llama.cpp':>10}{'oxillama':>10}{'ratio':>8}  bar")
    rows = (
        ("restore in place ms (set_data / load_snapshot)", "ll_set", "ox_load", True),
        ("restore, new engine ms (restore_bytes)", "ll_set", "ox_rst", True),
        ("restore, new engine + first logits ms", "ll_set", "ox_rl", False),
        ("restore from a cached file ms (Engine.restore)", "ll_set", "ox_file", True),
        ("save into a buffer ms (get_data / snapshot_into)", "ll_save", "ox_into", True),
        ("save to new bytes ms (snapshot_bytes)", "ll_save", "ox_save", True),
    )
    for label, a, b, barred in rows:
        ratio = times[b] / times[a]
        bar = f"  <=1.2x {verdict(ratio <= BAR)}" if barred else ""
        print(f"   {label:45}{times[a] * ms:10.2f}{times[b] * ms:10.2f}{ratio:7.2f}x{bar}")
    print("   the same calls repeated back to back (caches warm, for reference):")
    for label, a, b, _ in rows:
        ratio = hot[b] / hot[a]
        print(f"   {label:45}{hot[a] * ms:10.2f}{hot[b] * ms:10.2f}{ratio:7.2f}x")
    for what, parts in (("restore", st.restore_parts), ("save", st.save_parts)):
        print(f"\n   our {what}, step by step (medians, ms):")
        for k, v in parts.items():
            print(f"     {k:64}{v * ms:8.2f}")
        total = sum(v for k, v in parts.items() if not k.startswith(("(", " ")))
        print(f"     {'sum of the steps of the ' + what:64}{total * ms:8.2f}")

    # 3 ---------------------------------------------------------------------
    rss = asyncio.run(bench_rss(path, args.sessions))
    ll_created, ll_filled, ll_nctx = llama_context_rss(
        ll, tokens[: SESSION_PROMPT + SESSION_GEN], args.llama_contexts
    )
    del ll
    mib = 1 / 2**20
    per_session = rss["per_session"]
    pages = rss["pages_per_session"]
    kv_bytes = pages * rss["page_bytes"]
    n_tok = SESSION_PROMPT + SESSION_GEN
    print(
        f"\n3. RSS per idle session of {n_tok} tokens ({args.sessions} sessions, n_past "
        f"{rss['n_past']:.0f}, {rss['sessions']:.0f} opened)"
    )
    print(
        f"   oxillama: {per_session * mib:.2f} MiB per session; its KV: {pages:.1f} pages "
        f"x {rss['page_bytes'] / 1024:.0f} KiB ({rss['page_tokens']:.0f} positions each) "
        f"= {kv_bytes * mib:.2f} MiB; rest {(per_session - kv_bytes) * mib:+.2f} MiB"
    )
    print(
        f"   idle next-token state: {rss['with_logits']:.0f} sessions hold logits "
        f"({rss['vocab'] * 4 / 1024:.0f} KiB each), {rss['with_hidden']:.0f} a hidden state"
    )
    print(
        f"   llama.cpp: one more context (llama_init_from_model on the loaded llama_model, "
        f"n_ctx {ll_nctx}, medians of {args.llama_contexts}):"
    )
    print(
        f"     {ll_created * mib:.2f} MiB when created, {ll_filled * mib:.2f} MiB holding "
        f"the same {n_tok} tokens"
    )
    r_rss = per_session / ll_filled

    # 4 ---------------------------------------------------------------------
    runs, mixed = asyncio.run(bench_streams(path, args.reps))
    wall = {k: med([r[k].tok_s for r in runs]) for k in runs[0]}
    dec = {k: med([r[k].decode_tok_s for r in runs]) for k in runs[0]}
    t1, t2, sl = wall["t1"], wall["t2"], wall["sl"]
    r_streams = t1 / sl
    print(
        f"\n4. {STREAMS} concurrent streams, {STREAM_PROMPT}-token prompts, {STREAM_GEN} "
        f"generated each, greedy; aggregate tok/s, medians of {args.reps}"
    )
    print(
        f"{'':44}{'wall':>8}{'decode':>8}  (wall: submit to last token; decode: after "
        "the last stream's first token)"
    )
    labels = {
        "t1": "sessions, first turn",
        "sl": "stateless, same prompts",
        "t2": "sessions, second turn",
        "sl2": f"stateless, {2 * STREAM_PROMPT + STREAM_GEN}-token prompt = that context",
    }
    short = {"t1": "turn 1", "sl": "stateless", "t2": "turn 2", "sl2": "stateless, long prompt"}
    for k in ("t1", "sl", "t2", "sl2"):
        print(f"   {labels[k]:41}{wall[k]:8.1f}{dec[k]:8.1f}")
    print(
        f"   first turn / stateless: {r_streams:.2f} wall, {dec['t1'] / dec['sl']:.2f} decode "
        f"(bar >= 0.9 {verdict(r_streams >= 0.9)})"
    )
    print(
        f"   second turn / stateless same prompts: {t2 / sl:.2f} wall, "
        f"{dec['t2'] / dec['sl']:.2f} decode (its context is {STREAM_PROMPT + STREAM_GEN} "
        "positions longer)"
    )
    print(
        f"   second turn / stateless with the same context: {t2 / wall['sl2']:.2f} wall, "
        f"{dec['t2'] / dec['sl2']:.2f} decode"
    )
    print("   scheduler counters per run (medians; hits and preemptions summed over reps):")
    for k in ("t1", "sl", "t2", "sl2"):
        c = {n: med([r[k].counters[n] for r in runs]) for n in COUNTERS}
        hits = sum(r[k].counters["prefix_cache_hits"] for r in runs)
        pre = sum(r[k].counters["preempted"] + r[k].counters["session_swaps"] for r in runs)
        print(
            f"     {short[k]:23} decode steps {c['decode_steps']:4.0f}  tokens "
            f"{c['generated_tokens']:4.0f}  tokens/step "
            f"{c['generated_tokens'] / c['decode_steps']:4.2f}  session tokens "
            f"{c['session_decode_tokens']:4.0f}  turns {c['session_turns']:.0f}  "
            f"prefix hits {hits:.0f}  preempted/swapped {pre:.0f}"
        )
    print(
        f"   2 session + 2 stateless streams together: {mixed['decode_steps']:.0f} decode "
        f"steps for {mixed['generated_tokens']:.0f} tokens, {mixed['mixed_decode_steps']:.0f} "
        "mixed steps (sessions and requests in one forward pass)"
    )

    # table -----------------------------------------------------------------
    print(f"\nwhole bench: {time.perf_counter() - t_start:.0f} s\n")
    print("| measure | llama.cpp | oxillama | ratio | bar |")
    print("|---|---|---|---|---|")
    r_load = times["ox_load"] / times["ll_set"]
    r_into = times["ox_into"] / times["ll_save"]
    print(
        f"| restore {N_TOKENS}-token session into a loaded engine (`load_snapshot` / "
        f"`llama_state_set_data`), ms | {times['ll_set'] * ms:.2f} | "
        f"{times['ox_load'] * ms:.2f} | {r_load:.2f}x | <= 1.2x {verdict(r_load <= BAR)} |"
    )
    print(
        f"| restore into a new engine (`Engine.restore_bytes`), ms | {times['ll_set'] * ms:.2f} | "
        f"{times['ox_rst'] * ms:.2f} ({times['ox_rl'] * ms:.2f} with first logits) | "
        f"{r_restore:.2f}x | <= 1.2x {verdict(r_restore <= BAR)} |"
    )
    r_file = times["ox_file"] / times["ll_set"]
    print(
        f"| restore from a file in the page cache (`Engine.restore`), ms | "
        f"{times['ll_set'] * ms:.2f} (`set_data`) | {times['ox_file'] * ms:.2f} | "
        f"{r_file:.2f}x | <= 1.2x {verdict(r_file <= BAR)} |"
    )
    print(
        f"| save into a buffer (`snapshot_into` / `llama_state_get_data`), ms | "
        f"{times['ll_save'] * ms:.2f} | {times['ox_into'] * ms:.2f} | "
        f"{r_into:.2f}x | <= 1.2x {verdict(r_into <= BAR)} |"
    )
    print(
        f"| save to new `bytes` (`snapshot_bytes`), ms | {times['ll_save'] * ms:.2f} (into "
        f"its buffer) | {times['ox_save'] * ms:.2f} | {r_save:.2f}x | "
        f"<= 1.2x {verdict(r_save <= BAR)} |"
    )
    print(
        f"| RSS per idle {n_tok}-token session, MiB | {ll_filled * mib:.1f} (one context, "
        f"n_ctx {ll_nctx}) | {per_session * mib:.2f} (KV {kv_bytes * mib:.2f}) | "
        f"{r_rss:.3f}x | - |"
    )
    print(
        f"| {STREAMS} session streams vs {STREAMS} stateless, tok/s | - | {t1:.1f} vs {sl:.1f} "
        f"(second turn {t2:.1f}) | {r_streams:.2f} | >= 0.9 {verdict(r_streams >= 0.9)} |"
    )


if __name__ == "__main__":
    main()
