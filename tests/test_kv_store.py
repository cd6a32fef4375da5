"""The prefix store under an Engine: exact restores from the folder and
from Redis for each KV type, a restart in a new process, corrupt blocks,
a failing disk, a Redis that stops, keys that never cross models, KV types
or adapters."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oxillama import Engine, SamplerConfig
from oxillama.engine.kv_types import kv_position_bytes
from oxillama.errors import ParameterError
from oxillama.kv_store.blockfile import MAGIC
from oxillama.kv_store.disk import SUFFIX
from oxillama.kv_store.key import CHUNK, PAGES_PER_CHUNK, StoreContext, chain
from tests._kv_store_text import prompt
from tests._redis import RedisServer, redis_server

PROMPT = prompt(28)  # 609 tokens: two blocks, and 96 positions in a third
#: Restored: whole pages that leave at least one token to evaluate.
SAVED = 608
N_GEN = 12


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as r:
        yield r


def _engine(model_path: Path, kv_dtype: str = "f16", **kw: object) -> Engine:
    return Engine(
        model_path,
        context_size=1024,
        threads=2,
        sampler=SamplerConfig.greedy(),
        kv_dtype=kv_dtype,
        **kw,  # type: ignore[arg-type]
    )


def _blocks(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*" + SUFFIX))


class Stored:
    """A cold generation that wrote its blocks to a folder and to Redis."""

    def __init__(self, folder: Path, url: str, tokens: list[int], kv_dtype: str = "f16") -> None:
        self.folder, self.url, self.tokens, self.kv_dtype = folder, url, tokens, kv_dtype


_DBS = {"f16": 1, "q8_0": 2, "q4_0": 3, "q8_0/f16": 4}


@pytest.fixture(scope="module", params=list(_DBS))
def stored(
    request: pytest.FixtureRequest,
    model_path: Path,
    redis: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Stored:
    kv_dtype = request.param
    folder = tmp_path_factory.mktemp("store-" + kv_dtype.replace("/", "-"))
    url = redis.url(_DBS[kv_dtype])
    e = _engine(model_path, kv_dtype, kv_store=[folder, url])
    out = e.generate(PROMPT, N_GEN)
    assert e.kv_store is not None
    e.kv_store.flush()
    m = e.metrics()
    # A cold prefill: nothing was stored yet, so this is the reference.
    assert m["kv_store_hits_disk"] == m["kv_store_hits_redis"] == 0
    # Two whole blocks and the prompt's partial one.
    assert m["kv_store_writes_disk"] == m["kv_store_writes_redis"] == 3
    assert len(out.tokens) == N_GEN
    return Stored(folder, url, out.tokens, kv_dtype)


def test_blocks_are_in_the_kv_type(stored: Stored, model_path: Path) -> None:
    e = _engine(model_path)
    c = e.config
    files = _blocks(stored.folder)
    assert len(files) == 3
    shape = (c["n_layer"], c["n_head_kv"], c["dim_k"], c["dim_v"])
    per_pos = kv_position_bytes(stored.kv_dtype, *shape)
    sizes = []
    for f in files:
        data = f.read_bytes()
        assert data[:8] == MAGIC
        sizes.append(len(data))
    # Header (52 bytes), payload, checksum (16 bytes).
    assert sorted(sizes) == sorted(52 + n * per_pos + 16 for n in (CHUNK, CHUNK, SAVED - 2 * CHUNK))


def test_restore_from_folder_is_exact(stored: Stored, model_path: Path) -> None:
    e = _engine(model_path, stored.kv_dtype, kv_store=stored.folder)
    out = e.generate(PROMPT, N_GEN)
    m = e.metrics()
    assert m["kv_store_hits_disk"] == 3
    assert m["kv_store_tokens_saved_disk"] == SAVED
    assert m["kv_store_bytes_saved_disk"] > 0
    assert out.tokens == stored.tokens


def test_restore_from_redis_is_exact(stored: Stored, model_path: Path) -> None:
    e = _engine(model_path, stored.kv_dtype, kv_store=stored.url)
    out = e.generate(PROMPT, N_GEN)
    m = e.metrics()
    assert m["kv_store_hits_redis"] == 3
    assert m["kv_store_tokens_saved_redis"] == SAVED
    assert out.tokens == stored.tokens


@pytest.fixture(scope="module")
def f16(model_path: Path, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Stored:
    folder = tmp_path_factory.mktemp("store-f16-ref")
    e = _engine(model_path, kv_store=folder)
    out = e.generate(PROMPT, N_GEN)
    assert e.kv_store is not None
    e.kv_store.flush()
    assert e.metrics()["kv_store_hits_disk"] == 0
    return Stored(folder, "", out.tokens)


_CHILD = """
import json, sys
from oxillama import Engine, SamplerConfig
e = Engine(sys.argv[1], context_size=1024, threads=2, sampler=SamplerConfig.greedy(),
           kv_store=sys.argv[2])
out = e.generate(sys.argv[3], int(sys.argv[4]))
print(json.dumps({"tokens": out.tokens, "metrics": e.metrics()}))
"""


def _child(model_path: Path, store: str, text: str = PROMPT) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(model_path), store, text, str(N_GEN)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def test_restart_in_a_new_process_hits_the_folder(f16: Stored, model_path: Path) -> None:
    r = _result(_child(model_path, str(f16.folder)))
    m = r["metrics"]
    assert isinstance(m, dict)
    assert (m["kv_store_hits_disk"], m["kv_store_tokens_saved_disk"]) == (3, SAVED)
    assert r["tokens"] == f16.tokens


def test_flipped_byte_is_a_counted_miss(f16: Stored, model_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "store"
    shutil.copytree(f16.folder, folder)
    e = _engine(model_path, kv_store=folder)
    root = e._store.root() if e._store is not None else b""
    pages = chain(root, e.tokenize(PROMPT, add_special=True), 2 * PAGES_PER_CHUNK)
    second = next(p for p in _blocks(folder) if p.stem == pages[-1].hex())
    data = bytearray(second.read_bytes())
    data[len(data) // 2] ^= 0x40
    second.write_bytes(bytes(data))
    out = e.generate(PROMPT, N_GEN)
    m = e.metrics()
    assert m["kv_store_corrupt_blocks_disk"] == 1
    assert m["kv_store_hits_disk"] == 1  # the first block still restores
    assert m["kv_store_tokens_saved_disk"] == CHUNK
    assert out.tokens == f16.tokens
    # The damaged block was dropped and stored again, whole.
    assert e.kv_store is not None
    e.kv_store.flush()
    assert second.read_bytes() == (f16.folder / second.relative_to(folder)).read_bytes()


def test_truncated_file_is_a_counted_miss(f16: Stored, model_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "store"
    shutil.copytree(f16.folder, folder)
    e = _engine(model_path, kv_store=folder)
    root = e._store.root() if e._store is not None else b""
    pages = chain(root, e.tokenize(PROMPT, add_special=True), 2 * PAGES_PER_CHUNK)
    second = next(p for p in _blocks(folder) if p.stem == pages[-1].hex())
    second.write_bytes(second.read_bytes()[:1000])
    out = e.generate(PROMPT, N_GEN)
    m = e.metrics()
    assert m["kv_store_corrupt_blocks_disk"] == 1
    assert m["kv_store_hits_disk"] == 1
    assert out.tokens == f16.tokens


def test_failing_disk_degrades_to_redis(
    f16: Stored, model_path: Path, redis: RedisServer, tmp_path: Path
) -> None:
    folder = tmp_path / "store"
    url = redis.url(5)
    e = _engine(model_path, kv_store=[folder, url])
    # The folder turns into a file: every write into it fails (as a full
    # disk's would), and the store goes on with Redis.
    shutil.rmtree(folder)
    folder.write_bytes(b"not a folder")
    out = e.generate(PROMPT, N_GEN)
    assert e.kv_store is not None
    e.kv_store.flush()
    m = e.metrics()
    assert out.tokens == f16.tokens
    assert m["kv_store_errors_disk"] >= 1
    assert m["kv_store_writes_redis"] == 3
    again = _engine(model_path, kv_store=url)
    assert again.generate(PROMPT, N_GEN).tokens == f16.tokens
    assert again.metrics()["kv_store_hits_redis"] == 3
    # A folder that cannot be made is a configuration error, named at once.
    with pytest.raises(ParameterError, match="cannot create the folder"):
        _engine(model_path, kv_store=[folder, url])


def test_redis_stopped_mid_run_degrades(f16: Stored, model_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "store"
    shutil.copytree(f16.folder, folder)
    r = RedisServer(tmp_path)
    try:
        e = _engine(model_path, kv_store=[r.url(), folder])
        assert e.generate(PROMPT, N_GEN).tokens == f16.tokens
        assert e.kv_store is not None
        e.kv_store.flush()
        m = e.metrics()
        # Found in the folder, and copied up into the faster-listed Redis.
        assert m["kv_store_hits_disk"] == 3
        assert m["kv_store_writes_redis"] == 3
        e.reset()
        assert e.generate(PROMPT, N_GEN).tokens == f16.tokens
        assert e.metrics()["kv_store_hits_redis"] == 3  # now Redis serves them
    finally:
        r.stop()
    # Redis dies under the running engine: its lookup fails, counted and
    # logged, and the folder serves the next request; no error reaches it.
    e.reset()
    out = e.generate(PROMPT, N_GEN)
    m = e.metrics()
    assert out.tokens == f16.tokens
    assert m["kv_store_errors_redis"] >= 1
    assert (m["kv_store_hits_redis"], m["kv_store_hits_disk"]) == (3, 6)


def test_two_processes_write_the_same_blocks(f16: Stored, model_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    text = prompt(16)  # one block and more
    procs = [_child(model_path, str(folder), text) for _ in range(2)]
    results = [_result(p) for p in procs]
    assert results[0]["tokens"] == results[1]["tokens"]
    # One whole block, and partial ones up to the prompt and the context.
    files = _blocks(folder)
    assert len(files) == 3
    assert not [p for p in folder.rglob("*.tmp")]
    e = _engine(model_path, kv_store=folder)
    out = e.generate(text, N_GEN)
    m = e.metrics()
    assert (m["kv_store_hits_disk"], m["kv_store_tokens_saved_disk"]) == (2, 336)
    assert m["kv_store_corrupt_blocks_disk"] == 0
    assert out.tokens == results[0]["tokens"]


def test_another_kv_type_never_matches(f16: Stored, model_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "store"
    shutil.copytree(f16.folder, folder)
    e = _engine(model_path, "q8_0", kv_store=folder)
    e.generate(prompt(16), 1)
    m = e.metrics()
    assert m["kv_store_hits_disk"] == 0
    assert m["kv_store_misses_disk"] == 1


def test_keys_cover_model_kv_type_and_adapters() -> None:
    fp = {"size": 1, "probe": 8, "head_blake3": "a", "tail_blake3": "b"}
    rope = {"rope_base": 10000.0, "rope_dims": 64}
    base = StoreContext(fp, "f16", (0, 0), rope, ())
    others = [
        StoreContext({**fp, "size": 2}, "f16", (0, 0), rope, ()),
        StoreContext(fp, "q8_0", (0, 0), rope, ()),
        StoreContext(fp, "f16", (64, 0), rope, ()),
        StoreContext(fp, "f16", (0, 0), {**rope, "rope_base": 500000.0}, ()),
        StoreContext(fp, "f16", (0, 0), rope, (("digest", 1.0),)),
        StoreContext(fp, "f16", (0, 0), rope, (("digest", 0.5),)),
    ]
    roots = {base.root(), *(o.root() for o in others)}
    assert len(roots) == 1 + len(others)
    toks = list(range(3 * CHUNK))
    n = 3 * PAGES_PER_CHUNK
    a = chain(base.root(), toks, n)
    b = chain(base.root(), [*toks[:CHUNK], 7, *toks[CHUNK + 1 :]], n)
    # The pages before the changed token agree; every later one covers it.
    k = PAGES_PER_CHUNK
    assert a[:k] == b[:k]
    assert all(x != y for x, y in zip(a[k:], b[k:], strict=True))


def test_construction_reads_nothing(tmp_path: Path, model_path: Path) -> None:
    folder = tmp_path / "new" / "store"
    e = _engine(model_path, kv_store=[folder, "redis://127.0.0.1:1/0"])
    assert folder.is_dir()  # a missing folder is created
    m = e.metrics()
    assert sum(v for k, v in m.items() if k.startswith("kv_store_")) == 0


def test_adapters_are_in_the_key(f16: Stored, model_path: Path, tmp_path: Path) -> None:
    from tests.lora import cases

    adapter = tmp_path / "smol_a.gguf"
    cases.smol_a(model_path, adapter)
    folder = tmp_path / "store"
    shutil.copytree(f16.folder, folder)
    text = prompt(16)
    e = _engine(model_path, kv_store=folder, lora={str(adapter): 1.0})
    tuned = e.generate(text, N_GEN)
    m = e.metrics()
    # The base model's blocks (the same first 256 tokens) do not match.
    assert (m["kv_store_hits_disk"], m["kv_store_misses_disk"]) == (0, 1)
    assert e.kv_store is not None
    e.kv_store.flush()
    # The adapter's own blocks restore under the same adapter, exactly ...
    again = _engine(model_path, kv_store=folder, lora={str(adapter): 1.0})
    assert again.generate(text, N_GEN).tokens == tuned.tokens
    assert again.metrics()["kv_store_hits_disk"] == 2
    # ... also as a per-call adapter of a base engine; the context it leaves
    # (computed under the adapter) is then neither looked up nor stored
    # under the base model's key.
    base = _engine(model_path, kv_store=folder)
    assert base.generate(text, N_GEN, lora={str(adapter): 1.0}).tokens == tuned.tokens
    assert base.metrics()["kv_store_hits_disk"] == 2
    base.generate(" More.", 1)
    assert base.kv_store is not None
    base.kv_store.flush()
    m = base.metrics()
    assert (m["kv_store_hits_disk"], m["kv_store_misses_disk"]) == (2, 0)
    assert m["kv_store_writes_disk"] == 0


def test_gemma3_sliding_window_restores_exactly(tmp_path: Path) -> None:
    from tests._gguf_meta import gemma3_path

    # Past Gemma-3's 512-position window: the restored positions include
    # some that only the global layers still attend to.
    path, text = gemma3_path(), prompt(32)
    kw = {"context_size": 1024, "threads": 2, "sampler": SamplerConfig.greedy()}
    cold = Engine(path, kv_store=tmp_path, **kw)  # type: ignore[arg-type]
    first = cold.generate(text, N_GEN)
    assert cold.kv_store is not None
    cold.kv_store.flush()
    warm = Engine(path, kv_store=tmp_path, **kw)  # type: ignore[arg-type]
    assert warm.generate(text, N_GEN).tokens == first.tokens
    m = warm.metrics()
    assert m["kv_store_hits_disk"] == 3 and m["kv_store_tokens_saved_disk"] > 512


@pytest.mark.parametrize("name", ["deepseek2", "gemma3n"])
def test_compressed_and_shared_caches_restore_exactly(name: str, tmp_path: Path) -> None:
    """DeepSeek-V2's MLA cache (one latent row per token and layer) and
    Gemma-3n's (20 of 22 layers own a cache) go through the store as they
    are laid out: a restart restores them and continues as a cold run."""
    fixture = Path(__file__).parent / "models" / "fixtures" / f"{name}.gguf"
    toks = [5 + (i * 7) % 290 for i in range(300)]
    greedy = SamplerConfig.greedy()

    def run(kv_store: Path | None) -> tuple[list[int], dict[str, float]]:
        e = Engine(fixture, context_size=512, kv_store=kv_store)
        out = e.generate(toks, 8, sampler=greedy, ignore_eos=True)
        if e.kv_store is not None:
            e.kv_store.flush()
        return out.tokens, e.metrics()

    cold, m = run(tmp_path)
    assert m["kv_store_writes_disk"] == 3
    again, m = run(tmp_path)
    assert (m["kv_store_hits_disk"], m["kv_store_tokens_saved_disk"]) == (2, 288)
    assert again == cold == run(None)[0]
