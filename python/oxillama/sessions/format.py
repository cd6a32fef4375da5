"""The OXISNAP1 container: magic, version, checksum, tagged sections.

Layout (all integers little-endian)::

    offset  size  field
    0       8     magic  b"OXISNAP1"
    8       4     u32    format version
    12      8     u64    payload length P
    20      32    checksum of the payload
    52      P     payload: a sequence of sections

    section := u32 tag | u64 length L | L bytes

The checksum of version 3 is ``_native.checksum`` (XXH3-128 over 1 MiB
leaves and then over their digests, see ``rust/checksum.rs``) followed by 16
zero bytes; versions 1 and 2 carry the payload's BLAKE3 and are still read.
Both guard against corruption; neither authenticates (whoever writes a file
can write its digest), so the cheaper one is written.

Readers skip sections whose tag they do not know, so later versions can add
sections without breaking older readers. Nothing in the payload is used
before the checksum has been verified.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import oxillama._native as _native
from oxillama.errors import ParameterError, SnapshotFormatError

MAGIC = b"OXISNAP1"
#: BLAKE3 checksums, plain KV rows.
VERSION_BLAKE3 = 1
#: BLAKE3 checksums, KV rows possibly stored Hadamard-rotated
#: (``meta.engine.kv_rot``): version 1 readers would take rotated rows for
#: plain ones, so such files were given a version they refuse.
VERSION_KV_ROT = 2
#: The version written: the XXH3 leaf checksum; ``meta.engine.kv_rot``
#: says whether rows are rotated (no reader of versions 1 and 2 accepts it).
VERSION = 3
#: Versions this reader accepts (every version it has shipped).
SUPPORTED_VERSIONS = frozenset({VERSION_BLAKE3, VERSION_KV_ROT, VERSION})
#: A version 3 header's checksum field: the 16-byte checksum, then zeros.
_PAD = bytes(16)
HEADER = struct.Struct("<8sIQ32s")
SECTION = struct.Struct("<IQ")


@dataclass(frozen=True)
class Section:
    tag: int
    data: bytes | memoryview


def encode(sections: Iterable[Section], *, magic: bytes = MAGIC, version: int = VERSION) -> bytes:
    """Serializes sections into one container (header + checksummed payload)."""
    parts: list[bytes | memoryview] = []
    for s in sections:
        parts.append(SECTION.pack(s.tag, len(s.data)))
        parts.append(s.data)
    payload = b"".join(parts)
    return HEADER.pack(magic, version, len(payload), checksum(payload, version)) + payload


def checksum(payload: bytes | bytearray | memoryview, version: int = VERSION) -> bytes:
    """The header's 32-byte checksum field for ``payload`` in ``version``."""
    if version >= VERSION:
        return _native.checksum(payload) + _PAD
    return _native.blake3(payload)


#: A section written in place: (tag, length, fill) where ``fill`` writes
#: exactly ``length`` bytes into the view it is given.
Writer = tuple[int, int, Callable[[memoryview], None]]


def encoded_size(sections: Iterable[Writer]) -> int:
    """Bytes :func:`encode_into` writes for these sections."""
    return HEADER.size + sum(SECTION.size + n for _, n, _ in sections)


def encode_into(
    sections: Iterable[Writer],
    out: bytearray | memoryview | None = None,
    *,
    magic: bytes = MAGIC,
    version: int = VERSION,
) -> bytearray | memoryview:
    """Like :func:`encode`, but each section fills its own slice of one
    buffer, so large sections (the KV cache) are copied once. ``out``, when
    given, must be writable and exactly :func:`encoded_size` bytes long (a
    mapped file, say); otherwise a new bytearray is returned."""
    secs = list(sections)
    if out is None:
        out = bytearray(encoded_size(secs))
    view = fill_payload(secs, out)
    seal(view, checksum(view[HEADER.size :], version), magic=magic, version=version)
    return out


def fill_payload(sections: list[Writer], out: bytearray | memoryview) -> memoryview:
    """Writes every section into ``out`` (exactly :func:`encoded_size`
    bytes, writable) after room for the header, which :func:`seal` fills
    once the payload's digest is known; returns a view of ``out``."""
    size = encoded_size(sections)
    view = memoryview(out)
    if view.nbytes != size or view.readonly:
        raise ParameterError(f"encode_into needs a writable {size}-byte buffer, got {view.nbytes}")
    pos = HEADER.size
    for tag, n, fill in sections:
        SECTION.pack_into(view, pos, tag, n)
        pos += SECTION.size
        fill(view[pos : pos + n])
        pos += n
    return view


def seal(view: memoryview, digest: bytes, *, magic: bytes = MAGIC, version: int = VERSION) -> None:
    """Writes the header of a filled container, given its payload's
    checksum (:func:`checksum`; a bare 16-byte one is padded)."""
    if len(digest) == len(_PAD):
        digest += _PAD
    HEADER.pack_into(view, 0, magic, version, view.nbytes - HEADER.size, digest)


def read_header(blob: bytes | bytearray | memoryview, *, magic: bytes = MAGIC) -> tuple[int, int]:
    """Checks magic and version; returns ``(version, payload_length)``."""
    name = magic.decode()
    if len(blob) < len(magic):
        raise SnapshotFormatError(f"truncated: {len(blob)} bytes is shorter than the {name} magic")
    if bytes(blob[: len(magic)]) != magic:
        raise SnapshotFormatError(
            f"bad magic {bytes(blob[: len(magic)])!r}: not an {name} snapshot"
        )
    if len(blob) < HEADER.size:
        raise SnapshotFormatError(
            f"truncated: {len(blob)} bytes is shorter than the {HEADER.size}-byte header"
        )
    _, version, length, _ = HEADER.unpack_from(blob)
    if version not in SUPPORTED_VERSIONS:
        newest = max(SUPPORTED_VERSIONS)
        raise SnapshotFormatError(
            f"unsupported {name} version {version}: this reader knows versions up to {newest}"
            + ("; upgrade oxillama to read it" if version > newest else "")
        )
    return version, length


def decode(
    blob: bytes | bytearray | memoryview, *, magic: bytes = MAGIC
) -> tuple[int, dict[int, memoryview]]:
    """Verifies a container and returns ``(version, {tag: section data})``."""
    version, secs, verified = decode_verifying(blob, magic=magic, background=False)
    verified()
    return version, secs


def decode_verifying(
    blob: bytes | bytearray | memoryview, *, magic: bytes = MAGIC, background: bool = True
) -> tuple[int, dict[int, memoryview], Callable[[], None]]:
    """:func:`decode` with the checksum still running (on a thread when
    ``background`` and the payload is large): returns ``(version, sections,
    verified)``, where ``verified()`` waits and raises
    :class:`SnapshotFormatError` on a mismatch. Until it returns, the
    sections are unverified: read them, change nothing by them, and call
    ``verified()`` before raising any error found in them (a corrupt file
    reports its checksum, as :func:`decode` does)."""
    view = memoryview(blob)
    version, length = read_header(view, magic=magic)
    end = HEADER.size + length
    if len(view) < end:
        raise SnapshotFormatError(
            f"truncated: header announces a {length}-byte payload, "
            f"only {len(view) - HEADER.size} bytes follow"
        )
    if len(view) > end:
        raise SnapshotFormatError(f"{len(view) - end} unexpected bytes after the payload")
    payload = view[HEADER.size : end]
    digest = bytes(view[20:52])
    verified = _checksum(payload, digest, version, background)
    try:
        secs = dict(_sections(payload))
    except SnapshotFormatError:
        verified()
        raise
    return version, secs, verified


#: Below this a payload is hashed in place: a thread costs more than it
#: hides. A version 3 checksum runs at memory speed on the pool: always.
_BACKGROUND_MIN = 1 << 20


def _checksum(
    payload: memoryview, digest: bytes, version: int, background: bool
) -> Callable[[], None]:
    """The wait for ``payload``'s checksum to be compared with ``digest``."""
    found: list[bytes] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            found.append(checksum(payload, version))
        except BaseException as e:  # re-raised by verified(), in the caller's thread
            failed.append(e)

    def verified() -> None:
        if thread is not None:
            thread.join()
        if failed:
            raise failed[0]
        if found != [digest]:
            raise SnapshotFormatError("checksum mismatch: the snapshot is corrupt")

    thread = None
    if background and version < VERSION and len(payload) >= _BACKGROUND_MIN:
        # The hash runs without the GIL: a restore loads its model meanwhile.
        thread = threading.Thread(target=run, name="oxillama-snapshot-checksum", daemon=True)
        thread.start()
    else:
        run()
    return verified


def _sections(payload: memoryview) -> Iterator[tuple[int, memoryview]]:
    pos = 0
    seen: set[int] = set()
    while pos < len(payload):
        if len(payload) - pos < SECTION.size:
            raise SnapshotFormatError(f"truncated section header at payload offset {pos}")
        tag, length = SECTION.unpack_from(payload, pos)
        pos += SECTION.size
        if length > len(payload) - pos:
            raise SnapshotFormatError(
                f"section {tag} at payload offset {pos} claims {length} bytes, "
                f"only {len(payload) - pos} remain"
            )
        if tag in seen:
            raise SnapshotFormatError(f"section {tag} appears twice")
        seen.add(tag)
        yield tag, payload[pos : pos + length]
        pos += length
