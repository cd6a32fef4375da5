"""The Walsh-Hadamard rotation of quantized KV caches (llama.cpp's
``attn_rot_k``/``attn_rot_v``): when it is on, what the cache then
stores, the ``OXILLAMA_ATTN_ROT_DISABLE`` opt-out, and snapshots, which
record it and convert (with a warning) between settings. Fidelity against
llama.cpp's rotated caches is in test_kv_quant_reference.py, the K-shift
of rotated caches in test_context_shift.py and the Rust unit tests."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import oxillama._native as _native
from oxillama import Engine, SamplerConfig
from oxillama import sessions as snapshot
from oxillama.errors import OxiLlamaError, SnapshotFormatError
from oxillama.sessions import format as F
from oxillama.sessions import sections as S
from oxillama.sessions.session import parse

ROT_OFF = "OXILLAMA_ATTN_ROT_DISABLE"
PROMPT = "The old lighthouse keeper"


def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix, by Kronecker products (float64)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    return h / np.sqrt(n)


def _engine(model_path: Path, kv: str, n_ctx: int = 256) -> Engine:
    return Engine(
        model_path, context_size=n_ctx, threads=2, kv_dtype=kv, sampler=SamplerConfig.greedy()
    )


def _convert(
    e: Engine, data: bytes, src: tuple[str, tuple[int, int]], dst: tuple[str, tuple[int, int]]
) -> bytes:
    c = e.model.config
    return _native.convert_kv(
        data,
        int(c["n_layer"]),
        int(c["n_head_kv"]),
        int(c["dim_k"]),
        int(c["dim_v"]),
        e.n_past,
        src[0],
        dst[0],
        src[1],
        dst[1],
    )


def test_the_transform_matches_a_float64_matrix_product() -> None:
    """Rows through the native rotation (keys in blocks of 256, values in
    blocks of 64, as on Gemma-3) against numpy's H @ x in float64, and
    back."""
    layers, heads, dk, dv, n = 2, 2, 256, 128, 3
    rng = np.random.default_rng(36)
    x = (rng.standard_normal(layers * heads * n * (dk + dv)) * 3).astype(np.float32)
    x[7] = 60.0  # an outlier channel
    args = (layers, heads, dk, dv, n, "f32", "f32")
    out = np.frombuffer(_native.convert_kv(x.tobytes(), *args, (0, 0), (256, 64)), np.float32)
    want = []
    for layer in x.astype(np.float64).reshape(layers, -1):
        k = layer[: heads * n * dk].reshape(-1, dk)
        v = layer[heads * n * dk :].reshape(-1, 64)
        want += [(k @ hadamard(256).T).ravel(), (v @ hadamard(64).T).ravel()]
    np.testing.assert_allclose(out, np.concatenate(want), rtol=0, atol=2e-5)
    back = np.frombuffer(_native.convert_kv(out.tobytes(), *args, (256, 64), (0, 0)), np.float32)
    np.testing.assert_allclose(back, x, rtol=0, atol=2e-5)
    with pytest.raises(OxiLlamaError, match="Hadamard"):
        _native.convert_kv(x.tobytes(), *args, (0, 0), (512, 64))


def test_quantized_sides_are_rotated_as_llama_cpp_does(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2's 64-wide heads: each quantized side in blocks of 64, f16
    and f32 never; the opt-out is read when a cache is made."""
    monkeypatch.delenv(ROT_OFF, raising=False)
    cases = {"f16": (0, 0), "q8_0": (64, 64), "q4_0": (64, 64), "q8_0/f16": (64, 0)}
    cases["f32/q4_0"] = (0, 64)
    for kv, want in cases.items():
        assert _engine(model_path, kv, 32)._session.kv_rot == want, kv
    e = _engine(model_path, "q4_0", 32)
    assert _native.KvPool(e._model, 2, "q4_0").kv_rot == (64, 64)
    monkeypatch.setenv(ROT_OFF, "1")
    assert _engine(model_path, "q4_0", 32)._session.kv_rot == (0, 0)
    assert _native.KvPool(e._model, 2, "q4_0").kv_rot == (0, 0)
    # As llama.cpp's atoi: "0" (or anything not a nonzero number) keeps it.
    monkeypatch.setenv(ROT_OFF, "0")
    assert _engine(model_path, "q4_0", 32)._session.kv_rot == (64, 64)
    # The cache that was made keeps its setting.
    assert e._session.kv_rot == (64, 64)


@pytest.mark.parametrize("kv", ["q4_0", "q8_0"])
def test_the_cache_holds_the_rotated_rows(
    model_path: Path, monkeypatch: pytest.MonkeyPatch, kv: str
) -> None:
    """Layer 0's keys and values do not depend on attention, so an f32
    cache holds the exact rows there: the quantized cache holds those rows
    rotated and quantized, bit for bit (and, opted out, just quantized)."""
    ref = _engine(model_path, "f32")
    ref.eval(ref.tokenize(PROMPT))
    c = ref.model.config
    layer0 = int(c["n_head_kv"]) * ref.n_past
    for rot in ((64, 64), (0, 0)):
        if rot == (0, 0):
            monkeypatch.setenv(ROT_OFF, "1")
        e = _engine(model_path, kv)
        e.eval(e.tokenize(PROMPT))
        assert e._session.kv_rot == rot
        want = _convert(ref, ref._session.export_kv(), ("f32", (0, 0)), (kv, rot))
        n = layer0 * (len(want) // (int(c["n_layer"]) * layer0))
        got = e._session.export_kv()
        assert got[:n] == want[:n], rot
        assert got != want  # later layers attend through the quantized cache


def _meta(blob: bytes) -> dict[str, object]:
    return parse(blob)[0]


def test_snapshots_record_the_rotation(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rotated cache's snapshot says so (meta.engine.kv_rot, in format
    version 3, which readers that predate the rotation refuse); others
    have no such key."""
    e = _engine(model_path, "q4_0")
    e.generate(PROMPT, 4, ignore_eos=True)
    blob = e.snapshot_bytes()
    assert F.read_header(blob)[0] == F.VERSION == 3
    eng = _meta(blob)["engine"]
    assert isinstance(eng, dict) and eng["kv_rot"] == {"k": 64, "v": 64}
    assert snapshot.info(blob).kv_rot == (64, 64)
    for kv, off in (("f16", False), ("q8_0", True)):
        if off:
            monkeypatch.setenv(ROT_OFF, "1")
        plain = _engine(model_path, kv)
        plain.generate(PROMPT, 4, ignore_eos=True)
        b = plain.snapshot_bytes()
        eng = _meta(b)["engine"]
        assert F.read_header(b)[0] == 3 and isinstance(eng, dict) and "kv_rot" not in eng, kv
        assert snapshot.info(b).kv_rot == (0, 0)


def test_a_reader_that_predates_the_rotation_refuses(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = _engine(model_path, "q4_0")
    e.generate(PROMPT, 4, ignore_eos=True)
    blob = e.snapshot_bytes()
    monkeypatch.setattr(F, "SUPPORTED_VERSIONS", frozenset({1}))
    with pytest.raises(SnapshotFormatError, match="version 3"):
        Engine.restore_bytes(blob)


def test_files_of_either_setting_restore_into_the_other_with_a_warning(
    model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The rows are rotated back (or forth) and requantized once, with a
    warning that names both settings; the same setting restores exactly and
    silently."""
    e = _engine(model_path, "q4_0")
    e.generate(PROMPT, 8, ignore_eos=True)
    saved = e._session.export_kv()
    path = tmp_path / "rot.oxisnap"
    e.snapshot(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = Engine.restore(path)
    assert same._session.export_kv() == saved

    monkeypatch.setenv(ROT_OFF, "1")
    with pytest.warns(RuntimeWarning, match=r"Hadamard-rotated \(keys in blocks of 64.*unrotated"):
        off = Engine.restore(path)
    assert off._session.kv_rot == (0, 0)
    assert off._session.export_kv() == _convert(e, saved, ("q4_0", (64, 64)), ("q4_0", (0, 0)))
    assert len(off.generate("", 8, ignore_eos=True).tokens) == 8
    # Asking for other types converts quietly, but not across settings.
    with pytest.warns(RuntimeWarning, match="rotated back or forth"):
        Engine.restore(path, kv_dtype="q8_0")

    # The other way: an unrotated snapshot into a rotating process.
    plain = _engine(model_path, "q4_0")
    plain.generate(PROMPT, 8, ignore_eos=True)
    blob = plain.snapshot_bytes()
    monkeypatch.delenv(ROT_OFF)
    with pytest.warns(RuntimeWarning, match=r"q4_0 unrotated.*q4_0 Hadamard-rotated"):
        on = Engine.restore_bytes(blob)
    assert on._session.kv_rot == (64, 64)
    want = _convert(plain, plain._session.export_kv(), ("q4_0", (0, 0)), ("q4_0", (64, 64)))
    assert on._session.export_kv() == want
    # And the same session continues as the saved one would.
    assert same.generate("", 8, ignore_eos=True).tokens == e.generate("", 8, ignore_eos=True).tokens


def test_a_live_engine_restores_in_place_across_settings(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = _engine(model_path, "q8_0")
    e.generate(PROMPT, 8, ignore_eos=True)
    blob = e.snapshot_bytes()
    monkeypatch.setenv(ROT_OFF, "1")
    live = _engine(model_path, "q8_0")
    assert live._session.kv_rot == (0, 0)
    with pytest.warns(RuntimeWarning, match="Hadamard-rotated"):
        live.load_snapshot(blob)
    assert live._session.kv_rot == (0, 0)
    want = _convert(e, e._session.export_kv(), ("q8_0", (64, 64)), ("q8_0", (0, 0)))
    assert live._session.export_kv() == want
    assert len(live.generate("", 8, ignore_eos=True).tokens) == 8


def test_a_malformed_rotation_record_is_a_format_error(model_path: Path) -> None:
    e = _engine(model_path, "q4_0")
    e.generate(PROMPT, 4, ignore_eos=True)
    version, secs = F.decode(e.snapshot_bytes())
    meta = S.decode_json(secs[S.META], "meta")
    for bad in ({"k": 48, "v": 64}, {"k": 64}, [64, 64]):
        meta["engine"]["kv_rot"] = bad
        parts = [
            F.Section(t, S.encode_json(meta) if t == S.META else bytes(d)) for t, d in secs.items()
        ]
        with pytest.raises(SnapshotFormatError, match="kv_rot"):
            Engine.restore_bytes(F.encode(parts, version=version))
