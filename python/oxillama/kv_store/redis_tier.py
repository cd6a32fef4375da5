"""The shared tier: blocks in Redis, where processes, replicas and machines
meet. ``SET NX`` makes concurrent writers of one block safe (the first
wins; the block is the same either way). Eviction is Redis' own
(``maxmemory`` with an LRU policy); the store never deletes another
writer's block except one it found corrupt."""

from __future__ import annotations

from typing import Any

from oxillama.errors import ParameterError

PREFIX = b"oxillama:kv:"


class RedisTier:
    name = "redis"

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        try:
            import redis
        except ImportError as e:
            raise ParameterError(
                "kv_store: a redis:// tier needs the 'redis' package "
                "(pip install 'oxillama[redis]')"
            ) from e
        self.url = url
        self.errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        # No connection is made until the first command.
        self._client: Any = redis.Redis.from_url(
            url, socket_connect_timeout=timeout, socket_timeout=timeout
        )

    def has(self, key: bytes) -> bool:
        return bool(self._client.exists(PREFIX + key))

    def has_many(self, keys: list[bytes]) -> list[bool]:
        pipe = self._client.pipeline(transaction=False)
        for k in keys:
            pipe.exists(PREFIX + k)
        return [bool(x) for x in pipe.execute()]

    def get(self, key: bytes) -> bytes | None:
        data = self._client.get(PREFIX + key)
        return None if data is None else bytes(data)

    def discard(self, key: bytes) -> None:
        self._client.delete(PREFIX + key)

    def put(self, key: bytes, data: bytes) -> bool:
        return bool(self._client.set(PREFIX + key, data, nx=True))
