"""What a client keeps beside a server session: its title, its messages as
the chat page shows them, and its sampler settings. The session itself
holds tokens and KV, not turns, so a page reloaded, or opened in another
browser, reads the conversation from here.

With a sessions folder the notes of ``<id>`` live in
``<folder>/<id>.oxisnap.chat.json``, beside the session's snapshot, in the
shape ``oxillama chat``'s ``/save`` writes (its ``/load`` reads the pair),
so they survive a restart; without one they live in memory."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from oxillama.sessions.atomic import write_bytes

__all__ = ["SUFFIX", "SessionNotes"]

log = logging.getLogger("oxillama.server")

#: What follows the id in a notes file's name.
SUFFIX = ".oxisnap.chat.json"

Record = dict[str, Any]


class SessionNotes:
    """The notes of every session, by id."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        #: Notes as last written or read by this process.
        self._cache: dict[str, Record] = {}

    def path(self, sid: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{sid}{SUFFIX}"

    def get(self, sid: str) -> Record | None:
        """The notes of ``sid``, or None. A file that is not notes (damaged,
        or written by something else) is logged and read as none."""
        path = self.path(sid)
        if path is None:
            return self._cache.get(sid)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self._cache.pop(sid, None)
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            log.warning("cannot read the notes of session %s (%s): %s", sid, path, e)
            return None
        if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
            log.warning("the notes of session %s (%s) hold no messages", sid, path)
            return None
        self._cache[sid] = record
        return record

    def put(self, sid: str, title: str, messages: list[Any], settings: Any) -> Record:
        """Writes the notes of ``sid`` (atomically, with a folder)."""
        record: Record = {
            "title": title,
            "messages": messages,
            "settings": settings,
            "updated": time.time(),
        }
        path = self.path(sid)
        if path is not None:
            write_bytes(path, json.dumps(record, ensure_ascii=False).encode("utf-8"))
        self._cache[sid] = record
        return record

    def delete(self, sid: str) -> bool:
        """Removes the notes of ``sid``; whether there were any."""
        found = self._cache.pop(sid, None) is not None
        path = self.path(sid)
        if path is not None and path.is_file():
            path.unlink()
            found = True
        return found

    def ids(self) -> list[str]:
        """Every id with notes."""
        if self.folder is None:
            return sorted(self._cache)
        return sorted(p.name.removesuffix(SUFFIX) for p in self.folder.glob(f"*{SUFFIX}"))
