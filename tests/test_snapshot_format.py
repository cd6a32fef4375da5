"""The OXISNAP1 container alone: layout, checksum, section walking, and
mutation of every kind (hypothesis) ending in a SnapshotFormatError."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from oxillama import OxiLlamaError, _native
from oxillama.sessions.format import (
    HEADER,
    MAGIC,
    VERSION,
    Section,
    decode,
    decode_verifying,
    encode,
)
from oxillama.snapshot import SnapshotFormatError

BLOB = encode([Section(1, b'{"a":1}'), Section(2, bytes(range(200))), Section(9, b"")])


def test_layout_is_as_documented() -> None:
    assert BLOB[:8] == MAGIC == b"OXISNAP1"
    version, length = struct.unpack_from("<IQ", BLOB, 8)
    assert version == VERSION == 3 and length == len(BLOB) - 52 == len(BLOB) - HEADER.size
    assert BLOB[20:52] == _native.checksum(BLOB[52:]) + bytes(16)
    tag, n = struct.unpack_from("<IQ", BLOB, 52)
    assert (tag, n, BLOB[64:71]) == (1, 7, b'{"a":1}')


def test_round_trip_and_unknown_sections_are_kept_for_skipping() -> None:
    version, secs = decode(BLOB)
    assert version == 3 and sorted(secs) == [1, 2, 9]
    assert bytes(secs[2]) == bytes(range(200)) and bytes(secs[9]) == b""


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_checksum_on_a_thread_reports_as_the_inline_one(version: int) -> None:
    """Large payloads of BLAKE3 versions are hashed on a thread while the
    caller reads the sections (version 3's checksum runs inline on the
    pool); verified() then raises exactly what decode() raises."""
    big = encode([Section(1, b'{"a":1}'), Section(2, os.urandom(3 << 20))], version=version)
    got, secs, verified = decode_verifying(big)
    verified()
    verified()  # idempotent: restore may wait twice
    assert got == version and bytes(secs[1]) == b'{"a":1}'
    bad = bytearray(big)
    bad[-5] ^= 0x20
    _, secs, verified = decode_verifying(bytes(bad))
    assert bytes(secs[1]) == b'{"a":1}'  # readable, but not yet vouched for
    with pytest.raises(SnapshotFormatError, match="checksum mismatch"):
        verified()
    with pytest.raises(SnapshotFormatError, match="checksum mismatch"):
        decode(bytes(bad))


def test_a_corrupt_section_walk_reports_the_checksum_first() -> None:
    big = bytearray(encode([Section(1, b"x" * (2 << 20))], version=1))
    struct.pack_into("<Q", big, HEADER.size + 4, 1 << 40)  # the section's length
    with pytest.raises(SnapshotFormatError, match="checksum mismatch"):
        decode_verifying(bytes(big))


def test_duplicate_and_overlong_sections_are_refused() -> None:
    with pytest.raises(SnapshotFormatError, match="twice"):
        decode(encode([Section(1, b"x"), Section(1, b"y")]))
    payload = struct.pack("<IQ", 3, 1000) + b"short"
    blob = HEADER.pack(MAGIC, 1, len(payload), _native.blake3(payload)) + payload
    with pytest.raises(SnapshotFormatError, match="claims 1000 bytes"):
        decode(blob)
    payload = b"\x01\x00"
    blob = HEADER.pack(MAGIC, 1, len(payload), _native.blake3(payload)) + payload
    with pytest.raises(SnapshotFormatError, match="truncated section header"):
        decode(blob)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_bit_flip_is_detected(data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(BLOB) - 1))
    bit = data.draw(st.integers(0, 7))
    bad = bytearray(BLOB)
    bad[i] ^= 1 << bit
    with pytest.raises(SnapshotFormatError):
        decode(bytes(bad))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(junk: bytes) -> None:
    for blob in (junk, MAGIC + junk, BLOB[:52] + junk):
        try:
            decode(blob)
        except SnapshotFormatError:
            pass


@settings(max_examples=100, deadline=None)
@given(st.integers(0, len(BLOB) - 1))
def test_every_truncation_is_named(cut: int) -> None:
    with pytest.raises(SnapshotFormatError, match="truncated"):
        decode(BLOB[:cut])


def test_legacy_blake3_files_are_read_and_checked() -> None:
    """Versions 1 and 2 carry the payload's BLAKE3: still read, still
    checked; a version 3 header over a BLAKE3 digest is a mismatch."""
    secs = [Section(1, b'{"a":1}'), Section(2, bytes(range(200)))]
    for version in (1, 2):
        old = encode(secs, version=version)
        assert old[20:52] == _native.blake3(old[52:])
        assert decode(old)[0] == version
        forged = bytearray(old)
        struct.pack_into("<I", forged, 8, 3)
        with pytest.raises(SnapshotFormatError, match="checksum mismatch"):
            decode(bytes(forged))
    new = bytearray(encode(secs))
    new[40] ^= 1  # the padding after the 16-byte checksum is checked too
    with pytest.raises(SnapshotFormatError, match="checksum mismatch"):
        decode(bytes(new))


def test_the_checksum_is_xxh3_over_one_mib_leaves() -> None:
    """The definition in rust/checksum.rs, recomputed with the reference
    XXH3 implementation (the xxhash package): leaves of 1 MiB, then their
    little-endian digests hashed with the payload's length as seed."""
    for n in (0, 5, (1 << 20) - 1, 1 << 20, (3 << 20) + 17):
        data = os.urandom(n)
        leaves = b"".join(
            xxhash.xxh3_128_intdigest(data[i : i + (1 << 20)]).to_bytes(16, "little")
            for i in range(0, n, 1 << 20)
        )
        want = xxhash.xxh3_128_intdigest(leaves, seed=n).to_bytes(16, "little")
        assert _native.checksum(data) == want, n


def test_write_checksummed_writes_the_payload_and_returns_its_checksum(tmp_path: Path) -> None:
    # Big enough for the parallel path: the write runs beside the hash.
    payload = bytearray(i * 131 % 256 for i in range(3 << 20))
    path = tmp_path / "img"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, b"H" * HEADER.size)
        digest = _native.write_checksummed(fd, payload, HEADER.size)
    finally:
        os.close(fd)
    assert digest == _native.checksum(bytes(payload))
    assert path.read_bytes() == b"H" * HEADER.size + payload


def test_write_checksummed_reports_a_bad_descriptor() -> None:
    with pytest.raises(OSError):
        _native.write_checksummed(10_000, b"x" * 100, 0)
    with pytest.raises(OxiLlamaError):
        _native.write_checksummed(-1, b"x", 0)


GOOD_FP = {
    "size": 10,
    "mtime_ns": 1,
    "probe": 8,
    "head_blake3": "ab",
    "tail_blake3": "cd",
}


def test_a_stored_fingerprint_round_trips() -> None:
    from oxillama.model.fingerprint import Fingerprint

    assert Fingerprint.from_dict(GOOD_FP).to_dict() == GOOD_FP


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mtime_ns", float("inf")),  # a fuzzer's find: OverflowError before
        ("size", 10.0),
        ("size", True),
        ("probe", "8"),
        ("head_blake3", 171),
        ("tail_blake3", None),
    ],
)
def test_a_fingerprint_field_of_the_wrong_type_is_a_format_error(field: str, value: object) -> None:
    from oxillama.model.fingerprint import Fingerprint

    with pytest.raises(SnapshotFormatError, match=field):
        Fingerprint.from_dict({**GOOD_FP, field: value})


def test_a_fingerprint_without_a_field_is_a_format_error() -> None:
    from oxillama.model.fingerprint import Fingerprint

    with pytest.raises(SnapshotFormatError, match="missing probe"):
        Fingerprint.from_dict({k: v for k, v in GOOD_FP.items() if k != "probe"})
