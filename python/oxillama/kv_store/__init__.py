"""The tiered prefix store: a prompt's KV kept in content-addressed blocks on
a local directory and in Redis, so a restarted process, another process or
another replica restores a long prefix instead of prefilling it again (see
docs/prefix-store.md)."""

from oxillama.kv_store.key import CHUNK
from oxillama.kv_store.spec import KvStoreSpec, open_store
from oxillama.kv_store.store import KvStore

__all__ = ["CHUNK", "KvStore", "KvStoreSpec", "open_store"]
