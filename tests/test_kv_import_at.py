"""``Session.import_kv_at``: the prefix store's blocks written back where
they lie, one after another, after the positions a session keeps."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxillama import Engine, OxiLlamaError, _native
from oxillama.kv_store.layout import KvLayout
from oxillama.kv_store.store import import_blocks

TEXT = "The river bends twice before it reaches the mill, and then it slows. " * 8


@pytest.fixture(scope="module")
def filled(model_path: Path) -> tuple[Engine, bytes, int]:
    e = Engine(model_path, context_size=512, threads=2)
    e.eval(e.tokenize(TEXT))
    return e, e._session.export_kv(), e.n_past


def _session(e: Engine, kv: str = "f16") -> _native.Session:
    return _native.Session(e.model.native, 512, 2, kv)


@pytest.mark.parametrize("kv", ["f16", "q8_0", "q4_0"])
def test_blocks_rebuild_the_export_exactly(model_path: Path, kv: str) -> None:
    e = Engine(model_path, context_size=512, threads=2, kv_dtype=kv)
    e.eval(e.tokenize(TEXT))
    data, n = e._session.export_kv(), e.n_past
    layout = KvLayout.of(e.model.native.config(), kv)
    spans = [(0, 16), (16, 48), (48, n)]  # page-aligned and not
    blocks = layout.split(data, n, spans)
    s = _session(e, kv)
    s.import_kv_at(0, [(b - a, blk) for (a, b), blk in zip(spans, blocks, strict=True)])
    assert s.export_kv() == data
    # Keeping a prefix that ends inside a page: only the rest is written.
    s2 = _session(e, kv)
    s2.import_kv_at(0, [(48, data_of(layout, data, n, 0, 48))])
    s2.import_kv_at(37, [(n - 37, data_of(layout, data, n, 37, n))])
    assert s2.export_kv() == data


def data_of(layout: KvLayout, data: bytes, n: int, a: int, b: int) -> bytes:
    return layout.split(data, n, [(a, b)])[0]


def test_import_blocks_skips_what_the_session_holds(filled: tuple[Engine, bytes, int]) -> None:
    e, data, n = filled
    layout = KvLayout.of(e.model.native.config(), "f16")
    spans = [(0, 32), (32, 64), (64, n)]
    blocks = [
        (b - a, memoryview(x))
        for (a, b), x in zip(spans, layout.split(data, n, spans), strict=True)
    ]
    s = _session(e)
    s.import_kv_at(0, blocks[:1])
    s.import_kv_at(32, [(8, data_of(layout, data, n, 32, 40))])  # holds 40
    import_blocks(s, (n, blocks), have=40)
    assert s.export_kv() == data


def test_bad_blocks_leave_the_session_unchanged(filled: tuple[Engine, bytes, int]) -> None:
    e, data, n = filled
    layout = KvLayout.of(e.model.native.config(), "f16")
    s = _session(e)
    s.import_kv_at(0, [(n, data)])
    good = data_of(layout, data, n, 0, 16)
    for start, blocks, why in (
        (0, [(16, good[:-1])], "expected"),
        (n + 1, [(16, good)], "cannot import at position"),
        (n, [(16, good)] * 25, "past the context size"),
    ):
        with pytest.raises(OxiLlamaError, match=why):
            s.import_kv_at(start, blocks)
        assert s.export_kv() == data


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(0, 200),
    sizes=st.lists(st.integers(0, 90), max_size=4),
    cut=st.integers(-3, 3),
)
def test_any_blocks_import_or_raise_typed(
    filled: tuple[Engine, bytes, int], start: int, sizes: list[int], cut: int
) -> None:
    """Arbitrary starts, block sizes and byte counts (cut short or
    overlong) either import or raise an OxiLlamaError, never crash, and an
    error leaves the session as it was."""
    e, data, n = filled
    layout = KvLayout.of(e.model.native.config(), "f16")
    s = _session(e)
    s.import_kv_at(0, [(n, data)])
    blocks = []
    at = 0
    for p in sizes:
        a, b = at % n, min(n, at % n + p)
        blk = data_of(layout, data, n, a, b) if b > a else b""
        blocks.append((p, blk[: max(0, len(blk) + cut)] if cut < 0 else blk + bytes(cut)))
        at += p
    try:
        s.import_kv_at(start, blocks)
    except OxiLlamaError:
        assert s.export_kv() == data
