"""Leadership as one gate: asked before every side effect (scheduler calls, alerts, webhooks)."""

from __future__ import annotations

from watchd.integrations.leadership import AlwaysLeader, Leadership


class LeaderGate:
    def __init__(self, leadership: Leadership | None = None) -> None:
        self.leadership: Leadership = leadership or AlwaysLeader()

    async def refusal(self, what: str) -> str | None:
        """None once this engine leads (waiting up to the takeover time); otherwise why ``what`` was not
        done."""
        lead = self.leadership
        if await lead.wait_leader(lead.takeover_wait_s):
            return None
        return f"{what}: not the leader (the lease is held by {lead.holder or 'nobody'}); nothing done"
