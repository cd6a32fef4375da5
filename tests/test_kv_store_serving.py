"""The prefix store under the batching scheduler and the server: the prefix
cache as the memory tier, then the folder after a restart and Redis from
another server, exact for each KV type; the flags (also as Ray replicas
get them), /metrics, and the folder's byte bound."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from oxillama import AsyncEngine, Engine, ParameterError, SamplerConfig
from oxillama.kv_store import open_store
from oxillama.kv_store.disk import DiskTier
from oxillama.serving.flags import serve_options_from_mapping
from tests._kv_store_text import prompt
from tests._redis import RedisServer, redis_server

PROMPT = prompt(16)  # 352 tokens: one block and more
#: Restored: whole pages that leave at least one token to evaluate.
SAVED = 336
N_GEN = 10


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as r:
        yield r


def _run(engine: AsyncEngine, n: int) -> list[list[int]]:
    async def go() -> list[list[int]]:
        outs = []
        for _ in range(n):
            c = await engine.generate(PROMPT, N_GEN, sampler=SamplerConfig.greedy())
            outs.append(c.tokens)
        await engine.close()
        return outs

    return asyncio.run(go())


@pytest.mark.parametrize("kv_dtype", ["f16", "q8_0", "q4_0"])
def test_memory_then_folder_then_redis_are_exact(
    kv_dtype: str, model_path: Path, redis: RedisServer, tmp_path: Path
) -> None:
    url = redis.url(1 + ["f16", "q8_0", "q4_0"].index(kv_dtype))
    kw = {"context_size": 512, "threads": 2, "kv_dtype": kv_dtype}
    first = AsyncEngine(model_path, kv_store=[tmp_path, url], **kw)  # type: ignore[arg-type]
    cold, warm = _run(first, 2)
    m = first.metrics()
    assert m["kv_store_hits_disk"] == m["kv_store_hits_redis"] == 0  # the first was cold
    assert m["kv_store_hits_memory"] == 1  # the second found the prefix cache
    assert m["kv_store_tokens_saved_memory"] > 256
    # A whole block, and partial ones up to the prompt and to the context.
    assert m["kv_store_writes_disk"] == m["kv_store_writes_redis"] == 3
    assert warm == cold
    # A restart: a new engine on the same folder restores from it.
    again = AsyncEngine(model_path, kv_store=tmp_path, **kw)  # type: ignore[arg-type]
    assert _run(again, 1) == [cold]
    m = again.metrics()
    assert (m["kv_store_hits_disk"], m["kv_store_tokens_saved_disk"]) == (2, SAVED)
    # Another process sharing only Redis.
    other = AsyncEngine(model_path, kv_store=url, **kw)  # type: ignore[arg-type]
    assert _run(other, 1) == [cold]
    assert other.metrics()["kv_store_hits_redis"] == 2


def test_adapter_requests_are_stored_under_their_adapter(model_path: Path, tmp_path: Path) -> None:
    """A request with a LoRA adapter stores its blocks under the adapter's
    key: a restart restores them for the same adapter, exactly, and a
    request without it does not find them."""
    from tests.lora import cases

    adapter = tmp_path / "smol_a.gguf"
    cases.smol_a(model_path, adapter)
    folder = tmp_path / "store"
    kw = {"context_size": 512, "threads": 2, "loras": {"a": str(adapter)}}

    def run(engine: AsyncEngine, lora: str | None) -> list[int]:
        async def go() -> list[int]:
            c = await engine.generate(PROMPT, N_GEN, sampler=SamplerConfig.greedy(), lora=lora)
            await engine.close()
            return c.tokens

        return asyncio.run(go())

    first = AsyncEngine(model_path, kv_store=folder, **kw)  # type: ignore[arg-type]
    tuned = run(first, "a")
    assert first.metrics()["kv_store_writes_disk"] == 3
    again = AsyncEngine(model_path, kv_store=folder, **kw)  # type: ignore[arg-type]
    assert run(again, "a") == tuned
    m = again.metrics()
    assert (m["kv_store_hits_disk"], m["kv_store_tokens_saved_disk"]) == (2, SAVED)
    base = AsyncEngine(model_path, kv_store=folder, **kw)  # type: ignore[arg-type]
    run(base, None)
    m = base.metrics()
    assert (m["kv_store_hits_disk"], m["kv_store_misses_disk"]) == (0, 1)


def test_flags_reach_the_app_spec_and_ray() -> None:
    spec, _ = serve_options_from_mapping(
        {
            "model": "m.gguf",
            "sessions_dir": "/s",
            "kv_store": ["/cache", "redis://10.0.0.5:6379/0"],
            "kv_store_bytes": "2G",
        }
    )
    assert spec.kv_store == ("/cache", "redis://10.0.0.5:6379/0")
    assert spec.kv_store_bytes == 2 << 30


def test_disk_bound_evicts_least_recently_used(tmp_path: Path) -> None:
    size = 10_000
    tier = DiskTier(tmp_path, max_bytes=3 * size + 100)
    keys = [bytes([i]) * 32 for i in range(6)]
    for i, k in enumerate(keys[:3]):
        assert tier.put(k, bytes([i]) * size)
        time.sleep(0.02)  # distinct modification times
    assert tier.get(keys[0]) is not None  # used again: now the most recent
    time.sleep(0.02)
    for k in keys[3:5]:
        tier.put(k, b"x" * size)
        time.sleep(0.02)
    assert tier.bytes_used() <= 3 * size + 100
    held = tier.has_many(keys)
    assert held == [True, False, False, True, True, False]
    # A block larger than the bound is not written at all.
    assert not tier.put(keys[5], b"y" * (4 * size))
    assert tier.bytes_used() <= 3 * size + 100


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(
    model_path: Path, *store: str, bound: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    args = [sys.executable, "-m", "oxillama", "serve", "--model", str(model_path)]
    args += ["--port", str(port), "--threads", "2", "--context-size", "512"]
    for s in store:
        args += ["--kv-store", s]
    if bound is not None:
        args += ["--kv-store-bytes", bound]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        assert proc.poll() is None, "the server exited"
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server did not come up")


def _complete(url: str) -> str:
    body = {"prompt": PROMPT, "max_tokens": N_GEN, "temperature": 0}
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return str(json.loads(r.read())["choices"][0]["text"])


def _metric(url: str, family: str, tier: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    line = f'oxillama:kv_store_{family}_total{{tier="{tier}"}} '
    found = [ln for ln in text.splitlines() if ln.startswith(line)]
    assert found, f"no {line.strip()} in /metrics"
    return float(found[0].split()[-1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)  # a graceful stop: queued blocks are written
    assert proc.wait(timeout=60) == 0


def test_server_flags_and_metrics(model_path: Path, redis: RedisServer, tmp_path: Path) -> None:
    folder = str(tmp_path / "kv")
    shared = redis.url(7)
    proc, url = _serve(model_path, folder, shared, bound="100M")
    try:
        cold = _complete(url)
        assert _complete(url) == cold
        assert _metric(url, "hits", "memory") == 1
        assert _metric(url, "tokens_saved", "memory") > 256
        assert _metric(url, "misses", "disk") == 1
        assert _metric(url, "misses", "redis") == 1
    finally:
        _stop(proc)
    assert list(Path(folder).rglob("*.kvb"))
    # A second server that shares only Redis restores from it.
    proc, url = _serve(model_path, shared)
    try:
        assert _complete(url) == cold
        assert _metric(url, "hits", "redis") == 2
        assert _metric(url, "tokens_saved", "redis") == SAVED
        assert _metric(url, "corrupt_blocks", "redis") == 0
    finally:
        _stop(proc)


@pytest.mark.parametrize(
    ("spec", "bound", "words"),
    [
        ("s3://bucket/kv", None, "unsupported tier 's3://bucket/kv'"),
        ("redis://127.0.0.1:6379/0", 1 << 20, "kv_store_bytes needs a kv_store directory"),
        (["/nonexistent/a-kv", "/nonexistent/b-kv"], None, "at most one disk tier"),
        (42, None, "expected a folder, a redis:// URL or a list"),
    ],
)
def test_bad_store_options_are_refused_by_name(spec: object, bound: int | None, words: str) -> None:
    with pytest.raises(ParameterError, match=re.escape(words)):
        open_store(spec, bound)  # type: ignore[arg-type]


def test_recurrent_models_refuse_the_store_by_name(tmp_path: Path) -> None:
    from tests.models import _checks as arch

    path = arch.reference("mamba2").path
    with pytest.raises(ParameterError, match="'mamba2' is a recurrent model"):
        Engine(path, context_size=64, kv_store=tmp_path)
    with pytest.raises(ParameterError, match="'mamba2' is a recurrent model"):
        AsyncEngine(path, context_size=64, kv_store=tmp_path)


def test_a_dead_writers_temporary_file_is_cleared(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, max_bytes=100)
    sub = tmp_path / "ab"
    sub.mkdir()
    stale, fresh = sub / ".x.kvb.1.dead.tmp", sub / ".y.kvb.2.live.tmp"
    stale.write_bytes(b"half a block")
    fresh.write_bytes(b"being written")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    assert tier.put(b"\x01" * 32, b"z" * 200) is False  # larger than the bound
    assert tier.put(b"\x02" * 32, b"z" * 60)
    assert not stale.exists() and fresh.exists()


def test_session_turns_use_the_store(model_path: Path, tmp_path: Path) -> None:
    """A session's first turn is stored as it ends; a session of a new
    engine on the same folder restores it, and its second turn (whose
    prompt extends the first's context) is exact too."""
    more = "\nQuestion: Who carried the copper kettle?\nAnswer:"

    async def two_turns(engine: AsyncEngine) -> list[list[int]]:
        s = engine.session(sampler=SamplerConfig.greedy())
        first = await s.generate(PROMPT, N_GEN)
        second = await s.generate(more, N_GEN)
        await s.close()
        await engine.close()
        return [first.tokens, second.tokens]

    kw = {"context_size": 512, "threads": 2}
    cold_engine = AsyncEngine(model_path, kv_store=tmp_path, **kw)  # type: ignore[arg-type]
    cold = asyncio.run(two_turns(cold_engine))
    m = cold_engine.metrics()
    assert m["kv_store_hits_disk"] == 0 and m["kv_store_writes_disk"] >= 3
    warm_engine = AsyncEngine(model_path, kv_store=tmp_path, **kw)  # type: ignore[arg-type]
    assert asyncio.run(two_turns(warm_engine)) == cold
    m = warm_engine.metrics()
    # The first turn's prompt; the second turn's few new positions are not
    # worth re-importing the whole context for.
    assert (m["kv_store_hits_disk"], m["kv_store_tokens_saved_disk"]) == (2, SAVED)
