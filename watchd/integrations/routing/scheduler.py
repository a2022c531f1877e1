"""A node may belong to Slurm, to Kubernetes or to both (the same hardware shared): a Scheduler that routes
each node to the schedulers whose node-name patterns match it, and merges their answers.

Merging keeps the shared safety decisions whole: a node drained (or down) by someone else in *any* of its
schedulers reads as drained by someone else, so it is never touched anywhere; a node that is drained by
watchd in one scheduler and not yet in the other reads as not drained, so the drain goes on where it is
missing (the scheduler that has it answers ``already_drained``).
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watchd.integrations.base import Privileges, RequeueResult, Scheduler, SchedulerError
from watchd.jobs.model import JobProvider, job_providers_of
from watchd.model.nodes import (
    WATCHD_REASON_PREFIX,
    DrainResult,
    NodeState,
    RebootResult,
    ResumeResult,
    drained_by_watchd,
    left_as_is,
    plan_drain,
)
from watchd.port import Absent, VerbTable, verbs_of

_DRAIN_ORDER = ("failed", "held", "drained", "already_drained", "skipped")


@dataclass(frozen=True)
class Route:
    scheduler: Scheduler
    nodes: tuple[str, ...]  # shell-style patterns (fnmatch): "gpu-*", "dgx-[0-9]*"

    def matches(self, node: str) -> bool:
        return any(fnmatch.fnmatchcase(node, p) for p in self.nodes)


class RoutedScheduler:
    name = "routed"

    def __init__(self, routes: Sequence[Route], reason_prefix: str = WATCHD_REASON_PREFIX) -> None:
        if not routes:
            raise ValueError("no routes")
        self.routes = list(routes)
        self.reason_prefix = reason_prefix
        self.name = "+".join(r.scheduler.name for r in self.routes)
        self._last: dict[str, dict[str, NodeState]] = {}  # per scheduler: the states it last reported
        #: every verb of any of its schedulers (the first one's row where several have it)
        self.verbs: VerbTable = {
            n: v for r in reversed(self.routes) for n, v in verbs_of(r.scheduler).items()
        }

    def __getattr__(self, name: str) -> Any:
        """A verb that only some schedulers have (their own rows, beyond the Scheduler protocol): asked of
        each scheduler of its node (the first argument) that has it; :class:`Absent` when none has."""
        verb = self.__dict__.get("verbs", {}).get(name)
        if verb is None:
            raise AttributeError(name)

        async def routed(node: str, *args: Any, **kwargs: Any) -> Any:
            have = [r.scheduler for r in self.routes_of(node) if name in verbs_of(r.scheduler)]
            if not have:
                raise Absent(f"no scheduler of {node} can {name}")
            return verb.merge(await asyncio.gather(*(getattr(s, name)(node, *args, **kwargs) for s in have)))

        return routed

    def routes_of(self, node: str) -> list[Route]:
        return [r for r in self.routes if r.matches(node)]

    def _split(self, nodes: Sequence[str]) -> list[tuple[Route, list[str]]]:
        return [(r, [n for n in nodes if r.matches(n)]) for r in self.routes]

    def job_providers(self) -> list[JobProvider]:
        return [p for r in self.routes for p in job_providers_of(r.scheduler)]

    async def aclose(self) -> None:
        for r in self.routes:
            aclose = getattr(r.scheduler, "aclose", None)
            if aclose is not None:
                await aclose()

    async def node_states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        parts = [(r, names) for r, names in self._split(list(dict.fromkeys(nodes))) if names]
        answers = await asyncio.gather(*(r.scheduler.node_states(names) for r, names in parts))
        per_node: dict[str, list[NodeState]] = {}
        for (r, _), states in zip(parts, answers, strict=True):
            self._last.setdefault(r.scheduler.name, {}).update(states)
            for n, st in states.items():
                per_node.setdefault(n, []).append(st)
        return {n: self._merge(sts) for n, sts in per_node.items()}

    def _merge(self, states: list[NodeState]) -> NodeState:
        for st in states:
            if (st.drained or st.down) and not drained_by_watchd(st, self.reason_prefix):
                return st  # someone else's: never touched, in any scheduler
        for st in states:
            if not st.drained:
                return st  # still to drain somewhere
        return states[0]

    async def privileges(self) -> Privileges:
        """Refused if any route's scheduler refuses; unknown if any cannot tell."""
        answers = await asyncio.gather(*(r.scheduler.privileges() for r in self.routes))
        details = "; ".join(
            f"{r.scheduler.name}: {a.detail}" for r, a in zip(self.routes, answers, strict=True)
        )
        if any(a.allowed is False for a in answers):
            return Privileges(False, details)
        if any(a.allowed is None for a in answers):
            return Privileges(None, details)
        return Privileges(True, details)

    async def pools(self) -> dict[str, list[str]]:
        answers = await asyncio.gather(*(r.scheduler.pools() for r in self.routes))
        out: dict[str, list[str]] = {}
        for r, pools in zip(self.routes, answers, strict=True):
            for pool, members in pools.items():
                mine = [n for n in members if r.matches(n)]
                if mine:
                    out[f"{r.scheduler.name}:{pool}"] = mine
        return out

    async def drain(
        self, reasons: Mapping[str, str], states: Mapping[str, NodeState] | None = None
    ) -> dict[str, DrainResult]:
        if states is None:
            states = await self.node_states(list(reasons))
        # the shared decision on the merged states first: someone else's node is touched nowhere
        settled, groups = plan_drain(reasons, states, self.reason_prefix)
        routed = await self._drain_routes({n: reasons[n] for names in groups.values() for n in names})
        return {n: settled[n] if n in settled else routed[n] for n in reasons}

    async def apply_drain(self, groups: Mapping[str, Sequence[str]]) -> dict[str, DrainResult]:
        todo = {n: reason for reason, names in groups.items() for n in names}
        return await self._drain_routes(todo, planned=True)

    async def _drain_routes(self, todo: Mapping[str, str], planned: bool = False) -> dict[str, DrainResult]:
        """Each node of a drain the merged states planned, drained by each of its schedulers: where watchd
        drained it already that one answers ``already_drained``, so the drain goes on only where it is
        missing. ``planned``: on the states each scheduler last reported (the batcher just read them), each
        drains the rest as planned; otherwise each scheduler's own ``drain`` decides on its states."""
        parts = [(r, names) for r, names in self._split(list(todo)) if names]

        async def one(r: Route, names: list[str]) -> dict[str, DrainResult]:
            last = self._last.get(r.scheduler.name, {})
            known = {n: last[n] for n in names if n in last}
            try:
                if planned:
                    return await self._apply_on(r.scheduler, {n: todo[n] for n in names}, known)
                return await r.scheduler.drain(
                    {n: todo[n] for n in names}, known if len(known) == len(names) else None
                )
            except SchedulerError as exc:
                return {n: DrainResult(n, "failed", str(exc)) for n in names}

        answers = await asyncio.gather(*(one(r, names) for r, names in parts))
        merged: dict[str, list[tuple[str, DrainResult]]] = {}
        for (r, _), results in zip(parts, answers, strict=True):
            for n, res in results.items():
                merged.setdefault(n, []).append((r.scheduler.name, res))
        out: dict[str, DrainResult] = {}
        for n in todo:
            got = merged.get(n)
            if not got:
                out[n] = DrainResult(n, "failed", "no scheduler is configured for this node")
                continue
            outcome = min((res.outcome for _, res in got), key=_DRAIN_ORDER.index)
            detail = (
                got[0][1].detail
                if len(got) == 1
                else "; ".join(f"{s}: {res.outcome} {res.detail}".rstrip() for s, res in got)
            )
            out[n] = DrainResult(n, outcome, detail)
        return out

    async def _apply_on(
        self, scheduler: Scheduler, todo: Mapping[str, str], states: Mapping[str, NodeState]
    ) -> dict[str, DrainResult]:
        """One scheduler's share of a planned drain: a node it does not know, or that watchd drained there
        already, is settled on its state; the others are drained as planned."""
        results: dict[str, DrainResult] = {}
        groups: dict[str, list[str]] = {}
        for n, reason in todo.items():
            st = states.get(n)
            if st is None or drained_by_watchd(st, self.reason_prefix):
                results[n] = left_as_is(n, st)
            else:
                groups.setdefault(reason, []).append(n)
        if groups:
            results.update(await scheduler.apply_drain(groups))
        return results

    async def requeue_jobs_on(self, node: str, job: str | None = None) -> RequeueResult:
        routes = self.routes_of(node)
        if not routes:
            raise SchedulerError(f"no scheduler is configured for node {node}")
        answers = await asyncio.gather(
            *(r.scheduler.requeue_jobs_on(node, job) for r in routes), return_exceptions=True
        )
        requeued: list[str] = []
        not_requeueable: list[str] = []
        failed: dict[str, str] = {}
        for r, ans in zip(routes, answers, strict=True):
            if isinstance(ans, SchedulerError):
                failed[f"{r.scheduler.name}:*"] = str(ans)
            elif isinstance(ans, BaseException):
                raise ans
            else:
                requeued.extend(ans.requeued)
                not_requeueable.extend(ans.not_requeueable)
                failed.update(ans.failed)
        return RequeueResult(node, tuple(requeued), tuple(not_requeueable), failed)

    async def resume(self, node: str) -> ResumeResult:
        outcome, detail, _ = await self._each(
            node, lambda sched: sched.resume(node), ("failed", "resumed", "refused", "not_drained")
        )
        return ResumeResult(node, outcome, detail)  # type: ignore[arg-type]

    async def reboot(self, node: str, reason: str) -> RebootResult:
        outcome, detail, answers = await self._each(
            node, lambda sched: sched.reboot(node, reason), ("failed", "rebooting", "refused", "not_drained")
        )
        boot = next((a.boot_id for a in answers if isinstance(a, RebootResult) and a.boot_id), None)
        return RebootResult(node, outcome, detail, boot)  # type: ignore[arg-type]

    async def _each(
        self,
        node: str,
        call: Callable[[Scheduler], Awaitable[ResumeResult | RebootResult]],
        precedence: tuple[str, ...],
    ) -> tuple[str, str, list[ResumeResult | RebootResult]]:
        """``call`` on every scheduler of ``node``: one answer as it is; several, the first outcome of
        ``precedence`` any of them gave, with each one's detail; and the answers."""
        routes = self.routes_of(node)
        if not routes:
            return "failed", "no scheduler is configured for this node", []
        answers = await asyncio.gather(*(call(r.scheduler) for r in routes), return_exceptions=True)
        results: list[tuple[str, str, str]] = []
        given: list[ResumeResult | RebootResult] = []
        for r, ans in zip(routes, answers, strict=True):
            if isinstance(ans, SchedulerError):
                results.append((r.scheduler.name, "failed", str(ans)))
            elif isinstance(ans, BaseException):
                raise ans
            else:
                results.append((r.scheduler.name, ans.outcome, ans.detail))
                given.append(ans)
        if len(results) == 1:
            return results[0][1], results[0][2], given
        outcomes = {outcome for _, outcome, _ in results}
        outcome = next(o for o in precedence if o in outcomes)
        return outcome, "; ".join(f"{s}: {o} {d}".rstrip() for s, o, d in results), given
