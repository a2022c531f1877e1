"""Leadership: whether this engine may act now. The action pipeline asks it before every side effect
(scheduler calls, alerts, webhooks); reads (node states, pools, jobs) never wait for it."""

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


class AlwaysLeader:
    """A lone engine: it always leads."""

    holder: str | None = None
    takeover_wait_s = 0.0

    async def wait_leader(self, timeout: float) -> bool:
        return True
