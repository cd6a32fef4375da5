"""The memory-budgeted layer pager (``Engine(..., offload=...)``): the same
logits and tokens as the plain mapping, resident weights that follow the
budget (checked against the kernel's own count in /proc/self/smaps), typed
errors, metrics, snapshots. The Gemma-3 peak-RSS check runs in a child
process, where VmHWM covers nothing but that run."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from oxillama import AsyncEngine, Budget, Engine, Model, ParameterError, PinnedHotSet, SamplerConfig
from oxillama._native import GgufFile
from oxillama.model.offload import policy_from_dict
from oxillama.serving.http.metrics import ServerCollector
from oxillama.sessions.session import parse
from oxillama.snapshot import SnapshotError

PROMPT = "The capital of France is Paris. The capital of Italy is"


def weight_bytes(path: Path) -> int:
    return sum(t[4] for t in GgufFile.open(str(path)).tensors())


def mapped_rss(path: Path) -> int:
    """Bytes of ``path``'s mappings resident in this process (smaps)."""
    real = os.path.realpath(path)
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="utf-8") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                inside = len(head) >= 6 and head[5] == real
            elif inside and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


def page_cached(path: Path) -> int:
    """Bytes of ``path`` in the page cache (mincore over a fresh mapping,
    which faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    n_pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * n_pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        view = np.frombuffer(mm, dtype=np.uint8)
        rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), size, vec)
        del view
    assert rc == 0, ctypes.get_errno()
    return int((np.frombuffer(vec, dtype=np.uint8) & 1).sum()) * mmap.PAGESIZE


@pytest.fixture
def model(model_path: Path) -> Iterator[Model]:
    """The process's SmolLM2 model, back to the plain mapping afterwards
    (other tests share it)."""
    m = Model(model_path)
    m.set_offload(None)
    yield m
    m.set_offload(None)


def run(model: Model, n: int = 4) -> tuple[np.ndarray, list[int]]:
    e = Engine(model, context_size=128, threads=2, sampler=SamplerConfig.greedy())
    logits = e.eval(e.tokenize(PROMPT), all_logits=True)
    return logits, e.generate("", n).tokens


@pytest.mark.parametrize(
    "make",
    [
        lambda w: Budget(w // 4),
        lambda w: PinnedHotSet(w // 2, layers=(0, -1)),
        lambda w: PinnedHotSet(w // 2 + w // 3, embeddings=True),
        lambda w: Budget(w // 4, evict="furthest"),
        lambda w: PinnedHotSet(w // 2, layers=(1,), evict="furthest"),
    ],
    ids=["budget25", "pinned_layers", "pinned_head", "furthest25", "pinned_furthest"],
)
def test_same_logits_and_tokens_as_the_plain_mapping(model, model_path, make) -> None:
    ref_logits, ref_tokens = run(model)
    policy = make(weight_bytes(model_path))
    model.set_offload(policy)
    logits, tokens = run(model)
    assert tokens == ref_tokens
    assert logits.shape == ref_logits.shape
    assert logits.tobytes() == ref_logits.tobytes()  # every prefill row, bit for bit
    m = Engine(model).metrics()
    assert m["offload_budget"] == policy.n_bytes
    assert 0 < m["offload_peak_resident_bytes"] <= policy.n_bytes
    assert m["offload_resident_bytes"] <= policy.n_bytes
    assert m["offload_layer_loads"] > 0 and m["offload_bytes_read"] > 0


def test_resident_pages_follow_the_budget(model, model_path) -> None:
    w = weight_bytes(model_path)
    budget = w // 4
    model.set_offload(Budget(budget))
    # Loading faulted in the header and the norm vectors; the pager dropped
    # every page it did not make resident.
    assert mapped_rss(model_path) <= 64 << 10
    e = Engine(model, context_size=64, threads=2, sampler=SamplerConfig.greedy())
    for _ in range(3):
        e.generate(PROMPT, 4)
        e.reset()
        rss = mapped_rss(model_path)
        # Read-ahead units are counted by the pager but not yet mapped.
        # The kernel's fault-around maps up to 64 KiB of already cached
        # neighbours with each fault, on either side of a unit.
        assert 0 < rss <= budget + (1 << 20), (rss, budget)
    stats = e.metrics()
    assert stats["offload_evictions"] > 0
    # Cyclic access under LRU: every unpinned unit is read again each pass.
    assert stats["offload_bytes_read"] >= stats["offload_passes"] * w // 2
    # Without the pager the same run maps the whole model, less a tied
    # embedding table: once its head is packed for decode (CPUs with the
    # packed kernels), its file pages leave the process and only the rows
    # looked up come back.
    model.set_offload(None)
    e.generate(PROMPT, 4)
    names = {t[0]: t[4] for t in GgufFile.open(str(model_path)).tensors()}
    tied = names.get("token_embd.weight", 0) if "output.weight" not in names else 0
    assert mapped_rss(model_path) > (w - tied) * 9 // 10


def test_evicted_units_leave_the_page_cache(model_path, tmp_path) -> None:
    """On a private copy of the file (other processes on this machine map
    the installed one, and the kernel never drops pages a process maps)."""
    copy = tmp_path / "copy.gguf"
    with open(model_path, "rb") as src, open(copy, "wb") as dst:
        while chunk := src.read(16 << 20):
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
        os.posix_fadvise(dst.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    w = weight_bytes(copy)
    budget = w // 4
    m = Model(copy)
    m.set_offload(Budget(budget))
    e = Engine(m, context_size=64, threads=2, sampler=SamplerConfig.greedy())
    for _ in range(2):
        e.generate(PROMPT, 4)
        e.reset()
        # Whole folios are dropped, so none straddling a unit's edge stays
        # behind; what exceeds the budget is folios resident units share
        # with their neighbours and the kernel's read-ahead past a unit.
        cached = page_cached(copy)
        assert cached <= budget + (8 << 20), (cached, budget)
    m.set_offload(None)
    e.generate(PROMPT, 4)
    assert page_cached(copy) > w * 9 // 10


def test_pinned_units_stay_mapped(model, model_path) -> None:
    w = weight_bytes(model_path)
    model.set_offload(PinnedHotSet(w // 2, layers=(0, 1, -1)))
    m = Engine(model).metrics()
    pinned = m["offload_pinned_bytes"]
    assert pinned > 0 and m["offload_resident_bytes"] == pinned
    assert mapped_rss(model_path) >= pinned - (64 << 10)
    e = Engine(model, context_size=64, threads=2, sampler=SamplerConfig.greedy())
    e.generate(PROMPT, 3)
    loads = Engine(model).metrics()["offload_layer_loads"]
    e.generate("", 3)
    after = Engine(model).metrics()
    # Each pass loads every unpinned unit again, never the three pinned ones.
    n_layer = int(model.config["n_layer"])
    assert after["offload_layer_loads"] - loads >= 3 * (n_layer - 3)
    assert after["offload_resident_bytes"] >= pinned


def test_budget_too_small_names_the_sizes(model, model_path) -> None:
    with pytest.raises(ParameterError, match=r"budget of 1000000 bytes is too small.*layer \d+"):
        model.set_offload(Budget(1_000_000))
    w = weight_bytes(model_path)
    with pytest.raises(ParameterError, match=r"pinned set \(\d+ bytes\)"):
        Engine(model, offload=PinnedHotSet(w // 4, embeddings=True))
    assert model.offload is None  # nothing half-applied
    assert run(model, 2)[1]


@pytest.mark.parametrize(
    "bad",
    [
        lambda: Budget(0),
        lambda: Budget(-5),
        lambda: Budget(True),
        lambda: Budget(1.5e9),  # type: ignore[arg-type]
        lambda: PinnedHotSet(10**9, layers="01"),  # type: ignore[arg-type]
        lambda: PinnedHotSet(10**9, layers=(1, 1)),
        lambda: PinnedHotSet(10**9, layers=(0.5,)),  # type: ignore[arg-type]
        lambda: PinnedHotSet(10**9, embeddings="yes"),  # type: ignore[arg-type]
        lambda: Budget(10**9, evict="mru"),
        lambda: PinnedHotSet(10**9, evict=None),  # type: ignore[arg-type]
    ],
)
def test_bad_policy_values_are_parameter_errors(bad) -> None:
    with pytest.raises(ParameterError):
        bad()


def test_bad_policies_at_the_engine(model) -> None:
    with pytest.raises(ParameterError, match="offload must be None"):
        Engine(model, offload="cpu")  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="layer 30 does not exist"):
        Engine(model, offload=PinnedHotSet(10**9, layers=(30,)))
    with pytest.raises(ParameterError, match="loaded from bytes"):
        Engine.from_bytes(Path(model.model_path).read_bytes(), offload=Budget(10**9))
    model.set_offload(Budget(10**8))
    with pytest.raises(ParameterError, match="already runs"):
        Engine(model, offload=Budget(10**8 + 1))
    assert Engine(model, offload=Budget(10**8)).offload == Budget(10**8)
    assert Engine(model).offload == Budget(10**8)  # None leaves the model's policy


def test_concurrent_sessions_share_the_budget(model, model_path) -> None:
    ref = run(model, 4)[1]
    model.set_offload(Budget(weight_bytes(model_path) // 3))
    out: list[list[int]] = [[], [], []]

    def work(i: int) -> None:
        out[i] = run(model, 4)[1]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [ref, ref, ref]
    m = Engine(model).metrics()
    assert m["offload_peak_resident_bytes"] <= m["offload_budget"]


def test_snapshot_records_and_reapplies_the_policy(model, model_path, tmp_path) -> None:
    policy = PinnedHotSet(weight_bytes(model_path) // 2, layers=(0, -1))
    e = Engine(model, context_size=64, sampler=SamplerConfig.greedy(), offload=policy)
    e.generate(PROMPT, 3)
    path = tmp_path / "s.oxisnap"
    e.snapshot(path)
    want = e.generate("", 6).tokens
    meta, _ = parse(path.read_bytes())
    assert meta["engine"]["offload"] == {
        "policy": "pinned_hot_set",
        "n_bytes": policy.n_bytes,
        "layers": [0, -1],
        "embeddings": False,
        "output": False,
        "evict": "lru",
    }
    model.set_offload(None)
    back = Engine.restore(path)
    assert back.model is model and model.offload == policy
    assert back.generate("", 6).tokens == want
    # A different policy already in force is not silently replaced.
    model.set_offload(Budget(10**8))
    with pytest.raises(SnapshotError, match="offload"):
        Engine.restore(path)
    assert model.offload == Budget(10**8)


def test_snapshot_without_policy_reads_as_cpu(model, tmp_path) -> None:
    e = Engine(model, context_size=64, sampler=SamplerConfig.greedy())
    e.generate(PROMPT, 2)
    blob = e.snapshot_bytes()
    assert b'"offload":"cpu"' in blob.replace(b" ", b"")
    assert Engine.restore_bytes(blob).offload is None


def test_async_engine_and_server_metrics(model, model_path) -> None:
    import asyncio

    budget = Budget(weight_bytes(model_path) // 2)

    async def main() -> dict[str, float | int]:
        async with AsyncEngine(model, context_size=64, offload=budget) as ai:
            await ai.generate(PROMPT, 3)
            return ai.metrics()

    m = asyncio.run(main())
    assert m["offload_budget"] == budget.n_bytes and m["offload_bytes_read"] > 0
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(ServerCollector(lambda: m))
    text = generate_latest(registry).decode()
    assert "# TYPE oxillama:offload_bytes_read_total counter" in text
    assert "# TYPE oxillama:offload_resident_bytes gauge" in text


CHILD = r"""
import json, sys
from oxillama import Engine, Budget, SamplerConfig
from oxillama._native import GgufFile

path, frac = sys.argv[1], float(sys.argv[2])
weights = sum(t[4] for t in GgufFile.open(path).tensors())
budget = int(weights * frac)
e = Engine(path, context_size=128, threads=2, sampler=SamplerConfig.greedy(),
           offload=Budget(budget, evict="furthest") if budget else None)

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM restarts from the current RSS
tokens = e.generate("The capital of France is", 3).tokens
c = e.model.config
kv = 128 * c["n_head_kv"] * (c["dim_k"] + c["dim_v"]) * 2 * c["n_layer"]
print(json.dumps({"base": base, "hwm": status("VmHWM"), "budget": budget, "kv": kv,
                  "tokens": tokens, "metrics": e.metrics()}))
"""


def test_gemma3_peak_rss_within_budget_kv_and_overhead() -> None:
    """At 50% and 25% of Gemma-3-270M's weights (a child process per
    budget, so VmHWM is that run's peak; 3 greedy tokens, few because every
    pass rereads what the budget does not hold, and this VM's disk is
    rate-limited after a burst; ``furthest`` eviction reads the least):
    peak RSS <= RSS before the first
    token + budget + KV + 24 MiB (activations, the head's logits, the
    allocator)."""
    from tests._gguf_meta import gemma3_path

    path = str(gemma3_path())
    runs = {}
    for frac in (0.0, 0.5, 0.25):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, path, str(frac)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, (frac, out.returncode, out.stderr[-2000:])
        runs[frac] = json.loads(out.stdout.strip().splitlines()[-1])
    for frac in (0.5, 0.25):
        r = runs[frac]
        assert r["tokens"] == runs[0.0]["tokens"]
        assert r["hwm"] <= r["base"] + r["budget"] + r["kv"] + (24 << 20), r
        assert r["metrics"]["offload_peak_resident_bytes"] <= r["budget"]
    # The unbudgeted run maps the whole model: the bound above is not slack.
    full = runs[0.0]
    assert full["hwm"] - full["base"] > runs[0.5]["budget"] + (24 << 20)


def test_furthest_eviction_reads_the_model_minus_the_budget(model, model_path) -> None:
    w = weight_bytes(model_path)
    per_pass = {}
    for evict in ("lru", "furthest"):
        model.set_offload(Budget(w // 2, evict=evict))
        e = Engine(model, context_size=64, threads=2, sampler=SamplerConfig.greedy())
        e.generate(PROMPT, 2)
        before = e.metrics()
        e.generate("", 4)
        after = e.metrics()
        passes = after["offload_passes"] - before["offload_passes"]
        per_pass[evict] = (after["offload_bytes_read"] - before["offload_bytes_read"]) / passes
        assert after["offload_peak_resident_bytes"] <= w // 2
    # LRU rereads everything; furthest keeps half the model across passes.
    assert per_pass["lru"] > w * 0.95
    assert per_pass["furthest"] < w * 0.6, per_pass


@pytest.mark.parametrize(
    "bad",
    [
        "gpu",
        7,
        {"policy": "budget", "n_bytes": 10},
        {"policy": "budget", "n_bytes": -1, "evict": "lru"},
        {"policy": "budget", "n_bytes": 10, "evict": "lru", "extra": 1},
        {
            "policy": "pinned_hot_set",
            "n_bytes": 10,
            "layers": 3,
            "embeddings": False,
            "output": False,
            "evict": "lru",
        },
        {"policy": "mystery", "n_bytes": 10, "evict": "lru"},
    ],
)
def test_snapshot_offload_values_are_checked(bad) -> None:
    with pytest.raises(ValueError):
        policy_from_dict(bad)


def test_snapshot_offload_values_round_trip() -> None:
    assert policy_from_dict("cpu") is None
    for p in (Budget(5, evict="furthest"), PinnedHotSet(9, layers=(0, -1), output=True)):
        assert policy_from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_serve_with_an_offload_budget_reports_it_in_metrics(model_path, tmp_path) -> None:
    import socket
    import time
    import urllib.request

    import openai

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    budget = weight_bytes(model_path) // 3
    cmd = [sys.executable, "-m", "oxillama", "serve", "--model", str(model_path)]
    cmd += ["--port", str(port), "--threads", "2", "--context-size", "128"]
    cmd += ["--model-name", "smol", "--offload-budget", str(budget), "--offload-evict", "furthest"]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.05)
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        got = client.completions.create(model="smol", prompt=PROMPT, max_tokens=6, temperature=0)
        metrics = urllib.request.urlopen(url + "/metrics").read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    want = Engine(model_path, context_size=128, sampler=SamplerConfig.greedy()).generate(PROMPT, 6)
    assert got.choices[0].text == want.text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("oxillama:offload_")
    }
    assert values["oxillama:offload_budget_bytes"] == budget
    assert 0 < values["oxillama:offload_peak_resident_bytes"] <= budget
    assert values["oxillama:offload_bytes_read_total"] > 0
    assert "# TYPE oxillama:offload_evictions_total counter" in metrics
