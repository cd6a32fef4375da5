"""Pausing Python's cyclic garbage collector over a bulk build.

Loading a model makes ~100k container objects that all survive (merge
pairs, token lists, tables). Each few hundred allocations trigger a
collection, and the survivors soon trigger full ones that walk every object
in the process: on SmolLM2 that was a third of ``Engine(path)``. None of
these objects is garbage, so the collections find nothing; pausing them
changes no result.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["gc_paused"]

_lock = threading.Lock()
# Nesting across threads: the first to enter records whether collection was
# on, the last to leave restores exactly that.
_holders = 0
_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection inside the block (explicit ``gc.collect()``
    still works); collection resumes as it was once no thread is inside."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
