"""The action executor: turns decisions into scheduler calls, alerts and webhooks, safely.

One small stage per concern, in this order for every action:
1. de-duplication per action and node within the cooldown (durable: a restart neither repeats nor forgets);
2. mode: the engine's, made stricter by the rule's (dry-run decides and records, touches nothing);
3. safety for disruptive actions: the rule's rate limit and the blast-radius breaker; beyond them the action
   is held for an operator, an alert fires, and everything else goes on;
4. execution: drains coalesced into scheduler rounds (DrainBatcher), requeues, resumes, alerts, webhooks;
5. the audit record, and the outcome fed back to the rules as a ``watchd_action`` event.

Every action is written to the store as an intent before the scheduler is touched and finished after, so a
``kill -9`` in between is re-driven once at the next start (drains and requeues are idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from watchd.actions.audit import AuditRecord, AuditSink
from watchd.actions.safety import BreakerLimits, Verdict, breaker_verdict, rate_verdict
from watchd.clock import Clock
from watchd.engine.metrics import EngineMetrics
from watchd.integrations.alerts import Alert, AlertSink
from watchd.integrations.base import RequeueResult, Scheduler, SchedulerError
from watchd.integrations.webhook.sender import WebhookSender
from watchd.logs import get_logger
from watchd.model.events import Event, stable_id
from watchd.model.nodes import DrainResult, describe, drain_reason, drained_by_watchd, plan_drain
from watchd.rules import DISRUPTIVE, Decision, PlannedAction
from watchd.store.connection import StoreError
from watchd.store.database import Store
from watchd.store.held import HeldAction
from watchd.store.intents import Intent

Mode = Literal["dry-run", "enforce"]

_log = get_logger("watchd.executor")
_TOOK_OUT = ("drained", "already_drained")  # the node is out of service, by watchd
_DRAINED_BY_US = (*_TOOK_OUT, "dry_run")
_BREAKER_KEY = "breaker/"  # + pool: the key of a pool's breaker alert
_REQUEUE_FOLLOWS = "requeue_follows"  # in a drain's intent: its decision requeues after it
_RECHECK_S = 10.0  # seconds between reads of a de-duplicated drain's node state
BREAKER_ALERT = "WatchdBlastRadiusBreakerOpen"


@dataclass
class Pools:
    """Which pools (Slurm partitions) each node belongs to, and their sizes; refreshed by the engine."""

    of_node: dict[str, list[str]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_members(cls, members: Mapping[str, list[str]]) -> Pools:
        of_node: dict[str, list[str]] = {}
        for pool, nodes in members.items():
            for node in nodes:
                of_node.setdefault(node, []).append(pool)
        return cls(of_node, {pool: len(nodes) for pool, nodes in members.items()})

    def pools(self, node: str) -> list[str]:
        return self.of_node.get(node) or ["all"]


Gate = Callable[[], Verdict]


class SafetyGate:
    """A safety check to run at the last moment; remembers its verdict (the pool that held the action)."""

    def __init__(self, check: Gate) -> None:
        self._check = check
        self.verdict: Verdict | None = None

    def __call__(self) -> Verdict:
        self.verdict = self._check()
        return self.verdict


def held_pool(gate: SafetyGate | None) -> str:
    return gate.verdict.pool if gate is not None and gate.verdict is not None else ""


class DrainBatcher:
    """Coalesces drain requests that arrive while a scheduler round is in flight into the next round.

    A lone failure is drained at once; a burst of N failures costs two rounds, not N. Each round reads the
    nodes' states once, settles those that need no change (never touched), then asks each remaining
    request's gate (the safety breaker) one after another: rounds are serial, so the breaker counts exactly,
    and a node someone else already drained neither counts nor gets held."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._pending: dict[str, _DrainRequest] = {}
        self._inflight: dict[str, _DrainRequest] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="drain-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for request in [*self._inflight.values(), *self._pending.values()]:
            for fut in request.futures:
                if not fut.done():
                    fut.set_result(DrainResult("", "failed", "engine shutting down"))

    async def drain(
        self, node: str, reason: str, gate: Gate | None = None, replace: bool = False
    ) -> DrainResult:
        """``replace``: when watchd has already drained the node for another reason, this reason replaces
        that one (not a new disruption: no gate). Otherwise a node already drained by watchd is left as is."""
        fut: asyncio.Future[DrainResult] = asyncio.get_running_loop().create_future()
        pending = self._pending.get(node)
        if pending is None:
            self._pending[node] = _DrainRequest(reason, gate, replace, [fut])
        else:
            pending.futures.append(fut)
            if replace:  # coalesced with a plain drain: the replacing reason is the one that stays
                pending.reason, pending.replace = reason, True
        self._wakeup.set()
        return await fut

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            batch, self._pending = self._pending, {}
            if not batch:
                continue
            self._inflight = batch
            reasons = {node: r.reason for node, r in batch.items()}
            try:
                results = await self._round(
                    reasons, {n: r.gate for n, r in batch.items()}, {n for n, r in batch.items() if r.replace}
                )
            except SchedulerError as exc:
                results = {n: DrainResult(n, "failed", str(exc)) for n in reasons}
            except Exception as exc:  # an adapter bug must not stop every later drain
                _log.exception("drain_round_crashed", nodes=len(reasons))
                results = {n: DrainResult(n, "failed", f"internal error: {exc!r}") for n in reasons}
            self._inflight = {}
            for node, request in batch.items():
                result = results.get(node) or DrainResult(node, "failed", "scheduler returned no result")
                for fut in request.futures:
                    if not fut.done():
                        fut.set_result(result)

    async def _round(
        self, reasons: dict[str, str], gates: Mapping[str, Gate | None], replace: set[str]
    ) -> dict[str, DrainResult]:
        states = await self._scheduler.node_states(list(reasons))
        # a node to re-drain with a replacing reason is planned as if not drained: every adapter then sets
        # the new reason (scontrol update on a drained node changes its reason) through its usual path
        replaced: dict[str, str] = {}
        planned = dict(states)
        for node in replace:
            st = states.get(node)
            if st is not None and drained_by_watchd(st) and st.reason != drain_reason(reasons[node]):
                replaced[node] = st.reason or ""
                planned[node] = dataclasses.replace(st, flags=st.flags - {"DRAIN"})
        settled, groups = plan_drain(reasons, planned)
        results: dict[str, DrainResult] = dict(settled)
        allowed: dict[str, str] = {}
        for node in (n for names in groups.values() for n in names):
            gate = gates.get(node) if node not in replaced else None  # no new disruption: not counted
            verdict = gate() if gate is not None else Verdict(True)
            if verdict.allowed:
                allowed[node] = reasons[node]
            else:
                results[node] = DrainResult(node, "held", verdict.reason)
        if allowed:
            results.update(await self._scheduler.drain(allowed, planned))
        for node, was in replaced.items():
            if results[node].outcome == "drained":
                results[node] = DrainResult(node, "drained", f"{results[node].detail} (replacing {was!r})")
        return results


@dataclass(slots=True)
class _DrainRequest:
    reason: str
    gate: Gate | None
    replace: bool
    futures: list[asyncio.Future[DrainResult]]


@dataclass(frozen=True, slots=True)
class Outcome:
    outcome: str
    detail: str = ""


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
    ) -> None:
        self.mode: Mode = mode
        self._scheduler = scheduler
        self._clock = clock
        self._metrics = metrics
        self._audit = audit
        self.store = store or Store.open(":memory:")
        self._alerts = alerts
        self._webhooks = webhooks
        self.limits = limits or BreakerLimits()
        self.pools = pools or Pools()
        self._cooldown = cooldown_s
        self._slots = asyncio.Semaphore(max_concurrent)
        self._batcher = DrainBatcher(scheduler) if scheduler is not None else None
        self._tasks: set[asyncio.Task[None]] = set()
        self._feedback = feedback
        self._generator_url = generator_url
        self._alert_expiry: dict[str, asyncio.TimerHandle] = {}
        self._rechecked: dict[str, float] = {}  # node -> when its drained state was last read (dedup)

    async def __aenter__(self) -> ActionExecutor:
        if self._batcher is not None:
            self._batcher.start()
        self._redrive_unfinished()
        await self.refire_alerts()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drain_in_flight(timeout=10.0)
        if self._batcher is not None:
            await self._batcher.stop()
        for handle in self._alert_expiry.values():
            handle.cancel()

    async def drain_in_flight(self, timeout: float) -> None:
        """Wait (bounded) for the decisions being executed."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    def submit(self, decision: Decision, received_at: float) -> None:
        self._spawn(self._execute(decision, received_at))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------------------------------ decisions

    def effective_mode(self, decision: Decision | None) -> Mode:
        if self.mode == "dry-run" or (decision is not None and decision.mode == "dry-run"):
            return "dry-run"
        return "enforce"

    async def _execute(self, decision: Decision, received_at: float) -> None:
        async with self._slots:
            drain_outcome: str | None = None  # of a drain earlier in this decision
            for i, action in enumerate(decision.actions):
                start = self._clock.monotonic()
                requeue_follows = any(a.kind == "requeue" for a in decision.actions[i + 1 :])
                try:
                    result = await self._one(decision, action, drain_outcome, requeue_follows)
                except Exception as exc:  # a bug in one action must not lose the audit of the others
                    _log.exception("action_crashed", action=action.kind, node=action.node)
                    result = Outcome("failed", f"internal error: {exc!r}")
                if action.kind == "drain":
                    drain_outcome = result.outcome
                try:
                    self._record(decision, action, result, self._clock.monotonic() - start)
                except Exception:  # the store is full or locked: the actions that follow still run
                    _log.exception("audit_failed", action=action.kind, node=action.node)
            self._metrics.decision_latency.observe(self._clock.monotonic() - received_at)

    def _record(self, decision: Decision, action: PlannedAction, result: Outcome, elapsed: float) -> None:
        mode = self.effective_mode(decision)
        self._metrics.actions.labels(action.kind, mode, result.outcome).inc()
        entry = AuditRecord(
            time=self._clock.now(),
            rule=decision.rule,
            event_id=decision.event.id,
            node=action.node,
            action=action.kind,
            mode=mode,
            outcome=result.outcome,
            detail=result.detail,
            duration_s=round(elapsed, 6),
            params=_scalars(action.params),
        )
        self._audit_entry(entry)
        if self._feedback is not None and decision.event.kind != "watchd_action":
            self._feedback(
                Event(
                    id=stable_id("action", decision.event.id, decision.rule, action.kind, action.node),
                    node=action.node,
                    source="watchd",
                    kind="watchd_action",
                    time=self._clock.now(),
                    attrs={
                        "action": action.kind,
                        "outcome": result.outcome,
                        "rule": decision.rule,
                        "mode": mode,
                    },
                )
            )

    async def _one(
        self, decision: Decision, action: PlannedAction, drain_outcome: str | None, requeue_follows: bool
    ) -> Outcome:
        kind = action.kind
        if kind == "log":
            return Outcome("logged", str(action.params.get("message", "")))
        if kind == "alert":
            return await self._alert(decision, action)
        if kind == "webhook":
            return await self._webhook(decision, action)
        if kind == "requeue" and drain_outcome == "deduplicated":
            return Outcome("deduplicated", "the drain it follows was already decided within the cooldown")
        if kind == "requeue" and drain_outcome not in (None, *_DRAINED_BY_US):
            return Outcome("skipped", "the node was not drained by watchd, so its jobs are left alone")
        return await self._scheduled(
            decision,
            action,
            check_safety=not (kind == "requeue" and drain_outcome),
            requeue_follows=requeue_follows,
        )

    # ------------------------------------------------------------------------------------------ scheduler

    async def _scheduled(
        self,
        decision: Decision | None,
        action: PlannedAction,
        *,
        check_safety: bool,
        held_id: int = 0,
        requeue_follows: bool = False,
        mode: Mode | None = None,
        origin: tuple[str, str] | None = None,
    ) -> Outcome:
        """``origin``: the (rule, event id) an action without a decision comes from (default: an operator's
        release of ``held_id``)."""
        # a drain that replaces watchd's reason has its own key: the drain it follows must not swallow it
        replacing = action.kind == "drain" and bool(action.params.get("replace_reason"))
        key = f"drain-reason:{action.node}" if replacing else f"{action.kind}:{action.node}"
        if action.kind == "requeue" and (job := _requeue_job(action)) is not None:
            key = f"requeue:{action.node}:{job}"  # one job's requeue does not stand for the node's others
        now = self._clock.now()
        rule, event_id = origin or ("operator", f"held-{held_id}")
        if decision is not None:
            rule, event_id = decision.rule, decision.event.id
        params = _scalars(action.params)
        if action.kind == "drain" and requeue_follows and _plain_requeue_in(decision):
            params = {**params, _REQUEUE_FOLLOWS: True}  # a restart must still requeue after this drain
        mode = mode or self.effective_mode(decision)

        def begin() -> bool:
            return self.store.intents.begin(
                key,
                action.kind,
                action.node,
                rule,
                event_id,
                params,
                now,
                cooldown_until=now + self._cooldown,
            )

        if not begin() and not (
            action.kind == "drain"
            and mode == "enforce"
            and await self._drain_undone(action.node, now)
            and begin()
        ):
            return Outcome(
                "deduplicated", f"{action.kind} of {action.node} already decided within the cooldown"
            )
        gate: SafetyGate | None = None
        if action.kind in DISRUPTIVE:
            # Every disruptive action is counted in the breaker window; only decisions are also checked
            # (an operator's release, a follow-up requeue and a re-driven action are counted, not held).
            gate = self._gate(
                rule, decision.rate_limit if decision else None, action, mode, now, check_safety
            )
        result = await self._gated(action, gate, mode)
        if result.outcome == "held":
            result = self._hold(
                decision, action, params, result.detail, held_pool(gate), requeue_follows, now
            )
        # A failed drain stays counted: whether scontrol applied it is unknown, and the safe error is to
        # count one drain too many, never one too few.
        failed = result.outcome in ("failed", "no_scheduler", "held")
        self.store.intents.finish(
            key, result.outcome, result.detail, self._clock.now(), cooldown_until=now if failed else None
        )
        return result

    async def _drain_undone(self, node: str, now: float) -> bool:
        """Whether watchd's last drain of ``node`` (finished, within the cooldown) has been undone since: an
        operator or the scheduler returned the node to service. Then a new fault drains it again (and may
        requeue again) rather than being de-duplicated. The node's state is read at most every
        ``_RECHECK_S`` (a flood of events for a drained node must not become a flood of state reads)."""
        if self._scheduler is None or now - self._rechecked.get(node, -_RECHECK_S) < _RECHECK_S:
            return False
        last = self.store.intents.under(f"drain:{node}", limit=1)
        if not last or last[0].finished_at is None or last[0].outcome not in _TOOK_OUT:
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
        self.store.intents.clear_cooldown(f"drain:{node}")
        self.store.intents.clear_cooldown(f"requeue:{node}")
        return True

    async def _gated(self, action: PlannedAction, gate: SafetyGate | None, mode: Mode) -> Outcome:
        """Carry out one action past its safety gate; ``held`` when the gate says no."""
        if mode == "dry-run":
            verdict = gate() if gate is not None else Verdict(True)
            detail = _describe(action)
            if not verdict.allowed:  # dry-run holds nothing and pages nobody: it says what would happen
                detail += f"; the safety limits would hold it: {verdict.reason}"
            return Outcome("dry_run", detail)
        if action.kind == "drain":
            # The gate runs inside the serial drain round, once the node is known to be in service.
            return await self._call_scheduler(action, gate)
        verdict = gate() if gate is not None else Verdict(True)
        return Outcome("held", verdict.reason) if not verdict.allowed else await self._call_scheduler(action)

    def _hold(
        self,
        decision: Decision | None,
        action: PlannedAction,
        params: dict[str, Any],
        reason: str,
        pool: str,
        requeue_follows: bool,
        now: float,
    ) -> Outcome:
        already = next(
            (h for h in self.store.held.list() if h.kind == action.kind and h.node == action.node), None
        )
        if already is not None:  # a repeated event (a condition re-reported) adds no second held row
            return Outcome("held", f"already held as #{already.id}: {reason}")
        if requeue_follows:
            params = {**params, "requeue_after_release": True}
        held = self.store.held.hold(
            HeldAction(
                rule=decision.rule if decision is not None else "operator",
                kind=action.kind,
                node=action.node,
                pool=pool,
                params=params,
                event=decision.event.to_wire() if decision is not None else {},
                reason=reason,
                held_at=now,
            )
        )
        self._spawn(self._breaker_alert(reason, action, pool))
        return Outcome("held", f"held as #{held}: {reason}")

    def _gate(
        self, rule: str, rate_limit: Any, action: PlannedAction, mode: Mode, now: float, check: bool
    ) -> SafetyGate:
        """The safety check of one disruptive action, run at the last moment; when it allows (or when
        ``check`` is False), the disruption is counted at once, so concurrent actions see each other."""

        def decide() -> Verdict:
            verdict = self._safety(rule, rate_limit, action, mode, now) if check else Verdict(True)
            if verdict.allowed:
                self._count_disruption(rule, action.node, mode, now)
            return verdict

        return SafetyGate(decide)

    def _safety(self, rule: str, limit: Any, action: PlannedAction, mode: Mode, now: float) -> Verdict:
        prefix = "dry-run:" if mode == "dry-run" else ""
        if limit is not None:
            times = [t for _, t in self.store.breaker.since(f"{prefix}rule:{rule}", now - limit.per)]
            verdict = rate_verdict(rule, times, now, limit.max, limit.per)
            if not verdict.allowed:
                return Verdict(False, verdict.reason, f"rule:{rule}")
        if action.kind != "drain":
            return Verdict(True)
        pools = self.pools.pools(action.node)
        since = now - self.limits.window_s
        recent = {p: [n for n, _ in self.store.breaker.since(f"{prefix}{p}", since)] for p in pools}
        return breaker_verdict(action.node, pools, self.pools.sizes, recent, self.limits)

    def _count_disruption(self, rule: str, node: str, mode: Mode, now: float) -> None:
        prefix = "dry-run:" if mode == "dry-run" else ""
        for pool in (f"rule:{rule}", *self.pools.pools(node)):
            self.store.breaker.record(f"{prefix}{pool}", node, now)

    async def _call_scheduler(self, action: PlannedAction, gate: Gate | None = None) -> Outcome:
        if self._scheduler is None or self._batcher is None:
            return Outcome("no_scheduler", "no scheduler adapter is enabled")
        start = self._clock.monotonic()
        try:
            if action.kind == "drain":
                reason = str(action.params.get("reason", ""))
                replace = bool(action.params.get("replace_reason"))
                result = await self._batcher.drain(action.node, reason, gate, replace)
                out = Outcome(result.outcome, result.detail)
            elif action.kind == "requeue":
                job = _requeue_job(action)
                if job == _UNKNOWN_JOB:
                    out = Outcome("skipped", "the requeue names a job, and the event does not say which")
                else:
                    out = _requeue_outcome(await self._scheduler.requeue_jobs_on(action.node, job))
            else:
                resumed = await self._scheduler.resume(action.node)
                out = Outcome(resumed.outcome, resumed.detail)
        except SchedulerError as exc:
            out = Outcome("failed", str(exc))
        self._metrics.action_duration.labels(action.kind).observe(self._clock.monotonic() - start)
        return out

    def _redrive_unfinished(self) -> None:
        """Actions decided before a crash but never finished: drive each once more (they are idempotent).
        Then the requeues a crash kept from following their finished drain."""
        self._requeue_missed()
        for intent in self.store.intents.unfinished():
            _log.warning(
                "redriving_unfinished_action", key=intent.key, rule=intent.rule, decided_at=intent.decided_at
            )
            self._spawn(self._redrive(intent))

    def _requeue_missed(self) -> None:
        """A drain that took its node out within the cooldown, decided with a requeue after it, and no
        requeue of the node decided since: the crash came between the two. Requeue now (de-duplicated)."""
        for drain in self.store.intents.since("drain", self._clock.now() - self._cooldown):
            if not drain.params.get(_REQUEUE_FOLLOWS) or drain.outcome not in _TOOK_OUT:
                continue
            requeues = self.store.intents.under(f"requeue:{drain.node}", limit=1)
            if requeues and requeues[-1].decided_at >= drain.decided_at:
                continue
            _log.warning("requeue_after_restart", node=drain.node, rule=drain.rule)
            self._spawn(self._requeue_after(drain))

    async def _requeue_after(self, drain: Intent) -> None:
        requeue = PlannedAction(kind="requeue", node=drain.node, params={})
        result = await self._scheduled(None, requeue, check_safety=False, origin=(drain.rule, drain.event_id))
        self._audit_entry(
            AuditRecord(
                time=self._clock.now(),
                rule=drain.rule,
                event_id=drain.event_id,
                node=drain.node,
                action="requeue",
                mode=self.mode,
                outcome=result.outcome,
                detail=f"after a restart, the requeue that follows the drain: {result.detail}",
            )
        )

    async def _redrive(self, intent: Intent) -> None:
        """Drive an interrupted action once more, through the same safety limits as a new one (and the
        requeue its decision had after it, for a drain)."""
        key, rule = intent.key, intent.rule
        action = PlannedAction(kind=intent.kind, node=intent.node, params=intent.params)  # type: ignore[arg-type]
        now = self._clock.now()
        gate = (
            self._gate(rule, None, action, self.mode, now, check=True) if action.kind in DISRUPTIVE else None
        )
        result = await self._gated(action, gate, self.mode)
        if result.outcome == "held":
            result = self._hold(
                None, action, _scalars(action.params), result.detail, held_pool(gate), False, now
            )
        failed = result.outcome in ("failed", "no_scheduler", "held")
        detail = f"re-driven after a restart: {result.detail}"
        self.store.intents.finish(
            key, result.outcome, detail, self._clock.now(), cooldown_until=now if failed else None
        )
        self._audit_entry(
            AuditRecord(
                time=self._clock.now(),
                rule=rule,
                event_id=key,
                node=action.node,
                action=action.kind,
                mode=self.mode,
                outcome=result.outcome,
                detail=detail,
                params=_scalars(action.params),
            )
        )
        if intent.params.get(_REQUEUE_FOLLOWS) and result.outcome in _TOOK_OUT:
            await self._requeue_after(intent)

    # ------------------------------------------------------------------------------------------ held actions

    async def release(self, held_id: int, by: str) -> Outcome:
        """An operator lets a held action go: it runs now, past the breaker (still de-duplicated)."""
        held = self.store.held.release(held_id, by, self._clock.now())
        if held is None:
            return Outcome("not_held", f"no held action #{held_id}")
        params = {k: v for k, v in held.params.items() if k != "requeue_after_release"}
        action = PlannedAction(kind=held.kind, node=held.node, params=params)  # type: ignore[arg-type]
        result = await self._scheduled(None, action, check_safety=False, held_id=held_id)
        if held.params.get("requeue_after_release") and result.outcome in _DRAINED_BY_US:
            requeue = PlannedAction(kind="requeue", node=held.node, params={})
            requeued = await self._scheduled(None, requeue, check_safety=False, held_id=held_id)
            result = Outcome(
                result.outcome, f"{result.detail}; then requeue: {requeued.outcome} {requeued.detail}"
            )
        self._resolved(held, result.outcome, f"released by {by}: {result.detail}")
        return result

    def discard(self, held_id: int, by: str) -> Outcome:
        held = self.store.held.discard(held_id, by, self._clock.now())
        if held is None:
            return Outcome("not_held", f"no held action #{held_id}")
        result = Outcome("discarded", f"{held.kind} of {held.node} discarded by {by}")
        self._resolved(held, result.outcome, result.detail)
        return result

    def _resolved(self, held: HeldAction, outcome: str, detail: str) -> None:
        """An operator's release or discard: audited, and the pool's breaker alert ends once none is held."""
        self._breaker_cleared(held.pool)
        self._audit_entry(
            AuditRecord(
                time=self._clock.now(),
                rule=held.rule,
                event_id=f"held-{held.id}",
                node=held.node,
                action=held.kind,
                mode=self.mode,
                outcome=outcome,
                detail=detail,
                params=held.params,
            )
        )

    def _audit_entry(self, entry: AuditRecord) -> None:
        """Every audit record goes to the durable trail (the status API and the CLI read it after a restart)
        and to the in-memory one (the log line, the tests)."""
        self._audit.record(entry)
        self.store.audit.append(entry)

    # ------------------------------------------------------------------------------------------ alerts

    async def _alert(self, decision: Decision, action: PlannedAction) -> Outcome:
        if self._alerts is None:
            return Outcome("no_alertmanager", "no Alertmanager is configured")
        params = action.params
        labels = {
            "alertname": decision.rule,
            "severity": decision.severity,
            "node": action.node,
            **dict(decision.labels),
            **dict(params.get("labels") or {}),
        }
        alert = Alert(
            labels=labels,
            annotations={
                "summary": str(params.get("summary", "")),
                "description": str(params.get("description", "")),
            },
            generator_url=f"{self._generator_url}/api/v1/status?node={action.node}"
            if self._generator_url
            else "",
        )
        # Keyed by the group and the label set, as Alertmanager tells alerts apart: a second GPU's Xid on
        # the node (another pci_bus_id label) is a second page, not a replacement that resolves the first.
        group = "/".join(f"{v}" for v in decision.group.values())
        key = f"{decision.rule}/{group}/" + ",".join(f"{k}={v}" for k, v in sorted(alert.labels.items()))
        await self._fire(key, alert, float(params.get("resolve_after") or 3600.0))
        return Outcome("fired", f"{alert.name} {decision.rule}/{group}")

    async def _fire(self, key: str, alert: Alert, resolve_after: float) -> None:
        """Fire (or refresh) ``key`` and record it, so that a restarted engine fires it again."""
        assert self._alerts is not None
        await self._alerts.fire(key, alert)
        record = {
            "labels": alert.labels,
            "annotations": alert.annotations,
            "generator_url": alert.generator_url,
        }
        try:
            self.store.alerts.set(key, record, self._clock.now() + resolve_after)
        except StoreError:
            _log.exception("firing_alert_not_recorded", key=key)
        pool = _breaker_pool(key)
        self._expire_alert(key, resolve_after, None if pool is None else lambda: self._holding(pool))

    async def refire_alerts(self) -> None:
        """At start: the alerts firing when the engine stopped fire again with what was left of their time
        (and a breaker alert for as long as its pool has actions held); those whose time ran out meanwhile
        are forgotten (Alertmanager ends them itself when their endsAt passes)."""
        if self._alerts is None:
            return
        now = self._clock.now()
        for key, record, resolve_at in self.store.alerts.list():
            pool = _breaker_pool(key)
            if resolve_at <= now and not (pool is not None and self._holding(pool)):
                self.store.alerts.clear(key)
                continue
            try:
                alert = Alert(
                    record["labels"], record.get("annotations") or {}, record.get("generator_url", "")
                )
            except (KeyError, TypeError, ValueError) as exc:
                _log.warning("firing_alert_unreadable", key=key, error=str(exc))
                self.store.alerts.clear(key)
                continue
            await self._fire(key, alert, max(resolve_at - now, 1.0))

    def _expire_alert(self, key: str, after: float, holds: Callable[[], bool] | None = None) -> None:
        """Resolve ``key`` ``after`` seconds from now; while ``holds()`` says the condition is still there,
        look again every ``min(after, 60)`` seconds instead."""
        old = self._alert_expiry.pop(key, None)
        if old is not None:
            old.cancel()
        alerts = self._alerts
        if alerts is None:
            return
        loop = asyncio.get_running_loop()

        def resolve() -> None:
            if holds is not None and holds():
                self._alert_expiry[key] = loop.call_later(min(after, 60.0), resolve)
                return
            self._alert_expiry.pop(key, None)
            with contextlib.suppress(StoreError):
                self.store.alerts.clear(key)
            self._spawn(alerts.resolve(key))

        self._alert_expiry[key] = loop.call_later(after, resolve)

    def _holding(self, pool: str) -> bool:
        return any(h.pool == pool for h in self.store.held.list())

    def _breaker_cleared(self, pool: str) -> None:
        """After a release or discard: the breaker alert of a pool with nothing held left resolves now."""
        key = _BREAKER_KEY + pool
        if key in self._alert_expiry and not self._holding(pool):
            self._expire_alert(key, 0.0)

    async def _breaker_alert(self, reason: str, action: PlannedAction, pool: str) -> None:
        if self._alerts is None:
            return
        alert = Alert(
            labels={"alertname": BREAKER_ALERT, "severity": "critical", "pool": pool},
            annotations={
                "summary": f"watchd is holding disruptive actions ({pool})",
                "description": f"{reason}. Held: {action.kind} of {action.node}. "
                "Review with `watchd actions list`, then release or discard.",
            },
        )
        # it pages while anything of the pool is held, not only while the window is full
        await self._fire(_BREAKER_KEY + pool, alert, self.limits.window_s)

    async def _webhook(self, decision: Decision, action: PlannedAction) -> Outcome:
        if self._webhooks is None:
            return Outcome("failed", "webhooks are not available")
        params = action.params
        payload = {
            "rule": decision.rule,
            "severity": decision.severity,
            "node": action.node,
            "mode": self.effective_mode(decision),
            "labels": dict(decision.labels),
            "group": dict(decision.group),
            "event": decision.event.to_wire(),
        }
        result = await self._webhooks.post(
            str(params["url"]),
            payload,
            headers=params.get("headers") or None,
            max_attempts=int(params.get("retries", 3)) + 1,
            timeout=float(params.get("timeout_s", 5)),
        )
        return Outcome(
            result.outcome, f"HTTP {result.status} after {result.attempts} attempt(s) {result.error}".strip()
        )


def _scalars(params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters as they go to the audit log and the store: JSON values."""
    return json.loads(json.dumps(dict(params), default=str))  # type: ignore[no-any-return]


def _describe(action: PlannedAction) -> str:
    if action.kind == "drain":
        return f"would drain {action.node}: {drain_reason(str(action.params.get('reason', '')))}"
    if action.kind == "resume":
        return f"would resume {action.node} (if watchd drained it)"
    job = _requeue_job(action)
    return (
        f"would requeue the jobs on {action.node}"
        if job is None
        else f"would requeue job {job} on {action.node}"
    )


def _breaker_pool(key: str) -> str | None:
    """The pool of a breaker alert's key; None for any other alert."""
    return key.removeprefix(_BREAKER_KEY) if key.startswith(_BREAKER_KEY) else None


def _plain_requeue_in(decision: Decision | None) -> bool:
    """Whether the decision requeues every job on the node (not one named job)."""
    return decision is not None and any(
        a.kind == "requeue" and _requeue_job(a) is None for a in decision.actions
    )


_UNKNOWN_JOB = "?"  # what a template renders for a field the event does not carry


def _requeue_job(action: PlannedAction) -> str | None:
    """The one job a requeue is limited to (``job`` param), or None for every job on the node."""
    job = str(action.params.get("job") or "").strip()
    return job or None


def _requeue_outcome(result: RequeueResult) -> Outcome:
    parts = []
    if result.requeued:
        parts.append("requeued " + ",".join(result.requeued))
    if result.not_requeueable:
        parts.append("not requeueable " + ",".join(result.not_requeueable))
    if result.failed:
        parts.append("failed " + ", ".join(f"{j}: {e}" for j, e in result.failed.items()))
    if result.failed:
        outcome = "partial" if result.requeued else "failed"
    else:
        outcome = "requeued" if result.requeued else "nothing_to_requeue"
    return Outcome(outcome, "; ".join(parts) or "no jobs on the node")
