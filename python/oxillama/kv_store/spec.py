"""The ``kv_store=`` option: a directory, a ``redis://`` URL, or a list of
them (tiers in order), and the byte bound of the directory tier."""

from __future__ import annotations

import os
from collections.abc import Sequence

from oxillama.errors import ParameterError
from oxillama.kv_store.disk import DiskTier
from oxillama.kv_store.redis_tier import RedisTier
from oxillama.kv_store.store import KvStore, Tier

KvStoreSpec = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def _items(spec: KvStoreSpec) -> list[str]:
    if isinstance(spec, str | os.PathLike):
        items = [spec]
    elif isinstance(spec, Sequence):
        items = list(spec)
    else:
        raise ParameterError(f"kv_store: expected a folder, a redis:// URL or a list, got {spec!r}")
    out = []
    for x in items:
        if not isinstance(x, str | os.PathLike) or not os.fspath(x):
            raise ParameterError(f"kv_store: bad tier {x!r}: expected a folder or a redis:// URL")
        out.append(os.fspath(x))
    return out


def open_store(spec: KvStoreSpec | None, max_bytes: int | None = None) -> KvStore | None:
    """The store ``spec`` describes (None: no store). ``max_bytes`` bounds
    the directory tier (None: unbounded). Nothing is read here: a directory
    is only created, a Redis connection only made on first use."""
    if spec is None:
        if max_bytes is not None:
            raise ParameterError("kv_store_bytes needs a kv_store directory")
        return None
    if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes <= 0):
        raise ParameterError(f"kv_store_bytes must be a positive integer, got {max_bytes!r}")
    items = _items(spec)
    if not items:
        return None
    kinds: list[tuple[str, str]] = []
    for x in items:
        scheme = x.split("://", 1)[0].lower() if "://" in x else ""
        if scheme in ("redis", "rediss", "unix"):
            kinds.append(("redis", x))
        elif scheme:
            raise ParameterError(
                f"kv_store: unsupported tier {x!r}: expected a folder or a redis:// URL"
            )
        else:
            kinds.append(("disk", x))
    names = [k for k, _ in kinds]
    for k in sorted(set(names)):
        if names.count(k) > 1:
            raise ParameterError(f"kv_store: at most one {k} tier, got {names.count(k)}")
    if max_bytes is not None and "disk" not in names:
        raise ParameterError("kv_store_bytes needs a kv_store directory")
    tiers: list[Tier] = [RedisTier(x) if k == "redis" else DiskTier(x, max_bytes) for k, x in kinds]
    return KvStore(tiers)
