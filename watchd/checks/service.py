"""The checks in the engine: rounds on APScheduler, runs through the runner, verdicts to the state database
and to the rules as ``check_result`` events, and the validated return to service.

A round of a check: its nodes (partitions, node patterns) are started as they are idle, the least recently
checked first, never more than ``max_share`` of a partition at once, never a node backing off; each run is a
scheduler job pinned to the node, followed to its end, its output judged (:mod:`watchd.checks.judge`). A run
that fails on its own (low bandwidth against the baseline, ``#wrong``, a failed diagnostic, a crash) is
reported at once; one that passes waits for the round's end, where the peers are compared (a node below
``peers.share`` of its peers' median fails). Nodes that were not idle while the round lasted wait for the
next.

Restarts: every round and run is in the state database before anything is submitted. At start, runs still in
flight are followed to their end (their jobs keep running), an unfinished round is resumed with the nodes it
has not done, and a round the schedule should have started while the engine was away is started at once (one,
not one per missed slot)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from watchd.checks import plan
from watchd.checks.fabric.round import PairRound
from watchd.checks.fabric.validate import validate_pair
from watchd.checks.judge import Verdict, judge, judge_peers
from watchd.checks.kinds import CHECK_KINDS, undeclared_figures
from watchd.checks.metrics import CheckMetrics
from watchd.checks.params import ChecksConfig, CheckSpec
from watchd.checks.partner_waits import PartnerWaits
from watchd.checks.recovery import recover_validation
from watchd.checks.result_event import RunResult, check_result, run_result
from watchd.checks.risk import Order
from watchd.checks.runner import (
    RUNNER_VERBS,
    Availability,
    CheckJob,
    CheckRunner,
    JobHandle,
    RunnerError,
    RunOutput,
)
from watchd.checks.schedule import trigger_for
from watchd.checks.verdict import NOT_CHECKED, tag, validation_reason
from watchd.checks.views import CheckViews
from watchd.checks.waiting import Waiting
from watchd.clock import Clock
from watchd.logs import get_logger
from watchd.model.events import Event
from watchd.model.validation import Validation
from watchd.periodic import Periodic
from watchd.port import gated
from watchd.store.checks import CheckRun
from watchd.store.connection import StoreError
from watchd.store.database import Store

__all__ = ["CheckService"]

_log = get_logger("watchd.checks")
Emit = Callable[[Event], Awaitable[None]]


class CheckService(CheckViews):
    def __init__(
        self,
        config: ChecksConfig,
        runner: CheckRunner,
        store: Store,
        clock: Clock,
        emit: Emit,
        metrics: CheckMetrics,
        periodic: Periodic | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.store = store
        self.clock = clock
        self.emit = emit
        self.metrics = metrics
        self.periodic = periodic
        self.order: Callable[[CheckSpec, dict[str, tuple[str, ...]]], Order | None] | None = None  # risk
        self.nic_seen: Callable[[str], float | None] = lambda node: None  # a node's last NIC evidence
        self._running: dict[str, str] = {}  # node -> run id (any check): a node runs one check at a time
        self._tasks: set[asyncio.Task[Any]] = set()
        self._rounds: dict[str, str] = {}  # check -> its round in progress
        self._validating: set[str] = set()
        self._jobs: dict[str, str] = {}  # run id -> the scheduler's job id (for the event)
        self._failing: dict[
            str, set[str]
        ] = {}  # node -> checks whose last result failed (awaiting validation)
        self.partner_waits = PartnerWaits(config, store, clock, emit)

    # ----------------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Follow the runs a restart interrupted, resume unfinished rounds, schedule every check."""
        for st in self.store.checks.all_nodes():
            if st.last_outcome in ("failed", "timeout"):
                self._failing.setdefault(st.node, set()).add(st.check)
        for run in self.store.checks.unfinished():
            self._spawn(self._follow(run))
        self.partner_waits.restore()
        now = self.clock.now()
        for spec in self.config.items:
            if spec.schedule is None:
                continue
            last = self.store.checks.last_round(spec.name)
            if last is not None and last[2] is None:
                self._spawn(self._round(spec, last[1], resumed=True))
            if self.periodic is not None:
                trigger, first = trigger_for(spec, last, now)
                self.periodic.schedule(trigger, self._scheduled(spec), f"check:{spec.name}", first)
        self._update_awaiting()

    def gate(self, refusal: Callable[[str], Awaitable[str | None]]) -> None:
        """Ask ``refusal`` right before every change validation makes to the cluster (leadership)."""
        self.runner = gated(self.runner, RUNNER_VERBS, refusal)

    async def stop(self) -> None:
        """Stop following (the jobs go on; the next start follows them again)."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _scheduled(self, spec: CheckSpec) -> Callable[[], Awaitable[None]]:
        async def fire() -> None:
            if spec.name in self._rounds:
                _log.info("check_round_still_running", check=spec.name, round=self._rounds[spec.name])
                return
            await self._round(spec, self.clock.now())

        return fire

    # ------------------------------------------------------------------------------------------- rounds
    async def run_round(self, name: str, scheduled_at: float | None = None) -> dict[str, Any]:
        """One round of check ``name`` now (tests, the benchmark): what it did."""
        spec = self._spec(name)
        return await self._round(spec, self.clock.now() if scheduled_at is None else scheduled_at)

    async def _round(self, spec: CheckSpec, scheduled_at: float, resumed: bool = False) -> dict[str, Any]:
        rid = plan.round_id(spec.name, scheduled_at)
        self._rounds[spec.name] = rid
        try:
            if CHECK_KINDS[spec.type].nodes_per_run > 1:
                pairs = PairRound(
                    self.runner, self.store.checks, self.config, self.clock, self._running, self._run_one
                )
                pairs.nic_seen = self.nic_seen
                return await pairs.run(spec, rid, scheduled_at, self._settle, self._finish_raw)
            return await self._round_body(spec, rid, scheduled_at, resumed)
        finally:
            self._rounds.pop(spec.name, None)

    async def _round_body(
        self, spec: CheckSpec, rid: str, scheduled_at: float, resumed: bool
    ) -> dict[str, Any]:
        store = self.store.checks
        store.begin_round(spec.name, rid, scheduled_at, self.clock.now())
        try:
            members = await self.runner.members(spec.partitions)
        except RunnerError as exc:
            _log.error("check_round_no_members", check=spec.name, error=str(exc))
            return {"round": rid, "error": str(exc)}
        cands = plan.candidates(spec, members)
        limits = plan.caps(
            spec, {p: members[p] for p in members if p in set(p for ps in cands.values() for p in ps)}
        )
        order = self.order(spec, cands) if self.order is not None else None  # planner: risk, its budget
        verdicts: dict[str, Verdict] = {}
        held: dict[str, tuple[str, Verdict]] = {}  # passed, waiting for the peers: node -> (run id, verdict)
        done: set[str] = set()
        for run in store.in_round(spec.name, rid):  # a resumed round: what it did before the restart
            if run.finished_at is not None and run.outcome is not None:
                done.add(run.node)
                carried = CHECK_KINDS[spec.type].carried
                v = Verdict(run.outcome, run.evidence, {k: run.figures.get(k) for k in carried})
                verdicts[run.node] = v
                if run.outcome == "passed" and not run.figures.get("emitted"):
                    held[run.node] = (run.run_id, v)
            else:
                done.add(run.node)  # followed by _follow since the start
        running: dict[str, tuple[str, ...]] = {}
        tasks: dict[asyncio.Task[tuple[str, str, Verdict, RunOutput]], str] = {}
        waiting: dict[str, str] = {}
        passed_over: dict[str, str] = {}
        while True:
            pending = [n for n in cands if n not in done and n not in running and n not in passed_over]
            if pending:
                try:
                    avail = await self.runner.availability(pending, spec.time_limit)
                except RunnerError as exc:
                    _log.warning("check_availability_failed", check=spec.name, error=str(exc))
                    avail = {}
                # a node running any check (this engine's) is busy whatever the scheduler says
                for node in pending:
                    if node in self._running and node in avail:
                        avail[node] = Availability(False, "already being checked", avail[node].partitions)
                chosen = plan.pick(
                    {n: cands[n] for n in pending},
                    avail,
                    store.nodes(spec.name),
                    running=running,
                    done=done,
                    limits=limits,
                    now=self.clock.now(),
                    order=order,
                )
                for node, why in chosen.passed_over.items():
                    passed_over[node] = why
                    self.metrics.passed_over.labels(spec.name, why.split(" ", 1)[0]).inc()
                waiting = chosen.waiting
                for node, partition in chosen.start:
                    running[node] = cands[node]
                    task = asyncio.ensure_future(self._run_one(spec, node, rid, partition))
                    tasks[task] = node
            if not tasks:
                break
            finished, _ = await asyncio.wait(list(tasks), return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                node = tasks.pop(task)
                running.pop(node, None)
                done.add(node)
                try:
                    _, run_id, verdict, output = task.result()
                except Exception:  # a bug must cost only this node's run
                    _log.exception("check_run_failed", check=spec.name, node=node)
                    continue
                verdicts[node] = verdict
                if verdict.outcome == "passed":
                    held[node] = (run_id, verdict)
                    self._finish(spec, node, run_id, verdict, emitted=False)
                else:
                    await self._settle(spec, node, rid, run_id, verdict, output)
        # the peers: nodes below their share of the round's median fail
        compared = judge_peers(verdicts, self.config.peers)
        for node, (run_id, verdict) in held.items():
            final = compared.get(node, verdict)
            await self._settle(spec, node, rid, run_id, final, None)
        self.store.checks.finish_round(spec.name, rid, self.clock.now())
        self.metrics.rounds.labels(spec.name).inc()
        summary = {
            "round": rid,
            "checked": sorted(verdicts),
            "failed": sorted(n for n, v in {**verdicts, **compared}.items() if v.outcome != "passed"),
            "not_idle": dict(sorted(waiting.items())),
            "passed_over": dict(sorted(passed_over.items())),
        }
        _log.info(
            "check_round_finished", check=spec.name, **{k: len(v) for k, v in summary.items() if k != "round"}
        )
        return summary

    # --------------------------------------------------------------------------------------------- runs
    async def _run_one(
        self,
        spec: CheckSpec,
        node: str,
        rid: str,
        partition: str | None,
        validation: bool = False,
        peers: tuple[str, ...] = (),
    ) -> tuple[str, str, Verdict, RunOutput]:
        if validation and not peers and CHECK_KINDS[spec.type].nodes_per_run > 1:  # with a known-good node
            pair = (self.runner, self.store.checks, spec, node, rid, self._running, self._run_one)
            return node, *await validate_pair(*pair, self.clock.now, self._skip)
        run_id = f"{spec.name}.{node}.{uuid.uuid4().hex[:10]}"
        self.store.checks.start(run_id, spec.name, node, rid, self.clock.now(), validation=validation)
        for busy in (node, *peers):
            self._running[busy] = run_id
        self.metrics.running.inc()
        try:
            job = CheckJob(
                check=spec.name,
                node=node,
                argv=tuple(spec.argv()),
                time_limit_s=spec.time_limit,
                run_id=run_id,
                partition=partition,
                validation=validation,
                peers=peers,
            )
            try:
                handle = await self.runner.submit(job)
            except RunnerError as exc:
                output = RunOutput("not_started", detail=str(exc))
            else:
                self.store.checks.submitted(run_id, handle.job_id, handle.output, handle.nonce)
                self._jobs[run_id] = handle.job_id
                output = await self.runner.wait(handle)
        finally:
            for busy in (node, *peers):
                self._running.pop(busy, None)
            self.metrics.running.dec()
        verdict = judge(spec, node, output, self.config.baselines)
        return node, run_id, verdict, output

    async def _follow(self, run: CheckRun) -> None:
        """A run a restart interrupted: follow its job to the end and settle it as if nothing happened."""
        spec = self.config.check(run.check)
        if spec is None or not run.job_id:
            self._finish_raw(run.run_id, "error", "the engine stopped before the job was submitted", {})
            return
        self._running[run.node] = run.run_id
        self._jobs[run.run_id] = run.job_id
        try:
            handle = JobHandle(
                run.run_id,
                run.node,
                run.job_id,
                run.job_output,
                run.started_at,
                spec.time_limit,
                run.job_nonce,
            )
            output = await self.runner.wait(handle)
        finally:
            self._running.pop(run.node, None)
        verdict = judge(spec, run.node, output, self.config.baselines)
        if CHECK_KINDS[spec.type].nodes_per_run > 1:  # a pair's run says nothing alone: its round is re-run
            self._finish_raw(run.run_id, verdict.outcome, verdict.evidence, dict(verdict.figures))
            return
        if verdict.outcome == "passed" and not run.validation and not run.round.startswith("run:"):
            self._finish(spec, run.node, run.run_id, verdict, emitted=False)  # the resumed round emits it
            return
        await self._settle(spec, run.node, run.round, run.run_id, verdict, output, validation=run.validation)

    def _finish_raw(self, run_id: str, outcome: str, evidence: str, figures: dict[str, Any]) -> None:
        try:
            self.store.checks.finish(run_id, self.clock.now(), outcome, evidence, figures)
        except StoreError as exc:
            _log.error("check_store_failed", run=run_id, error=str(exc), rate_limited=True)

    def _finish(
        self,
        spec: CheckSpec,
        node: str,
        run_id: str,
        verdict: Verdict,
        *,
        emitted: bool,
        count_round: bool = True,
    ) -> None:
        figures = {k: v for k, v in verdict.figures.items() if v is not None}
        figures["emitted"] = emitted
        try:
            st = self.store.checks.finish(
                run_id,
                self.clock.now(),
                verdict.outcome,
                verdict.evidence,
                figures,
                backoff=(spec.backoff.initial, spec.backoff.max),
                count_round=count_round,
            )
        except StoreError as exc:
            _log.error("check_store_failed", run=run_id, error=str(exc), rate_limited=True)
            return
        if st is not None and st.last_success is not None:
            self.metrics.last_success.labels(spec.name, node).set(st.last_success)
        if verdict.busbw is not None:
            self.metrics.busbw.labels(spec.name, node).set(verdict.busbw)

    async def _settle(
        self,
        spec: CheckSpec,
        node: str,
        rid: str,
        run_id: str,
        verdict: Verdict,
        output: RunOutput | None,
        *,
        validation: bool = False,
        count_round: bool = True,
    ) -> Event:
        """Record the run's final verdict, count it, and hand its event to the rules."""
        self._finish(spec, node, run_id, verdict, emitted=True, count_round=count_round)
        self.metrics.runs.labels(spec.name, verdict.outcome).inc()
        event = self.event(spec, node, rid, run_id, verdict, validation=validation)
        (_log.debug if verdict.passed else _log.warning)(
            "check_result", check=spec.name, node=node, outcome=verdict.outcome, evidence=verdict.evidence
        )
        failing = self._failing.setdefault(node, set())
        if verdict.outcome in ("failed", "timeout"):
            failing.add(spec.name)
        elif verdict.outcome == "passed":
            failing.discard(spec.name)
        if not failing:
            self._failing.pop(node, None)
        self.metrics.awaiting_validation.set(len(self._failing))
        await self.emit(event)
        return event

    def event(
        self, spec: CheckSpec, node: str, rid: str, run_id: str, verdict: Verdict, *, validation: bool = False
    ) -> Event:
        kind = CHECK_KINDS[spec.type]
        undeclared = undeclared_figures(kind, verdict.figures)
        if undeclared:  # a judge out of step with its row (tests/checks/test_kinds.py holds them together)
            _log.warning("check_figures_undeclared", check=spec.name, kind=kind.name, figures=undeclared)
        job = self._jobs.pop(run_id, None)
        return check_result(
            spec, node, rid, run_id, verdict, job=job, validation=validation, time=self.clock.now()
        )

    def _update_awaiting(self) -> None:
        self.metrics.awaiting_validation.set(len(self._failing))

    # ------------------------------------------------------------------------------- on demand, validate
    def _spec(self, name: str) -> CheckSpec:
        spec = self.config.check(name)
        if spec is None:
            raise KeyError(
                f"no check named {name!r} (configured: {', '.join(c.name for c in self.config.items)})"
            )
        return spec

    async def run_now(self, nodes: Sequence[str], names: Sequence[str] = ()) -> list[RunResult]:
        """``watchd checks run``: the named checks (default: the suite) on each node, now, if it is idle."""
        specs = [self._spec(n) for n in names] if names else self.config.node_suite()
        rid = f"run:{uuid.uuid4().hex[:8]}"
        try:
            avail = await self.runner.availability(
                list(nodes), max((s.time_limit for s in specs), default=60.0)
            )
        except RunnerError as exc:
            return [RunResult(node=n, outcome="error", passed=False, evidence=str(exc)) for n in nodes]

        async def on(node: str) -> list[RunResult]:
            a = avail.get(node)
            if a is None or not a.idle or node in self._running:
                why = (
                    "unknown node"
                    if a is None
                    else ("already being checked" if node in self._running else a.why)
                )
                return [
                    RunResult(node=node, check=s.name, outcome="skipped", passed=False, evidence=why)
                    for s in specs
                ]
            out: list[RunResult] = []
            failed: str | None = None  # the first check that found the node wanting
            for k, spec in enumerate(specs):
                # after a failure the rules may drain the node: the checks left would wait on it for their
                # whole time limit, then count as errors; they are skipped, saying why
                why = await self._left_service(node, failed) if failed else ""
                if not why:
                    _, run_id, verdict, output = await self._run_one(
                        spec, node, rid, (a.partitions or (None,))[0]
                    )
                    if output.status == "not_started":  # the node may have left service while it waited
                        why = await self._left_service(node, failed)
                        if why:
                            self._skip(run_id, why)
                if why:
                    out += [
                        RunResult(node=node, check=s.name, outcome="skipped", passed=False, evidence=why)
                        for s in specs[k:]
                    ]
                    break
                event = await self._settle(spec, node, rid, run_id, verdict, output, count_round=False)
                out.append(run_result(event))
                if failed is None and verdict.outcome in ("failed", "timeout"):
                    failed = spec.name
            return out

        results = await asyncio.gather(*(on(n) for n in dict.fromkeys(nodes)))
        return [r for rs in results for r in rs]

    async def _left_service(self, node: str, failed: str | None) -> str:
        """Why ``node`` left service (drained, down), in the words of ``watchd checks run``; "" while it is
        in service (busy or reserved is not out of service: a check waits for it as before)."""
        try:
            a = (await self.runner.availability([node], 60.0)).get(node)
        except RunnerError:
            return ""  # unknown: the next run tells
        if a is None or a.idle:
            return ""
        if a.why.startswith("drained"):
            what = "node drained"
        elif a.why.startswith("node is down"):
            what = "node down"
        else:
            return ""
        return f"{what} after {failed} failed" if failed else f"{what} before the check started"

    def _skip(self, run_id: str, why: str) -> None:
        self._jobs.pop(run_id, None)
        try:
            self.store.checks.skip(run_id, self.clock.now(), why)
        except StoreError as exc:
            _log.error("check_store_failed", run=run_id, error=str(exc), rate_limited=True)

    async def validate(self, node: str, round_id: str) -> Validation:
        """Run the suite on ``node`` (drained by watchd: the ``validate`` action checked), inside what the
        runner sets up for it, its runs recorded under ``round_id``; return the node to service only if
        every check passed, else drain it again with the new evidence."""
        specs = self.config.suite()
        if not specs:
            return Validation("refused", False, "no checks in the validation suite (checks.items[].in_suite)")
        if node in self._validating or node in self._running:
            return Validation("refused", False, f"{node} is already being checked")
        self._validating.add(node)
        results: list[RunResult] = []
        failed: list[tuple[str, str]] = []  # (tag: what sinfo -R shows of the reason, evidence)
        unchecked: list[tuple[str, str]] = []  # (check, evidence): pair checks without a partner
        unchecked_run: tuple[CheckSpec, str] | None = None
        try:
            try:
                await self.runner.begin_validation(node, sum(s.time_limit for s in specs))
            except RunnerError as exc:
                return Validation("failed", False, f"validation not begun: {exc}")
            try:
                for spec in specs:
                    _, run_id, verdict, output = await self._run_one(
                        spec, node, round_id, None, validation=True
                    )
                    if verdict.outcome == NOT_CHECKED:  # since when it waits survives a restart
                        since = self.partner_waits.since(node)
                        verdict = Verdict(NOT_CHECKED, verdict.evidence, {"waiting_since": since})
                    event = await self._settle(
                        spec, node, round_id, run_id, verdict, output, validation=True, count_round=False
                    )
                    results.append(run_result(event))
                    if verdict.outcome == NOT_CHECKED:
                        unchecked.append((spec.name, verdict.evidence))
                        unchecked_run = unchecked_run or (spec, run_id)
                    elif not verdict.passed:
                        failed.append((tag(spec.name, verdict.figures), verdict.evidence))
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.runner.end_validation(node, False, "validate interrupted")
                raise
            passed = not failed and not unchecked
            reason = validation_reason(failed, unchecked)
            try:
                done = await self.runner.end_validation(node, passed, reason)
            except RunnerError as exc:
                what = "resumed" if passed else "drained again"
                detail = f"the checks ran, but {node} was not {what}: {exc}"
                return Validation("interrupted", passed, detail, results)
        finally:
            self._validating.discard(node)
        if passed:
            self._failing.pop(node, None)  # validated: back in service
        self._update_awaiting()
        checks = ", ".join(str(r.get("check")) for r in results)
        detail = f"every check passed ({checks})" if passed else reason
        if done != "resumed" and not failed and unchecked_run is not None:
            self.partner_waits.wait(node, unchecked_run[0], round_id, unchecked_run[1], unchecked[0][1])
            return Validation("not_checked", False, detail, results)
        self.partner_waits.stop(node)
        return Validation("resumed" if done == "resumed" else "drained", passed, detail, results)

    # ------------------------------------------------------------------------ waiting for a pair partner
    @property
    def waiting(self) -> dict[str, Waiting]:
        """The nodes whose validation could not check their links (no partner): drained, tried again."""
        return self.partner_waits.nodes

    def stop_waiting(self, node: str) -> None:
        self.partner_waits.stop(node)

    async def page_waiting(self) -> list[str]:
        return await self.partner_waits.page()

    def waiting_validation(self) -> set[str]:
        """The nodes being validated now."""
        return set(self._validating)

    def busy_nodes(self) -> set[str]:
        """The nodes running a check of this engine's, or being validated."""
        return set(self._running) | self._validating

    async def recover(self, node: str, round_id: str, reason: str | None) -> Validation:
        """A validation a crash interrupted (the ``validate`` action driven again):
        :func:`watchd.checks.recovery.recover_validation`."""
        v = await recover_validation(self.config, self.store.checks, self.runner, node, round_id, reason)
        if v.passed and v.done != "interrupted":
            self._failing.pop(node, None)
            self._update_awaiting()
        return v
