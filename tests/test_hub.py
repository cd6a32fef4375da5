"""Models by Hugging Face Hub name, with no network: a hub cache built by
hand (``models--ORG--NAME/snapshots/<commit>/FILE`` and ``refs/main``) and
``HF_HUB_OFFLINE=1``. ``from_pretrained`` takes a glob or an exact name; a
snapshot records repo, commit and file and restores from another cache at
another path; a cached file with another fingerprint is the typed
mismatch."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oxillama import AsyncEngine, Engine, LoadError, ModelMismatchError, SamplerConfig, snapshot
from oxillama.model.hub import HubRef
from oxillama.model.hub import locate as hub_locate
from oxillama.sessions import session as snapshot_session
from tests.models import _checks as arch

REPO = "tiny-org/smollm2-gguf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILE = "tiny-llama-Q4_1.gguf"


def private_model(tmp_path: Path, fixture: str = "llama") -> Path:
    """A copy of a small fixture that no other test holds open: the process
    model cache is keyed by the file, so a shared file would hand back a
    model opened (and labelled) elsewhere."""
    dst = tmp_path / f"{fixture}-private.gguf"
    shutil.copyfile(arch.reference(fixture).path, dst)
    return dst


def make_cache(root: Path, model: Path, *, others: tuple[str, ...] = ()) -> Path:
    repo = root / ("models--" + REPO.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    # The hub's own cache holds symlinks into blobs/; a link works the same.
    (snap / FILE).symlink_to(model)
    for name in others:
        (snap / name).write_bytes(b"not a model")
    (snap / "README.md").write_text("# tiny\n")
    return root


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return private_model(tmp_path)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return home


def test_from_pretrained_takes_a_glob_or_an_exact_name(
    offline: Path, tmp_path: Path, model: Path
) -> None:
    cache = make_cache(tmp_path / "c1", model, others=("tiny-llama-Q8_0.gguf",))
    by_glob = Engine.from_pretrained(REPO, "*Q4_1.gguf", cache_dir=cache, context_size=128)
    exact = Engine.from_pretrained(REPO, FILE, cache_dir=cache, context_size=128)
    assert by_glob.model is exact.model  # one copy of the weights
    ref = by_glob.model.hub
    assert ref is not None and (ref.repo_id, ref.revision, ref.filename) == (REPO, COMMIT, FILE)
    greedy = SamplerConfig.greedy()
    plain = Engine(model, context_size=128, sampler=greedy)
    by_glob.set_sampler(greedy)
    assert by_glob.generate("Hi", 4).tokens == plain.generate("Hi", 4).tokens


def test_a_glob_that_matches_more_or_less_than_one_file_lists_the_candidates(
    offline: Path, tmp_path: Path, model: Path
) -> None:
    cache = make_cache(tmp_path / "c1", model, others=("tiny-llama-Q8_0.gguf",))
    with pytest.raises(LoadError, match="matches 2 files") as info:
        Engine.from_pretrained(REPO, "*.gguf", cache_dir=cache)
    assert FILE in str(info.value) and "README.md" in str(info.value)
    with pytest.raises(LoadError, match="matches no file"):
        Engine.from_pretrained(REPO, "*Q6_K*.gguf", cache_dir=cache)
    with pytest.raises(LoadError, match="not in the hub cache"):
        Engine.from_pretrained("nobody/nothing", "*.gguf", cache_dir=cache)
    with pytest.raises(LoadError, match="cannot get"):
        Engine.from_pretrained(REPO, "missing.gguf", cache_dir=cache)


def test_a_snapshot_restores_from_another_cache_at_another_path(
    offline: Path, tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = make_cache(tmp_path / "c1", model)
    eng = Engine.from_pretrained(
        REPO, "*.gguf", cache_dir=first, context_size=128, sampler=SamplerConfig(seed=3)
    )
    eng.generate("The lighthouse keeper", 6, ignore_eos=True)
    path = tmp_path / "s.oxisnap"
    eng.snapshot(path)
    want = eng.generate("", 8, ignore_eos=True).tokens
    hub = snapshot.info(path).hub
    assert hub is not None and (hub.repo_id, hub.revision, hub.filename) == (REPO, COMMIT, FILE)
    # "Another machine": the first cache is gone, the second is elsewhere.
    del eng
    shutil.rmtree(first)
    monkeypatch.setenv("HF_HUB_CACHE", str(make_cache(tmp_path / "elsewhere" / "c2", model)))
    located: list[Path] = []

    def locate(ref: HubRef, cache_dir: Path | None = None) -> Path:
        located.append(hub_locate(ref, cache_dir))
        return located[-1]

    monkeypatch.setattr(snapshot_session, "hub_locate", locate)
    restored = Engine.restore(path)
    assert len(located) == 1 and "elsewhere" in str(located[0])
    assert restored.generate("", 8, ignore_eos=True).tokens == want


def test_a_cached_file_with_another_fingerprint_is_the_mismatch_error(
    offline: Path, tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = make_cache(tmp_path / "c1", model)
    eng = Engine.from_pretrained(REPO, FILE, cache_dir=first, context_size=128)
    eng.generate("Hi", 2)
    blob = eng.snapshot_bytes()
    shutil.rmtree(first)
    wrong = make_cache(tmp_path / "c2", private_model(tmp_path, "qwen2"))
    monkeypatch.setenv("HF_HUB_CACHE", str(wrong))
    with pytest.raises(ModelMismatchError):
        Engine.restore_bytes(blob)
    with pytest.raises(LoadError):  # what code written for the runtime we model catches
        Engine.restore_bytes(blob)


def test_async_engine_and_the_cli_load_by_hub_name(
    offline: Path, tmp_path: Path, model: Path
) -> None:
    cache = make_cache(tmp_path / "c1", model)

    async def run() -> str | None:
        ae = AsyncEngine.from_pretrained(REPO, FILE, cache_dir=cache, context_size=128)
        try:
            return None if ae.engine.model.hub is None else ae.engine.model.hub.revision
        finally:
            await ae.close()

    assert asyncio.run(run()) == COMMIT
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    r = subprocess.run(
        [sys.executable, "-m", "oxillama", "info", "--hf", f"{REPO}:*Q4_1.gguf"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "general.architecture = 'llama'" in r.stdout
    both = subprocess.run(
        [sys.executable, "-m", "oxillama", "generate", "x", "-m", str(model), "--hf", REPO],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert both.returncode != 0 and "--model or --hf" in both.stderr
