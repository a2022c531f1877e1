"""The first stage of every action: whatever happens after, its outcome is audited (the one place an audit
record of an action is built), counted, and, for a decided action (or one driven again from its intent after
a restart or a failover), fed back to the rules as a ``watchd_action`` event."""

from __future__ import annotations

from collections.abc import Callable

from watchd.actions.audit import AuditRecord
from watchd.actions.handler import Attempt
from watchd.actions.outcome import ActionResult, Outcome
from watchd.actions.stages import Next
from watchd.actions.trail import AuditTrail, scalars
from watchd.clock import Clock
from watchd.engine.metrics import EngineMetrics
from watchd.logs import get_logger
from watchd.model.action import SOURCE as FEEDBACK_SOURCE
from watchd.model.action import ActionFeedback
from watchd.model.events import Event, stable_id
from watchd.store.connection import StoreError, text

_log = get_logger("watchd.executor")


def audit_record(attempt: Attempt, result: ActionResult, time: float, elapsed: float = 0.0) -> AuditRecord:
    """The audit record of ``attempt`` come to ``result``: its note (who asked, why it ran again) before the
    outcome's detail, its parameters and its result data as JSON."""
    detail = (
        f"{attempt.note}: {result.detail}"
        if attempt.note and result.detail
        else attempt.note or result.detail
    )
    return AuditRecord(
        time=time,
        rule=attempt.rule,
        event_id=attempt.event_id,
        node=attempt.action.node,
        action=attempt.action.kind,
        mode=attempt.mode,
        outcome=result.outcome.value,  # what the trail, the metrics and the rules see: the plain name
        detail=detail,
        duration_s=round(elapsed, 6),
        params=scalars(attempt.action.params),
        result=scalars(result.data),
    )


class Record:
    def __init__(
        self,
        clock: Clock,
        metrics: EngineMetrics,
        audit: AuditTrail,
        feedback: Callable[[Event], None] | None,
    ) -> None:
        self._clock = clock
        self._metrics = metrics
        self._audit = audit
        self._feedback = feedback

    async def __call__(self, attempt: Attempt, next: Next) -> ActionResult:
        action = attempt.action
        start = self._clock.monotonic()
        unrecorded = ""  # why its decision could not be recorded
        try:
            result = await next(attempt)
        except StoreError as exc:  # its intent could not be recorded: counted, reported, the batch refused
            _log.error(
                "action_not_recorded", action=action.kind, node=action.node, error=str(exc), rate_limited=True
            )
            result = ActionResult(Outcome.FAILED, f"not recorded: {exc}")
            unrecorded = f"{action.kind} on {action.node} not recorded: {exc}"
        except Exception as exc:  # a bug in one action must not lose the audit of the others
            _log.exception("action_crashed", action=action.kind, node=action.node)
            result = ActionResult(Outcome.FAILED, f"internal error: {exc!r}")
        try:
            self._record(attempt, result, self._clock.monotonic() - start)
        except StoreError as exc:  # the store is full or locked: the actions that follow still run (an
            # action whose intent is finished is audited once the store takes writes again: Recovery)
            _log.error(
                "audit_failed", action=action.kind, node=action.node, error=str(exc), rate_limited=True
            )
            unrecorded = unrecorded or f"{action.kind} on {action.node}: audit record not written: {exc}"
        except Exception:
            _log.exception("audit_failed", action=action.kind, node=action.node)
        if unrecorded and attempt.on_unrecorded is not None:
            attempt.on_unrecorded(unrecorded)
        return result

    def _record(self, attempt: Attempt, result: ActionResult, elapsed: float) -> None:
        action, decision, mode = attempt.action, attempt.decision, attempt.mode
        self._metrics.actions.labels(action.kind, mode, result.outcome.value).inc()
        self._audit.record(audit_record(attempt, result, self._clock.now(), elapsed))
        if self._feedback is None:
            return
        parts: tuple[str, ...]
        if decision is not None and decision.event.kind != ActionFeedback.KIND:
            rule, parts = decision.rule, (decision.event.id, decision.rule, action.kind, action.node)
        elif decision is None and attempt.redrive:
            # driven again from its intent (a restart, a failover): its outcome is its decision's, and the
            # rules that follow it (a reset not done -> a reboot) must hear of it as from the first run
            rule = attempt.rule
            parts = (attempt.event_id, rule, action.kind, action.node, repr(attempt.now))
        else:
            return
        feedback = ActionFeedback(action=action.kind, outcome=result.outcome.value, rule=rule, mode=mode)
        self._feedback(
            feedback.to_event(
                id=stable_id("action", *(text(p) for p in parts)),  # hashable even with a lone surrogate
                node=action.node,
                source=FEEDBACK_SOURCE,
                time=self._clock.now(),
            )
        )
