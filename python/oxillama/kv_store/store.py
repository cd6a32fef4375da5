"""The prefix store: tiers in order, lookups that restore the longest run of
stored blocks, and a writer thread that stores a finished response's blocks.

A tier that fails (a full disk, a Redis that is down) is counted, logged and
skipped for a few seconds; a block that fails its checksum is a miss,
counted and deleted. Neither reaches the caller: the prompt is prefilled.
"""

from __future__ import annotations

import atexit
import functools
import logging
import queue
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from oxillama.kv_store import blockfile
from oxillama.kv_store.counters import Counters
from oxillama.kv_store.key import CHUNK, PAGE, PAGES_PER_CHUNK, chain
from oxillama.kv_store.layout import KvLayout

log = logging.getLogger("oxillama.kv_store")

#: Seconds a failed tier is skipped before it is tried again.
RETRY_SECONDS = 5.0
#: Bytes of blocks waiting for the writer beyond which a save is dropped
#: (the writer is behind: a slow disk or Redis must not grow memory).
MAX_PENDING_BYTES = 1 << 30
#: A restore copies every position from the first, so it must spare the
#: prefill of at least this fraction of them (and a page): a prefilled
#: token costs a few hundred times a copied position.
MIN_GAIN = 1 / 64
#: Keys remembered as present in every tier (saves skip them).
KNOWN_KEYS = 1 << 16


class Tier(Protocol):
    name: str
    errors: tuple[type[BaseException], ...]

    def has_many(self, keys: list[bytes]) -> list[bool]: ...
    def get(self, key: bytes) -> bytes | memoryview | None: ...
    def put(self, key: bytes, data: bytes) -> bool: ...
    def discard(self, key: bytes) -> None: ...


#: Keys, the bytes the job holds, what makes the encoded blocks (on the
#: writer thread: cutting and checksumming a long export takes a while),
#: and the tiers to write.
_Job = tuple[list[bytes], int, Callable[[], list[bytes]], list[Tier]]


#: What :meth:`KvStore.fetch` finds: the positions, and the blocks that
#: hold them from position 0 (each ``(positions, KV export)``).
Fetched = tuple[int, list[tuple[int, memoryview]]]


def import_blocks(session: Any, got: Fetched, have: int) -> None:
    """Puts fetched blocks into ``session``, which holds ``have`` positions
    of the same tokens: blocks that end within them are skipped, the rest
    are written where they lie (no joined copy). On error the session is
    unchanged."""
    start, todo = 0, got[1]
    while todo and start + todo[0][0] <= have:
        start += todo[0][0]
        todo = todo[1:]
    session.import_kv_at(start, todo)


def _worth(n: int, have: int) -> bool:
    """Whether restoring ``n`` positions pays when ``have`` are held."""
    return n - have >= max(PAGE, int(n * MIN_GAIN))


def _encode_all(blocks: list[tuple[bytes, int, memoryview]]) -> list[bytes]:
    return [blockfile.encode(key, positions, p) for key, positions, p in blocks]


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

    def _probe(self, keys: list[bytes]) -> list[list[int]]:
        """For each key, the tiers (up now) that hold it."""
        where: list[list[int]] = [[] for _ in keys]
        if not keys:
            return where
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
        return where

    def fetch(self, root: bytes, tokens: Sequence[int], have: int = 0) -> Fetched | None:
        """The longest run of stored blocks at the start of ``tokens`` that
        leaves at least one token to evaluate, as ``(positions, blocks)``
        (each block ``(its positions, its KV export)``, in order, for
        ``Session.import_kv_at``: see :func:`import_blocks`); None when it
        would not go past the ``have`` positions the caller already holds."""
        n_pages = (len(tokens) - 1) // PAGE
        if n_pages <= 0 or not _worth(n_pages * PAGE, have):
            return None
        pages = chain(root, tokens, n_pages)
        # Whole blocks first, then the longest partial block after them.
        full = n_pages // PAGES_PER_CHUNK
        ends = [(c + 1) * PAGES_PER_CHUNK for c in range(full)]
        where = self._probe([pages[e - 1] for e in ends])
        plan: list[tuple[int, list[int]]] = []  # (end page, tiers)
        for e, w in zip(ends, where, strict=True):
            if not w:
                break
            plan.append((e, w))
        lo = len(plan) * PAGES_PER_CHUNK
        hi = min(n_pages, lo + PAGES_PER_CHUNK - 1)
        if hi > lo:
            tails = list(range(hi, lo, -1))
            for e, w in zip(tails, self._probe([pages[e - 1] for e in tails]), strict=True):
                if w:
                    plan.append((e, w))
                    break
        got: list[tuple[int, int, memoryview]] = []  # (tier, positions, payload)
        start = 0
        for e, w in plan:
            positions = (e - start) * PAGE
            read = self._read(pages[e - 1], positions, w)
            if read is None:
                break
            got.append((read[0], positions, read[1]))
            start = e
        n = start * PAGE
        if n < n_pages * PAGE:
            for i, t in enumerate(self.tiers):
                if self._up(i) and not any(g[0] == i for g in got):
                    self.counters.add(t.name, misses=1)
        if not _worth(n, have):
            return None
        promote: dict[int, list[tuple[bytes, int, memoryview]]] = {}
        at = 0
        for (i, positions, p), (e, w) in zip(got, plan, strict=False):
            saved = max(0, at + positions - max(at, have))
            at += positions
            self.counters.add(
                self.tiers[i].name, hits=1, tokens_saved=saved, bytes_saved=len(p) if saved else 0
            )
            # Faster tiers that lacked the block get it (in the background).
            for k in range(i):
                if k not in w:
                    promote.setdefault(k, []).append((pages[e - 1], positions, p))
        for k, blocks in promote.items():
            self._enqueue(
                (
                    [key for key, _, _ in blocks],
                    sum(len(p) for _, _, p in blocks),
                    functools.partial(_encode_all, blocks),
                    [self.tiers[k]],
                )
            )
        return n, [(positions, p) for _, positions, p in got]

    def _read(self, key: bytes, positions: int, tiers: list[int]) -> tuple[int, memoryview] | None:
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
                return i, blockfile.decode(key, positions, data)
            except blockfile.CorruptBlock as e:
                self.counters.add(t.name, corrupt_blocks=1)
                log.warning("kv_store: %s block %s is corrupt (%s): a miss", t.name, key.hex(), e)
                try:
                    t.discard(key)
                except t.errors as err:
                    self._failed(i, "delete", err)
        return None

    # ---------------------------------------------------------------- saves

    def save(
        self,
        root: bytes,
        layout: KvLayout,
        tokens: Sequence[int],
        session: Any,
        marks: Sequence[int] = (),
    ) -> int:
        """Queues the blocks of ``tokens`` whose KV ``session`` holds (its
        first ``n_past`` positions) that are not known to be stored yet:
        every whole block, and a partial block ending at the last page
        boundary at or before each of ``marks`` and the end (a prompt's
        length less one is the mark its own lookup needs). Returns how many.
        The export happens now, the writes on the writer thread."""
        n = min(int(session.n_past), len(tokens))
        n_pages = n // PAGE
        if n_pages == 0 or not self.tiers:
            return 0
        pages = chain(root, tokens, n_pages)
        ends = {(c + 1) * PAGES_PER_CHUNK for c in range(n_pages // PAGES_PER_CHUNK)}
        for mark in (*marks, n):
            e = min(mark, n) // PAGE
            if e > 0:
                ends.add(e)
        with self._lock:
            new = sorted(e for e in ends if pages[e - 1] not in self._known)
        if not new:
            return 0
        export = session.export_kv()
        past = int(session.n_past)
        keys = [pages[e - 1] for e in new]
        spans = [((e - 1) // PAGES_PER_CHUNK * CHUNK, e * PAGE) for e in new]

        def encode() -> list[bytes]:
            blocks = layout.split(export, past, spans)
            return [
                blockfile.encode(k, b - a, blk)
                for k, (a, b), blk in zip(keys, spans, blocks, strict=True)
            ]

        self._enqueue((keys, len(export), encode, list(self.tiers)))
        return len(new)

    def _enqueue(self, job: _Job) -> None:
        size = job[1]
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
        keys, size, make, tiers = job
        try:
            data = make()
        except Exception:  # a bug here must not stop the writer
            log.exception("kv_store: encoding blocks failed; not stored")
            data = []
            keys = []
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
            self._pending -= size
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
