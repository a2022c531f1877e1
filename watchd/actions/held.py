"""Actions held for an operator: holding one (and paging about its pool), then its release or discard.

A held drain keeps what its decision did after it: the requeue, and the remediation (``gpu_reset``,
``reboot``). Released, the drain runs, then the requeue, then the remediation, each through the pipeline and
audited, so that the break-fix loop goes on without a person; a remediation that cannot follow (the drain
did not take the node out, the handler refused) is audited with why, and logged."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from watchd.actions.alerting import AlertKeeper
from watchd.actions.handler import Attempt, Mode
from watchd.actions.handlers import HANDLERS, handler_for
from watchd.actions.handlers.remediation_guard import RemediationHandler
from watchd.actions.handlers.requeue import HANDLER as REQUEUE
from watchd.actions.outcome import DRAINED_BY_US, ActionResult, Outcome
from watchd.actions.stages import Pipeline
from watchd.actions.stages.record import audit_record
from watchd.actions.trail import AuditTrail, scalars
from watchd.clock import Clock
from watchd.logs import get_logger
from watchd.model.events import Scalar
from watchd.rules.decision import PlannedAction
from watchd.store import keys
from watchd.store.database import Store
from watchd.store.held import HeldAction

REQUEUE_AFTER_RELEASE = "requeue_after_release"  # in a held drain's params: its decision requeued after it
#: in a held drain's params: the remediations its decision asked after it, as JSON [{"kind", "params"}]
REMEDIATE_AFTER_RELEASE = "remediate_after_release"
#: what a re-driven remediation may end as without a person being told more than its audit record
_UNDER_WAY = frozenset({Outcome.REBOOTING, Outcome.RESET, Outcome.DRY_RUN})
_AFTER_RELEASE = (REQUEUE_AFTER_RELEASE, REMEDIATE_AFTER_RELEASE)

_log = get_logger("watchd.actions.held")

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
        remedies = remediations_after(attempt)
        if remedies:
            params = {**params, REMEDIATE_AFTER_RELEASE: json.dumps(remedies, sort_keys=True)}
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
        params = {k: v for k, v in held.params.items() if k not in _AFTER_RELEASE}
        note = f"released by {by}"
        result = await self._run.run(self._attempt(PlannedAction(held.kind, held.node, params), held, note))
        drained = result.outcome
        if held.params.get(REQUEUE_AFTER_RELEASE) and result.outcome in DRAINED_BY_US:
            requeue = PlannedAction(REQUEUE.kind, held.node, {})
            requeued = await self._run.run(self._attempt(requeue, held, note))
            result = ActionResult(
                result.outcome,
                f"{result.detail}; then requeue: {requeued.outcome} {requeued.detail}",
                {**result.data, "requeue": requeued.data},
            )
        for kind, rparams in _remedies(held.params.get(REMEDIATE_AFTER_RELEASE)):
            # through the pipeline after the drain, as in its decision: a drain that did not take the node
            # out skips it (audited, with why)
            action = PlannedAction(kind, held.node, rparams)
            done = await self._run.run(self._attempt(action, held, f"{note}, after the drain", drained))
            if done.outcome not in _UNDER_WAY:
                _log.warning(
                    "remediation_not_redriven",
                    node=held.node,
                    action=kind,
                    held=held.id,
                    outcome=done.outcome.value,
                    detail=done.detail,
                )
            result = ActionResult(
                result.outcome,
                f"{result.detail}; then {kind}: {done.outcome} {done.detail}",
                {**result.data, kind: {"outcome": done.outcome.value, **done.data}},
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

    def _attempt(
        self, action: PlannedAction, held: HeldAction, note: str, after_drain: Outcome | None = None
    ) -> Attempt:
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
            after_drain=after_drain,
        )


def remediations_after(attempt: Attempt) -> list[dict[str, Any]]:
    """The remediations (reboot, gpu_reset: every :class:`RemediationHandler`) that come after
    ``attempt``'s action in its decision, with their parameters as decided: what a held drain's release
    drives again."""
    decision = attempt.decision
    if decision is None:
        return []
    actions = list(decision.actions)
    here = next((i for i, a in enumerate(actions) if a is attempt.action), None)
    if here is None:
        here = next((i for i, a in enumerate(actions) if a == attempt.action), len(actions))
    return [{"kind": a.kind, "params": scalars(a.params)} for a in actions[here + 1 :] if _remedy(a.kind)]


def _remedy(kind: object) -> bool:
    """Whether ``kind`` is a remediation: what a held drain's release drives again after it."""
    return isinstance(HANDLERS.get(str(kind)), RemediationHandler)


def _remedies(raw: Scalar | None) -> Sequence[tuple[str, dict[str, Any]]]:
    """The remediations kept with a held drain (:data:`REMEDIATE_AFTER_RELEASE`); a value that is not what
    :func:`remediations_after` wrote is logged and yields none."""
    if raw is None:
        return []
    try:
        items = json.loads(str(raw))
        out = [(str(i["kind"]), dict(i["params"])) for i in items if _remedy(i["kind"])]
    except (ValueError, TypeError, KeyError) as exc:
        _log.error("held_remediation_unreadable", error=str(exc), value=str(raw)[:200])
        return []
    return out
