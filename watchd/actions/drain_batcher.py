"""Drains coalesced into scheduler rounds: a burst of N failures costs two rounds, not N."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from watchd.actions.outcome import ActionResult, Outcome
from watchd.actions.safety import Gate, Verdict
from watchd.integrations.base import Scheduler, SchedulerError
from watchd.logs import get_logger
from watchd.model.nodes import DrainResult, drain_reason, drained_by_watchd, plan_drain
from watchd.store.connection import Fenced, StoreError

_log = get_logger("watchd.executor")

#: a drain whose round met a failure of the state database waits this long before its next round, doubling
STORE_RETRY_S = 0.5
STORE_RETRY_MAX_S = 8.0
#: ... at most this many times (0.5 + 1 + 2 + 4 + 8 + 8 = 23.5 s): then it is interrupted, its intent left
#: open for the executor's re-drive once the store answers (and, at worst, the next start's recovery)
STORE_RETRIES = 6

#: called with "retried" or "interrupted" for each drain whose round met a store failure (the metric)
StoreFailureListener = Callable[[str], None]


class DrainBatcher:
    """Coalesces drain requests that arrive while a scheduler round is in flight into the next round.

    A lone failure is drained at once; a burst of N failures costs two rounds, not N. Each round reads the
    nodes' states once, settles those that need no change (never touched), then asks each remaining
    request's gate (the safety breaker) one after another: rounds are serial, so the breaker counts exactly,
    and a node someone else already drained neither counts nor gets held.

    A gate that fails on the state database (the breaker's window could not be read or written) costs only
    its own request, never the round: that drain waits (``STORE_RETRY_S``, doubling) and goes into a later
    round, its caller still waiting and its intent still open; after ``STORE_RETRIES`` it is answered
    ``interrupted`` (the intent stays open, and the executor drives it again once the store answers), at
    once when the write was fenced (another engine leads now, and drives it)."""

    def __init__(
        self,
        scheduler: Scheduler,
        on_store_failure: StoreFailureListener | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._on_store_failure = on_store_failure
        self._retry_s, self._retry_max_s, self._retries = STORE_RETRY_S, STORE_RETRY_MAX_S, STORE_RETRIES
        self._pending: dict[str, _DrainRequest] = {}
        self._inflight: dict[str, _DrainRequest] = {}
        self._waiting: dict[str, _DrainRequest] = {}  # store-failed, until their next round
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="drain-batcher")

    async def stop(self) -> None:
        """Cancel the round in flight; every drain not answered yet is ``interrupted``: its intent stays open
        and the next start (or the leader) drives it again."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for request in [*self._inflight.values(), *self._pending.values(), *self._waiting.values()]:
            if request.timer is not None:
                request.timer.cancel()
            request.answer(ActionResult(Outcome.INTERRUPTED, "engine shutting down: driven again at start"))
        self._inflight, self._pending, self._waiting = {}, {}, {}

    async def drain(
        self, node: str, reason: str, gate: Gate | None = None, replace: bool = False
    ) -> ActionResult:
        """``replace``: when watchd has already drained the node for another reason, this reason replaces
        that one (not a new disruption: no gate). Otherwise a node already drained by watchd is left as is."""
        fut: asyncio.Future[ActionResult] = asyncio.get_running_loop().create_future()
        request = _DrainRequest(reason, gate, replace, [fut])
        waiting = self._waiting.get(node)
        if waiting is not None:  # goes with the one waiting after a store failure, in its next round
            waiting.merge(request)
        elif (pending := self._pending.get(node)) is not None:
            pending.merge(request)
        else:
            self._pending[node] = request
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
            store_failed: dict[str, StoreError] = {}
            try:
                results = await self._round(batch, store_failed)
            except SchedulerError as exc:
                results = {n: ActionResult(Outcome.FAILED, str(exc)) for n in batch}
            except StoreError as exc:  # not from a gate (none today): every drain of the round waits
                results, store_failed = {}, dict.fromkeys(batch, exc)
            except Exception as exc:  # an adapter bug must not stop every later drain
                _log.exception("drain_round_crashed", nodes=len(batch))
                results = {n: ActionResult(Outcome.FAILED, f"internal error: {exc!r}") for n in batch}
            self._inflight = {}
            for node, request in batch.items():
                if node in store_failed and node not in results:
                    self._retry(node, request, store_failed[node])
                else:
                    request.answer(
                        results.get(node) or ActionResult(Outcome.FAILED, "scheduler returned no result")
                    )

    def _retry(self, node: str, request: _DrainRequest, error: StoreError) -> None:
        """``node``'s gate failed on the state database: the drain waits and goes into a later round, or,
        after ``retries``, is interrupted (its intent stays open: the executor drives it again)."""
        request.tries += 1
        if isinstance(error, Fenced) or request.tries > self._retries:  # fenced: another engine leads now
            self._counted("interrupted")
            _log.error(
                "drain_interrupted", node=node, rounds=request.tries, error=str(error), rate_limited=True
            )
            why = (
                f"not recorded ({error}): driven by the engine that leads"
                if isinstance(error, Fenced)
                else f"the state database failed in {request.tries} drain rounds, the last time: {error}; "
                "driven again once it answers"
            )
            request.answer(ActionResult(Outcome.INTERRUPTED, why))
            return
        delay = min(self._retry_max_s, self._retry_s * 2 ** (request.tries - 1))
        self._counted("retried")
        _log.warning("drain_waits_for_the_store", node=node, retry_in_s=delay, error=str(error))
        if (newer := self._pending.pop(node, None)) is not None:  # asked again during the round: one request
            request.merge(newer)
        self._waiting[node] = request
        request.timer = asyncio.get_running_loop().call_later(delay, self._wake, node)

    def _wake(self, node: str) -> None:
        request = self._waiting.pop(node, None)
        if request is None:
            return
        request.timer = None
        if (newer := self._pending.get(node)) is not None:  # cannot be (drain() joins the waiting one)
            request.merge(newer)
        self._pending[node] = request
        self._wakeup.set()

    def _counted(self, result: str) -> None:
        if self._on_store_failure is not None:
            self._on_store_failure(result)

    async def _round(
        self, batch: Mapping[str, _DrainRequest], store_failed: dict[str, StoreError]
    ) -> dict[str, ActionResult]:
        """One round: the drains' results by node; a node whose gate failed on the store has none and is
        put in ``store_failed`` (the round goes on without it)."""
        reasons = {node: r.reason for node, r in batch.items()}
        states = await self._scheduler.node_states(list(reasons))
        # a node to re-drain with a replacing reason is planned as if not drained: every adapter then sets
        # the new reason (scontrol update on a drained node changes its reason) through its usual path
        replaced: dict[str, str] = {}
        planned = dict(states)
        for node in (n for n, r in batch.items() if r.replace):
            st = states.get(node)
            if st is not None and drained_by_watchd(st) and st.reason != drain_reason(reasons[node]):
                replaced[node] = st.reason or ""
                planned[node] = dataclasses.replace(st, flags=st.flags - {"DRAIN"})
        settled, groups = plan_drain(reasons, planned)
        results = {node: _result(r) for node, r in settled.items()}
        allowed: set[str] = set()
        for node in (n for names in groups.values() for n in names):
            gate = batch[node].gate if node not in replaced else None  # no new disruption: not counted
            try:
                verdict = gate() if gate is not None else Verdict(True)
            except StoreError as exc:  # this drain waits for the store; the round goes on
                store_failed[node] = exc
                continue
            if verdict.allowed:
                allowed.add(node)
            else:
                results[node] = ActionResult(Outcome.HELD, verdict.reason)
        todo = {reason: [n for n in names if n in allowed] for reason, names in groups.items()}
        if allowed:  # planned once, here: the scheduler drains the nodes as planned
            drained = await self._scheduler.apply_drain({r: names for r, names in todo.items() if names})
            results.update({node: _result(r) for node, r in drained.items()})
        for node, was in replaced.items():
            if node in results and results[node].outcome == Outcome.DRAINED:
                results[node] = ActionResult(Outcome.DRAINED, f"{results[node].detail} (replacing {was!r})")
        return results


@dataclass(slots=True)
class _DrainRequest:
    reason: str
    gate: Gate | None
    replace: bool
    futures: list[asyncio.Future[ActionResult]]
    tries: int = 0  # rounds whose gate failed on the store
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def merge(self, other: _DrainRequest) -> None:
        """``other`` (a later request for the node) is answered with this one; its reason replaces this one's
        when it replaces (the gate stays this one's: one drain, counted once)."""
        self.futures.extend(other.futures)
        if other.replace:
            self.reason, self.replace = other.reason, True

    def answer(self, result: ActionResult) -> None:
        for fut in self.futures:
            if not fut.done():
                fut.set_result(result)


def _result(result: DrainResult) -> ActionResult:
    return ActionResult(Outcome(result.outcome), result.detail)
