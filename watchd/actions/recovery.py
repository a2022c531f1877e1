"""After a crash: actions finished but never audited get their audit record (marked as recovered), actions
decided but never finished are driven once more (they are idempotent), and a requeue that a crash kept from
following its finished drain is done now (in dry-run too: a dry-run drain is followed by its dry-run
requeue).

In the running engine, once the store takes writes again after failing (:meth:`Recovery.catch_up`): the
finishes that could not be written are written, the finished actions whose audit record could not be
written are audited, and the actions interrupted mid-way are driven again."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from watchd.actions.audit import AuditRecord
from watchd.actions.handler import Attempt, Mode
from watchd.actions.handlers import handler_for
from watchd.actions.handlers.drain import HANDLER as DRAIN
from watchd.actions.handlers.requeue import HANDLER as REQUEUE
from watchd.actions.outcome import DRAINED_BY_US, NOT_DONE, ActionResult, Outcome
from watchd.actions.stages import Next, Pipeline
from watchd.actions.trail import AuditTrail, scalars
from watchd.clock import Clock
from watchd.logs import get_logger
from watchd.rules.decision import Decision, PlannedAction
from watchd.store import keys
from watchd.store.connection import StoreError, store_failed
from watchd.store.database import Store
from watchd.store.intents import Intent

_log = get_logger("watchd.executor")

REQUEUE_FOLLOWS = "requeue_follows"  # in a drain's intent: its decision requeues the node after it
RETRY_MAX_S = 300.0  # the longest wait between two re-drives of an action that keeps being interrupted
MODE = "mode"  # in the intent of an action no rule decided: the mode it runs in (an operator's: enforce)
#: the note of a re-drive in the running engine: its finish could not be written, or it was interrupted
STALE = "re-driven once the state database took writes again, or after an interruption"
#: the note of an audit record written from its finished intent
AFTER_RESTART = "recovered after a restart (finished, never audited)"
AFTER_STORE = "audited once the state database took writes again (finished, its audit record not written)"

Spawn = Callable[[Coroutine[Any, Any, None]], None]


def intent_params(decision: Decision, index: int, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of a decision's action as its intent keeps them: a drain followed by a requeue of the
    whole node says so, so that a restart between the two still requeues."""
    if not handler_for(decision.actions[index].kind).takes_node_out:
        return params
    later = decision.actions[index + 1 :]
    whole_node = any(REQUEUE.whole_node(a) for a in decision.actions if handler_for(a.kind).follows_drain)
    if whole_node and any(handler_for(a.kind).follows_drain for a in later):
        return {**params, REQUEUE_FOLLOWS: True}
    return params


class Recovery:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        mode: Mode,
        cooldown_s: float,
        redrive: Pipeline,
        requeue: Pipeline,
        audit: AuditTrail,
        spawn: Spawn,
    ) -> None:
        self._store = store
        self._clock = clock
        self._mode: Mode = mode
        self._cooldown = cooldown_s
        self._redrive_pipeline = redrive
        self._requeue_pipeline = requeue
        self._audit = audit
        self._spawn = spawn
        self._retry_at: dict[str, float] = {}  # stale intent key -> when it may be driven again
        self._retry_in: dict[str, float] = {}  # ... and the wait after that (doubling)
        self._failures_seen = 0  # the store's failed writes when catch_up last caught up

    def start(self) -> None:
        """The audit records a crash kept from following their finished intent, the requeues it kept from
        following their finished drain, then every unfinished action."""
        with contextlib.suppress(StoreError):  # leadership regained: this process's own, known finishes
            self._store.intents.write_unwritten()
        self._audit_unaudited()
        self._requeue_missed()
        for intent in self._store.intents.unfinished():
            if self._store.intents.in_flight(intent.key):
                continue  # driven here already (leadership lost and regained): never twice
            _log.warning(
                "redriving_unfinished_action", key=intent.key, rule=intent.rule, decided_at=intent.decided_at
            )
            self._store.intents.adopt(intent.key)  # in flight here: a new decision waits, never replaces
            self._spawn(self._redrive(intent))

    def catch_up(self) -> int:
        """Once the store takes writes again (the leader only), when a write failed since the last call:
        write the finishes that could not be written, audit the finished actions whose audit record could
        not be written, requeue after the drains whose requeue could not be recorded; then drive again what
        was interrupted (:meth:`redrive_stale`). Returns how many are driven again; a StoreError (the store
        failed again) leaves the rest for the next call."""
        failures = self._store.health.failures
        if failures != self._failures_seen:  # a write failed since the last call
            self._store.intents.write_unwritten()
            if self._audit.missed:
                self._audit.missed = False
                try:
                    self._audit_unaudited(AFTER_STORE)
                except StoreError:
                    self._audit.missed = True
                    raise
            # a requeue whose intent could not be written after its drain: done now (de-duplicated)
            self._requeue_missed(
                "once the state database took writes again, the requeue that follows the drain"
            )
            self._failures_seen = failures
        return self.redrive_stale()

    def redrive_stale(self) -> int:
        """Once the store takes writes again: drive once more each action that was interrupted mid-way (a
        drain whose rounds kept failing on the store, a validation whose last step failed) or cancelled, so
        that it is finished and audited without waiting for the next decision on its node or a restart;
        one that keeps coming back waits longer each time (doubling, up to ``RETRY_MAX_S``). The leader only
        (a follower's re-drive would be refused). Returns how many."""
        now = self._clock.now()
        stale = self._store.intents.stale()
        keys_ = {i.key for i in stale}
        for key in [k for k in self._retry_in if k not in keys_]:  # done since: its next wait starts over
            self._retry_in.pop(key, None)
            self._retry_at.pop(key, None)
        stale = [i for i in stale if self._retry_at.get(i.key, now) <= now]
        for intent in stale:
            # one that keeps coming back (an interrupted step the scheduler keeps refusing) waits longer
            delay = self._retry_in[intent.key] = min(RETRY_MAX_S, 2 * self._retry_in.get(intent.key, 1.0))
            self._retry_at[intent.key] = now + delay
            _log.warning("redriving_stale_action", key=intent.key, rule=intent.rule)
            self._store.intents.adopt(intent.key)
            self._spawn(self._redrive(intent, STALE))
        return len(stale)

    def _audit_unaudited(self, note: str = AFTER_RESTART) -> None:
        """A ``kill -9`` between finishing an intent and appending its audit record, or a store that took
        the finish and not the audit record, left an action done but never audited: audit it now, from the
        intent, marked as recovered (``note``)."""
        for intent in self._store.intents.unaudited(self._clock.now() - max(self._cooldown, 86400.0)):
            _log.warning("audit_recovered", key=intent.key, rule=intent.rule, outcome=intent.outcome)
            self._record(
                AuditRecord(
                    time=self._clock.now(),
                    rule=intent.rule,
                    event_id=intent.event_id,
                    node=intent.node,
                    action=intent.kind,
                    mode=self._mode if intent.outcome != Outcome.DRY_RUN else "dry-run",
                    outcome=intent.outcome or Outcome.FAILED.value,
                    detail=f"{note}: {intent.detail}",
                    params=intent.params,
                )
            )

    def _requeue_missed(self, note: str = "after a restart, the requeue that follows the drain") -> None:
        """A drain that took its node out within the cooldown, decided with a requeue after it, and no
        requeue of the node decided since: a crash came between the two, or the store failed to record the
        requeue. Requeue now (de-duplicated), ``note`` before its outcome."""
        for drain in self._store.intents.since(DRAIN.kind, self._clock.now() - self._cooldown):
            if not drain.params.get(REQUEUE_FOLLOWS) or drain.outcome not in DRAINED_BY_US:
                continue
            requeues = self._store.intents.under(keys.requeue(drain.node), limit=1)
            if requeues and requeues[-1].decided_at >= drain.decided_at:
                continue
            _log.warning("requeue_after_restart", node=drain.node, rule=drain.rule)
            self._spawn(self._requeue_after(drain, note=note))

    async def _requeue_after(
        self,
        drain: Intent,
        drained: str | None = None,
        note: str = "after a restart, the requeue that follows the drain",
    ) -> None:
        # a dry-run drain (a dry-run engine, or a rule in dry-run) is followed by a dry-run requeue
        mode: Mode = "dry-run" if (drained or drain.outcome) == Outcome.DRY_RUN else self._mode
        requeue = PlannedAction(REQUEUE.kind, drain.node, {})
        attempt = self._attempt(requeue, drain.rule, drain.event_id, check_safety=False, mode=mode)
        attempt.note = note
        await self._requeue_pipeline.run(attempt)

    def _record(self, entry: AuditRecord) -> None:
        try:
            self._audit.record(entry)
        except StoreError as exc:  # the store is full or locked: reported by its metrics and readiness
            _log.error(
                "audit_failed", action=entry.action, node=entry.node, error=str(exc), rate_limited=True
            )

    async def _redrive(self, intent: Intent, why: str = "re-driven after a restart") -> None:
        """Drive an interrupted action once more, through the same safety limits as a new one (and the
        requeue its decision had after it, for a drain), in the mode it was decided in."""
        params = {k: v for k, v in intent.params.items() if k != MODE}
        mode = intent.params.get(MODE)
        attempt = self._attempt(
            PlannedAction(intent.kind, intent.node, params),
            intent.rule,
            intent.key,
            mode=mode if mode in ("dry-run", "enforce") else None,  # type: ignore[arg-type]
        )
        attempt.note, attempt.redrive = why, True
        result = await self._redrive_pipeline.run(attempt)
        if intent.params.get(REQUEUE_FOLLOWS) and result.outcome in DRAINED_BY_US:
            await self._requeue_after(intent, result.outcome)

    def _attempt(
        self,
        action: PlannedAction,
        rule: str,
        event_id: str,
        check_safety: bool = True,
        mode: Mode | None = None,
    ) -> Attempt:
        return Attempt(
            action=action,
            handler=handler_for(action.kind),
            mode=mode or self._mode,
            rule=rule,
            event_id=event_id,
            now=self._clock.now(),
            params=scalars(action.params),
            check_safety=check_safety,
        )


class FinishIntent:
    """The stage of a re-driven action in place of de-duplication: its intent exists (recovery adopted it);
    it is finished with the outcome, and never left in flight (it would block its node)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def __call__(self, attempt: Attempt, next: Next) -> ActionResult:
        try:
            result = await next(attempt)
        except StoreError as exc:  # mid-way: still open, driven again once the store answers
            _log.error("redrive_interrupted", key=attempt.event_id, error=str(exc), rate_limited=True)
            result = ActionResult(Outcome.INTERRUPTED, f"{store_failed(exc)}; driven again once it answers")
        except Exception as exc:
            _log.exception("redrive_crashed", key=attempt.event_id)
            result = ActionResult(Outcome.FAILED, f"internal error: {exc!r}")
        if result.outcome == Outcome.INTERRUPTED:  # still mid-way: open, driven again later
            self._store.intents.forget(attempt.event_id)
            return result
        failed = result.outcome in NOT_DONE
        try:
            self._store.intents.finish(
                attempt.event_id,  # a re-driven action goes by its intent's key
                result.outcome,
                f"{attempt.note}: {result.detail}",
                self._clock.now(),
                cooldown_until=attempt.now if failed else None,
                result=result.data,
            )
        except StoreError as exc:  # kept by the store: written once it takes writes again (catch_up)
            _log.error("intent_finish_failed", key=attempt.event_id, error=str(exc), rate_limited=True)
        return result
