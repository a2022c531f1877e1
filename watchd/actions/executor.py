"""The action executor: turns decisions into scheduler calls, alerts and webhooks, safely.

Each action of a decision goes through one pipeline of small stages (:mod:`watchd.actions.stages`), the
handler of its kind (:mod:`watchd.actions.handlers`) saying how each stage treats it:

1. record: whatever happens after, the outcome is audited and fed back to the rules (``watchd_action``);
2. follow the drain: a requeue after a drain in the same decision acts on what the drain left;
3. de-duplicate per action and node within the cooldown (durable: a restart neither repeats nor forgets);
4. mode: the engine's, made stricter by the rule's (dry-run decides and records, touches nothing);
5. leadership: only the leader touches anything (scheduler, Alertmanager, webhooks);
6. safety for disruptive actions: the rule's rate limit and the blast-radius breaker; beyond them the action
   is held for an operator, an alert fires, and everything else goes on;
7. execute: the handler runs it (drains coalesced into scheduler rounds by the DrainBatcher).

Every de-duplicated action is written to the store as an intent before the scheduler is touched and
finished after, so a ``kill -9`` in between is re-driven once at the next start (drains and requeues are
idempotent): :mod:`watchd.actions.recovery`. Held actions are released or discarded by an operator:
:mod:`watchd.actions.held`. Alerts are kept firing, expired and re-fired by :mod:`watchd.actions.alerting`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from watchd.actions.alerting import AlertKeeper
from watchd.actions.audit import AuditSink
from watchd.actions.drain_batcher import DrainBatcher
from watchd.actions.gates import Safety
from watchd.actions.handler import Attempt, Mode
from watchd.actions.handlers import handler_for
from watchd.actions.handlers.resume import HANDLER as RESUME
from watchd.actions.held import HeldActions, Hold
from watchd.actions.leader_gate import COMMAND_VERBS, LeaderGate
from watchd.actions.outcome import ActionResult, Outcome
from watchd.actions.pools import Pools
from watchd.actions.recovery import MODE, FinishIntent, Recovery, intent_params
from watchd.actions.runtime import CommandPath, Runtime, SparePool, Validator
from watchd.actions.safety import BreakerLimits
from watchd.actions.stages import Pipeline
from watchd.actions.stages.dedup import Deduplicate
from watchd.actions.stages.execute import Execute
from watchd.actions.stages.follow import FollowTheDrain
from watchd.actions.stages.follow_ups import FollowUps
from watchd.actions.stages.leadership import Leadership as LeadershipStage
from watchd.actions.stages.mode import DryRun
from watchd.actions.stages.record import Record
from watchd.actions.stages.safety import SafetyLimits
from watchd.actions.trail import AuditTrail, scalars
from watchd.clock import Clock
from watchd.engine.metrics import EngineMetrics
from watchd.integrations.alerts import AlertSink
from watchd.integrations.base import SCHEDULER_VERBS, Scheduler
from watchd.integrations.leadership import Leadership
from watchd.integrations.webhook.sender import WebhookSender
from watchd.logs import get_logger
from watchd.model.events import Event
from watchd.port import gated, verbs_of
from watchd.rules import Decision
from watchd.rules.decision import PlannedAction
from watchd.store import keys
from watchd.store.connection import StoreError
from watchd.store.database import Store

__all__ = ["ActionExecutor", "ActionResult", "Mode", "Pools"]

_log = get_logger("watchd.executor")


class ActionExecutor:
    def __init__(
        self,
        scheduler: Scheduler | None,
        mode: Mode,
        clock: Clock,
        metrics: EngineMetrics,
        audit: AuditSink,
        *,
        store: Store | None = None,
        alerts: AlertSink | None = None,
        webhooks: WebhookSender | None = None,
        limits: BreakerLimits | None = None,
        pools: Pools | None = None,
        cooldown_s: float = 600.0,
        max_concurrent: int = 1024,
        feedback: Callable[[Event], None] | None = None,
        generator_url: str = "",
        leadership: Leadership | None = None,
        recover_at_start: bool = True,
    ) -> None:
        self.mode: Mode = mode
        #: False with a shared store and an elected leader: recovery waits for :meth:`take_over`
        self.recover_at_start = recover_at_start
        self.store = store or Store.open(":memory:")
        self._clock = clock
        self._metrics = metrics
        self.leader_gate = leader = LeaderGate(leadership)
        # every change to the cluster is asked through the gate right before the call (fencing)
        if scheduler is not None:
            scheduler = gated(scheduler, verbs_of(scheduler) or SCHEDULER_VERBS, leader.now)
        self._slots = asyncio.Semaphore(max_concurrent)
        self._tasks: set[asyncio.Task[None]] = set()
        # of the decisions submitted, not yet recorded: why not, once it is known (None: recorded)
        self._deciding: set[asyncio.Future[str | None]] = set()
        self._batcher = (
            DrainBatcher(scheduler, lambda result: metrics.drain_store_failures.labels(result).inc())
            if scheduler is not None
            else None
        )
        self._safety = Safety(self.store, limits or BreakerLimits(), pools or Pools())
        trail = AuditTrail(audit, self.store)
        self.alerts = AlertKeeper(
            alerts, self.store, clock, leader, self._spawn, lambda: self.limits.window_s
        )
        self.runtime = runtime = Runtime(
            scheduler,
            self._batcher,
            self.alerts,
            webhooks,
            clock,
            metrics,
            generator_url,
            audit=self.store.audit,
            intents=self.store.intents,
            nodes=self.store.nodes,
        )

        # the pipelines, assembled here once; every one starts by recording (the one place an action is
        # audited) after its follow-ups; the paths without a decision skip the stages that need one
        follow_ups = FollowUps(runtime, clock, lambda attempt: self._operator.run(attempt))
        record = Record(clock, metrics, trail, feedback)
        dedup = Deduplicate(self.store, clock, cooldown_s, scheduler)
        acting = (
            DryRun(self._safety),
            LeadershipStage(leader),
            SafetyLimits(self._safety, Hold(self.store, self.alerts, self._spawn)),
            Execute(runtime),
        )
        self._decided = Pipeline(follow_ups, record, FollowTheDrain(), dedup, *acting)
        # an operator's release or resume, an engine-made change (spares, validation), a follow-up
        self._operator = Pipeline(follow_ups, record, dedup, *acting)
        self._trail = trail
        self.held = HeldActions(self.store, clock, mode, self._operator, self.alerts, trail)
        redrive = Pipeline(follow_ups, record, FinishIntent(self.store, clock), *acting)
        self._recovery = Recovery(
            self.store, clock, mode, cooldown_s, redrive, self._operator, trail, self._spawn
        )

    def attach(
        self,
        *,
        spares: SparePool | None = None,
        validation: Validator | None = None,
        keep_spare_s: float | None = None,
        commands: CommandPath | None = None,
    ) -> None:
        """The engine's services that change the cluster through actions (the hot spares, validation, the
        commands to the agents): they must be attached before the executor starts, so that recovery can
        re-drive their actions."""
        if commands is not None:
            self.runtime.commands = gated(commands, COMMAND_VERBS, self.leader_gate.now)
        if spares is not None:
            self.runtime.spares = spares
        if validation is not None:
            self.runtime.validation = validation
        if keep_spare_s is not None:
            self.runtime.keep_spare_s = keep_spare_s

    @property
    def limits(self) -> BreakerLimits:
        return self._safety.limits

    @limits.setter
    def limits(self, limits: BreakerLimits) -> None:
        self._safety.limits = limits

    @property
    def pools(self) -> Pools:
        return self._safety.pools

    @pools.setter
    def pools(self, pools: Pools) -> None:
        self._safety.pools = pools

    async def __aenter__(self) -> ActionExecutor:
        if self._batcher is not None:
            self._batcher.start()
        if self.recover_at_start:
            self._recovery.start()
            await self.alerts.refire()
        return self

    async def take_over(self) -> None:
        """This engine was just elected over a shared store: what the previous leader left (its
        unfinished actions, the audit records and requeues a crash kept from following, the alerts it had
        firing) is now this one's to finish, as after a restart."""
        self._recovery.start()
        await self.alerts.refire()

    async def __aexit__(self, *exc: object) -> None:
        await self.drain_in_flight(timeout=10.0)
        if self._batcher is not None:
            await self._batcher.stop()
        with contextlib.suppress(StoreError):  # else left unfinished: driven again at the next start
            self.store.intents.write_unwritten()
        self.alerts.close()

    async def drain_in_flight(self, timeout: float) -> None:
        """Wait (bounded) for the decisions being executed."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    def submit(self, decision: Decision, received_at: float) -> asyncio.Future[str | None]:
        """Run ``decision``; the future is done once it is recorded (None) or could not be (why: its first
        intent, or an audit record of it before, failed on the store): see :meth:`deciding`."""
        recorded: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._deciding.add(recorded)
        recorded.add_done_callback(self._deciding.discard)

        def settle(why: str | None) -> None:
            if not recorded.done():
                recorded.set_result(why)

        task = asyncio.create_task(self._execute(decision, received_at, settle))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: settle(None))
        return recorded

    def catch_up(self) -> int:
        """Call once the store takes writes again: the finishes and audit records that could not be written
        are written, and the actions interrupted mid-way are driven again (how many). Never raises: when
        the store fails again, the rest waits for the next call."""
        try:
            return self._recovery.catch_up()
        except StoreError as exc:
            _log.error("store_catch_up_failed", error=str(exc), rate_limited=True)
            return 0

    def deciding(self) -> set[asyncio.Future[str | None]]:
        """The decisions submitted and not yet recorded: neither has their first action's intent been written
        (a crash after it is re-driven at the next start, the requeue after a drain included) nor have they
        run to the end (audited, or failed to be)."""
        return set(self._deciding)

    async def release(self, held_id: int, by: str) -> ActionResult:
        """An operator lets a held action go: it runs now, past the breaker (still de-duplicated)."""
        return await self.held.release(held_id, by)

    def discard(self, held_id: int, by: str) -> ActionResult:
        return self.held.discard(held_id, by)

    async def act(
        self,
        kind: str,
        node: str,
        params: Mapping[str, Any] | None = None,
        *,
        rule: str,
        note: str = "",
        mode: Mode | None = None,
        event_id: str | None = None,
    ) -> ActionResult:
        """Run one action that no rule decided (an operator's, or the engine's own: the hot spares,
        validation) through the pipeline: intent, mode (the engine's unless ``mode``), leadership, audit
        under ``rule`` with ``note`` before its detail. Counted by the breaker when disruptive, never held."""
        mode = mode or self.mode
        now = self._clock.now()
        action = PlannedAction(kind, node, dict(params or {}))
        attempt = Attempt(
            action=action,
            handler=handler_for(kind),
            mode=mode,
            rule=rule,
            event_id=event_id or f"{rule}-{kind}-{node}-{now:.6f}",
            now=now,
            # the mode goes with the intent: a re-drive after a crash runs in it, whatever the engine's
            params={**scalars(action.params), MODE: mode},
            check_safety=False,
            note=note,
        )
        return await self._operator.run(attempt)

    async def operator_resume(self, node: str, by: str) -> ActionResult:
        """An operator returns ``node`` to service (``watchd node resume``): carried out now, whatever the
        engine's mode (a person decided it), recorded as an intent and audited as rule ``operator``. The
        scheduler refuses a node watchd did not drain. Not de-duplicated by an earlier resume's cooldown (only
        by one in flight): the operator may resume again a node watchd drained again since."""
        self.store.intents.clear_cooldown(keys.action(RESUME.kind, node))
        event_id = f"operator-resume-{node}-{self._clock.now():.6f}"
        return await self.act(
            RESUME.kind, node, rule="operator", note=f"by {by}", mode="enforce", event_id=event_id
        )

    def effective_mode(self, decision: Decision | None) -> Mode:
        if self.mode == "dry-run" or (decision is not None and decision.mode == "dry-run"):
            return "dry-run"
        return "enforce"

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(
        self, decision: Decision, received_at: float, recorded: Callable[[str | None], None] | None = None
    ) -> None:
        async with self._slots:
            after_drain: Outcome | None = None  # of a drain earlier in this decision
            mode = self.effective_mode(decision)
            for i, action in enumerate(decision.actions):
                handler = handler_for(action.kind)
                attempt = Attempt(
                    action=action,
                    handler=handler,
                    mode=mode,
                    rule=decision.rule,
                    event_id=decision.event.id,
                    now=self._clock.now(),
                    params=intent_params(decision, i, scalars(action.params)),
                    decision=decision,
                    requeue_follows=any(handler_for(a.kind).follows_drain for a in decision.actions[i + 1 :]),
                    after_drain=after_drain,
                    on_recorded=None if recorded is None else lambda: recorded(None),
                    on_unrecorded=recorded,
                )
                result = await self._decided.run(attempt)
                if handler.takes_node_out:
                    after_drain = result.outcome
            self._metrics.decision_latency.observe(self._clock.monotonic() - received_at)
