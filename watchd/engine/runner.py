"""The engine as a service shell, in the style of aiohttp's runner: ``Engine(config)`` is inert (no file,
socket or task); :meth:`Engine.start` opens the state, loads the rules, restores what they remembered,
builds the integrations, starts the executor, the processor, the subsystems and their periodic jobs, then
serves; :meth:`Engine.cleanup` undoes it in reverse order, each step bounded (``async with`` does both).

The engine is the rules, the action executor and a list of subsystems (:mod:`watchd.subsystem`), composed
once: each takes the event kinds and the news (decisions, outcomes...) it subscribed to, through tables built
once; their periodic jobs, routes, collectors and status are theirs."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

from watchd.actions.agent_commands import AgentCommands
from watchd.actions.audit import MemoryAudit
from watchd.actions.executor import ActionExecutor, Pools
from watchd.actions.handler import Mode
from watchd.actions.handlers.validate import HANDLER as VALIDATE
from watchd.actions.marks import NodeMarks, unmark_with
from watchd.actions.remediation import Remediation
from watchd.actions.safety import BreakerLimits
from watchd.checks.metrics import CheckMetrics
from watchd.checks.registry import build_runner
from watchd.checks.service import CheckService
from watchd.checks.subsystem import Checks
from watchd.clock import Clock, SystemClock
from watchd.config import EngineConfig
from watchd.detect.correlator import Correlator
from watchd.detect.service import Detectors
from watchd.engine.acks import BatchAcks
from watchd.engine.dedup import SeenIds
from watchd.engine.heap import HeapPolicy
from watchd.engine.housekeeping import prune
from watchd.engine.lanes import IngestQueue
from watchd.engine.loop_lag import LoopLag
from watchd.engine.metrics import EngineMetrics
from watchd.engine.preflight import preflight
from watchd.engine.privileges import privileges
from watchd.engine.rule_keeper import RuleKeeper
from watchd.engine.server import make_app
from watchd.engine.status import EngineStatus
from watchd.fleetview.watch import FleetWatch
from watchd.httputil import HttpLimits, serve
from watchd.integrations.alertmanager.notifier import AlertmanagerNotifier, notifier_from_settings
from watchd.integrations.base import Scheduler, SchedulerError
from watchd.integrations.leadership import AlwaysLeader, Leadership
from watchd.integrations.registry import ElectedLeadership, build_leadership, build_scheduler, collectors
from watchd.integrations.webhook.sender import WebhookSender
from watchd.jobs.model import JobProvider, job_providers_of
from watchd.logs import get_logger
from watchd.model.action import ActionOutcome, NodeReturned
from watchd.model.events import Event
from watchd.periodic import Periodic
from watchd.reliability.subsystem import Reliability
from watchd.reports.engine_hook import UsageHook
from watchd.rules import RuleEngine, RuleSet
from watchd.store.database import Store
from watchd.store.held import HeldReleased
from watchd.store.opening import open_state
from watchd.subsystem import Dispatch, Housekeeping, News, Subsystem

_log = get_logger("watchd.engine")
_PROCESS_RUN = 500  # events evaluated per wake-up of the processing task, at most

#: seconds between write probes of the state database (how soon "unwritable" clears once space returns)
STORE_PROBE_S = 2.0
#: an ingest request finding the store unwritable probes it at once, at most this often
INLINE_PROBE_S = 0.25


class Engine:
    """The engine. What exists once started (``store``, ``executor``, ``alerts``, ``webhooks``, ``token``...;
    ``scheduler`` when it comes from the config) is set by :meth:`start`."""

    store: Store
    executor: ActionExecutor
    alerts: AlertmanagerNotifier | None
    webhooks: WebhookSender
    status_model: EngineStatus
    token: str | None
    reliability: Reliability
    fleet: FleetWatch
    commands: AgentCommands

    def __init__(
        self,
        config: EngineConfig,
        *,
        scheduler: Scheduler | None = None,
        use_config_scheduler: bool = True,
        clock: Clock | None = None,
        job_providers: list[JobProvider] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.metrics = EngineMetrics()
        self.metrics.leader.set_function(lambda: 1.0 if self._leading()[0] else 0.0)
        self.metrics.mode_enforce.set(1 if config.mode == "enforce" else 0)
        self.audit = MemoryAudit()
        self.scheduler = scheduler
        self._scheduler_from_config = scheduler is None and use_config_scheduler
        #: asked before acting: the elected leadership when replicas elect a leader, else always leading
        self.leadership: Leadership = AlwaysLeader()
        self._elector: ElectedLeadership | None = None
        self._job_providers = job_providers
        self.queue = IngestQueue(maxsize=config.ingest.queue_size)  # Xids before summaries (lanes.py)
        self.acks = BatchAcks(lambda: self.executor.deciding())  # what each ingest reply waits for
        self.seen = SeenIds(self.clock, config.ingest.dedup_window_s, config.ingest.dedup_max_ids)
        self.periodic = Periodic()
        reload = config.reload
        self.rule_keeper = RuleKeeper(
            config.rules,
            defaults=config.default_rules,
            snapshot_s=config.state.rules_snapshot_s,
            watch_s=reload.poll_interval_s if reload.watch_files else None,
            clock=self.clock,
            metrics=self.metrics,
            following=self.following,
        )
        self.detectors = Detectors(
            config.detectors, config.jobs, self.clock, self.metrics.registry, self.emit
        )
        self.usage = UsageHook(config.reports, self.metrics.registry, self.clock, slurm=config.slurm)
        self.checks: CheckService | None = None  # with checks.enabled
        self.subsystems: list[Subsystem] = []
        self.dispatch, self.news = Dispatch({}, ()), News([])  # the subsystems' tables, built with them
        self.port = 0
        self._stack = AsyncExitStack()
        self._processor: asyncio.Task[None] | None = None
        self._started = False
        self._probed_at = -1e18  # monotonic time of the last inline probe of an unwritable store
        self._fenced = False  # a shared store whose writes the elected leader's token fences
        self._executor_ready = asyncio.Event()
        self._takeovers: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------------------------ the parts

    @property
    def rules(self) -> RuleSet:
        return self.rule_keeper.rules

    @property
    def evaluator(self) -> RuleEngine:
        return self.rule_keeper.evaluator

    @property
    def correlator(self) -> Correlator:
        return self.detectors.correlator

    def reload_rules(self) -> bool:
        """Build the new rule set completely, then swap it in; on error the old one stays active."""
        return self.rule_keeper.reload()

    async def emit(self, event: Event) -> None:
        """An event the engine made (a finding, a check's result) to the rules: waits, never drops."""
        await self.queue.put((event, self.clock.monotonic()))

    def _acted(self, event: Event) -> None:
        """An action's outcome: news to the subsystems at once, then back to the rules."""
        self.news.publish(ActionOutcome(event))
        self._feed_back(event)

    def _feed_back(self, event: Event) -> None:
        """The engine's own events go back to the rules (e.g. the lemon-node rule counts drains)."""
        try:
            self.queue.put_nowait((event, self.clock.monotonic()))
        except asyncio.QueueFull:
            _log.warning("feedback_event_dropped_queue_full", node=event.node)

    # ------------------------------------------------------------------------------------ status

    def status(self, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The status document; ``query``: its paging and filters (see EngineStatus.document); each
        subsystem's part under its name."""
        document = self.status_model.document(query)
        for subsystem in self.subsystems:
            part = subsystem.status()
            if part is not None:
                document[subsystem.name] = part
        return document

    def ready(self) -> tuple[bool, str]:
        """Ready for traffic: unless replicas elect a leader and this one follows, or the state database does
        not take writes (decisions could not be recorded). In-memory only: never waits for the database."""
        healthy, detail = self.health()
        if not healthy:
            return False, detail
        return self._leading()

    def health(self) -> tuple[bool, str]:
        """Whether the state database takes writes (the last write or probe succeeded), and why not."""
        store = getattr(self, "store", None)
        if store is None or store.health.writable:
            return True, "ok"
        return False, f"state database unwritable: {store.health.reason}"

    def following(self) -> str | None:
        """Why this engine may not decide now: it follows over a shared store (its writes are fenced)."""
        elector = self._elector
        if self._fenced and elector is not None and not elector.is_leader:
            return f"follower (leader: {elector.holder or 'none yet'})"
        return None

    def _leading(self) -> tuple[bool, str]:
        elector = self._elector
        if elector is None:
            return True, "ok"
        return (True, "leader") if elector.is_leader else (False, f"follower (leader: {elector.holder})")

    def _leadership_changed(self, leading: bool) -> None:
        if leading:
            task = asyncio.create_task(self._took_over(), name="take-over")
            self._takeovers.add(task)  # referenced until done (the loop keeps only weak references)
            task.add_done_callback(self._takeovers.discard)

    async def _took_over(self) -> None:
        """Elected over a shared store: the rules' last snapshot, then the executor's recovery."""
        await self._executor_ready.wait()
        restored = self.rule_keeper.take_over()
        _log.info("took_over", rules_restored=restored)
        await self.executor.take_over()

    # ------------------------------------------------------------------------------------ the store

    def writable(self) -> bool:
        """Whether decisions can be recorded now: an unwritable store is probed again (one small write, at
        most every ``INLINE_PROBE_S``), so that writes resume as soon as space (or the lock) returns."""
        health = self.store.health
        if health.writable:
            return True
        now = self.clock.monotonic()
        if now - self._probed_at >= INLINE_PROBE_S:
            self._probed_at = now
            self._probe_store_now()
        return health.writable

    async def _probe_store(self) -> None:
        self._probe_store_now()

    def _probe_store_now(self) -> None:
        was = self.store.health.writable
        ok = self.store.probe(self.clock.now())
        if ok and not was:
            _log.warning("state_writable_again", path=self.store.path)
        if ok and self.following() is None and self._leading()[0]:
            self.executor.catch_up()  # what could not be finished or audited is now; interrupted: re-driven
        elif not ok and was:
            reason = self.store.health.reason
            _log.error("state_unwritable", path=self.store.path, reason=reason, rate_limited=True)

    def _store_failed(self, operation: str, error: Exception) -> None:
        self.metrics.store_errors.labels(operation).inc()

    # ------------------------------------------------------------------------------------ operators

    def held(self) -> list[dict[str, Any]]:
        return self.status_model.held()

    async def release(self, held_id: int, by: str) -> dict[str, str]:
        result = await self.executor.release(held_id, by)
        held = self.store.held.get(held_id)
        if held is not None and held.status == "released":  # a drain taken out now: a failure from now
            self.news.publish(HeldReleased(held, result.outcome.value, self.clock.now(), self.config.mode))
        return {"outcome": result.outcome, "detail": result.detail}

    def discard(self, held_id: int, by: str) -> dict[str, str]:
        result = self.executor.discard(held_id, by)
        return {"outcome": result.outcome, "detail": result.detail}

    async def resume(self, node: str, by: str) -> dict[str, str]:
        """An operator's resume of ``node``, through the executor (audited; a node watchd did not drain is
        refused by the scheduler)."""
        result = await self.executor.operator_resume(node, by)
        if result.outcome == "resumed":
            self.news.publish(NodeReturned(node, self.clock.now()))
        return {"outcome": result.outcome, "detail": result.detail}

    async def validate(self, node: str, note: str, mode: Mode | None = "enforce") -> dict[str, Any]:
        """``watchd node validate`` (an operator: enforce), or ``checks.auto_validate`` (None: the engine's
        mode): the ``validate`` action, the check suite, then back in service only if every check passed."""
        params = {"round": f"validate:{uuid.uuid4().hex[:8]}"}
        result = await self.executor.act(VALIDATE.kind, node, params, rule="validate", note=note, mode=mode)
        if result.outcome == "resumed":  # back in service through its validation: its failures end here
            self.news.publish(NodeReturned(node, self.clock.now()))
        return {"outcome": result.outcome.value, "detail": result.detail, **result.data}

    def evaluated(self, event: Event) -> asyncio.Future[None]:
        """Done once ``event`` has been evaluated and the decisions handed to the executor until then have
        been recorded (their intents or audit records written) or failed to be."""
        return self.acks.evaluated(event)

    def unrecorded(self, events: Sequence[Event]) -> str | None:
        """Why a decision made on one of ``events`` could not be recorded, or None (asked once, after
        :meth:`evaluated`)."""
        return self.acks.unrecorded(events)

    def recent_actions(self, limit: int) -> list[dict[str, Any]]:
        return self.status_model.recent_actions(limit)

    # ---------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open, load, restore and build; start the tasks, the subsystems and the periodic jobs; serve. Any
        failure undoes what was done, in reverse order, and is raised (a ConfigError names file and key)."""
        if self._started:
            raise RuntimeError("the engine is already started")
        stack = self._stack
        await stack.__aenter__()
        try:
            await self._start(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._started = True
        _log.info(
            "engine_started",
            host=self.config.listen.host,
            port=self.port,
            mode=self.config.mode,
            rules=len(self.rules.rules),
            auth=self.token is not None,
            scheduler=self.scheduler.name if self.scheduler else None,
            state=str(self.config.state.path),
            alertmanagers=len(self.config.alertmanager.urls),
        )

    async def _start(self, stack: AsyncExitStack) -> None:
        config = self.config
        checked = preflight(config)  # what `watchd engine --check` checks, before anything is opened
        self.token, credentials, tls = checked.token, checked.credentials, checked.tls
        self.rule_keeper.load()
        self.store = open_state(config.state)
        stack.callback(self.store.close)
        self.metrics.store_writable.set_function(lambda: 1.0 if self.store.health.writable else 0.0)
        self.store.on_error(self._store_failed)
        self.rule_keeper.attach(self.store)
        stack.callback(self.rule_keeper.save_now)  # after the processor stopped, before the close
        self._lead(stack)
        if self.scheduler is not None:
            await privileges(self.scheduler, self.metrics.scheduler_privileged)
        self._build_executor()
        self.subsystems = self._build_subsystems()
        for collector in [*(c for s in self.subsystems for c in s.collectors()), *collectors(self.config)]:
            self.metrics.registry.register(collector)
            stack.callback(self.metrics.registry.unregister, collector)
        self.dispatch, self.news = Dispatch.of(self.subsystems), News(self.subsystems)
        await stack.enter_async_context(self.webhooks)
        if self.alerts is not None:
            await stack.enter_async_context(self.alerts)
        if self._elector is not None:
            self._elector.start()  # campaigns from now on; stopped (the Lease handed over) after the executor
            stack.push_async_callback(self._elector.stop)
            if self._fenced:
                stack.callback(self.rule_keeper.save_now)  # the last snapshot, while still the leader
        await self._refresh_pools()
        await stack.enter_async_context(self.executor)
        self._executor_ready.set()
        self._processor = asyncio.create_task(self._process(), name="engine-processor")
        periodic = self.periodic
        periodic.every(config.safety.pools_refresh_s, self._refresh_pools, "pools")
        periodic.every(3600.0, self._prune, "prune")
        periodic.every(STORE_PROBE_S, self._probe_store, "store-probe")
        for subsystem in self.subsystems:
            await subsystem.start()
            stack.push_async_callback(subsystem.stop)
            for job in subsystem.jobs():
                periodic.every(job.every_s, job.run, job.name)
        periodic.start()
        stack.push_async_callback(self._stop_tasks)
        app = make_app(
            token=self.token,
            queue=self.queue,
            seen=self.seen,
            metrics=self.metrics,
            clock=self.clock,
            max_body_bytes=config.ingest.max_body_bytes,
            max_events=config.ingest.max_events_per_batch,
            engine=self,
            ack_timeout_s=config.ingest.ack_timeout_s,
            limits=HttpLimits.of(config.http),
            credentials=credentials,
            subsystems=self.subsystems,
        )
        self.port = await stack.enter_async_context(
            serve(app, config.listen.host, config.listen.port, HttpLimits.of(config.http), tls)
        )

    def _lead(self, stack: AsyncExitStack) -> None:
        """The scheduler and the leadership from the config; over a shared store the database lease's token
        fences every write."""
        if self._scheduler_from_config:
            self._elector = build_leadership(self.config)
            self.scheduler = build_scheduler(self.config)
        if self._elector is not None:
            self.leadership = self._elector
            if self.store.shared:
                from watchd.integrations.dblease import DatabaseLease

                if isinstance(self._elector, DatabaseLease):
                    self.store.connection.fence = self._elector
                    self._elector.on_change = self._leadership_changed
                    self._fenced = True
        aclose = getattr(self.scheduler, "aclose", None)
        if aclose is not None:
            stack.push_async_callback(aclose)  # runs late: after the executor and processor stopped

    def _build_executor(self) -> None:
        config = self.config
        self.alerts = (
            notifier_from_settings(
                config.alertmanager, registry=self.metrics.registry, clock=self.clock, periodic=self.periodic
            )
            if config.alertmanager.urls
            else None
        )
        self.webhooks = WebhookSender()
        safety = config.safety
        self.executor = ActionExecutor(
            self.scheduler,
            config.mode,
            self.clock,
            self.metrics,
            self.audit,
            store=self.store,
            alerts=self.alerts,
            webhooks=self.webhooks,
            limits=BreakerLimits(safety.max_fraction, safety.max_nodes, safety.window_s),
            cooldown_s=config.actions.cooldown_s,
            max_concurrent=config.actions.max_concurrent,
            feedback=self._acted,
            generator_url=config.external_url.rstrip("/"),
            leadership=self.leadership,
            recover_at_start=not self._fenced,
        )
        self.status_model = EngineStatus(
            clock=self.clock,
            store=self.store,
            executor=self.executor,
            correlator=self.detectors.correlator,
            findings=self.detectors.findings,
            queue=self.queue,
            rule_names=lambda: self.rules.names,
            scheduler=self.scheduler.name if self.scheduler is not None else None,
            alerts=self.alerts,
            breaker_window_s=safety.window_s,
        )

    def _build_subsystems(self) -> list[Subsystem]:
        """The subsystems in their start order (they stop in reverse); the executor's services (spares,
        validation) are attached to it before it starts: its recovery drives their actions again."""
        config = self.config
        providers = self._job_providers
        self.detectors.providers = providers if providers is not None else job_providers_of(self.scheduler)
        self.reliability = Reliability(
            config.reliability,
            self.store,
            self.clock,
            self.detectors.correlator.topology,
            lambda node: self.executor.pools.of_node.get(node, []),
            emit=self.emit,
        )
        leading = lambda: self._leading()[0]  # noqa: E731
        self.fleet = FleetWatch.of_engine(
            self.scheduler,
            self.executor,
            drains=config.drains,
            spares=config.spares,
            clock=self.clock,
            registry=self.metrics.registry,
            emit=self._feed_back,
            leading=leading,
        )
        self.usage.attach(self.store, config.state.path)
        subsystems: list[Subsystem] = [self.rule_keeper, self.detectors, self.reliability, self.fleet]
        watch = self.fleet  # every return to service, also those watchd is not told of, ends a failure
        self.reliability.fleet_listing = lambda: (
            None if watch.listed_at is None else (watch.nodes, watch.listed_at)
        )
        if config.checks.enabled:
            runner = build_runner(config.checks.runner, config)
            metrics = CheckMetrics(self.metrics.registry)
            service = CheckService(
                config.checks, runner, self.store, self.clock, self.emit, metrics, self.periodic
            )
            service.gate(self.executor.leader_gate.now)
            self.checks = service
            checks = Checks(service, self.validate, frozenset(config.checks.auto_validate))
            fleet = self.fleet  # idle partners for the validations waiting for one: the listing it keeps
            checks.fleet_nodes = lambda: fleet.nodes if fleet.listed_at is not None else None
            checks.leading = leading
            self.reliability.validating = service.waiting_validation
            subsystems.append(checks)
        audit, remediation, marks = self.store.audit, config.remediation, self.store.nodes.open_marks
        self.commands = AgentCommands(
            self.clock,
            self.metrics.registry,
            max_pending=remediation.max_commands,
            leading=leading,
            bindings=self.store.command_bindings,
        )
        self.marks = NodeMarks(
            self.store.nodes, unmark_with(self.executor), self.clock, leading, self.metrics.registry
        )
        subsystems += [
            self.usage,
            self.marks,  # lemons and nodes left for a person: out until cleared
            Remediation(self.scheduler, audit, remediation, self.clock, self.emit, leading, marks),
            self.commands,  # the agents' commands (a GPU reset): their intents and bindings durable
            LoopLag(self.metrics.registry),
            HeapPolicy(),  # last: it starts with everything built, and freezes it
        ]
        self.executor.attach(
            spares=self.fleet,
            validation=self.checks,
            keep_spare_s=config.spares.keep_for_requeued_s,
            commands=self.commands,
        )
        return subsystems

    async def cleanup(self) -> None:
        """Stop serving, evaluate what was accepted (bounded), stop the jobs, the subsystems and the executor
        (bounded), hand over the lead, close the integrations, save what the rules remember, close the
        state: the reverse of :meth:`start`."""
        await self._stack.aclose()
        if self._started:
            self._started = False
            _log.info("engine_stopped")

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.cleanup()

    async def _stop_tasks(self) -> None:
        # Ingest is closed by now: evaluate what was accepted (bounded), then stop.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.queue.join(), timeout=5.0)
        await self.periodic.stop(timeout=5.0)
        if self._processor is not None:
            self._processor.cancel()
            await asyncio.gather(self._processor, return_exceptions=True)
            self._processor = None
        for task in list(self._takeovers):
            task.cancel()
        await asyncio.gather(*self._takeovers, return_exceptions=True)

    # ---------------------------------------------------------------------------------------- periodic

    async def _refresh_pools(self) -> None:
        if self.scheduler is None:
            return
        try:
            self.executor.pools = Pools.from_members(await self.scheduler.pools())
        except SchedulerError as exc:
            _log.warning("pools_unavailable", error=str(exc))

    async def _prune(self) -> None:
        if self.following() is None:  # the leader prunes a shared store
            prune(self.store, self.config, now := self.clock.now())
            self.news.publish(Housekeeping(now))

    # ---------------------------------------------------------------------------------------- the stream

    async def _process(self) -> None:
        queue, acks, keeper = self.queue, self.acks, self.rule_keeper
        handlers, publish = self.dispatch.handlers, self.news.publish
        with_job, submit = self.detectors.with_job, self.executor.submit
        while True:
            event, received_at = await queue.get()
            # then the rest queued, at most _PROCESS_RUN: one wake-up per run; then sleep(0) lets ingest in
            run = 0
            while True:
                try:
                    for handle in handlers(event.kind):
                        handle(event)
                    for decision in keeper.evaluator.evaluate(with_job(event)):
                        publish(decision)
                        self.metrics.rule_matches.labels(decision.rule).inc()
                        acks.decided(event, submit(decision, received_at))
                except Exception:
                    _log.exception("evaluation_failed", event_id=event.id, node=event.node)
                acks.settle(event)
                queue.task_done()
                run += 1
                if run == _PROCESS_RUN or queue.empty():
                    break
                event, received_at = queue.get_nowait()
            self.metrics.queue_depth.set(queue.qsize())
            if run == _PROCESS_RUN:
                await asyncio.sleep(0)
