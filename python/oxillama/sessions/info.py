"""``oxillama.sessions.info``: what a snapshot holds, without a model."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oxillama.errors import SnapshotError
from oxillama.model.fingerprint import Fingerprint
from oxillama.model.hub import HubRef
from oxillama.sessions.atomic import refuse_temp
from oxillama.sessions.format import MAGIC, read_header
from oxillama.sessions.sections import LORA, decode_json
from oxillama.sessions.session import lora_entries, parse, snap_rot_of


@dataclass(frozen=True)
class SnapshotInfo:
    magic: bytes
    version: int
    arch_id: str
    model_path: str
    tokenizer_path: str | None
    max_context_length: int
    num_threads: int
    tokens_count: int
    kv_dtype: str
    created_at: str
    size_bytes: int
    fingerprint: Fingerprint
    library_version: str
    #: Hub repo, commit and file of a model loaded by hub name, else None.
    hub: HubRef | None = None
    #: Active LoRA adapters: ``name``, ``path``, ``fingerprint``, ``scale``.
    loras: tuple[dict[str, Any], ...] = ()
    #: Hadamard block sizes the cached keys and values are stored under
    #: (0: unrotated; see ``OXILLAMA_ATTN_ROT_DISABLE``).
    kv_rot: tuple[int, int] = (0, 0)


def info(source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> SnapshotInfo:
    """Reads and verifies a snapshot (file path or bytes); loads no model."""
    if isinstance(source, (str, os.PathLike)):
        refuse_temp(source)
        try:
            blob: bytes | bytearray | memoryview = Path(source).read_bytes()
        except OSError as e:
            raise SnapshotError(f"cannot read snapshot {str(source)!r}: {e}") from e
    else:
        blob = source
    version, _ = read_header(blob)
    meta, secs = parse(blob)
    loras = tuple(lora_entries(decode_json(secs[LORA], "lora"))) if LORA in secs else ()
    eng = meta["engine"] if isinstance(meta["engine"], dict) else {}
    tok = meta.get("tokenizer_path")
    return SnapshotInfo(
        magic=MAGIC,
        version=version,
        arch_id=str(meta["arch"]),
        model_path=str(meta["model_path"]),
        tokenizer_path=tok if isinstance(tok, str) else None,
        max_context_length=int(eng.get("context_size", 0)),
        num_threads=int(eng.get("threads", 0)),
        tokens_count=int(meta["n_past"]),
        kv_dtype=str(eng.get("kv_dtype", "")),
        created_at=str(meta.get("created_at", "")),
        size_bytes=len(blob),
        fingerprint=Fingerprint.from_dict(meta["fingerprint"]),
        library_version=str(meta.get("library_version", "")),
        hub=HubRef.from_dict(meta.get("hub")),
        loras=loras,
        kv_rot=snap_rot_of(eng),
    )
