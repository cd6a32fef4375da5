"""Quantized KV caches (issue 36): q8_0 and q4_0 rows as ggml's blocks,
their sizes, snapshots of them, and the names that select them."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

import oxillama._native as _native
from oxillama import Engine, SamplerConfig
from oxillama import sessions as snapshot
from oxillama.errors import ParameterError
from oxillama.serving.flags import app_spec
from oxillama.serving.http.app_spec import AppSpec

GGML = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0}
PROMPT = "The old lighthouse keeper"


def _rows(rng: np.random.Generator) -> list[np.ndarray]:
    """Random rows at every scale, and the edge cases of both quantizers."""
    rows = [
        (rng.standard_normal(64) * 10.0 ** rng.uniform(-8, 8)).astype(np.float32)
        for _ in range(400)
    ]
    rows += [rng.uniform(-1, 1, 96).astype(np.float32) for _ in range(50)]
    edge = [
        np.zeros(32),
        np.full(32, 3.0),
        np.full(32, -3.0),
        np.r_[np.zeros(31), [-1e-30]],
        np.r_[[5.0, -5.0], np.zeros(30)],  # equal magnitudes: the first wins
        np.r_[[-5.0, 5.0], np.zeros(30)],
        np.r_[[1e30], np.ones(31)],  # the scale overflows f16
        np.r_[[60000.0], -np.arange(31.0)],
        np.r_[[127.0], np.arange(-15.5, 15.5)],  # exact halves in q8_0
        np.r_[[-8.0], np.arange(-7.5, 8.0, 0.5)],  # exact halves in q4_0
        np.r_[[1.0, -1.0], rng.uniform(-1e-3, 1e-3, 30)],
    ]
    rows += [np.asarray(e, dtype=np.float32) for e in edge]
    return rows


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_rows_quantize_to_the_bytes_of_ggml_reference_quantizer(kv: str) -> None:
    rng = np.random.default_rng(36)
    rows = _rows(rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # gguf-py on f16 overflow
        for i, x in enumerate(rows):
            want = quants.quantize(x.reshape(1, -1), GGML[kv]).tobytes()
            got = _native.kv_encode_row(kv, x.tolist())
            assert got == want, (kv, i, x[:4])
    assert len(rows) > 450


def test_unknown_kv_types_are_rejected_by_name(model_path: Path) -> None:
    for kwargs, name in (
        ({"kv_dtype": "q5_1"}, "q5_1"),
        ({"kv_dtype_k": "bf16"}, "bf16"),
        ({"kv_dtype_v": "Q8_0"}, "Q8_0"),
    ):
        with pytest.raises(ParameterError, match=name):
            Engine(model_path, context_size=64, threads=1, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="q3"):
        Engine.restore_bytes(b"", kv_dtype="q3")
    with pytest.raises(SystemExit):
        _serve_spec(["--cache-type-v", "q5_0"])


def _serve_spec(argv: list[str]) -> AppSpec:
    import argparse

    from oxillama.serving.flags import add_serve_parser

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    add_serve_parser(sub, lambda a: 0)
    spec = app_spec(parser.parse_args(["serve", "--model", "m.gguf", *argv]))
    assert isinstance(spec, AppSpec)
    return spec


def test_serve_flags_select_each_side(model_path: Path) -> None:
    spec = _serve_spec(["--cache-type-k", "q8_0", "--cache-type-v", "q4_0"])
    assert (spec.cache_type_k, spec.cache_type_v) == ("q8_0", "q4_0")
    spec = _serve_spec([])
    assert (spec.cache_type_k, spec.cache_type_v) == ("f16", "f16")


def test_key_and_value_types_can_differ(model_path: Path) -> None:
    e = Engine(model_path, context_size=64, threads=1, kv_dtype_k="q8_0")
    assert e._session.kv_dtype == "q8_0/f16"
    e = Engine(model_path, context_size=64, threads=1, kv_dtype="q4_0", kv_dtype_v="f32")
    assert e._session.kv_dtype == "q4_0/f32"
    e = Engine(model_path, context_size=64, threads=1, kv_dtype_k="q8_0", kv_dtype_v="q8_0")
    assert e._session.kv_dtype == "q8_0"
    e.generate(PROMPT, 4, ignore_eos=True)


def _session_of(model_path: Path, kv: str, ids: list[int]) -> Engine:
    e = Engine(model_path, context_size=1024, threads=2, kv_dtype=kv)
    e.eval(ids)
    return e


def test_kv_and_snapshot_sizes_follow_the_type(model_path: Path) -> None:
    """A 1,000-token session: q8_0 holds 34 bytes per 32 values (0.53x of
    f16), q4_0 18 (0.28x); a snapshot carries the blocks as they are."""
    probe = Engine(model_path, context_size=64, threads=1)
    text = " ".join(f"Line {i} of the keeper's log." for i in range(400))
    ids = probe.tokenize(text)[:1000]
    assert len(ids) == 1000
    kv, snap = {}, {}
    for t in ("f16", "q8_0", "q4_0"):
        e = _session_of(model_path, t, ids)
        kv[t] = e._session.export_kv_len()
        snap[t] = e.snapshot_size()
        assert len(e.snapshot_bytes()) == snap[t]
        assert snapshot.info(e.snapshot_bytes()).kv_dtype == t
    c = probe.model.config
    per_value = int(c["n_layer"]) * int(c["n_head_kv"]) * 1000 * (int(c["dim_k"]) + int(c["dim_v"]))
    assert kv["f16"] == 2 * per_value
    assert kv["q8_0"] == per_value // 32 * 34
    assert kv["q4_0"] == per_value // 32 * 18
    assert kv["q8_0"] / kv["f16"] <= 0.55 and kv["q4_0"] / kv["f16"] <= 0.30
    assert snap["q8_0"] / snap["f16"] <= 0.55 and snap["q4_0"] / snap["f16"] <= 0.30
    # Everything but the KV is the same size in all three (up to the
    # type's name in the metadata, and the quantized caches' record of
    # their Hadamard rotation).
    rest = [snap[t] - kv[t] for t in ("f16", "q8_0", "q4_0")]
    assert max(rest) - min(rest) <= 8 + len(',"kv_rot":{"k":64,"v":64}'), rest
    print("kv bytes", kv, "snapshot bytes", snap)


CHILD = """
import json, sys
from oxillama import Engine
out = {}
for kv, path in json.loads(sys.argv[1]).items():
    e = Engine.restore(path)
    assert e._session.kv_dtype == kv, (e._session.kv_dtype, kv)
    out[kv] = e.generate("", 24, ignore_eos=True).tokens
print(json.dumps(out))
"""

KV_TYPES = ("q8_0", "q4_0", "q8_0/q4_0", "f16/q8_0")


def test_snapshots_continue_exactly_in_another_process(model_path: Path, tmp_path: Path) -> None:
    paths: dict[str, str] = {}
    whole: dict[str, list[int]] = {}
    for kv in KV_TYPES:
        cfg = SamplerConfig(temperature=0.8, top_p=0.95, seed=7)
        e = Engine(model_path, context_size=256, threads=2, kv_dtype=kv, sampler=cfg)
        whole[kv] = e.generate(PROMPT, 40, ignore_eos=True).tokens
        e.reset()
        first = e.generate(PROMPT, 16, ignore_eos=True).tokens
        assert first == whole[kv][:16]
        paths[kv] = str(tmp_path / f"{kv.replace('/', '-')}.oxisnap")
        e.snapshot(paths[kv])
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    rest = json.loads(out.stdout)
    for kv in KV_TYPES:
        assert rest[kv] == whole[kv][16:], kv


def test_restore_into_another_type_converts_once(model_path: Path, tmp_path: Path) -> None:
    e = Engine(model_path, context_size=256, threads=2, kv_dtype="f16")
    e.generate(PROMPT, 8, ignore_eos=True)
    blob = e.snapshot_bytes()
    # Same type: as before, no conversion, no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = Engine.restore_bytes(blob)
    assert same._session.kv_dtype == "f16"
    # An explicit type converts quietly: the KV is the f16 rows requantized
    # (Hadamard-rotated first, as a q8_0 cache stores them by default).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = Engine.restore_bytes(blob, kv_dtype="q8_0")
    assert q._session.kv_dtype == "q8_0" and q._session.kv_rot == (64, 64)
    c = e.model.config
    want = _native.convert_kv(
        e._session.export_kv(),
        int(c["n_layer"]),
        int(c["n_head_kv"]),
        int(c["dim_k"]),
        int(c["dim_v"]),
        e.n_past,
        "f16",
        "q8_0",
        (0, 0),
        (64, 64),
    )
    assert q._session.export_kv() == want
    assert q.n_past == e.n_past
    assert len(q.generate("", 8, ignore_eos=True).tokens) == 8
    # And back: a q8_0 snapshot into f16, then into q4_0 for the values.
    back = Engine.restore_bytes(q.snapshot_bytes(), kv_dtype="f16/q4_0")
    assert back._session.kv_dtype == "f16/q4_0"


def test_a_pool_of_another_type_converts_with_a_warning(model_path: Path) -> None:
    import asyncio

    from oxillama import AsyncEngine

    e = Engine(model_path, context_size=256, threads=2, kv_dtype="q8_0")
    e.generate(PROMPT, 8, ignore_eos=True)
    blob = e.snapshot_bytes()

    async def main() -> list[int]:
        ae = AsyncEngine(model_path, context_size=256, threads=2, kv_dtype="q4_0", max_batch=2)
        try:
            with pytest.warns(RuntimeWarning, match="q8_0.*q4_0"):
                s = await ae.restore_session(blob)
            return (await s.generate("", 4, ignore_eos=True)).tokens
        finally:
            await ae.close()

    assert len(asyncio.run(main())) == 4


def test_cli_generate_takes_the_cache_types(model_path: Path) -> None:
    args = ["generate", "The capital of France is", "-n", "8", "--temperature", "0", "-q"]
    r = subprocess.run(
        [sys.executable, "-m", "oxillama", *args, "--cache-type-k", "q8_0", "-c", "128"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "oxillama", *args, "--cache-type-v", "q2_k"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "q2_k" in r.stderr
