"""Drains coalesced into scheduler rounds: a burst of N failures costs two rounds, not N."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from watchd.actions.outcome import ActionResult, Outcome
from watchd.actions.safety import Gate, Verdict
from watchd.integrations.base import Scheduler, SchedulerError
from watchd.logs import get_logger
from watchd.model.nodes import DrainResult, drain_reason, drained_by_watchd, plan_drain

_log = get_logger("watchd.executor")


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
                    fut.set_result(ActionResult(Outcome.FAILED, "engine shutting down"))

    async def drain(
        self, node: str, reason: str, gate: Gate | None = None, replace: bool = False
    ) -> ActionResult:
        """``replace``: when watchd has already drained the node for another reason, this reason replaces
        that one (not a new disruption: no gate). Otherwise a node already drained by watchd is left as is."""
        fut: asyncio.Future[ActionResult] = asyncio.get_running_loop().create_future()
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
                results = {n: ActionResult(Outcome.FAILED, str(exc)) for n in reasons}
            except Exception as exc:  # an adapter bug must not stop every later drain
                _log.exception("drain_round_crashed", nodes=len(reasons))
                results = {n: ActionResult(Outcome.FAILED, f"internal error: {exc!r}") for n in reasons}
            self._inflight = {}
            for node, request in batch.items():
                result = results.get(node) or ActionResult(Outcome.FAILED, "scheduler returned no result")
                for fut in request.futures:
                    if not fut.done():
                        fut.set_result(result)

    async def _round(
        self, reasons: dict[str, str], gates: Mapping[str, Gate | None], replace: set[str]
    ) -> dict[str, ActionResult]:
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
        results = {node: _result(r) for node, r in settled.items()}
        allowed: dict[str, str] = {}
        for node in (n for names in groups.values() for n in names):
            gate = gates.get(node) if node not in replaced else None  # no new disruption: not counted
            verdict = gate() if gate is not None else Verdict(True)
            if verdict.allowed:
                allowed[node] = reasons[node]
            else:
                results[node] = ActionResult(Outcome.HELD, verdict.reason)
        if allowed:
            drained = await self._scheduler.drain(allowed, planned)
            results.update({node: _result(r) for node, r in drained.items()})
        for node, was in replaced.items():
            if results[node].outcome == Outcome.DRAINED:
                results[node] = ActionResult(Outcome.DRAINED, f"{results[node].detail} (replacing {was!r})")
        return results


@dataclass(slots=True)
class _DrainRequest:
    reason: str
    gate: Gate | None
    replace: bool
    futures: list[asyncio.Future[ActionResult]]


def _result(result: DrainResult) -> ActionResult:
    return ActionResult(Outcome(result.outcome), result.detail)
