"""The action executor: turns decisions into scheduler calls, safely.

Stages, each small: dry-run (decide and record, touch nothing), de-duplication per action and node within a
cooldown, coalescing of concurrent drains into one scheduler round, and the audit record. A requeue that
follows a drain in the same rule runs only when that drain took the node out of service: a node drained
by someone else is never touched, its jobs included.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Literal

from watchd.adapters.base import DrainResult, RequeueResult, Scheduler, SchedulerError, drain_reason
from watchd.clock import Clock
from watchd.engine.audit import AuditRecord, AuditSink
from watchd.engine.metrics import EngineMetrics
from watchd.logs import get_logger
from watchd.rules import Decision, PlannedAction

Mode = Literal["dry-run", "enforce"]

_log = get_logger("watchd.executor")
_DRAINED_BY_US = ("drained", "already_drained", "dry_run")


class DrainBatcher:
    """Coalesces drain requests that arrive while a scheduler round is in flight into the next round.

    A lone failure is drained at once; a burst of N failures costs two rounds, not N."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._pending: dict[str, tuple[str, list[asyncio.Future[DrainResult]]]] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="drain-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for _, futures in self._pending.values():
            for fut in futures:
                if not fut.done():
                    fut.set_result(DrainResult("", "failed", "engine shutting down"))

    async def drain(self, node: str, reason: str) -> DrainResult:
        fut: asyncio.Future[DrainResult] = asyncio.get_running_loop().create_future()
        if node in self._pending:
            self._pending[node][1].append(fut)
        else:
            self._pending[node] = (reason, [fut])
        self._wakeup.set()
        return await fut

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            batch, self._pending = self._pending, {}
            if not batch:
                continue
            reasons = {node: reason for node, (reason, _) in batch.items()}
            try:
                results: Mapping[str, DrainResult] = await self._scheduler.drain(reasons)
            except SchedulerError as exc:
                results = {n: DrainResult(n, "failed", str(exc)) for n in reasons}
            except Exception as exc:  # an adapter bug must not stop every later drain
                _log.exception("drain_round_crashed", nodes=len(reasons))
                results = {n: DrainResult(n, "failed", f"internal error: {exc!r}") for n in reasons}
            for node, (_, futures) in batch.items():
                result = results.get(node) or DrainResult(node, "failed", "scheduler returned no result")
                for fut in futures:
                    if not fut.done():
                        fut.set_result(result)


class ActionExecutor:
    def __init__(
        self,
        scheduler: Scheduler | None,
        mode: Mode,
        clock: Clock,
        metrics: EngineMetrics,
        audit: AuditSink,
        cooldown_s: float = 600.0,
        max_concurrent: int = 1024,
    ) -> None:
        self.mode: Mode = mode
        self._scheduler = scheduler
        self._clock = clock
        self._metrics = metrics
        self._audit = audit
        self._cooldown = cooldown_s
        self._last: dict[tuple[str, str], float] = {}
        self._slots = asyncio.Semaphore(max_concurrent)
        self._batcher = DrainBatcher(scheduler) if scheduler is not None else None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ActionExecutor:
        if self._batcher is not None:
            self._batcher.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drain_in_flight(timeout=10.0)
        if self._batcher is not None:
            await self._batcher.stop()

    async def drain_in_flight(self, timeout: float) -> None:
        """Wait (bounded) for the decisions being executed."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    def submit(self, decision: Decision, received_at: float) -> None:
        task = asyncio.create_task(self._execute(decision, received_at))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, decision: Decision, received_at: float) -> None:
        async with self._slots:
            drain_outcome: str | None = None  # of a drain earlier in this decision
            for action in decision.actions:
                start = self._clock.monotonic()
                outcome, detail = await self._one(action, drain_outcome)
                if action.kind == "drain":
                    drain_outcome = outcome
                elapsed = self._clock.monotonic() - start
                self._metrics.actions.labels(action.kind, self.mode, outcome).inc()
                self._audit.record(
                    AuditRecord(
                        time=self._clock.now(),
                        rule=decision.rule,
                        event_id=decision.event.id,
                        node=action.node,
                        action=action.kind,
                        mode=self.mode,
                        outcome=outcome,
                        detail=detail,
                        duration_s=round(elapsed, 6),
                        params=dict(action.params),
                    )
                )
            self._metrics.decision_latency.observe(self._clock.monotonic() - received_at)

    def _first_within_cooldown(self, action: PlannedAction) -> bool:
        key = (action.kind, action.node)
        now = self._clock.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._cooldown:
            return False
        self._last[key] = now
        return True

    def _forget(self, action: PlannedAction) -> None:
        self._last.pop((action.kind, action.node), None)

    async def _one(self, action: PlannedAction, drain_outcome: str | None) -> tuple[str, str]:
        if action.kind == "log":
            return "logged", str(action.params.get("message", ""))
        if action.kind == "requeue" and drain_outcome == "deduplicated":
            return "deduplicated", "the drain it follows was already decided within the cooldown"
        if action.kind == "requeue" and drain_outcome not in (None, *_DRAINED_BY_US):
            return "skipped", "the node was not drained by watchd, so its jobs are left alone"
        if not self._first_within_cooldown(action):
            return "deduplicated", f"{action.kind} of {action.node} already decided within the cooldown"
        if self.mode == "dry-run":
            return "dry_run", _describe(action)
        if self._scheduler is None or self._batcher is None:
            self._forget(action)
            return "no_scheduler", "no scheduler adapter is enabled"
        start = self._clock.monotonic()
        outcome: str
        try:
            if action.kind == "drain":
                result = await self._batcher.drain(action.node, str(action.params.get("reason", "")))
                outcome, detail = result.outcome, result.detail
            else:
                outcome, detail = _requeue_outcome(await self._scheduler.requeue_jobs_on(action.node))
        except SchedulerError as exc:
            outcome, detail = "failed", str(exc)
        except Exception as exc:
            _log.exception("action_crashed", action=action.kind, node=action.node)
            outcome, detail = "failed", f"internal error: {exc!r}"
        self._metrics.action_duration.labels(action.kind).observe(self._clock.monotonic() - start)
        if outcome == "failed":
            self._forget(action)  # let the next event retry
        return outcome, detail


def _describe(action: PlannedAction) -> str:
    if action.kind == "drain":
        return f"would drain {action.node}: {drain_reason(str(action.params.get('reason', '')))}"
    return f"would requeue the jobs on {action.node}"


def _requeue_outcome(result: RequeueResult) -> tuple[str, str]:
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
    return outcome, "; ".join(parts) or "no jobs on the node"
