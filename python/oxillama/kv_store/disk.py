"""The directory tier: one file per block, bounded in bytes, least recently
used first out.

Files are written to a temporary name and renamed into place, so a reader
never sees half a block and two processes writing the same block each
rename a whole one. A read refreshes the file's modification time, which is
what eviction orders by (access times are often not kept: noatime).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from pathlib import Path

from oxillama.errors import ParameterError
from oxillama.mapped import map_file

SUFFIX = ".kvb"


#: Age past which a temporary file is a dead writer's, deleted when the
#: folder is counted.
STALE_TMP_SECONDS = 3600.0


class DiskTier:
    name = "disk"
    #: What a failed read or write raises (a full disk, a lost mount).
    errors: tuple[type[BaseException], ...] = (OSError,)

    def __init__(self, path: str | os.PathLike[str], max_bytes: int | None) -> None:
        self.root = Path(path)
        self.max_bytes = max_bytes
        # The folder is made now; its contents are read only on demand.
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ParameterError(f"kv_store: cannot create the folder {self.root}: {e}") from e
        self._lock = threading.Lock()
        #: Bytes in the folder as last counted plus what this process wrote
        #: since (None: not counted yet); other writers are found by the
        #: full count that runs whenever the estimate passes the bound.
        self._used: int | None = None

    def _path(self, key: bytes) -> Path:
        h = key.hex()
        return self.root / h[:2] / (h + SUFFIX)

    def has(self, key: bytes) -> bool:
        return self._path(key).is_file()

    def has_many(self, keys: list[bytes]) -> list[bool]:
        return [self.has(k) for k in keys]

    def get(self, key: bytes) -> bytes | memoryview | None:
        """The block's bytes, mapped rather than read: the checksum and the
        KV import then read the page cache where it lies, and no fresh
        memory (a page fault per 4 KiB) is written for a copy. Blocks are
        only ever replaced by a rename, never rewritten in place, so the
        mapping stays whole while it is read."""
        p = self._path(key)
        try:
            with p.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    data: bytes | memoryview = b""  # a miss, counted as corrupt
                else:
                    data = memoryview(map_file(f.fileno()))
        except FileNotFoundError:
            return None
        with contextlib.suppress(OSError):
            os.utime(p)  # recently used: evicted last
        return data

    def discard(self, key: bytes) -> None:
        with contextlib.suppress(OSError):
            self._path(key).unlink()

    def put(self, key: bytes, data: bytes) -> bool:
        """Writes the block unless it is there (then only marks it used);
        True when this call wrote it. Raises OSError (a full disk)."""
        if self.max_bytes is not None and len(data) > self.max_bytes:
            return False
        p = self._path(key)
        if p.is_file():
            with contextlib.suppress(OSError):
                os.utime(p)
            return False
        p.parent.mkdir(exist_ok=True)
        tmp = p.parent / f".{p.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        with self._lock:
            if self._used is not None:
                self._used += len(data)
        self._bound()
        return True

    def _files(self) -> list[tuple[float, int, Path]]:
        out = []
        stale = time.time() - STALE_TMP_SECONDS
        for sub in self.root.iterdir():
            if not sub.is_dir():
                continue
            for e in os.scandir(sub):
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat()
                    if e.name.endswith(SUFFIX):
                        out.append((st.st_mtime, st.st_size, Path(e.path)))
                    elif e.name.endswith(".tmp") and st.st_mtime < stale:
                        # A writer that died mid-block (the rename never came).
                        os.unlink(e.path)
        return out

    def _bound(self) -> None:
        if self.max_bytes is None:
            return
        with self._lock:
            if self._used is not None and self._used <= self.max_bytes:
                return
            files = self._files()
            used = sum(size for _, size, _ in files)
            for _, size, path in sorted(files):
                if used <= self.max_bytes:
                    break
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                used -= size
            self._used = used

    def bytes_used(self) -> int:
        """Bytes of blocks in the folder now (a full count)."""
        return sum(size for _, size, _ in self._files())
