"""Per-tier counters of the prefix store (``kv_store_*`` metrics)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

#: The metric families, each labelled by tier.
FAMILIES = ("hits", "misses", "corrupt_blocks", "tokens_saved", "bytes_saved")
#: Beside them: blocks written, and failed reads or writes (a full disk, an
#: unreachable Redis) that made the store fall back to the other tiers.
EXTRA = ("writes", "errors")


@dataclass
class TierCounters:
    hits: int = 0
    misses: int = 0
    corrupt_blocks: int = 0
    tokens_saved: int = 0
    bytes_saved: int = 0
    writes: int = 0
    errors: int = 0


class Counters:
    """Thread-safe counters for a fixed list of tiers."""

    def __init__(self, tiers: list[str]) -> None:
        self._lock = threading.Lock()
        self._by = {t: TierCounters() for t in tiers}

    def add(self, tier: str, **inc: int) -> None:
        with self._lock:
            c = self._by[tier]
            for k, v in inc.items():
                setattr(c, k, getattr(c, k) + v)

    def as_dict(self) -> dict[str, int]:
        """Flat keys ``kv_store_<family>_<tier>``."""
        with self._lock:
            return {
                f"kv_store_{f.name}_{tier}": getattr(c, f.name)
                for tier, c in self._by.items()
                for f in fields(c)
            }
