"""How Ray Serve runs oxillama's replicas (readable without Ray)."""

from __future__ import annotations

import dataclasses
from typing import Any

from oxillama.errors import ParameterError

__all__ = ["RayOptions"]


@dataclasses.dataclass(frozen=True)
class RayOptions:
    """How Ray Serve runs the replicas. With ``max_replicas`` the
    deployment autoscales between ``min_replicas`` and ``max_replicas`` on
    ``target_ongoing_requests`` per replica; otherwise it keeps
    ``replicas``."""

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None
    #: Requests a replica accepts at once (default: twice ``max_batch``);
    #: the router sends the rest elsewhere or queues them.
    max_ongoing_requests: int | None = None
    #: CPUs Ray reserves per replica; also its engine's threads unless
    #: ``threads`` is set.
    replica_cpus: float = 1.0
    drain_seconds: float = 30.0
    #: Where each replica writes a Prometheus ``file_sd`` target file for
    #: its own metrics endpoint (default: ``<sessions_dir>/metrics-targets``).
    metrics_targets_dir: str | None = None
    name: str = "oxillama"

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ParameterError(f"replicas must be at least 1, got {self.replicas}")
        if (self.min_replicas is None) != (self.max_replicas is None) and (
            self.max_replicas is None
        ):
            raise ParameterError("min_replicas needs max_replicas (autoscaling)")
        if self.max_replicas is not None:
            low = self.min_replicas or 0
            if self.max_replicas < max(1, low):
                raise ParameterError(
                    f"max_replicas ({self.max_replicas}) must be at least 1 and at least "
                    f"min_replicas ({low})"
                )
        elif self.target_ongoing_requests is not None:
            raise ParameterError("target_ongoing_requests needs max_replicas (autoscaling)")
        if self.replica_cpus <= 0:
            raise ParameterError(f"replica_cpus must be positive, got {self.replica_cpus}")
        if self.drain_seconds < 0:
            raise ParameterError(f"drain_seconds must be >= 0, got {self.drain_seconds}")

    def autoscaling(self) -> dict[str, Any] | None:
        if self.max_replicas is None:
            return None
        out: dict[str, Any] = {
            "min_replicas": self.min_replicas or 0,
            "max_replicas": self.max_replicas,
            "initial_replicas": max(self.min_replicas or 0, 1),
        }
        if self.target_ongoing_requests is not None:
            out["target_ongoing_requests"] = self.target_ongoing_requests
        return out
