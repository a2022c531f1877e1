"""Actions held for an operator: holding one (and paging about its pool), then its release or discard."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from watchd.actions.alerting import AlertKeeper
from watchd.actions.handler import Attempt, Mode
from watchd.actions.handlers import handler_for
from watchd.actions.handlers.requeue import HANDLER as REQUEUE
from watchd.actions.outcome import DRAINED_BY_US, ActionResult, Outcome
from watchd.actions.stages import Pipeline
from watchd.actions.stages.record import audit_record
from watchd.actions.trail import AuditTrail, scalars
from watchd.clock import Clock
from watchd.rules.decision import PlannedAction
from watchd.store import keys
from watchd.store.database import Store
from watchd.store.held import HeldAction

REQUEUE_AFTER_RELEASE = "requeue_after_release"  # in a held drain's params: its decision requeued after it

Spawn = Callable[[Coroutine[Any, Any, None]], None]


class Hold:
    """Keep an action the safety limits stopped, for an operator, and page about its pool."""

    def __init__(self, store: Store, alerts: AlertKeeper, spawn: Spawn) -> None:
        self._store = store
        self._alerts = alerts
        self._spawn = spawn

    def __call__(self, attempt: Attempt, reason: str, pool: str) -> ActionResult:
        action, decision = attempt.action, attempt.decision
        already = self._store.held.find(action.kind, action.node)
        if already is not None:  # a repeated event (a condition re-reported) adds no second held row
            return ActionResult(Outcome.HELD, f"already held as #{already.id}: {reason}")
        params = attempt.params
        if attempt.requeue_follows:
            params = {**params, REQUEUE_AFTER_RELEASE: True}
        held = self._store.held.hold(
            HeldAction(
                rule=decision.rule if decision is not None else "operator",
                kind=action.kind,
                node=action.node,
                pool=pool,
                params=params,
                event=decision.event.to_wire() if decision is not None else {},
                reason=reason,
                held_at=attempt.now,
            )
        )
        self._spawn(self._alerts.breaker_open(reason, action.kind, action.node, pool))
        return ActionResult(Outcome.HELD, f"held as #{held}: {reason}")


class HeldActions:
    """An operator's release (the action runs now, past the breaker, still de-duplicated) or discard."""

    def __init__(
        self, store: Store, clock: Clock, mode: Mode, run: Pipeline, alerts: AlertKeeper, audit: AuditTrail
    ) -> None:
        self._store = store
        self._clock = clock
        self._mode: Mode = mode
        self._run = run
        self._alerts = alerts
        self._audit = audit

    async def release(self, held_id: int, by: str) -> ActionResult:
        held = self._store.held.release(held_id, by, self._clock.now())
        if held is None:
            return ActionResult(Outcome.NOT_HELD, f"no held action #{held_id}")
        params = {k: v for k, v in held.params.items() if k != REQUEUE_AFTER_RELEASE}
        note = f"released by {by}"
        result = await self._run.run(self._attempt(PlannedAction(held.kind, held.node, params), held, note))
        if held.params.get(REQUEUE_AFTER_RELEASE) and result.outcome in DRAINED_BY_US:
            requeue = PlannedAction(REQUEUE.kind, held.node, {})
            requeued = await self._run.run(self._attempt(requeue, held, note))
            result = ActionResult(
                result.outcome,
                f"{result.detail}; then requeue: {requeued.outcome} {requeued.detail}",
                {**result.data, "requeue": requeued.data},
            )
        self._alerts.breaker_cleared(held.pool)
        return result

    def discard(self, held_id: int, by: str) -> ActionResult:
        held = self._store.held.discard(held_id, by, self._clock.now())
        if held is None:
            return ActionResult(Outcome.NOT_HELD, f"no held action #{held_id}")
        result = ActionResult(Outcome.DISCARDED, f"{held.kind} of {held.node} discarded by {by}")
        attempt = self._attempt(PlannedAction(held.kind, held.node, held.params), held, "")
        self._alerts.breaker_cleared(held.pool)
        self._audit.record(audit_record(attempt, result, self._clock.now()))
        return result

    def _attempt(self, action: PlannedAction, held: HeldAction, note: str) -> Attempt:
        """An operator's release runs (and is audited) under the rule that decided the held action."""
        return Attempt(
            action=action,
            handler=handler_for(action.kind),
            mode=self._mode,
            rule=held.rule,
            event_id=keys.held_event(held.id),
            now=self._clock.now(),
            params=scalars(action.params),
            check_safety=False,
            note=note,
        )
