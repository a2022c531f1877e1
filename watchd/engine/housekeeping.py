"""The engine's hourly housekeeping: what its state database keeps is bounded by the rate of actions and by
the audit's retention, not by uptime."""

from __future__ import annotations

from watchd.config import EngineConfig
from watchd.store.database import Store


def prune(store: Store, config: EngineConfig, now: float) -> None:
    """Drop what is past its retention: audit records, breaker counts, expired cooldowns, resolved held
    actions and finished intents past the audit's retention (held ones and unfinished intents are never
    pruned), check runs, the nodes' remediations and cleared marks (open marks are never pruned), the
    agents' command bindings (the subsystems prune theirs on the engine's Housekeeping news: reliability's
    records)."""
    retention = now - config.state.audit_retention_days * 86400
    store.audit.prune(retention)
    store.breaker.prune(now - max(config.safety.window_s, 86400.0))
    store.intents.prune_cooldowns(now)
    store.held.prune(retention)
    store.intents.prune(retention)
    store.checks.prune(retention)
    store.nodes.prune(retention)  # remediations past every window, marks cleared long ago (open ones stay)
    store.command_bindings.prune(retention, now)
