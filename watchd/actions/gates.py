"""The safety gate of a disruptive action: the rule's rate limit and the blast-radius breaker, asked at the
last moment, with the disruption counted in the durable window as soon as it is allowed."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from watchd.actions.pools import Pools
from watchd.actions.safety import (
    BreakerLimits,
    SafetyGate,
    Verdict,
    breaker_verdict,
    rate_verdict_counted,
)
from watchd.store import keys

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt, Mode
    from watchd.store.database import Store


def held_pool(gate: SafetyGate | None) -> str:
    return gate.verdict.pool if gate is not None and gate.verdict is not None else ""


class Safety:
    """Builds the gates; ``limits`` and ``pools`` may be replaced at any time (the engine refreshes pools)."""

    def __init__(self, store: Store, limits: BreakerLimits, pools: Pools) -> None:
        self._store = store
        self.limits = limits
        self.pools = pools

    def gate(self, attempt: Attempt) -> SafetyGate | None:
        """The gate of a disruptive action, None for any other. Every disruptive action is counted in the
        breaker window; only those with ``check_safety`` are also checked (an operator's release, a
        follow-up requeue and a re-driven action are counted, not held)."""
        if not attempt.handler.disruptive:
            return None
        rate_limit = attempt.decision.rate_limit if attempt.decision is not None else None
        a = attempt

        def decide() -> Verdict:
            verdict = self._verdict(a, rate_limit) if a.check_safety else Verdict(True)
            if verdict.allowed:
                self._count(a.rule, a.action.node, a.mode, a.now)
            return verdict

        return SafetyGate(decide)

    def drain_counted(self, attempt: Attempt) -> bool:
        """Whether the node of ``attempt`` is counted as taken out within the breaker's window (in the
        window of its mode): after a drain, whether the breaker let that drain through."""
        since = attempt.now - self.limits.window_s
        node = attempt.action.node
        return all(
            self._store.breaker.contains(_counted(p, attempt.mode), node, since)
            for p in self.pools.pools(node)
        )

    def _verdict(self, attempt: Attempt, limit: Any) -> Verdict:
        rule, node, now = attempt.rule, attempt.action.node, attempt.now
        if limit is not None:
            pool = _counted(keys.rule_pool(rule), attempt.mode)
            # strictly within ``per`` (as rate_verdict counts), by one SQL count
            within = self._store.breaker.count(pool, math.nextafter(now - limit.per, math.inf))
            verdict = rate_verdict_counted(rule, within, limit.max, limit.per)
            if not verdict.allowed:
                return Verdict(False, verdict.reason, keys.rule_pool(rule))
        if not attempt.handler.takes_node_out:  # the breaker counts nodes taken out of service
            return Verdict(True)
        pools = self.pools.pools(node)
        since = now - self.limits.window_s
        window = self._store.breaker
        # per pool one indexed lookup and one SQL count: the cost does not grow with the window's rows
        counted = {p: window.contains(_counted(p, attempt.mode), node, since) for p in pools}
        taken = {p: window.count(_counted(p, attempt.mode), since) for p in pools if not counted[p]}
        return breaker_verdict(node, pools, self.pools.sizes, taken, counted, self.limits)

    def _count(self, rule: str, node: str, mode: Mode, now: float) -> None:
        # one transaction: a store failing mid-way counts the disruption in every pool or in none (the gate
        # is then asked again in a later round, and a pool that counted it does not count it twice)
        pools = [_counted(p, mode) for p in (keys.rule_pool(rule), *self.pools.pools(node))]
        self._store.breaker.record_all(pools, node, now)


def _counted(pool: str, mode: Mode) -> str:
    """Dry-run counts in a window of its own: it must never fill the real one."""
    return keys.dry_run_pool(pool) if mode == "dry-run" else pool
