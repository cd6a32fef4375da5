"""A store bound to one model and KV type: the block keys' context, the
layout of its KV, and the lookups and saves an engine or the scheduler
makes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from oxillama.errors import ParameterError
from oxillama.kv_store.key import StoreContext
from oxillama.kv_store.layout import KvLayout
from oxillama.kv_store.store import Fetched, KvStore
from oxillama.model.fingerprint import prefetch_fingerprint

#: A LoRA stack as keys see it: (adapter file digest, scale) pairs.
LoraKey = tuple[tuple[str, float], ...]


def lora_key(active: Mapping[Any, float] | Sequence[tuple[Any, float]]) -> LoraKey:
    """The key of the adapters ``active`` (``LoraAdapter`` objects with
    their scales; those at scale 0 change nothing)."""
    pairs = active.items() if isinstance(active, Mapping) else active
    return tuple(sorted((a.fingerprint, float(s)) for a, s in pairs if s != 0.0))


class StoreBinding:
    def __init__(self, store: KvStore, model: Any, kv_dtype: str, kv_rot: tuple[int, int]) -> None:
        config = model.native.config()
        if config.get("recurrent"):
            raise ParameterError(
                f"kv_store: {config['arch']!r} is a recurrent model, whose state is not kept "
                "per block of positions; it cannot use a prefix store"
            )
        if model.model_path is None:
            raise ParameterError(
                "kv_store needs a model loaded from a file (its fingerprint keys the blocks)"
            )
        self.store = store
        self.model = model
        self.kv_dtype = kv_dtype
        self.kv_rot = (int(kv_rot[0]), int(kv_rot[1]))
        self.layout = KvLayout.of(config, kv_dtype)
        self._rope = {k: config.get(k) for k in ("rope_base", "rope_dims", "n_ctx_train")}
        self._roots: dict[LoraKey, bytes] = {}
        # The model file is fingerprinted on a thread now (it is not the
        # store), so the first lookup does not wait for it.
        self._fingerprinted = prefetch_fingerprint(model.model_path)

    def root(self, loras: LoraKey = ()) -> bytes:
        r = self._roots.get(loras)
        if r is None:
            self._fingerprinted()
            fp = self.model.fingerprint().to_dict()
            fp.pop("mtime_ns", None)  # a copied file keeps its bytes, not its mtime
            ctx = StoreContext(fp, self.kv_dtype, self.kv_rot, self._rope, loras)
            r = self._roots[loras] = ctx.root()
        return r

    def fetch(self, tokens: Sequence[int], have: int = 0, loras: LoraKey = ()) -> Fetched | None:
        return self.store.fetch(self.root(loras), tokens, have)

    def save(
        self, tokens: Sequence[int], session: Any, marks: Sequence[int] = (), loras: LoraKey = ()
    ) -> int:
        return self.store.save(self.root(loras), self.layout, tokens, session, marks)
