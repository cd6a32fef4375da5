"""A prefix cache for prompts: the KV of prompt prefixes already computed,
so requests that share a system prompt prefill it once.

Prefixes are cut at 16-token block boundaries and kept in a radix tree over
token ids (one edge per 16-token block). A node that holds KV stores the
positions up to its depth; a lookup walks the tree along the prompt and
returns the deepest stored node. Entries are evicted least recently used
first when the byte budget is exceeded (or when the scheduler needs their
memory: :meth:`PrefixCache.evict_one`). Hits and misses are counted.

What a node keeps is opaque here: the scheduler stores a forked session
that holds the prefix's KV pages (shared, not copied, with every request
that reuses it), with its size in bytes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

BLOCK = 16


@dataclass(eq=False)
class _Node:
    depth: int  # tokens from the root
    parent: _Node | None
    key: tuple[int, ...] = ()
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    kv: Any = None
    nbytes: int = 0


class PrefixCache:
    """Thread-safe; ``budget_bytes`` bounds the KV held."""

    def __init__(self, budget_bytes: int = 256 << 20) -> None:
        self.budget = budget_bytes
        self._root = _Node(0, None)
        self._lru: OrderedDict[_Node, None] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.hit_tokens = 0

    @property
    def bytes_used(self) -> int:
        return self._bytes

    @property
    def entries(self) -> int:
        return len(self._lru)

    def lookup(self, tokens: list[int]) -> tuple[int, Any]:
        """The longest stored prefix of ``tokens`` that leaves at least one
        token to evaluate: ``(n, kv)``, or ``(0, None)``."""
        with self._lock:
            node, best = self._root, None
            limit = len(tokens) - 1
            while node.depth + BLOCK <= limit:
                key = tuple(tokens[node.depth : node.depth + BLOCK])
                child = node.children.get(key)
                if child is None:
                    break
                node = child
                if node.kv is not None:
                    best = node
            if best is None:
                self.misses += 1
                return 0, None
            self.hits += 1
            self.hit_tokens += best.depth
            self._lru.move_to_end(best)
            return best.depth, best.kv

    def wants(self, tokens: list[int]) -> int:
        """How many positions of ``tokens`` a store would keep (0: none new)."""
        n = ((len(tokens) - 1) // BLOCK) * BLOCK
        if n == 0:
            return 0
        with self._lock:
            node = self._walk(tokens, n, create=False)
            return 0 if node is not None and node.kv is not None else n

    def store(self, tokens: list[int], n: int, kv: Any, nbytes: int | None = None) -> None:
        """Keeps the KV of ``tokens[:n]`` (``n`` a multiple of the block);
        ``nbytes`` is its size (``len(kv)`` by default)."""
        size = len(kv) if nbytes is None else nbytes
        if n == 0 or n % BLOCK or size > self.budget:
            return
        with self._lock:
            node = self._walk(tokens, n, create=True)
            assert node is not None
            if node.kv is not None:
                self._lru.move_to_end(node)
                return
            node.kv = kv
            node.nbytes = size
            self._bytes += size
            self._lru[node] = None
            while self._bytes > self.budget and self._lru:
                old, _ = self._lru.popitem(last=False)
                self._drop(old)

    def _walk(self, tokens: list[int], n: int, *, create: bool) -> _Node | None:
        node = self._root
        while node.depth < n:
            key = tuple(tokens[node.depth : node.depth + BLOCK])
            child = node.children.get(key)
            if child is None:
                if not create:
                    return None
                child = _Node(node.depth + BLOCK, node, key)
                node.children[key] = child
            node = child
        return node

    def evict_one(self) -> bool:
        """Drops the least recently used entry; False when there is none."""
        with self._lock:
            if not self._lru:
                return False
            old, _ = self._lru.popitem(last=False)
            self._drop(old)
            return True

    def _drop(self, node: _Node) -> None:
        assert node.kv is not None
        self._bytes -= node.nbytes
        node.kv = None
        node.nbytes = 0
        # Prune now-empty branches.
        while node.parent is not None and node.kv is None and not node.children:
            del node.parent.children[node.key]
            node = node.parent
