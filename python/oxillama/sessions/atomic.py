"""Replacing a snapshot file so that a crash never leaves a partial one.

Every snapshot writer (``Engine.snapshot``, ``snapshot.dump``, OXISPEC1
saves, ``AsyncSession.snapshot``) goes through :func:`replace_file`: the
bytes go to a temp file in the target's folder, which is fsynced, renamed
over the target (``os.replace``, atomic on POSIX and Windows), and the
folder is fsynced. A SIGKILL at any moment leaves, under the final name,
either the previous complete file or the new complete one.

Temp files are named ``.{name}.{host}.{pid}.{random}.tmp``: hidden, with
an extension no snapshot has, so listings that match ``*.oxisnap`` never see
them, and :func:`is_temp` lets anything else tell them apart. Readers refuse
them (:func:`refuse_temp`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from oxillama.errors import SnapshotError, SnapshotWriteError

__all__ = ["STALE_AFTER", "is_temp", "refuse_temp", "replace_file", "sweep_stale", "write_bytes"]

#: Seconds after its last write at which a temp file counts as abandoned
#: whoever wrote it. A save writes for milliseconds (24 MB: ~10 ms), so an
#: hour leaves any live writer alone, even a badly stalled one.
STALE_AFTER = 3600.0

_SUFFIX = ".tmp"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

#: Temp files this process is writing now: the same pid in a name does not
#: prove the writer is alive (a restarted container often gets its pid back).
_IN_FLIGHT: set[Path] = set()
_IN_FLIGHT_LOCK = threading.Lock()


def _host_tag() -> str:
    """Who can check a pid in a temp name: the host and, where there is one,
    its pid namespace (replicas in containers sharing a volume and a host
    name still differ there)."""
    ident = socket.gethostname()
    try:
        ident += "\0" + os.readlink("/proc/self/ns/pid")
    except OSError:
        pass
    return hashlib.blake2s(ident.encode(), digest_size=4).hexdigest()


_HOST = _host_tag()


def temp_path(target: Path) -> Path:
    """A fresh temp name for a save to ``target``, in its folder."""
    return target.with_name(f".{target.name}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}{_SUFFIX}")


#: A temp file's name: target, host tag (absent in names written before
#: there was one), pid, random.
_TEMP = re.compile(r"\.(.+?)\.(?:([0-9a-f]{8})\.)?([0-9]+)\.[0-9a-f]{8}\.tmp")


def _owner(name: str, target: str) -> tuple[str | None, int] | None:
    """``(host tag, pid)`` of a temp file of a save to ``target``, else None."""
    prefix = f".{target}."
    if not (name.startswith(prefix) and name.endswith(_SUFFIX)):
        return None
    fields = name[len(prefix) : -len(_SUFFIX)].split(".")
    if len(fields) == 2:
        fields.insert(0, "")
    if len(fields) != 3 or not fields[1].isdigit():
        return None
    return fields[0] or None, int(fields[1])


def is_temp(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an unfinished (or abandoned) save's temp file."""
    return _TEMP.fullmatch(Path(path).name) is not None


def refuse_temp(path: str | os.PathLike[str]) -> None:
    """Raises :class:`SnapshotError` for a temp file: it may be partial, and
    even a complete one was never committed."""
    if is_temp(path):
        raise SnapshotError(
            f"{str(path)!r} is the temp file of an unfinished save, not a snapshot; "
            "read the file it was being written to"
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by another user
    return True


def _abandoned(path: Path, host: str | None, pid: int, now: float) -> bool:
    if host == _HOST:
        if pid == os.getpid():
            with _IN_FLIGHT_LOCK:
                if path not in _IN_FLIGHT:
                    return True
        elif not _pid_alive(pid):
            return True
    try:
        return now - path.stat().st_mtime > STALE_AFTER
    except OSError:
        return False  # already gone


def sweep_stale(target: str | os.PathLike[str]) -> int:
    """Removes the temp files of saves to ``target`` whose writer is provably
    gone; returns how many it removed. The next save to a path calls it.

    A temp file is removed when:

    - it was written on this host and pid namespace (the name says so) by
      this process, but is not one of the saves this process is running now
      (an earlier process with the same pid left it: restarted containers
      often get their pid back);
    - it was written on this host and pid namespace by a pid that no longer
      exists;
    - or it was last written more than :data:`STALE_AFTER` seconds ago,
      whoever wrote it (a writer on another host sharing the folder, a pid
      since reused by an unrelated process, a name from before names
      carried the host).

    Anything else is left alone: another live process (a replica sharing
    the folder) may be writing it right now. Temp files of other targets and
    files that do not follow the naming scheme are never touched.
    """
    target = Path(target)
    folder = target.parent
    now = time.time()
    removed = 0
    try:
        entries = os.scandir(folder)
    except OSError:
        return 0  # the save itself reports a missing or unreadable folder
    with entries:
        for entry in entries:
            owner = _owner(entry.name, target.name)
            if owner is None:
                continue
            path = folder / entry.name
            if _abandoned(path, *owner, now):
                try:
                    path.unlink()
                    removed += 1
                except FileNotFoundError:
                    pass  # another save swept it first
                except OSError:
                    pass  # not ours to remove (permissions): harmless, it is ignored
    return removed


def replace_file(
    path: str | os.PathLike[str], write: Callable[[int], None], *, durable: bool = True
) -> None:
    """Runs ``write(fd)`` on a new temp file next to ``path`` and commits it
    under ``path``: fsync of the file (when ``durable``), ``os.replace``,
    fsync of the folder (when ``durable``).

    On any failure the previous file under ``path`` is untouched and the temp
    file is removed; an ``OSError`` (disk full, permission denied, missing
    folder) becomes :class:`SnapshotWriteError`. (The one exception: an
    fsync of the folder failing after the rename, reported as such.) Stale temp files of earlier
    saves to ``path`` are swept first (see :func:`sweep_stale`).

    Without ``durable`` the rename is still atomic for every reader and
    survives this process being killed; only a power loss or kernel crash
    soon after can lose the new file (llama.cpp's guarantee)."""
    target = Path(path)
    sweep_stale(target)
    # A named temp file, not an unnamed O_TMPFILE one: ext4 writes those
    # about ten times slower (measured 75 ms against 7 for 24 MB).
    tmp = temp_path(target)
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.add(tmp)
    try:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
        except OSError as e:
            raise _write_error(target, e) from e
        try:
            try:
                write(fd)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException as e:
            _discard(tmp)
            if isinstance(e, OSError) and not isinstance(e, SnapshotError):
                raise _write_error(target, e) from e
            raise
    finally:
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.discard(tmp)
    if durable:
        _fsync_dir(target)


def write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Replaces ``path`` with ``data`` as :func:`replace_file` does."""
    replace_file(path, lambda fd: write_all(fd, memoryview(data)), durable=durable)


#: Bytes per write() call. Measured here on ext4: 24 MB went to the page
#: cache in 10 ms in writes of up to 128 KiB, but in 75-120 ms in writes of
#: 256 KiB or more (one 24 MB write: 107 ms).
_WRITE_CHUNK = 128 << 10


def write_all(fd: int, data: memoryview) -> None:
    """Writes all of ``data`` at the descriptor's position, in chunks."""
    done = 0
    with data.cast("B") as flat:
        size = flat.nbytes
        while done < size:
            with flat[done : done + _WRITE_CHUNK] as part:
                done += os.write(fd, part)


def _discard(tmp: Path) -> None:
    try:
        tmp.unlink()
    except OSError:
        pass  # never created, or the folder went away with it


def _write_error(target: Path, e: OSError, committed: bool = False) -> SnapshotWriteError:
    reason = e.strerror or str(e) or type(e).__name__
    what = (
        f"the snapshot {str(target)!r} was written, but its folder could not be synced, "
        "so a power loss may still bring back the previous file"
        if committed
        else f"cannot save the snapshot to {str(target)!r}"
    )
    return SnapshotWriteError(e.errno or errno.EIO, f"{what}: {reason}")


#: Errors of an fsync on a folder that mean "this platform or file system
#: cannot do that", not "the rename may be lost".
_NO_DIR_FSYNC = {errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EISDIR, errno.EPERM}


def _fsync_dir(target: Path) -> None:
    """Makes the rename durable where folders can be fsynced."""
    try:
        dfd = os.open(target.parent, os.O_RDONLY | _O_CLOEXEC)
    except OSError:
        return  # a folder that cannot be opened (Windows, no read permission)
    try:
        os.fsync(dfd)
    except OSError as e:
        if e.errno not in _NO_DIR_FSYNC:
            raise _write_error(target, e, committed=True) from e
    finally:
        os.close(dfd)
