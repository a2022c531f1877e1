"""The engine's side of reliability accounting and checkpoint advice: feeds the pure trackers
(:mod:`watchd.reliability`) from the event stream and the actions' feedback, keeps the durable record in the
state database, and serves the report, the advice, the metrics and the ``checkpoint_interval`` findings.

Hot path: its subscriptions (every kind) are a few dict operations per event; writes happen on failures (rare)
and in :meth:`flush` (every ``reliability.flush_s``). The periodic work grows with the fleet (a row per node
and interval: 4.3 s a minute at 100,000 nodes when done at once), so :meth:`flush` and :meth:`cycle` write
and read in pages with the event loop served between them, and build the report in a worker thread: a drain
decided meanwhile waits for one page, not for the whole fleet. The API serves the reports the cycle built
(:mod:`watchd.reliability.cached`), and the advice of every running job is refreshed in slices
(:mod:`watchd.slices`).

A failure ends on every way back to service: watchd's resume, a validation that passed, ``node_repaired``,
and any other (an admin's ``scontrol`` resume) seen in the fleet listing at each flush
(:mod:`watchd.reliability.returns`). A held drain counts once released, from then (:meth:`~.released`)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client.registry import Collector

from watchd.clock import Clock
from watchd.httputil import error_response, json_response
from watchd.jobs.topology import JobTopology
from watchd.logs import get_logger
from watchd.model.action import KIND as FEEDBACK_KIND
from watchd.model.action import ActionOutcome, NodeReturned
from watchd.model.events import Event
from watchd.model.fleet import FleetNode
from watchd.model.gpu import SUMMARY_KIND
from watchd.model.heartbeat import KIND as HEARTBEAT_KIND
from watchd.model.registry import REPAIRED_KIND
from watchd.model.reliability import JOB_ADVICE_PATH
from watchd.model.reliability import SOURCE as ADVICE_SOURCE
from watchd.reliability.cached import Built, ReportCache
from watchd.reliability.evidence import FAILURE_OUTCOMES, gpu_of, hardware_evidence
from watchd.reliability.jobs import JobTracker
from watchd.reliability.metrics import ReliabilityCollector
from watchd.reliability.report import (
    ADVICE_DOC,
    Advice,
    Failure,
    NodeInfo,
    Report,
    advice_finding,
    advise,
    build_report,
    parse_since,
)
from watchd.reliability.returns import back_in_service, held_failure
from watchd.reliability.service import Interval, NodeService, ServiceTracker
from watchd.reliability.settings import ReliabilityConfig
from watchd.rules.decision import Decision
from watchd.slices import Steps, pause, run_all, run_sliced
from watchd.store.connection import StoreError
from watchd.store.database import Store
from watchd.store.held import HeldAction, HeldReleased
from watchd.store.reliability import PAGE, FailureRow, IntervalRow, NodeRow
from watchd.subsystem import ANY, Component, Handler, Housekeeping, Job, Operator

_log = get_logger("watchd.reliability")
_PENDING_MAX = 10_000  # drains decided on hardware evidence, awaiting their outcome
_OWN_SOURCES = frozenset({"watchd", "detector", ADVICE_SOURCE})  # events that are no report from a node
_FLUSH_BACKLOG = 10_000  # closed intervals waiting for the periodic flush: save them now


_T = TypeVar("_T")


async def _collect(pages: Iterator[list[_T]]) -> list[_T]:
    """Every page's rows, the event loop served between pages."""
    out: list[_T] = []
    for page in pages:
        out.extend(page)
        await pause()
    return out


class Reliability(Component):
    """Reliability accounting and checkpoint advice, as one subsystem of the engine (:mod:`watchd.subsystem`):
    every event is exposure or a heartbeat, decisions and their outcomes are failures, the intervals are
    flushed to the state database every ``flush_s``, and every ``interval_s`` the report is built and a job
    checkpointing far off the advice becomes a finding (``emit``)."""

    name = "reliability"

    def __init__(
        self,
        config: ReliabilityConfig,
        store: Store,
        clock: Clock,
        topology: JobTopology,
        partitions_of: Callable[[str], list[str]],
        emit: Callable[[Event], Awaitable[None]] | None = None,
    ) -> None:
        self.emit = emit
        self.config = config
        self.store = store
        self.clock = clock
        self.topology = topology
        self.partitions_of = partitions_of
        self.service = ServiceTracker(config.gap_s, config.max_nodes)
        self.job_tracker = JobTracker()
        self._pending: dict[tuple[str, str], tuple[Event, str]] = {}
        self._partitions: dict[str, tuple[str, ...]] = {}
        self._advice: dict[str, Advice] = {}
        self._last_finding: dict[str, float] = {}
        # the fleet's report (the last cycle's) and the queries' (since, partition), with their documents
        self.reports = ReportCache(max_age_s=2 * config.interval_s)
        self.failures_recorded = 0
        self.metrics_collector: Collector = ReliabilityCollector(self)
        #: the engine's last fleet listing and when it was taken (None: none): returns watchd was not told of
        self.fleet_listing: Callable[[], tuple[Sequence[FleetNode], float] | None] = lambda: None
        #: the nodes being validated now (their drain lifted for the checks: not back yet)
        self.validating: Callable[[], Collection[str]] = frozenset
        self._marked: dict[str, float] = {}  # node -> when its open failure was recorded (this process)
        for row in store.reliability.nodes():
            self.service.restore(row.node, out_since=row.out_since, model=row.gpu_model, gpus=row.gpus)
            self._partitions[row.node] = row.partitions

    # ------------------------------------------------------------------------------------ the subsystem

    def jobs(self) -> Sequence[Job]:
        return (
            Job("reliability-flush", self.config.flush_s, self.flush),
            Job("reliability", self.config.interval_s, self._advise_cycle),
        )

    async def stop(self) -> None:
        self.flush_now()

    def collectors(self) -> Sequence[Collector]:
        return (self.metrics_collector,)

    def status(self) -> dict[str, Any]:
        return self.summary()

    def routes(self, app: web.Application, operator: Operator) -> None:
        async def document(request: web.Request) -> web.Response:
            try:
                return json_response(await self.document(request.query))
            except ValueError as exc:
                return error_response(400, str(exc))
            except LookupError as exc:
                return error_response(404, str(exc).strip("'\""))

        async def job_advice(request: web.Request) -> web.Response:
            job = request.query.get("job")
            if not job:
                return error_response(400, "job: required")
            try:
                return json_response({"job": (await self.document({"job": job}))["job"]})
            except LookupError as exc:
                return error_response(404, str(exc).strip("'\""))

        app.router.add_get("/api/v1/reliability", document)
        # one job's advice alone: the agents' token may read it (an agent asks for a job on its node)
        app.router.add_get(JOB_ADVICE_PATH, job_advice)

    async def _advise_cycle(self) -> None:
        """The report and checkpoint advice; a job far off the advice becomes a finding."""
        for event in await self.cycle():
            _log.info("checkpoint_interval", job=event.attrs.get("job"), summary=event.attrs.get("summary"))
            if self.emit is not None:
                await self.emit(event)  # waits, never drops

    # ------------------------------------------------------------------------------------- the stream

    def subscriptions(self) -> Mapping[str, Handler]:
        """Every kind: a node's report is exposure, a heartbeat times checkpoints, a repair ends a failure."""
        return {
            SUMMARY_KIND: self._summary,
            HEARTBEAT_KIND: self._heartbeat,
            REPAIRED_KIND: self._repaired,
            ANY: self._exposure,
        }

    def news(self) -> Mapping[type, Callable[[Any], None]]:
        """Decisions and their outcomes are failures; watchd's returns to service end them."""
        return {
            Decision: self.decided,
            ActionOutcome: lambda news: self.feedback(news.event),
            NodeReturned: lambda news: self.restored(news.node, news.time),
            HeldReleased: self._released,
            Housekeeping: lambda news: self.prune(news.now),
        }

    def _summary(self, event: Event) -> None:
        if event.source in _OWN_SOURCES:
            return
        attrs = event.attrs
        gpu, model, job = attrs.get("gpu"), attrs.get("model"), attrs.get("job")
        back = self.service.seen(
            event.node,
            event.time,
            model=model if isinstance(model, str) else None,
            gpu=gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None,
            job=job if isinstance(job, str) else None,
        )
        if back:
            self._close_failures(event.node, event.time)
        self._save_backlog()

    def _heartbeat(self, event: Event) -> None:
        if event.source in _OWN_SOURCES:
            return
        attrs = event.attrs
        job, rank, phase = attrs.get("job"), attrs.get("rank"), attrs.get("phase") or "train"
        if isinstance(job, str) and isinstance(rank, int) and isinstance(phase, str):
            label = self.topology.canonical(job)
            self.job_tracker.heartbeat(label, rank, phase, event.time, event.node)
            if self.service.seen(event.node, event.time, job=label):
                self._close_failures(event.node, event.time)
        else:
            self.service.seen(event.node, event.time)
        self._save_backlog()

    def _repaired(self, event: Event) -> None:
        if event.source in _OWN_SOURCES:
            return
        self.restored(event.node, event.time)
        self._save_backlog()

    def _exposure(self, event: Event) -> None:
        """Any other report from a node: exposure."""
        if event.source in _OWN_SOURCES:
            return
        self.service.seen(event.node, event.time)
        self._save_backlog()

    def _save_backlog(self) -> None:
        if self.service.closed_pending >= _FLUSH_BACKLOG:
            self._save(self.service.take_closed(), [])

    def decided(self, decision: Decision) -> None:
        """A decision with a drain on hardware evidence: remembered until the drain's outcome comes back."""
        drains = [a.node for a in decision.actions if a.kind == "drain"]
        if not drains:
            return
        evidence = hardware_evidence(decision.event)
        if evidence is None:
            return
        for node in drains:
            if len(self._pending) >= _PENDING_MAX:
                del self._pending[next(iter(self._pending))]
            self._pending.setdefault((decision.rule, node), (decision.event, evidence))

    def feedback(self, event: Event) -> None:
        """An action's outcome (``watchd_action``): a drain on hardware evidence is a failure; a resume
        returns the node to service."""
        if event.kind != FEEDBACK_KIND:
            return
        action, outcome = event.attrs.get("action"), event.attrs.get("outcome")
        if action == "resume" and outcome == "resumed":
            self.restored(event.node, event.time)
            return
        if action != "drain":
            return
        pending = self._pending.pop((str(event.attrs.get("rule")), event.node), None)
        if pending is None or outcome not in FAILURE_OUTCOMES:
            return
        source, evidence = pending
        rule, mode = str(event.attrs.get("rule")), str(event.attrs.get("mode"))
        self._failed(event.node, min(source.time, event.time), rule, source, evidence, mode, event.time)

    def released(self, held: HeldAction, outcome: str, t: float, mode: str = "enforce") -> bool:
        """An operator released a drain the breaker held, and it ended ``outcome`` at ``t``: a failure from
        ``t`` (the node served until then) when it took the node out on hardware evidence. Read from the held
        row, so a release after a restart counts too. Whether it was counted."""
        found = held_failure(held, outcome)
        if found is None:
            return False
        source, evidence = found
        self._pending.pop((held.rule, held.node), None)
        return self._failed(held.node, t, held.rule, source, evidence, mode, t)

    def _released(self, news: HeldReleased) -> None:
        self.released(news.held, news.outcome, news.time, news.mode)

    def _failed(
        self, node: str, at: float, rule: str, source: Event, evidence: str, mode: str, recorded: float
    ) -> bool:
        state = self.service.nodes.get(node)
        if state is not None and state.out_since is not None:
            return False  # still out from a failure counted before (dry-run does not drain): the same one
        self.service.failed(node, at)
        self._marked[node] = recorded
        try:
            self.store.reliability.add_failure(at, node, rule, source.id, evidence, gpu_of(source), mode)
        except StoreError as exc:  # counted by the store's listener; the accounting misses this one
            _log.error("failure_not_recorded", node=node, error=str(exc), rate_limited=True)
            return False
        self.failures_recorded += 1
        _log.info("failure_recorded", node=node, evidence=evidence, rule=rule)
        return True

    def restored(self, node: str, t: float) -> None:
        """``node`` is back in service at ``t`` (watchd resumed or validated it, an operator resumed it
        through watchd, a repair system said so, the fleet listing shows it)."""
        self._marked.pop(node, None)
        if self.service.restored(node, t) is not None:
            self._close_failures(node, t)

    def seen_back(self) -> list[str]:
        """The nodes out after a failure that the fleet listing shows in service again (an operator's
        resume watchd was not told of): their failures end when the listing was taken."""
        got = self.fleet_listing()
        if got is None:
            return []
        listing, at = got
        out = {
            node: self._marked.get(node, state.out_since)
            for node, state in self.service.nodes.items()
            if state.out_since is not None
        }
        back = back_in_service(listing, at, out, self.validating()) if out else []
        for node in back:
            _log.info("seen_back_in_service", node=node)
            self.restored(node, at)
        return back

    def _close_failures(self, node: str, t: float) -> None:
        try:
            self.store.reliability.close_failures(node, t)
        except StoreError as exc:  # the failure stays open (its GPU-hours lost keep growing): logged
            _log.error("failure_not_closed", node=node, error=str(exc), rate_limited=True)

    # ------------------------------------------------------------------------------------- periodic

    async def flush(self) -> None:
        """The periodic save, :data:`PAGE` nodes at a time, the event loop served between pages; first the
        returns to service the fleet listing shows."""
        self.seen_back()
        self._save(self.service.take_closed(), [])
        states = list(self.service.nodes.values())
        for i in range(0, len(states), PAGE):
            self._save(*self._changes(states[i : i + PAGE]))
            await pause()
        self._forget_evicted()

    def flush_now(self) -> None:
        """Save the service intervals and what changed of the nodes (a failed write is retried next time)."""
        closed = self.service.take_closed()
        intervals, nodes = self._changes(list(self.service.nodes.values()))
        self._save(closed + intervals, nodes)
        self._forget_evicted()

    def _changes(self, states: list[NodeService]) -> tuple[list[Interval], list[NodeService]]:
        """The open intervals of ``states`` and those of them whose attributes or partitions changed."""
        intervals, dirty = self.service.open_and_dirty(states)
        changed = {s.node: s for s in dirty}
        for state in states:
            parts = tuple(sorted(self.partitions_of(state.node)))
            if self._partitions.get(state.node) != parts:
                self._partitions[state.node] = parts
                changed[state.node] = state
        return intervals, list(changed.values())

    def _forget_evicted(self) -> None:
        if len(self._partitions) > len(self.service.nodes):  # the nodes the tracker evicted
            self._partitions = {n: p for n, p in self._partitions.items() if n in self.service.nodes}

    def _save(self, intervals: list[Interval], nodes: list[NodeService]) -> None:
        try:
            if intervals:
                self.store.reliability.save_intervals(IntervalRow(i.node, i.start, i.end) for i in intervals)
            if nodes:
                self.store.reliability.save_nodes(
                    NodeRow(s.node, s.model, len(s.gpus), self._partitions.get(s.node, ()), s.out_since)
                    for s in nodes
                )
        except StoreError as exc:
            _log.error("service_not_saved", error=str(exc), rate_limited=True)
            for s in nodes:
                s.dirty = True

    def prune(self, now: float) -> None:
        _, forgotten = self.store.reliability.prune(now - self.config.retention_days * 86400.0)
        for node in forgotten:  # seen again since (not yet flushed): saved again with the next flush
            state = self.service.nodes.get(node)
            if state is not None:
                state.dirty = True
        self.job_tracker.prune(now, max(3600.0, 10 * self.config.gap_s))

    @property
    def _report(self) -> Report | None:
        """The fleet's report from the last cycle (or the last request that found it stale)."""
        current = self.reports.current
        return current.report if current is not None else None

    async def cycle(self) -> list[Event]:
        """:meth:`cycle_now` without holding the event loop: saved and read in pages, built in a thread, the
        advice refreshed in slices."""
        now = self.clock.now()
        since = now - self.config.window_days * 86400.0
        built = await self.reports.rebuild(lambda: self._build_off_loop(now, since, None, flush=True))
        running = await run_sliced(self._running_steps(now))
        return await run_sliced(self._refresh_steps(built.report, now, running))

    async def _build_off_loop(self, now: float, since: float, partition: str | None, *, flush: bool) -> Built:
        """The report over ``[since, now]``: saved first (``flush``), the record read in pages with the event
        loop served between them, built with its document in a worker thread."""
        if flush:
            await self.flush()
        rel = self.store.reliability
        nodes = await _collect(rel.node_pages())
        intervals = await _collect(rel.interval_pages(since))
        failures = await _collect(rel.failure_pages(since))
        partitions = dict(self._partitions)

        def build() -> Built:
            return Built.of(self._build(nodes, intervals, failures, partitions, now, since, partition))

        return await asyncio.to_thread(build)

    def _running_steps(self, now: float) -> Steps[Mapping[str, tuple[int, str | None]]]:
        """Each running job's number of nodes and partition: from the detectors' last pass when at most
        ``interval_s`` old (they pass every ``detectors.interval_s``), else from a pass of our own."""
        last = self.topology.last_sizes
        if last is not None and 0.0 <= now - last[0] <= self.config.interval_s:
            return last[1]
        return (yield from self.topology.size_steps(now))

    def cycle_now(self) -> list[Event]:
        """Refresh the report and every running job's advice; the findings for jobs far off the advice."""
        now = self.clock.now()
        self.reports.current = Built.of(self.report(now=now))
        sizes = run_all(self.topology.size_steps(now))
        return run_all(self._refresh_steps(self.reports.current.report, now, sizes))

    def _refresh_steps(
        self, report: Report, now: float, running: Mapping[str, tuple[int, str | None]]
    ) -> Steps[list[Event]]:
        """Every running job's advice from ``report``, one job a step; the findings for jobs far off it."""
        advice: dict[str, Advice] = {}
        findings: list[Event] = []
        for label, state in list(self.job_tracker.jobs.items()):  # heartbeats may add jobs between steps
            yield
            if state.done:
                continue
            nodes, partition = self._size(label, state.nodes, running)
            a = self._advise(label, nodes, partition, report, now)
            if a is None:
                continue
            advice[label] = a
            if (
                a.far_too_long
                and now - self._last_finding.get(label, -math.inf) >= self.config.finding_repeat_s
            ):
                self._last_finding[label] = now
                findings.append(advice_finding(a, sorted(state.nodes)[0], now))
        self._advice = advice
        for label in [j for j in self._last_finding if j not in self.job_tracker.jobs]:
            del self._last_finding[label]
        return findings

    @staticmethod
    def _size(
        label: str, heartbeat_nodes: Collection[str], running: Mapping[str, tuple[int, str | None]]
    ) -> tuple[int, str | None]:
        """A job's number of nodes and partition as the topology sees it; else the nodes its heartbeats
        came from."""
        nodes, partition = running.get(label, (0, None))
        return (nodes or len(heartbeat_nodes)), partition

    def _advise(
        self, label: str, nodes: int, partition: str | None, report: Report, now: float
    ) -> Advice | None:
        state = self.job_tracker.jobs.get(label)
        if state is None:
            return None
        assumed = self.config.assumed_node_mtbf_hours
        return advise(
            state,
            nodes=nodes,
            partition=partition,
            estimate=report.mtbf_of_partition(partition),
            now=now,
            default_cost_s=self.config.checkpoint_cost_s,
            assumed_node_mtbf_s=assumed * 3600.0 if assumed is not None else None,
            restart_s=self.config.restart_s,
            factor=self.config.far_factor,
        )

    # ------------------------------------------------------------------------------------- reading

    def report(
        self, *, now: float | None = None, since: float | None = None, partition: str | None = None
    ) -> Report:
        """The accounting from the durable record (saved first), over ``[since, now]``."""
        now = self.clock.now() if now is None else now
        since = now - self.config.window_days * 86400.0 if since is None else since
        self.flush_now()
        rel = self.store.reliability
        return self._build(
            rel.nodes(), rel.intervals(since), rel.failures(since), self._partitions, now, since, partition
        )

    def _build(
        self,
        nodes: list[NodeRow],
        intervals: list[IntervalRow],
        failures: list[FailureRow],
        partitions: Mapping[str, tuple[str, ...]],
        now: float,
        since: float,
        partition: str | None,
    ) -> Report:
        """Pure: the report from the rows read (safe in a worker thread)."""
        return build_report(
            now=now,
            since=since,
            intervals=[Interval(r.node, r.start, r.end) for r in intervals],
            failures=[
                Failure(f.time, f.node, f.rule, f.evidence, f.mode, f.gpu, f.back_at) for f in failures
            ],
            info={
                r.node: NodeInfo(r.gpu_model, r.gpus, r.partitions or partitions.get(r.node, ()))
                for r in nodes
            },
            confidence=self.config.confidence,
            partition=partition,
            lemon_failures=self.config.lemon_failures,
            lemon_window_s=self.config.lemon_window_days * 86400.0,
        )

    async def document(self, query: Mapping[str, str]) -> dict[str, Any]:
        """``GET /api/v1/reliability``: ``since`` (epoch seconds, or a duration like ``30d``), ``partition``,
        ``job``. Raises ValueError for a query it cannot read. Served from the reports kept
        (:mod:`watchd.reliability.cached`: the fleet's from the last cycle; a query's for ``max_age_s``),
        built off the event loop when missing or stale; ``report_age_s`` says how old."""
        now = self.clock.now()
        raw_since = query.get("since") or ""
        since = parse_since(raw_since, now) if raw_since else None
        partition = query.get("partition") or None
        job = query.get("job") or None
        if since is None and partition is None:
            window = now - self.config.window_days * 86400.0
            built = await self.reports.fleet(now, lambda: self._build_off_loop(now, window, None, flush=True))
        else:
            start = since if since is not None else now - self.config.window_days * 86400.0
            built = await self.reports.query(
                (raw_since, partition), now, lambda: self._build_off_loop(now, start, partition, flush=False)
            )
        report = built.report
        doc = dict(built.doc)  # the document is shared: only its top level is added to
        doc["partition"] = partition
        doc["report_age_s"] = round(max(0.0, now - report.now), 3)
        doc["advice_model"] = ADVICE_DOC
        if job is not None:
            label = self.topology.canonical(job)
            state = self.job_tracker.jobs.get(label)
            if state is None:
                raise LookupError(f"job {job}: no heartbeats from it (is it running with watchd.client?)")
            nodes, part = self._size(label, state.nodes, await run_sliced(self._running_steps(now)))
            a = self._advise(label, nodes, part, report, now)
            doc["job"] = (
                a.to_dict()
                if a is not None
                else {
                    "job": label,
                    "advice": None,
                    "why": "no checkpoint cost measured or configured, or no MTBF",
                }
            )
        else:
            doc["jobs"] = [a.to_dict() for a in sorted(self._advice.values(), key=lambda a: a.job)[:1000]]
        return doc

    def advice(self, job: str) -> Advice | None:
        return self._advice.get(self.topology.canonical(job))

    # ------------------------------------------------------------------------------------- metrics

    def summary(self) -> dict[str, Any]:
        """The status document's ``reliability`` section (from the last cycle; cheap)."""
        report = self._report
        far = sorted(a.job for a in self._advice.values() if a.far_too_long)
        if report is None:
            return {
                "fleet": None,
                "lemons": [],
                "gpu_hours_lost": 0.0,
                "jobs_advised": 0,
                "jobs_far_off": far,
            }
        return {
            "since": report.since,
            "fleet": report.fleet.to_dict(),
            "lemons": [{"node": n, "failures": c} for n, c in report.lemons[:20]],
            "failures": len(report.failures),
            "gpu_hours_lost": round(report.gpu_hours_lost, 3),
            "jobs_advised": len(self._advice),
            "jobs_far_off": far[:100],
        }
