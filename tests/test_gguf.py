"""GGUF parsing: a valid file round-trips; every kind of damage is a LoadError."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oxillama import LoadError, _native
from tests._gguf_builder import ARRAY, GGUF, STRING, U32, U64, Tensor, small_model_file

VALID = small_model_file().build()


def parse(data: bytes) -> _native.GgufFile:
    return _native.GgufFile.from_bytes(data)


def test_valid_file_round_trips(tmp_path: Path) -> None:
    f = parse(VALID)
    meta = f.metadata()
    assert meta["general.name"] == "tiny test ✓"
    assert meta["test.u64"] == 2**63 and meta["test.i64"] == -(2**62)
    assert meta["test.u16"] == 65535 and meta["test.i8"] == -7 and meta["test.bool"] is True
    assert meta["test.strings"] == ["a", "bc", ""]
    assert meta["test.nested"] == [[1, 2], [3]]
    assert meta["test.empty"] == []
    names = [t[0] for t in f.tensors()]
    assert names == ["a.weight", "b.weight", "c.weight"]
    # Our builder agrees with llama.cpp's own reader on the same bytes.
    path = tmp_path / "t.gguf"
    path.write_bytes(VALID)
    ref = gguf.GGUFReader(path)
    for t in ref.tensors:
        assert f.tensor_bytes(t.name) == bytes(t.data.tobytes())
    mapped = _native.GgufFile.open(str(path))
    assert mapped.is_mapped and mapped.metadata() == meta


def expect_error(data: bytes, *fragments: str) -> None:
    with pytest.raises(LoadError) as e:
        parse(data)
    msg = str(e.value)
    for frag in fragments:
        assert frag in msg, msg


def test_every_truncation_of_the_header_is_an_error() -> None:
    data_offset = parse(VALID).data_offset
    for n in range(data_offset):
        with pytest.raises(LoadError):
            parse(VALID[:n])


def test_truncated_tensor_data_names_the_tensor() -> None:
    f = parse(VALID)
    last = f.tensors()[-1]
    expect_error(VALID[: last[3] + 10], "tensor c.weight extends past end of file", "file size")


def test_bad_magic_and_versions() -> None:
    expect_error(b"GGML" + VALID[4:], "bad magic")
    expect_error(b"", "truncated")
    for v in (0, 1, 4, 999):
        expect_error(VALID[:4] + struct.pack("<I", v) + VALID[8:], f"unsupported GGUF version {v}")
    expect_error(VALID[:4] + struct.pack(">I", 3) + VALID[8:], "big-endian")


def header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def test_absurd_counts_are_rejected_before_allocation() -> None:
    expect_error(header(2**63, 0), "tensor count")
    expect_error(header(0, 2**64 - 1), "metadata count")
    big_array = GGUF(kvs=[("x", STRING, "y")]).build()
    # String length claiming more bytes than exist.
    bad = header(0, 1) + struct.pack("<Q", 2**62) + b"key" + bytes(32)
    expect_error(bad, "metadata key #0")
    # Array length far beyond the file.
    arr = header(0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", ARRAY, U32, 2**60)
    expect_error(arr, "array length")
    assert parse(big_array).metadata() == {"x": "y"}


def test_nested_arrays_too_deep() -> None:
    value: tuple[int, list] = (U32, [1])
    for _ in range(20):
        value = (ARRAY, [value])
    expect_error(GGUF(kvs=[("deep", ARRAY, value)]).build(), "nested deeper")


def test_unknown_value_type_and_bad_bool() -> None:
    expect_error(
        header(0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 77) + b"\0" * 16,
        "unknown value type 77",
    )
    expect_error(
        header(0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 7) + b"\x05" + b"\0" * 16,
        "bool",
    )


def test_duplicate_keys_and_tensors() -> None:
    expect_error(GGUF(kvs=[("a", U32, 1), ("a", U32, 2)]).build(), "duplicate metadata key a")
    t = Tensor("w", [32], 0, bytes(128))
    expect_error(GGUF(tensors=[t, t]).build(), "duplicate tensor name w")


@pytest.mark.parametrize(
    ("dims", "ggml_type", "fragment"),
    [
        ([32, 1, 1, 1, 1], 0, "5 dimensions"),
        ([0, 4], 0, "dimension 0 is 0"),
        ([2**40, 2**40], 0, "too large"),
        ([33], 2, "whole number of Q4_0 blocks"),
        ([32], 99, "unsupported type id 99"),
        ([32], 4, "unsupported type id 4"),
    ],
)
def test_bad_tensor_shapes_and_types(dims: list[int], ggml_type: int, fragment: str) -> None:
    expect_error(GGUF(tensors=[Tensor("w", dims, ggml_type, bytes(128))]).build(), fragment)


def test_offsets_past_end_and_misaligned() -> None:
    good = GGUF(tensors=[Tensor("w", [32], 0, bytes(128))]).build()
    # Locate the tensor's offset field: it is the last 8 bytes before the padding.
    f = parse(good)
    info_end = good.index(b"w") + 1 + 4 + 8 + 4  # name, n_dims, one dim, type
    for off, frag in [
        (2**63, "extends past end of file"),
        (4096, "extends past end of file"),
        (3, "not a multiple of the alignment"),
    ]:
        bad = good[:info_end] + struct.pack("<Q", off) + good[info_end + 8 :]
        expect_error(bad, frag)
    assert f.tensors()[0][3] == f.data_offset


def test_bad_alignment_metadata() -> None:
    for a in (0, 3, 2**40):
        expect_error(GGUF(kvs=[("general.alignment", U64, a)]).build(), "general.alignment")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="cannot open"):
        _native.GgufFile.open(str(tmp_path / "nope.gguf"))
    with pytest.raises(LoadError, match="not a regular file"):
        _native.GgufFile.open(str(tmp_path))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, len(VALID)),
)
def test_mutated_files_never_crash(edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(VALID)
    for i, v in edits:
        data[i] = v
    for candidate in (bytes(data), bytes(data[:cut])):
        try:
            f = parse(candidate)
        except LoadError:
            continue
        # Whatever parses must be internally consistent.
        for _name, _ty, _dims, off, nbytes in f.tensors():
            assert off + nbytes <= f.file_size


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_after_a_valid_prefix(tail: bytes) -> None:
    for prefix in (b"GGUF" + struct.pack("<I", 3), VALID[:40]):
        try:
            parse(prefix + tail)
        except LoadError:
            pass


def test_real_model_file(model_path: Path) -> None:
    f = _native.GgufFile.open(str(model_path))
    meta = f.metadata()
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 30
    types = [t[1] for t in f.tensors()]
    assert types.count("Q4_1") == 210 and types.count("F32") == 61 and types.count("Q8_0") == 1
    assert len(meta["tokenizer.ggml.tokens"]) == 49152
    ref = gguf.GGUFReader(model_path)
    by_name = {t.name: t for t in ref.tensors}
    for name, _ty, dims, off, nbytes in f.tensors()[:20]:
        r = by_name[name]
        assert list(dims) == [int(d) for d in r.shape] and nbytes == r.n_bytes
        assert off == r.data_offset


def test_float_tensor_values_match_numpy() -> None:
    f = parse(VALID)
    a = np.frombuffer(f.tensor_bytes("a.weight"), dtype=np.float32)
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(a, rng.standard_normal((4, 32)).astype(np.float32).ravel())
