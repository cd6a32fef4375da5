"""Incremental text assembly: UTF-8-safe decoding and stop strings."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextAssembler:
    """Turns token byte pieces into text pieces that never split a UTF-8
    character and never leak the beginning of a stop string.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._text = ""
        self._emitted = 0
        self.stopped = False

    @property
    def text(self) -> str:
        """All text produced so far, cut at a matched stop string."""
        return self._text[: self._emitted] if self.stopped else self._text

    def push(self, piece: bytes) -> str:
        """Adds one token's bytes; returns the text that is now safe to emit."""
        if self.stopped:
            return ""
        self._text += self._decoder.decode(piece, final=False)
        return self._release()

    def finish(self) -> str:
        """Flushes everything still held back (end of generation)."""
        if self.stopped:
            return ""
        self._text += self._decoder.decode(b"", final=True)
        out = self._text[self._emitted :]
        self._emitted = len(self._text)
        return out

    def _release(self) -> str:
        longest = max((len(s) for s in self._stop), default=0)
        window_start = max(0, self._emitted - longest)
        hit = -1
        for s in self._stop:
            i = self._text.find(s, window_start)
            if i != -1 and (hit == -1 or i < hit):
                hit = i
        if hit != -1:
            out = self._text[self._emitted : hit]
            self._emitted = hit
            self.stopped = True
            return out
        # Hold back a suffix that could still grow into a stop string.
        hold = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self._text) - self._emitted), 0, -1):
                if self._text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        end = len(self._text) - hold
        out = self._text[self._emitted : end]
        self._emitted = end
        return out
