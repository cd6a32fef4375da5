"""Offload policies: running a model whose weights need not all stay in
memory (``Engine(..., offload=Budget(n))``).

A policy belongs to the :class:`~oxillama.Model`, since the weights are
one copy per process shared by every engine on them; the Rust pager
(``rust/model/pager.rs``) does the paging."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from oxillama.errors import ParameterError

__all__ = [
    "Budget",
    "OffloadPolicy",
    "PinnedHotSet",
    "check_policy",
    "native_args",
    "policy_from_dict",
]


EVICT = ("lru", "furthest")


def _evict(v: object, owner: str) -> None:
    if v not in EVICT:
        raise ParameterError(f'{owner}: evict must be "lru" or "furthest", got {v!r}')


def _n_bytes(v: object, owner: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ParameterError(f"{owner}: n_bytes must be a positive integer, got {v!r}")
    return v


@dataclass(frozen=True)
class Budget:
    """At most ``n_bytes`` of weights resident. Layers and slices of the
    output head are mapped from the file when the forward pass reaches
    them, the next one is read ahead while the current one computes, and
    resident ones are dropped (unmapped and evicted from the page cache)
    once the budget would be passed: the least recently used first
    (``evict="lru"``), or (``evict="furthest"``) the one the forward pass
    needs again last, which for a budget below the model's size reads
    about the model minus the budget per token instead of all of it."""

    n_bytes: int
    evict: str = "lru"

    def __post_init__(self) -> None:
        _n_bytes(self.n_bytes, "Budget")
        _evict(self.evict, "Budget")

    def to_dict(self) -> dict[str, Any]:
        return {"policy": "budget", "n_bytes": self.n_bytes, "evict": self.evict}


@dataclass(frozen=True)
class PinnedHotSet:
    """A :class:`Budget` of ``n_bytes`` whose chosen units stay resident
    for the model's lifetime: ``layers`` (indices; negative ones count from
    the last layer), ``embeddings`` (the token embedding; the output head
    too when the model ties them) and ``output`` (the output head). The
    rest is paged within what the pinned set leaves of the budget, evicted
    in ``evict`` order as for :class:`Budget`."""

    n_bytes: int
    layers: tuple[int, ...] = ()
    embeddings: bool = False
    output: bool = False
    evict: str = "lru"

    def __post_init__(self) -> None:
        _n_bytes(self.n_bytes, "PinnedHotSet")
        _evict(self.evict, "PinnedHotSet")
        layers = self.layers
        if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
            raise ParameterError(
                f"PinnedHotSet: layers must be a sequence of layer indices, got {layers!r}"
            )
        items = tuple(layers)
        for il in items:
            if not isinstance(il, int) or isinstance(il, bool):
                raise ParameterError(f"PinnedHotSet: layer index {il!r} is not an integer")
        if len(set(items)) != len(items):
            raise ParameterError(f"PinnedHotSet: layers {list(items)} name a layer twice")
        object.__setattr__(self, "layers", items)
        for name in ("embeddings", "output"):
            if not isinstance(getattr(self, name), bool):
                raise ParameterError(
                    f"PinnedHotSet: {name} must be True or False, got {getattr(self, name)!r}"
                )

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": "pinned_hot_set",
            "n_bytes": self.n_bytes,
            "layers": list(self.layers),
            "embeddings": self.embeddings,
            "output": self.output,
            "evict": self.evict,
        }


OffloadPolicy = Budget | PinnedHotSet


def check_policy(policy: object) -> OffloadPolicy | None:
    if policy is None or isinstance(policy, (Budget, PinnedHotSet)):
        return policy
    raise ParameterError(
        f"offload must be None, oxillama.Budget or oxillama.PinnedHotSet, "
        f"not {type(policy).__name__}"
    )


def policy_from_dict(d: object) -> OffloadPolicy | None:
    """The policy a snapshot recorded: ``"cpu"`` (snapshots before the
    pager, and engines without a policy) is None. Raises ValueError for
    anything else it does not know."""
    if d == "cpu" or d is None:
        return None
    if not isinstance(d, dict):
        raise ValueError(f'offload must be "cpu" or an object, got {d!r}')
    kind = d.get("policy")
    keys = set(d)
    if kind == "budget" and keys == {"policy", "n_bytes", "evict"}:
        return Budget(d["n_bytes"], evict=d["evict"])
    pinned_keys = {"policy", "n_bytes", "layers", "embeddings", "output", "evict"}
    if kind == "pinned_hot_set" and keys == pinned_keys:
        if not isinstance(d["layers"], list):
            raise ValueError(f"offload.layers must be a list, got {d['layers']!r}")
        return PinnedHotSet(
            d["n_bytes"],
            tuple(d["layers"]),
            embeddings=d["embeddings"],
            output=d["output"],
            evict=d["evict"],
        )
    raise ValueError(f"unknown offload policy {d!r}")


def native_args(policy: OffloadPolicy, n_layer: int) -> tuple[int, list[int], bool, bool, str]:
    if isinstance(policy, Budget):
        return policy.n_bytes, [], False, False, policy.evict
    layers = []
    for il in policy.layers:
        resolved = il + n_layer if il < 0 else il
        if not 0 <= resolved < n_layer:
            raise ParameterError(
                f"PinnedHotSet: layer {il} does not exist, the model has {n_layer} layers"
            )
        layers.append(resolved)
    if len(set(layers)) != len(layers):
        raise ParameterError(f"PinnedHotSet: layers {list(policy.layers)} name a layer twice")
    return policy.n_bytes, sorted(layers), policy.embeddings, policy.output, policy.evict
