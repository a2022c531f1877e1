"""Leadership: whether this engine may act now. The action pipeline asks it before every side effect
(scheduler calls, alerts, webhooks); reads (node states, pools, jobs) never wait for it.

Two elections implement it besides the lone engine's :class:`AlwaysLeader`: the Kubernetes Lease
(:mod:`watchd.integrations.kubernetes.lease`) and, for engines sharing a PostgreSQL store, the database lease
(:mod:`watchd.integrations.dblease`), whose fencing token every write and every side effect checks
(:meth:`Leadership.confirm`)."""

from __future__ import annotations

from typing import Protocol


class Leadership(Protocol):
    #: Who leads now, as far as this engine knows (None: unknown); named in "not the leader" outcomes.
    holder: str | None
    #: How long a side effect waits for leadership before it fails with "not the leader".
    takeover_wait_s: float

    async def wait_leader(self, timeout: float) -> bool:
        """True once this engine leads (at once when it does), False when ``timeout`` passed first."""
        ...

    async def confirm(self) -> bool:
        """Right before a side effect: whether this engine still leads *now*, asked of the authority (the
        database lease: this engine's fencing token is still the lease's, and the lease is not about to
        expire), not of what it believed at its last renewal. Never waits for leadership."""
        ...


class AlwaysLeader:
    """A lone engine: it always leads."""

    holder: str | None = None
    takeover_wait_s = 0.0

    async def wait_leader(self, timeout: float) -> bool:
        return True

    async def confirm(self) -> bool:
        return True
