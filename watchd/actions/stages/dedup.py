"""De-duplication per action key within the cooldown, durable: the intent is written before the action runs
and finished after, so a restart neither repeats nor forgets it."""

from __future__ import annotations

from watchd.actions.handler import Attempt
from watchd.actions.outcome import NOT_DONE, TOOK_OUT, ActionResult, Outcome
from watchd.actions.stages import Next
from watchd.clock import Clock
from watchd.integrations.base import Scheduler, SchedulerError
from watchd.logs import get_logger
from watchd.model.nodes import describe
from watchd.store import keys
from watchd.store.connection import StoreError, store_failed
from watchd.store.database import Store

_log = get_logger("watchd.executor")
RECHECK_S = 10.0  # seconds between reads of a de-duplicated drain's node state


class Deduplicate:
    def __init__(self, store: Store, clock: Clock, cooldown_s: float, scheduler: Scheduler | None) -> None:
        self._store = store
        self._clock = clock
        self._cooldown = cooldown_s
        self._scheduler = scheduler
        self._rechecked: dict[str, float] = {}  # node -> when its drained state was last read

    async def __call__(self, attempt: Attempt, next: Next) -> ActionResult:
        key = attempt.handler.key(attempt.action)
        if key is None:
            return await next(attempt)
        action = attempt.action
        if not self._begin(attempt, key) and not (
            attempt.handler.takes_node_out
            and attempt.mode == "enforce"
            and await self._drain_undone(action.node, attempt.now)
            and self._begin(attempt, key)
        ):
            when = "in progress" if attempt.handler.cooldown_s == 0 else "already decided within the cooldown"
            return ActionResult(Outcome.DEDUPLICATED, f"{action.kind} of {action.node} {when}")
        if attempt.on_recorded is not None:
            attempt.on_recorded()  # the intent is durable: a crash from here on is re-driven at next start
        try:
            result = await next(attempt)
        except StoreError as exc:  # mid-way (a safety gate's count, a hold): open, driven again (catch_up)
            _log.error("action_interrupted", key=key, error=str(exc), rate_limited=True)
            result = ActionResult(Outcome.INTERRUPTED, f"{store_failed(exc)}; driven again once it answers")
        except Exception as exc:
            # a crash of the action must not leave its intent open (nor in flight here) for ever
            self._store.intents.finish(
                key, Outcome.FAILED, f"internal error: {exc!r}", self._clock.now(), cooldown_until=attempt.now
            )
            raise
        except BaseException:  # cancelled (shutdown): left unfinished, for the next start to re-drive
            self._store.intents.forget(key)
            raise
        # A failed drain stays counted in the breaker: whether scontrol applied it is unknown, and the safe
        # error is to count one drain too many, never one too few. Its cooldown is lifted: the next retries.
        # When the finish cannot be written (StoreError), the outcome is still what happened (audited as
        # such): the store keeps the finish and writes it once it takes writes again (Intents.finish).
        if result.outcome == Outcome.INTERRUPTED:  # left mid-way: open, for the leader to drive again
            self._store.intents.forget(key)
            return result
        failed = result.outcome in NOT_DONE
        try:
            self._store.intents.finish(
                key,
                result.outcome,
                result.detail,
                self._clock.now(),
                cooldown_until=attempt.now if failed else None,
                result=result.data,
            )
        except StoreError as exc:
            _log.error("intent_finish_failed", key=key, error=str(exc), rate_limited=True)
        return result

    def _begin(self, attempt: Attempt, key: str) -> bool:
        a = attempt
        cooldown = a.handler.cooldown_s if a.handler.cooldown_s is not None else self._cooldown
        return self._store.intents.begin(
            key,
            a.action.kind,
            a.action.node,
            a.rule,
            a.event_id,
            a.params,
            a.now,
            cooldown_until=a.now + cooldown,
        )

    async def _drain_undone(self, node: str, now: float) -> bool:
        """Whether watchd's last drain of ``node`` (finished, within the cooldown) has been undone since: an
        operator or the scheduler returned the node to service. Then a new fault drains it again (and may
        requeue again) rather than being de-duplicated. The node's state is read at most every
        ``RECHECK_S`` (a flood of events for a drained node must not become a flood of state reads)."""
        if self._scheduler is None or now - self._rechecked.get(node, -RECHECK_S) < RECHECK_S:
            return False
        last = self._store.intents.under(keys.drain(node), limit=1)
        if not last or last[0].finished_at is None or last[0].outcome not in TOOK_OUT:
            return False
        self._rechecked[node] = now
        try:
            state = (await self._scheduler.node_states([node])).get(node)
        except SchedulerError as exc:
            _log.warning("drain_recheck_failed", node=node, error=str(exc))
            return False
        if state is None or state.drained:
            return False
        _log.info("drain_undone", node=node, state=describe(state))
        self._store.intents.clear_cooldown(keys.drain(node))
        self._store.intents.clear_cooldown(keys.requeue(node))
        return True
