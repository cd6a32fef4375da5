"""The prefix store: tiers in order, lookups that restore the longest run of
stored blocks, and a writer thread that stores a finished response's blocks.

A tier that fails (a full disk, a Redis that is down) is counted, logged and
skipped for a few seconds; a block that fails its checksum is a miss,
counted and deleted. Neither reaches the caller: the prompt is prefilled.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

from oxillama.kv_store import blockfile
from oxillama.kv_store.counters import Counters
from oxillama.kv_store.key import CHUNK, chain
from oxillama.kv_store.layout import KvLayout

log = logging.getLogger("oxillama.kv_store")

#: Seconds a failed tier is skipped before it is tried again.
RETRY_SECONDS = 5.0
#: Bytes of blocks waiting for the writer beyond which a save is dropped
#: (the writer is behind: a slow disk or Redis must not grow memory).
MAX_PENDING_BYTES = 1 << 30
#: Keys remembered as present in every tier (saves skip them).
KNOWN_KEYS = 1 << 16


class Tier(Protocol):
    name: str
    errors: tuple[type[BaseException], ...]

    def has_many(self, keys: list[bytes]) -> list[bool]: ...
    def get(self, key: bytes) -> bytes | None: ...
    def put(self, key: bytes, data: bytes) -> bool: ...
    def discard(self, key: bytes) -> None: ...


_Job = tuple[list[bytes], list[bytes], list[Tier]]


def _close_at_exit(ref: weakref.ref[KvStore]) -> None:
    store = ref()
    if store is not None:
        store.close()


class KvStore:
    """Tiers in lookup order (fastest first). Thread-safe."""

    def __init__(self, tiers: Sequence[Tier]) -> None:
        self.tiers = list(tiers)
        self.counters = Counters([t.name for t in self.tiers])
        self._down: dict[int, float] = {}
        self._known: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        # A graceful exit stores what is queued (weakly: the store may go first).
        atexit.register(_close_at_exit, weakref.ref(self))

    # ------------------------------------------------------------- failures

    def _up(self, i: int) -> bool:
        return self._down.get(i, 0.0) <= time.monotonic()

    def _failed(self, i: int, what: str, err: BaseException) -> None:
        t = self.tiers[i]
        self.counters.add(t.name, errors=1)
        self._down[i] = time.monotonic() + RETRY_SECONDS
        log.warning(
            "kv_store: %s tier %s failed (%s); using the other tiers for %.0f s",
            t.name,
            what,
            err,
            RETRY_SECONDS,
        )

    # --------------------------------------------------------------- lookup

    def fetch(
        self, root: bytes, layout: KvLayout, tokens: Sequence[int], have: int = 0
    ) -> tuple[int, bytearray] | None:
        """The KV of the longest run of stored blocks at the start of
        ``tokens`` that leaves at least one token to evaluate, as
        ``(positions, export bytes)``; None when it would not go past the
        ``have`` positions the caller already holds."""
        m = (len(tokens) - 1) // CHUNK
        if m <= 0 or m * CHUNK <= have:
            return None
        keys = chain(root, tokens, m)
        where: list[list[int]] = [[] for _ in keys]
        for i, t in enumerate(self.tiers):
            if not self._up(i):
                continue
            try:
                found = t.has_many(keys)
            except t.errors as e:
                self._failed(i, "lookup", e)
                continue
            for j, ok in enumerate(found):
                if ok:
                    where[j].append(i)
        payloads: list[memoryview] = []
        took: list[int] = []
        for j, key in enumerate(keys):
            got = self._read(key, where[j])
            if got is None:
                break
            took.append(got[0])
            payloads.append(got[1])
        n = len(payloads)
        if n < m:
            for i, t in enumerate(self.tiers):
                if i not in where[n] and self._up(i):
                    self.counters.add(t.name, misses=1)
            with self._lock:
                self._known.pop(keys[n], None)
        if n * CHUNK <= have:
            return None
        promote: dict[int, tuple[list[bytes], list[bytes]]] = {}
        for j, (i, p) in enumerate(zip(took, payloads, strict=True)):
            saved = CHUNK - max(0, min(CHUNK, have - j * CHUNK))
            self.counters.add(
                self.tiers[i].name, hits=1, tokens_saved=saved, bytes_saved=len(p) if saved else 0
            )
            # Faster tiers that lacked the block get it (in the background).
            for k in range(i):
                if k not in where[j]:
                    ks, ds = promote.setdefault(k, ([], []))
                    ks.append(keys[j])
                    ds.append(blockfile.encode(keys[j], CHUNK, bytes(p)))
        for k, (ks, ds) in promote.items():
            self._enqueue((ks, ds, [self.tiers[k]]))
        return n * CHUNK, layout.join(payloads, CHUNK)

    def _read(self, key: bytes, tiers: list[int]) -> tuple[int, memoryview] | None:
        for i in tiers:
            t = self.tiers[i]
            if not self._up(i):
                continue
            try:
                data = t.get(key)
            except t.errors as e:
                self._failed(i, "read", e)
                continue
            if data is None:
                continue  # evicted since the probe
            try:
                return i, blockfile.decode(key, CHUNK, data)
            except blockfile.CorruptBlock as e:
                self.counters.add(t.name, corrupt_blocks=1)
                log.warning("kv_store: %s block %s is corrupt (%s): a miss", t.name, key.hex(), e)
                try:
                    t.discard(key)
                except t.errors as err:
                    self._failed(i, "delete", err)
        return None

    # ---------------------------------------------------------------- saves

    def save(self, root: bytes, layout: KvLayout, tokens: Sequence[int], session: Any) -> int:
        """Queues the blocks of ``tokens`` whose KV ``session`` holds (its
        first ``n_past`` positions) that are not known to be stored yet;
        returns how many. The export happens now, the writes on the
        writer thread."""
        n = min(int(session.n_past), len(tokens))
        m = n // CHUNK
        if m == 0 or not self.tiers:
            return 0
        keys = chain(root, tokens, m)
        with self._lock:
            new = [j for j, k in enumerate(keys) if k not in self._known]
        if not new:
            return 0
        export = session.export_kv()
        past = int(session.n_past)
        spans = [(j * CHUNK, (j + 1) * CHUNK) for j in new]
        blocks = layout.split(export, past, spans)
        del export
        data = [blockfile.encode(keys[j], CHUNK, b) for j, b in zip(new, blocks, strict=True)]
        self._enqueue(([keys[j] for j in new], data, list(self.tiers)))
        return len(new)

    def _enqueue(self, job: _Job) -> None:
        size = sum(len(d) for d in job[1])
        with self._lock:
            if self._closed:
                return
            if self._pending + size > MAX_PENDING_BYTES:
                log.warning("kv_store: the writer is behind; %d blocks not stored", len(job[0]))
                return
            self._pending += size
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._writer, name="oxillama-kv-store", daemon=True
                )
                self._thread.start()
        self._queue.put(job)

    def _writer(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(job)
            finally:
                self._queue.task_done()

    def _write(self, job: _Job) -> None:
        keys, data, tiers = job
        stored = [True] * len(keys)
        for t in tiers:
            i = self.tiers.index(t)
            for j, (k, d) in enumerate(zip(keys, data, strict=True)):
                if not self._up(i):
                    stored[j] = False
                    continue
                try:
                    if t.put(k, d):
                        self.counters.add(t.name, writes=1)
                except t.errors as e:
                    stored[j] = False
                    self._failed(i, "write", e)
        with self._lock:
            self._pending -= sum(len(d) for d in data)
            if len(tiers) == len(self.tiers):
                for k, ok in zip(keys, stored, strict=True):
                    if ok:
                        self._known[k] = None
                        self._known.move_to_end(k)
                while len(self._known) > KNOWN_KEYS:
                    self._known.popitem(last=False)

    def flush(self) -> None:
        """Waits until every queued block is written (or failed)."""
        self._queue.join()

    def close(self) -> None:
        """Writes what is queued and stops the writer."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def metrics(self) -> dict[str, int]:
        return self.counters.as_dict()
