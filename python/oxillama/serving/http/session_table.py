"""The server's stateful sessions, at most ``max_sessions`` of them live,
holding together at most ``max_kv_bytes`` of KV cache when that is set.

Past either bound, the least recently used idle session (no turn running
or waiting for it) leaves memory: with a sessions folder it is hibernated (its
snapshot written to ``<folder>/<id>.oxisnap``, the file the save route
writes, then closed) and restored from that file on its next request;
without one it is evicted, and its next request gets a 404 saying why. A
session named by a request that is not live is also restored from the
folder when its file is there, so a restarted server picks up every
session saved before.

Every use of a session holds its :class:`Lease`, one at a time per id, so
two requests for one id never race and a session in a turn is never picked
to leave.

The count is held when a session is admitted. KV memory grows during
turns, so it is measured (on the scheduler's worker, between steps: the
pool pages each session holds, or the copy of its KV it keeps while out of
the pool) after every turn, in the background, and when a session is
restored; idle sessions then leave, least recently used first, until the
live ones fit. Sessions in a turn are never picked, so they may take the
total past the bound until their turns end. A session that alone holds
more than the bound stays live for its turn and leaves once idle (its next
turn restores it).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from oxillama.errors import OxiLlamaError
from oxillama.serving.async_engine import AsyncEngine
from oxillama.serving.async_session import AsyncSession
from oxillama.serving.http.api_error import ApiError
from oxillama.serving.http.limits import format_size
from oxillama.sessions import SnapshotError

__all__ = ["Lease", "SessionTable"]

log = logging.getLogger("oxillama.server")


@dataclass
class _Gate:
    """One session id's lock, alive while someone holds or awaits it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class Lease:
    """The right to use one session until :meth:`release` (idempotent,
    synchronous: it may run in a cancelled task or a ``finally``)."""

    def __init__(self, table: SessionTable, sid: str, session: AsyncSession) -> None:
        self.table, self.sid, self.session = table, sid, session
        self._held = True

    async def persist(self) -> None:
        """Ends the turn with the session's snapshot in the folder, when the
        table persists turns (called while the lease is held)."""
        if self._held:
            await self.table._persist(self.sid, self.session)

    def release(self) -> None:
        if self._held:
            self._held = False
            self.table._leave(self.sid)
            # The turn may have grown the session's KV.
            self.table._want_fit()


#: Why a session's snapshot is written: the end of a turn (persist_turns),
#: leaving memory past the bound, a graceful stop, the save route.
SAVE_REASONS = ("turn", "hibernate", "drain", "explicit")
#: Why a session is read from its file: its next request after this process
#: hibernated it; a newer file than the live copy (another server took turns
#: of it); a request for a session this process never wrote (an earlier run,
#: another replica, a save before a restart); the restore route.
RESTORE_REASONS = ("wake", "stale", "adopt", "explicit")


@dataclass
class SessionCounts:
    created: int = 0
    evicted: int = 0
    saves: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SAVE_REASONS, 0))
    restores: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESTORE_REASONS, 0))


class SessionTable:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        max_sessions: int,
        folder: Path | None,
        remembered_evictions: int,
        persist_turns: bool = False,
        max_kv_bytes: int | None = None,
    ) -> None:
        self.engine = engine
        self.max_kv_bytes = max_kv_bytes
        #: Bytes of one page of the engine's KV pool.
        self._page_bytes = int(engine.metrics()["kv_page_bytes"]) if max_kv_bytes else 0
        #: KV bytes of each live session at its last measure.
        self._kv: dict[str, int] = {}
        #: The background task fitting the sessions in ``max_kv_bytes``, and
        #: whether a turn ended since it last measured.
        self._fitter: asyncio.Task[None] | None = None
        self._fit_again = False
        self.persist_turns = persist_turns and folder is not None
        #: Per session, the (mtime_ns, size) of its file as this process
        #: last wrote or read it: another stamp means another server wrote it.
        self._stamps: dict[str, tuple[int, int]] = {}
        self.max_sessions = max_sessions
        self.folder = folder
        self._live: collections.OrderedDict[str, AsyncSession] = collections.OrderedDict()
        self._gates: dict[str, _Gate] = {}
        #: Slots promised to sessions being created or restored.
        self._reserved = 0
        self._room = asyncio.Lock()
        self._evicted: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._remember = remembered_evictions
        #: Ids this process hibernated and has not restored since (one short
        #: string per snapshot file on disk).
        self._on_disk: set[str] = set()
        self.counts = SessionCounts()

    # ------------------------------------------------------------ queries

    def path(self, sid: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{sid}.oxisnap"

    @property
    def n_live(self) -> int:
        return len(self._live)

    @property
    def kv_bytes(self) -> int:
        """KV bytes the live sessions hold, as last measured (measured only
        under ``max_kv_bytes``)."""
        return sum(self._kv.values())

    @property
    def n_on_disk(self) -> int:
        """Sessions this process wrote to the folder (hibernated, or saved by
        a drain) and has not restored since."""
        return len(self._on_disk)

    def has(self, sid: str) -> bool:
        """Whether ``sid`` is live or has its file in the folder."""
        sess = self._live.get(sid)
        if sess is not None and not sess.closed:
            return True
        path = self.path(sid)
        return path is not None and path.is_file()

    def gone_error(self, sid: str) -> ApiError | None:
        """The 404 a request for the evicted session ``sid`` gets (saying
        why), or None when it was not evicted."""
        return self._evicted_error(sid) if sid in self._evicted else None

    # -------------------------------------------------------------- gates

    async def _enter(self, sid: str) -> None:
        gate = self._gates.get(sid)
        if gate is None:
            gate = self._gates[sid] = _Gate()
        gate.users += 1
        try:
            await gate.lock.acquire()
        except BaseException:
            self._drop_user(sid, gate)
            raise

    def _leave(self, sid: str) -> None:
        gate = self._gates[sid]
        gate.lock.release()
        self._drop_user(sid, gate)

    def _drop_user(self, sid: str, gate: _Gate) -> None:
        gate.users -= 1
        if gate.users == 0:
            del self._gates[sid]

    def _idle(self, sid: str) -> bool:
        return sid not in self._gates

    # ------------------------------------------------------------- leases

    async def lease(self, sid: str, *, create: bool = True) -> Lease:
        """The live session ``sid``: restored from the folder when its file
        is there, else new (with ``create``). Raises a 404 for a session
        evicted earlier (or unknown, without ``create``) and a 503 when
        every live session is busy and the table is full."""
        await self._enter(sid)
        try:
            sess = self._live.get(sid)
            if sess is not None and not sess.closed and not self._stale(sid):
                self._live.move_to_end(sid)
                return Lease(self, sid, sess)
            stale = sess is not None and not sess.closed
            if sess is not None and stale:
                # Another server took turns of it since: the file is newer.
                del self._live[sid]
                await sess.close()
            self._live.pop(sid, None)
            self._kv.pop(sid, None)
            path = self.path(sid)
            if path is not None and path.is_file():
                why = "stale" if stale else "wake" if sid in self._on_disk else "adopt"
                sess = await self._admit(sid, lambda: self._restore(sid, path, why))
                await self._fit_memory()
            elif sid in self._evicted:
                raise self._evicted_error(sid)
            elif not create:
                raise ApiError(404, f"no session '{sid}' on this server", kind="not_found_error")
            else:

                async def fresh() -> AsyncSession:
                    self.counts.created += 1
                    return self.engine.session()

                sess = await self._admit(sid, fresh)
            return Lease(self, sid, sess)
        except BaseException:
            self._leave(sid)
            raise

    async def replace_from_file(self, sid: str) -> AsyncSession:
        """Loads ``sid`` from its file in the folder in place of the live
        one (the restore route)."""
        path = self.path(sid)
        assert path is not None
        await self._enter(sid)
        try:
            if not path.is_file():
                raise ApiError(404, f"no saved session '{sid}'", kind="not_found_error")
            old = self._live.pop(sid, None)
            self._kv.pop(sid, None)
            if old is not None:
                # Restoring replaces it; its slot is reused, not kept.
                await old.close()
            sess = await self._admit(sid, lambda: self._restore(sid, path, "explicit"))
            await self._fit_memory()
            return sess
        finally:
            self._leave(sid)

    async def save(self, sid: str) -> int:
        """Writes the live (or hibernated) session ``sid`` to its file in
        the folder (the save route); the tokens it holds. Raises a 404 for
        a session this server does not have."""
        path = self.path(sid)
        assert path is not None
        lease = await self.lease(sid, create=False)
        try:
            await lease.session.snapshot(path)
            # This process wrote the file: not a reason to read it again.
            self._note_stamp(sid)
            self.counts.saves["explicit"] += 1
            return lease.session.n_past
        finally:
            lease.release()

    # ------------------------------------------------- copies and removal

    def live_tokens(self) -> dict[str, int]:
        """The tokens each live session holds, by id."""
        return {sid: sess.n_past for sid, sess in self._live.items() if not sess.closed}

    def saved_ids(self) -> list[str]:
        """The ids with a snapshot file in the folder."""
        if self.folder is None:
            return []
        return sorted(p.name.removesuffix(".oxisnap") for p in self.folder.glob("*.oxisnap"))

    async def snapshot_bytes(self, sid: str) -> bytes:
        """The session ``sid`` as OXISNAP1 bytes (restored from its file
        when it is not live). Raises a 404 for a session this server does
        not have."""
        lease = await self.lease(sid, create=False)
        try:
            return await lease.session.snapshot_bytes()
        finally:
            lease.release()

    async def fork(self, src: str, dst: str) -> AsyncSession | None:
        """A new session ``dst`` continuing ``src``'s state (KV, tokens,
        sampler), or None when ``src`` has none on this server (never had a
        turn, or evicted): the fork then starts empty, and its first turn
        evaluates the whole history. Either way its next turn gives exactly
        the tokens ``src`` would give for the same messages. The KV is not
        copied: the fork shares ``src``'s pages copy on write
        (:meth:`AsyncSession.fork`), after restoring ``src`` from its file
        if it is not live. Raises a 409 when ``dst`` exists."""
        path = self.path(src)
        made: AsyncSession | None = None
        if src in self._live or (path is not None and path.is_file()):
            lease = await self.lease(src, create=False)
            try:
                made = await lease.session.fork()
            finally:
                lease.release()
        await self._enter(dst)
        try:
            dst_path = self.path(dst)
            if dst in self._live or (dst_path is not None and dst_path.is_file()):
                if made is not None:
                    await made.close()
                raise ApiError(
                    409, f"session '{dst}' already exists", param="id", code="session_exists"
                )
            if made is None:
                return None
            twin = made

            async def take() -> AsyncSession:
                self.counts.created += 1
                return twin

            sess = await self._admit(dst, take)
            await self._fit_memory()
            return sess
        finally:
            self._leave(dst)

    async def replace_from_bytes(self, sid: str, blob: bytes) -> AsyncSession:
        """Makes the snapshot ``blob`` the live session ``sid`` (an imported
        file), replacing any live one; with a folder, also its file there."""
        await self._enter(sid)
        try:
            try:
                new = await self.engine.restore_session(blob)
            except SnapshotError as e:
                raise ApiError(400, f"cannot import the snapshot: {e}", param="body") from None
            try:
                old = self._live.pop(sid, None)
                self._kv.pop(sid, None)
                if old is not None:
                    await old.close()
                self._evicted.pop(sid, None)
                self._on_disk.discard(sid)
                sess = await self._admit(sid, lambda: _ready(new))
            except BaseException:
                await new.close()
                raise
            path = self.path(sid)
            if path is not None:
                await sess.snapshot(path)
                self._note_stamp(sid)
            await self._fit_memory()
            return sess
        finally:
            self._leave(sid)

    async def delete(self, sid: str) -> bool:
        """Closes the session ``sid`` and removes its file; whether there
        was anything to remove. Waits for a turn in flight to end."""
        await self._enter(sid)
        try:
            found = False
            sess = self._live.pop(sid, None)
            self._kv.pop(sid, None)
            if sess is not None:
                await sess.close()
                found = True
            path = self.path(sid)
            if path is not None and path.is_file():
                path.unlink()
                found = True
            self._on_disk.discard(sid)
            self._stamps.pop(sid, None)
            if sid in self._evicted:
                del self._evicted[sid]
                found = True
            return found
        finally:
            self._leave(sid)

    def _evicted_error(self, sid: str) -> ApiError:
        memory = (
            ""
            if self.max_kv_bytes is None
            else f" holding at most {format_size(self.max_kv_bytes)} of KV cache together"
        )
        raise_ = (
            "--max-sessions"
            if self.max_kv_bytes is None
            else "--max-sessions and --max-session-memory"
        )
        return ApiError(
            404,
            f"session '{sid}' was evicted: this server keeps at most {self.max_sessions} "
            f"live sessions{memory} and, having no sessions folder, drops the least recently "
            "used idle one past that. Start the server with --sessions-dir DIR to have idle "
            "sessions hibernated to disk and restored on their next request instead, or raise "
            f"{raise_}.",
            kind="not_found_error",
            param="session",
            code="session_evicted",
        )

    def _stamp(self, sid: str) -> tuple[int, int] | None:
        path = self.path(sid)
        try:
            st = path.stat() if path is not None else None
        except OSError:
            return None
        return None if st is None else (st.st_mtime_ns, st.st_size)

    def _note_stamp(self, sid: str) -> None:
        stamp = self._stamp(sid)
        if stamp is not None:
            self._stamps[sid] = stamp

    def _stale(self, sid: str) -> bool:
        if not self.persist_turns:
            return False
        now = self._stamp(sid)
        return now is not None and now != self._stamps.get(sid)

    async def _persist(self, sid: str, sess: AsyncSession) -> None:
        path = self.path(sid)
        if not self.persist_turns or path is None:
            return
        await sess.snapshot(path)
        self._note_stamp(sid)
        self.counts.saves["turn"] += 1

    async def _restore(self, sid: str, path: Path, why: str) -> AsyncSession:
        stamp = self._stamp(sid)
        try:
            sess = await self.engine.restore_session(path)
        except SnapshotError as e:
            raise ApiError(400, f"cannot restore session '{sid}': {e}", param="session") from None
        self.counts.restores[why] += 1
        if stamp is not None:
            self._stamps[sid] = stamp
        self._on_disk.discard(sid)
        self._evicted.pop(sid, None)
        return sess

    # --------------------------------------------------------------- room

    async def _admit(self, sid: str, make: Callable[[], Awaitable[AsyncSession]]) -> AsyncSession:
        """Makes room for one more session (the caller holds ``sid``'s
        gate), then makes it and puts it in the table."""
        async with self._room:
            while len(self._live) + self._reserved >= self.max_sessions:
                victim = next((s for s in self._live if self._idle(s)), None)
                if victim is None:
                    raise ApiError(
                        503,
                        f"all {self.max_sessions} live sessions are in a turn "
                        "(--max-sessions); retry shortly",
                        kind="server_error",
                        code="sessions_busy",
                    )
                await self._retire(victim)
            self._reserved += 1
        try:
            sess = await make()
        finally:
            self._reserved -= 1
        self._live[sid] = sess
        return sess

    async def _retire(self, sid: str) -> None:
        """Hibernates (with a folder) or evicts the idle session ``sid``."""
        await self._enter(sid)  # free (it is idle): taken without waiting
        try:
            sess = self._live[sid]
            path = self.path(sid)
            if path is not None:
                try:
                    await sess.snapshot(path)
                except (OxiLlamaError, OSError) as e:
                    log.error("cannot hibernate session %s to %s: %s", sid, path, e)
                    raise ApiError(
                        503,
                        "the server is full and cannot hibernate an idle session to its "
                        "sessions folder",
                        kind="server_error",
                        code="sessions_full",
                    ) from None
                self._on_disk.add(sid)
                self.counts.saves["hibernate"] += 1
            else:
                self._evicted[sid] = None
                while len(self._evicted) > self._remember:
                    self._evicted.popitem(last=False)
                self.counts.evicted += 1
            del self._live[sid]
            self._kv.pop(sid, None)
            await sess.close()
        finally:
            self._leave(sid)

    # ------------------------------------------------------------- memory

    def _want_fit(self) -> None:
        """Fits the live sessions in ``max_kv_bytes`` soon, in a task of its
        own: the turn's response is not held up by the hibernations, and
        turns ending meanwhile are covered by one more pass."""
        if self.max_kv_bytes is None:
            return
        self._fit_again = True
        if self._fitter is not None and not self._fitter.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (the server is gone): nothing to fit
        self._fitter = loop.create_task(self._fit_loop())

    async def _fit_loop(self) -> None:
        while self._fit_again:
            self._fit_again = False
            try:
                await self._fit_memory()
            except ApiError as e:
                # Nobody waits for this task: the failure is logged, and
                # the next turn's end tries again.
                log.error("cannot fit the live sessions in --max-session-memory: %s", e.message)
            except OxiLlamaError as e:
                log.error("cannot measure the live sessions' KV: %s", e)
                return

    async def settled(self) -> None:
        """Returns once the live sessions were fitted in ``max_kv_bytes``
        after every turn that has ended (at once without a bound)."""
        while self._fitter is not None and not self._fitter.done():
            await asyncio.shield(self._fitter)

    async def _fit_memory(self) -> None:
        """Measures the live sessions' KV, then hibernates (or evicts) the
        least recently used idle ones while it is over ``max_kv_bytes``.
        Sessions in a turn stay: the end of their turn fits again."""
        budget = self.max_kv_bytes
        if budget is None:
            return
        async with self._room:
            live = list(self._live.items())
            sizes = await self._measure([sess for _, sess in live])
            # A session replaced or retired while the worker measured is
            # not counted; one admitted meanwhile is, at the next measure.
            self._kv = {
                sid: n
                for (sid, sess), n in zip(live, sizes, strict=True)
                if self._live.get(sid) is sess
            }
            while self.kv_bytes > budget:
                victim = next((s for s in self._live if self._idle(s) and self._kv.get(s)), None)
                if victim is None:
                    return
                if self._kv[victim] > budget:
                    log.info(
                        "session %s alone holds %s of KV, more than --max-session-memory "
                        "(%s): it leaves memory whenever it is idle",
                        victim,
                        format_size(self._kv[victim]),
                        format_size(budget),
                    )
                await self._retire(victim)

    async def _measure(self, sessions: list[AsyncSession]) -> list[int]:
        """Each session's KV bytes, read on the worker in one call between
        two steps (the engine exposes what each holds: its pool pages, or
        its KV's copy while out of the pool; nothing is estimated)."""
        page = self._page_bytes
        fut = self.engine.scheduler.call(lambda: [s._kv_bytes(page) for s in sessions])
        return list(await asyncio.wrap_future(fut))

    async def save_all(self) -> int:
        """Saves every live session to the folder (none without one) and
        keeps it live; the number saved. A session mid-turn is saved once
        its turn is over."""
        if self.folder is None:
            return 0
        saved = 0
        for sid in list(self._live):
            await self._enter(sid)
            try:
                sess = self._live.get(sid)
                path = self.path(sid)
                if sess is None or path is None:
                    continue
                try:
                    await sess.snapshot(path)
                except (OxiLlamaError, OSError) as e:
                    log.error("cannot save session %s to %s: %s", sid, path, e)
                    continue
                self._on_disk.add(sid)
                self._note_stamp(sid)
                self.counts.saves["drain"] += 1
                saved += 1
            finally:
                self._leave(sid)
        return saved

    async def close(self) -> None:
        if self._fitter is not None and not self._fitter.done():
            self._fitter.cancel()
        for sess in list(self._live.values()):
            await sess.close()
        self._live.clear()
        self._kv.clear()


async def _ready(sess: AsyncSession) -> AsyncSession:
    return sess
