"""Keeps a long-running server's heap from creeping.

glibc serves an allocation above ``M_MMAP_THRESHOLD`` with its own mmap and
gives it back to the system on free. The threshold starts at 128 KiB but
rises, up to 32 MiB, each time such a block is freed, so after the first
few snapshots (hibernated sessions) and logits rows, blocks of hundreds of
KiB come from the heap instead and leave holes it seldom returns: in
``benches/soak.py`` RSS grew 6-10% over 200 requests. Setting the
threshold explicitly turns the adjustment off, so big transient buffers
always go back to the system (one mmap/munmap each, microseconds against a
decode step of milliseconds) and RSS stays flat.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

__all__ = ["pin_mmap_threshold"]

log = logging.getLogger("oxillama.server")

#: mallopt's parameter number for the mmap threshold in glibc's malloc.h.
_M_MMAP_THRESHOLD = -3
#: Above the 64 KiB of Python's own arenas' small objects, below a logits row.
THRESHOLD = 64 << 10


def pin_mmap_threshold(threshold: int = THRESHOLD) -> bool:
    """Fixes glibc's mmap threshold; False where the C library is not glibc
    or the user already chose (``MALLOC_MMAP_THRESHOLD_`` in the
    environment)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.warning("could not set malloc's mmap threshold; RSS may creep over time")
    return ok
