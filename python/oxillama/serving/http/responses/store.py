"""What the server keeps of each stored response beside its session: the
response object (what ``GET /v1/responses/{id}`` answers) and the
conversation up to and including its reply, as chat messages (what a
``previous_response_id`` continues).

The session holds the tokens and KV; this holds the turns. With a sessions
folder the record of ``<id>`` is ``<folder>/<id>.oxisnap.response.json``,
beside the session's snapshot, so it lives as long as the session does
there (hibernated, restarted); without one it is in memory, and dropped
once its session has left the table (evicted past ``--max-sessions``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oxillama.sessions.atomic import write_bytes

__all__ = ["SUFFIX", "StoredResponses"]

log = logging.getLogger("oxillama.server")

#: What follows the id in a record file's name.
SUFFIX = ".oxisnap.response.json"

Record = dict[str, Any]


class StoredResponses:
    """The records of the stored responses, by id."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._memory: dict[str, Record] = {}

    def path(self, rid: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{rid}{SUFFIX}"

    def get(self, rid: str) -> Record | None:
        """The record of ``rid``, or None (a damaged file is logged and read
        as none)."""
        path = self.path(rid)
        if path is None:
            return self._memory.get(rid)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            log.warning("cannot read stored response %s (%s): %s", rid, path, e)
            return None
        if not isinstance(record, dict) or not isinstance(record.get("conversation"), list):
            log.warning("stored response %s (%s) holds no conversation", rid, path)
            return None
        return record

    def put(self, rid: str, response: dict[str, Any], conversation: list[Any]) -> None:
        record = {"response": response, "conversation": conversation}
        path = self.path(rid)
        if path is None:
            self._memory[rid] = record
        else:
            write_bytes(path, json.dumps(record, ensure_ascii=False).encode("utf-8"))

    def delete(self, rid: str) -> bool:
        """Removes the record of ``rid``; whether there was one."""
        found = self._memory.pop(rid, None) is not None
        path = self.path(rid)
        if path is not None and path.is_file():
            path.unlink()
            found = True
        return found

    def keep_only(self, alive: Callable[[str], bool]) -> None:
        """Drops the in-memory records whose session is gone (a record in
        the folder goes with its snapshot's deletion)."""
        for rid in [r for r in self._memory if not alive(r)]:
            del self._memory[rid]
