"""Ray Serve request routing with session affinity.

A request naming a session (the ``X-Session-Id`` header, which Ray Serve's
proxy puts in the request's ``session_id``) goes to the replica that
served the session's last turn, where its KV is live. Any other request
(a session named in the body only among them: the proxy reads no body),
and a session whose replica is gone or full, goes to the least loaded
replica: that replica restores the session from the shared sessions folder
(every turn ends with its snapshot there), so the continuation is exact
whichever replica answers; affinity only saves the restore."""

from __future__ import annotations

import collections
import random
from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

__all__ = ["SessionAffinityRouter"]


class SessionAffinityRouter(FIFOMixin, RequestRouter):
    """``RequestRouterConfig(request_router_class=SessionAffinityRouter)``.

    Each router (one per proxy and per deployment handle) remembers the
    replica of the sessions it routed, the most recent ``max_sessions`` of
    them. A router that has not seen a session (another proxy's, or one
    from before a restart) sends it to the least loaded replica, which
    then becomes its home."""

    def initialize_state(self, max_sessions: int = 100_000, **kwargs: Any) -> None:
        self._homes: collections.OrderedDict[str, ReplicaID] = collections.OrderedDict()
        self._max_sessions = max_sessions

    def home(self, session: str) -> ReplicaID | None:
        return self._homes.get(session)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            # Every pass over the candidates is the full set: the routing
            # loop backs off between passes when all of them are full.
            pending_request.routing_context.should_backoff = True
        sid = pending_request.metadata.session_id if pending_request is not None else ""
        home = self._homes.get(sid) if sid else None
        if home is not None:
            at_home = [r for r in candidate_replicas if r.replica_id == home]
            others = [r for r in candidate_replicas if r.replica_id != home]
            if at_home:
                # A full home replica gives way to the least loaded other.
                return [at_home, others] if others else [at_home]
        # One rank: the base class takes the shortest queue, the first of
        # equals; shuffled, equals share the load.
        return [random.sample(candidate_replicas, len(candidate_replicas))]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        sid = pending_request.metadata.session_id
        if not sid:
            return
        self._homes[sid] = replica_id
        self._homes.move_to_end(sid)
        while len(self._homes) > self._max_sessions:
            self._homes.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        for sid in [s for s, r in self._homes.items() if r == replica_id]:
            del self._homes[sid]
