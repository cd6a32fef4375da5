"""OXISNAP1 snapshots of live sessions: exact continuation across processes,
relocation, forks, atomic writes, and typed errors on every kind of bad
input (tests/test_snapshot_format.py covers the container alone)."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oxillama import Engine, SamplerConfig, snapshot
from oxillama.sessions.format import SUPPORTED_VERSIONS, Section, decode, encode
from oxillama.snapshot import ModelMismatchError, SnapshotError, SnapshotFormatError

CASES = {
    "greedy": SamplerConfig.greedy(),
    "sampled": SamplerConfig(
        temperature=0.8,
        top_p=0.95,
        repetition_penalty=1.1,
        dry_multiplier=0.8,
        seed=1234,
    ),
    "mirostat": SamplerConfig(mirostat=2, mirostat_tau=5.0, mirostat_eta=0.1, seed=99),
}
PROMPT = "The old lighthouse keeper"

# Run in a fresh interpreter: restore each snapshot and continue for 44.
CHILD = """
import json, sys
from oxillama import Engine
out = {}
for name, path in json.loads(sys.argv[1]).items():
    e = Engine.restore(path)
    out[name] = e.generate("", 44, ignore_eos=True).tokens
print(json.dumps(out))
"""


def test_continuation_is_exact_across_processes(model_path: Path, tmp_path: Path) -> None:
    paths: dict[str, str] = {}
    whole: dict[str, list[int]] = {}
    first: dict[str, list[int]] = {}
    for name, cfg in CASES.items():
        e = Engine(model_path, context_size=256, threads=2, sampler=cfg)
        whole[name] = e.generate(PROMPT, 64, ignore_eos=True).tokens
        e.reset()
        first[name] = e.generate(PROMPT, 20, ignore_eos=True).tokens
        paths[name] = str(tmp_path / f"{name}.oxisnap")
        e.snapshot(paths[name])
    run = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(paths)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    rest = json.loads(run.stdout.strip().splitlines()[-1])
    for name in CASES:
        assert len(whole[name]) == 64
        assert first[name] + rest[name] == whole[name], name


@pytest.fixture(scope="module")
def saved(model_path: Path) -> tuple[Engine, bytes]:
    """A sampled session 12 tokens in, and its snapshot."""
    e = Engine(model_path, context_size=256, threads=2, sampler=CASES["sampled"])
    e.generate(PROMPT, 12, ignore_eos=True)
    return e, e.snapshot_bytes()


def test_restored_session_carries_everything(saved: tuple[Engine, bytes]) -> None:
    e, blob = saved
    # The last position travels as its 576-float hidden state, from which the
    # output head gives back the very same logits.
    _, secs = decode(blob)
    assert 9 in secs and 4 not in secs and len(secs[9]) == 4 * 576
    r = Engine.restore_bytes(blob, threads=1)
    assert r.threads == 1 and r.n_ctx == e.n_ctx and r.n_past == e.n_past
    assert r.tokens == e.tokens and r.sampler == e.sampler
    assert r._sampler.get_state() == e._sampler.get_state()
    assert r._last_logits is not None and e._last_logits is not None
    np.testing.assert_array_equal(r._last_logits, e._last_logits)


def test_two_restores_are_independent_sessions(saved: tuple[Engine, bytes]) -> None:
    _, blob = saved
    a, b = Engine.restore_bytes(blob), Engine.restore_bytes(blob)
    ta = a.generate("", 10, ignore_eos=True).tokens
    a.generate(" and then", 5, ignore_eos=True)  # a moves on; b must not notice
    assert b.generate("", 10, ignore_eos=True).tokens == ta


def test_pickle_and_deepcopy_fork_the_session(saved: tuple[Engine, bytes]) -> None:
    e, blob = saved
    want = Engine.restore_bytes(blob).generate("", 8, ignore_eos=True).tokens
    fork = copy.deepcopy(Engine.restore_bytes(blob))
    assert fork.generate("", 8, ignore_eos=True).tokens == want
    unpickled = pickle.loads(pickle.dumps(Engine.restore_bytes(blob)))
    assert unpickled.generate("", 8, ignore_eos=True).tokens == want
    # The pickle references the model by path: it is far smaller than the model.
    assert len(pickle.dumps(e)) < 20 << 20


def test_info_reads_metadata_without_a_model(
    saved: tuple[Engine, bytes], tmp_path: Path, model_path: Path
) -> None:
    e, blob = saved
    p = tmp_path / "s.oxisnap"
    p.write_bytes(blob)
    for src in (p, str(p), blob):
        i = snapshot.info(src)
        assert i.magic == b"OXISNAP1" and i.version == 3 and i.arch_id == "llama"
        assert i.model_path == str(model_path) and i.tokenizer_path is None
        assert (i.tokens_count, i.max_context_length, i.kv_dtype) == (e.n_past, 256, "f16")
        assert i.num_threads == 2 and i.size_bytes == len(blob)
        assert i.fingerprint.size == model_path.stat().st_size
        assert i.created_at.startswith("20") and i.library_version


def test_empty_and_truncated_sessions_restore(model_path: Path) -> None:
    e = Engine(model_path, context_size=64, threads=1, sampler=SamplerConfig.greedy())
    empty = Engine.restore_bytes(e.snapshot_bytes())
    assert empty.n_past == 0
    want = e.generate("Hello there", 6).tokens
    assert empty.generate("Hello there", 6).tokens == want
    # After truncate the last logits are gone; the restored engine recomputes.
    e.reset()
    e.generate("Hello there", 6)
    e.truncate(3)
    r = Engine.restore_bytes(e.snapshot_bytes())
    assert r.generate("", 5).tokens == e.generate("", 5).tokens


def test_relocated_model_is_found_and_verified(saved: tuple[Engine, bytes], tmp_path: Path) -> None:
    e, blob = saved
    moved = tmp_path / "moved.gguf"
    shutil.copyfile(e.model_path, moved)  # type: ignore[arg-type]
    want = Engine.restore_bytes(blob).generate("", 6, ignore_eos=True).tokens
    r = Engine.restore_bytes(blob, model_path=moved)
    assert r.model_path == moved and r.generate("", 6, ignore_eos=True).tokens == want
    # Another model (one byte changed near the end) is refused, showing both
    # fingerprints.
    with moved.open("r+b") as f:
        f.seek(-100, os.SEEK_END)
        b = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(ModelMismatchError) as info:
        Engine.restore_bytes(blob, model_path=moved)
    assert info.value.expected != info.value.found
    assert "expected" in str(info.value) and "found" in str(info.value)


def test_missing_model_file_is_a_clear_error(saved: tuple[Engine, bytes], tmp_path: Path) -> None:
    _, blob = saved
    with pytest.raises(SnapshotError, match="model_path="):
        Engine.restore_bytes(blob, model_path=tmp_path / "nowhere.gguf")


def test_engine_from_bytes_cannot_be_snapshotted(model_path: Path) -> None:
    e = Engine.from_bytes(model_path.read_bytes(), context_size=16, threads=1)
    with pytest.raises(SnapshotError, match="from bytes"):
        e.snapshot_bytes()


def test_failed_restore_leaves_engines_untouched(saved: tuple[Engine, bytes]) -> None:
    _, blob = saved
    a, control = Engine.restore_bytes(blob), Engine.restore_bytes(blob)
    bad = bytearray(blob)
    bad[-1] ^= 1
    with pytest.raises(SnapshotFormatError, match="checksum"):
        Engine.restore_bytes(bytes(bad))
    with pytest.raises(SnapshotFormatError):
        Engine.restore_bytes(blob[:-10])
    assert (
        a.generate("", 8, ignore_eos=True).tokens == control.generate("", 8, ignore_eos=True).tokens
    )


def test_bad_headers_raise_the_specific_error(saved: tuple[Engine, bytes]) -> None:
    _, blob = saved
    for cut in range(0, 53):  # every byte of the header, and one past it
        with pytest.raises(SnapshotFormatError, match="truncated"):
            snapshot.loads(blob[:cut])
    rng = np.random.default_rng(5)
    for cut in rng.integers(53, len(blob), size=20):
        with pytest.raises(SnapshotFormatError, match="truncated"):
            snapshot.loads(blob[: int(cut)])
    with pytest.raises(SnapshotFormatError, match="bad magic"):
        snapshot.loads(b"OXISNAP2" + blob[8:])
    newer = bytearray(blob)
    # Version 2 (rotated KV rows) is read; the one after the newest is not.
    v = max(SUPPORTED_VERSIONS) + 1
    newer[8:12] = v.to_bytes(4, "little")
    with pytest.raises(SnapshotFormatError, match=rf"unsupported .* version {v}"):
        snapshot.loads(bytes(newer))
    with pytest.raises(SnapshotFormatError, match="unexpected bytes"):
        snapshot.loads(blob + b"\0")


def test_write_is_atomic_and_cleans_up(saved: tuple[Engine, bytes], tmp_path: Path) -> None:
    e, blob = saved
    p = tmp_path / "s.oxisnap"
    p.write_bytes(blob)
    before = p.read_bytes()

    def boom(fd: int) -> None:
        raise OSError("disk on fire")

    orig = os.fsync
    os.fsync = boom  # type: ignore[assignment]
    try:
        with pytest.raises(OSError, match="disk on fire"):
            e.snapshot(p)
    finally:
        os.fsync = orig
    assert p.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s.oxisnap"]
    with pytest.raises(OSError):
        e.snapshot(tmp_path / "no" / "such" / "dir.oxisnap")
    # A good write replaces the file with exactly what snapshot_bytes gives.
    e.snapshot(p)
    assert snapshot.info(p).size_bytes == len(e.snapshot_bytes())
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s.oxisnap"]


def test_non_durable_save_skips_fsync_only(
    saved: tuple[Engine, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e, _ = saved

    def no_fsync(fd: int) -> None:
        raise AssertionError("durable=False must not fsync")

    monkeypatch.setattr(os, "fsync", no_fsync)
    p = tmp_path / "fast.oxisnap"
    e.snapshot(p, durable=False)
    assert snapshot.info(p).tokens_count == len(e.tokens)
    assert Engine.restore(p).tokens == e.tokens
    assert sorted(x.name for x in tmp_path.iterdir()) == ["fast.oxisnap"]


def test_a_corrupt_snapshot_naming_a_missing_model_reports_its_checksum(
    saved: tuple[Engine, bytes],
) -> None:
    """A fresh restore hashes the file while it loads the model the file
    names; when the file is corrupt, that is the error, whatever the
    unverified name led to."""
    _, blob = saved
    _, secs = decode(blob)
    meta = json.loads(bytes(secs[1]))
    meta["model_path"] = "/nonexistent/model.gguf"
    secs[1] = memoryview(json.dumps(meta).encode())
    # An unknown section (skipped by readers) makes the hash big enough to
    # run on a thread.
    secs[9999] = memoryview(bytes(2 << 20))
    bad = bytearray(encode([Section(t, bytes(d)) for t, d in secs.items()]))
    assert "not found" in str(_restore_error(bytes(bad)))
    bad[-1] ^= 1
    err = _restore_error(bytes(bad))
    assert isinstance(err, SnapshotFormatError) and "checksum" in str(err)


def _restore_error(blob: bytes) -> Exception:
    with pytest.raises(SnapshotError) as info:
        Engine.restore_bytes(blob)
    return info.value


def test_corrupt_file_on_disk_raises_the_format_error(
    saved: tuple[Engine, bytes], tmp_path: Path
) -> None:
    _, blob = saved
    p = tmp_path / "bad.oxisnap"
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 0x10
    p.write_bytes(bytes(bad))
    with pytest.raises(SnapshotFormatError, match="checksum"):
        Engine.restore(p)
    p.write_bytes(b"")
    with pytest.raises(SnapshotFormatError, match="truncated"):
        Engine.restore(p)
    with pytest.raises(SnapshotError, match="cannot read"):
        Engine.restore(tmp_path / "absent.oxisnap")


SECTION_TAGS = [1, 2, 3, 5, 6, 9]  # meta, tokens, kv, sampler config and state, hidden


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tag=st.sampled_from(SECTION_TAGS), junk=st.binary(max_size=64), cut=st.booleans())
def test_well_checksummed_garbage_in_any_section_is_a_snapshot_error(
    saved: tuple[Engine, bytes], tag: int, junk: bytes, cut: bool
) -> None:
    """Valid container, hostile contents: every section replaced (or cut
    short) must end in a SnapshotError, never another exception."""
    _, blob = saved
    _, secs = decode(blob)
    data = {t: bytes(d) for t, d in secs.items()}
    data[tag] = data[tag][: len(data[tag]) // 2] if cut else junk
    forged = encode([Section(t, d) for t, d in data.items()])
    with pytest.raises(SnapshotError):
        snapshot.loads(forged)
