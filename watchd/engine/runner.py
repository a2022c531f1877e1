"""The engine as a service shell, in the style of aiohttp's runner: ``Engine(config)`` is inert (no file,
socket or task); :meth:`Engine.start` opens the state, loads the rules, restores what they remembered,
builds the integrations, starts the executor, the processor and the periodic jobs, then serves;
:meth:`Engine.cleanup` undoes it in reverse order, each step bounded. ``async with Engine(...)`` does both."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import deque
from collections.abc import Coroutine, Mapping
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

from watchd.actions.attempt import Mode
from watchd.actions.audit import MemoryAudit
from watchd.actions.executor import ActionExecutor, Pools
from watchd.actions.handlers.validate import HANDLER as VALIDATE
from watchd.actions.outcome import ActionResult
from watchd.actions.safety import BreakerLimits
from watchd.checks.service import CheckService
from watchd.clock import Clock, SystemClock
from watchd.config import EngineConfig
from watchd.detect.correlator import Correlator
from watchd.detect.finding import Finding
from watchd.engine.dedup import SeenIds
from watchd.engine.fleet import FleetWatch, GatedFleet
from watchd.engine.metrics import EngineMetrics
from watchd.engine.reliability import Reliability
from watchd.engine.server import Accepted, make_app
from watchd.engine.status import EngineStatus
from watchd.errors import ConfigError
from watchd.httputil import HttpLimits, serve
from watchd.integrations.alertmanager.notifier import AlertmanagerNotifier
from watchd.integrations.base import Scheduler, SchedulerError
from watchd.integrations.fleet import FleetBackend, fleet_backends
from watchd.integrations.leadership import AlwaysLeader, Leadership
from watchd.integrations.registry import ElectedLeadership, build_leadership, build_scheduler
from watchd.integrations.webhook.sender import WebhookSender
from watchd.jobs.model import JobProvider, JobProviderError, job_providers_of
from watchd.jobs.topology import JobTopology
from watchd.logs import get_logger
from watchd.model.events import Event
from watchd.periodic import Periodic
from watchd.reports.engine_hook import FLUSH_S as USAGE_FLUSH_S
from watchd.reports.engine_hook import UsageHook
from watchd.rules import RuleEngine, RuleSet, load_rules
from watchd.rules.loader import rule_files
from watchd.rules.persist import StateCopy, state_to_data
from watchd.security import engine_credentials, listener_tls
from watchd.store.connection import StoreError
from watchd.store.database import Store

_log = get_logger("watchd.engine")
_PROCESS_RUN = 500  # events evaluated per wake-up of the processing task, at most


#: The engine writes the state database on its event loop: a write waits this long for another process's
#: lock, then fails (the batch is answered 503 and the agent re-sends it), so that a lock held by someone
#: else never stalls ingest, /healthz and the detectors for the whole default busy timeout.
BUSY_TIMEOUT_S = 0.1
#: seconds between write probes of the state database (how soon "unwritable" clears once space returns)
STORE_PROBE_S = 2.0
#: an ingest request finding the store unwritable probes it at once, at most this often
INLINE_PROBE_S = 0.25


def open_store(config: EngineConfig) -> Store:
    if config.state.kind == "postgres":  # issue 22: shared by the engines of an HA pair
        pg = config.state.postgres
        dsn, password = pg.resolve()
        return Store.open_postgres(
            dsn,
            password,
            lock_timeout_s=pg.lock_timeout_s,
            statement_timeout_s=pg.statement_timeout_s,
            connect_timeout_s=pg.connect_timeout_s,
        )
    path = config.state.path
    if path is None:
        _log.warning(
            "state_not_durable",
            hint="set state.path: decisions, cooldowns and the breaker are lost on restart",
        )
        return Store.open(":memory:")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"state.path: cannot create {path.parent}: {exc.strerror}") from None
    return Store.open(path, busy_timeout_s=BUSY_TIMEOUT_S)


def _encode_snapshot(snapshot: dict[str, tuple[str, StateCopy]]) -> dict[str, tuple[str, str]]:
    return {
        rule: (fp, json.dumps(state_to_data(copy), separators=(",", ":")))
        for rule, (fp, copy) in snapshot.items()
    }


class Engine:
    """The engine. The parts that exist once started (``rules``, ``evaluator``, ``store``, ``executor``,
    ``alerts``, ``webhooks``, ``status_model``, ``token``; ``scheduler`` when it comes from the config) are
    set by :meth:`start`."""

    rules: RuleSet
    evaluator: RuleEngine
    store: Store
    executor: ActionExecutor
    alerts: AlertmanagerNotifier | None
    webhooks: WebhookSender
    status_model: EngineStatus
    token: str | None
    reliability: Reliability  # issue 17: reliability accounting and checkpoint advice
    fleet: FleetWatch

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
        self.job_providers: list[JobProvider] = []
        self.correlator = Correlator(config.detectors, JobTopology(config.jobs.member_ttl_s))
        self.findings: deque[Finding] = deque(maxlen=200)
        self._jobs_refreshed_at = -1e18
        self._rule_state_saved = False
        self._next_rule_save = -1.0
        self._rule_mtimes: dict[str, float] = {}
        self.queue: asyncio.Queue[Accepted] = asyncio.Queue(maxsize=config.ingest.queue_size)
        self._acks: dict[int, asyncio.Future[None]] = {}  # id(queued event) -> its batch's reply waits
        self.seen = SeenIds(self.clock, config.ingest.dedup_window_s, config.ingest.dedup_max_ids)
        self._evictions_seen: dict[str, int] = {}  # fleet evictions already counted, by what
        self._groups_evaluator, self._groups_seen = 0, 0  # the rule engine whose evictions were counted
        self.periodic = Periodic()
        self.usage = UsageHook(config.reports, self.metrics.registry, self.clock)  # issue 18
        self.port = 0
        self._stack = AsyncExitStack()
        self._processor: asyncio.Task[None] | None = None
        self._started = False
        self._probed_at = -1e18  # monotonic time of the last inline probe of an unwritable store
        self._ack_waiters: set[asyncio.Future[Any]] = set()
        self.checks: CheckService | None = None  # issue 21: active checks (watchd.engine.checks_api)
        self._auto_validate = frozenset(config.checks.auto_validate) if config.checks.enabled else frozenset()
        self._fenced = False  # a shared store whose writes the elected leader's token fences (issue 22)
        self._executor_ready = asyncio.Event()
        self._takeovers: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Task[Any]] = set()  # automatic validations

    # ---------------------------------------------------------------------------------------- rules

    def reload_rules(self) -> bool:
        """Build the new rule set completely, then swap it in; on error the old one stays active."""
        self._rule_mtimes = self._mtimes()
        try:
            new = load_rules(self.config.rules)
            evaluator = new.engine()
            evaluator.carry_state_from(self.evaluator)
        except ConfigError as exc:
            _log.error("rules_reload_failed", error=str(exc))
            self.metrics.rules_reload_ok.set(0)
            return False
        except Exception as exc:  # a loader bug must not take the old rules (or the watcher) with it
            _log.exception("rules_reload_failed", error=f"{type(exc).__name__}: {exc}")
            self.metrics.rules_reload_ok.set(0)
            return False
        self.rules, self.evaluator = new, evaluator
        self.metrics.rules_loaded.set(len(new.rules))
        self.metrics.rules_reload_ok.set(1)
        self.metrics.rules_reload_time.set(self.clock.now())
        _log.info("rules_reloaded", rules=len(new.rules))
        return True

    def _restore_rule_state(self, saved: dict[str, tuple[str, str]]) -> None:
        """What the rules remembered when the engine last saved it (a restart, clean or not, neither resets
        a count window nor a cooldown). A state that cannot be used is logged and left out, never fatal."""
        decoded: dict[str, tuple[str, Any]] = {}
        skipped: list[str] = []
        for rule, (fp, text) in saved.items():
            try:
                decoded[rule] = (fp, json.loads(text))
            except ValueError as exc:
                skipped.append(f"{rule}: unreadable JSON: {exc}")
        restored, left_out = self.evaluator.restore(decoded)
        skipped += left_out
        for reason in skipped:
            _log.warning("rule_state_not_restored", reason=reason)
        if saved:
            _log.info("rule_state_restored", rules=len(restored), skipped=len(skipped))

    async def _save_rule_state(self) -> None:
        if self.following() is not None:
            return  # the leader's snapshot is the one that counts
        started = self.clock.monotonic()
        if started < self._next_rule_save:
            return
        snapshot = self.evaluator.snapshot()  # a copy, here: evaluation may go on while it is encoded
        if snapshot or self._rule_state_saved:
            encoded = await asyncio.to_thread(_encode_snapshot, snapshot)
            try:
                self.store.rule_state.save(encoded, self.clock.now())
            except StoreError as exc:  # counted and reported (metrics, /readyz); the next snapshot retries
                _log.error("rule_state_save_failed", error=str(exc))
                return
            self._rule_state_saved = bool(snapshot)
        # a huge state (100,000s of groups) takes seconds to encode: then save less often, so that
        # saving never takes more than a tenth of the engine's time
        self._next_rule_save = started + 10 * (self.clock.monotonic() - started)

    def _save_rule_state_now(self) -> None:
        if self.following() is not None:
            return
        try:
            self.store.rule_state.save(_encode_snapshot(self.evaluator.snapshot()), self.clock.now())
        except Exception:  # shutdown goes on: the last periodic snapshot is what the next start gets
            _log.exception("rule_state_save_failed")

    def _mtimes(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for path in self.config.rules:
            try:  # a folder removed or renamed, or a file mid-rename: it reads as changed, not as a crash
                files = rule_files(path)
            except OSError:
                out[str(path)] = -1.0
                continue
            for f in files:
                with contextlib.suppress(OSError):
                    out[str(f)] = f.stat().st_mtime
        return out

    async def _check_rule_files(self) -> None:
        if self._mtimes() != self._rule_mtimes:
            _log.info("rule_files_changed")
            self.reload_rules()

    # ---------------------------------------------------------------------------------------- status

    def _feed_back(self, event: Event) -> None:
        """The engine's own actions go back to the rules (e.g. the lemon-node rule counts drains)."""
        self.reliability.feedback(event)  # a drain on hardware evidence is a failure (issue 17)
        try:
            self.queue.put_nowait((event, self.clock.monotonic()))
        except asyncio.QueueFull:
            _log.warning("feedback_event_dropped_queue_full", node=event.node)

    def status(self, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The status document; ``query``: its paging and filters (see EngineStatus.document)."""
        document = self.status_model.document(query)
        if self.checks is not None:
            document["checks"] = self.checks.status()
        document["drains"] = self.fleet.summary()  # issue 17: nodes out of service by owner, spares
        return document

    async def drains(self, refresh: bool = False) -> dict[str, Any]:
        """Every node out of service in the fleet, classified (``watchd drains``); ``refresh``: list now."""
        if refresh:
            await self.fleet.poll()
        return self.fleet.document()

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

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)  # referenced until done (the loop keeps only weak references)
        task.add_done_callback(self._background.discard)

    def _leadership_changed(self, leading: bool) -> None:
        if leading:
            task = asyncio.create_task(self._took_over(), name="take-over")
            self._takeovers.add(task)  # referenced until done (the loop keeps only weak references)
            task.add_done_callback(self._takeovers.discard)

    async def _took_over(self) -> None:
        """Elected over a shared store (issue 22): what the rules remembered at the previous leader's last
        snapshot, then its unfinished actions and firing alerts (the executor's recovery)."""
        await self._executor_ready.wait()
        try:
            saved = self.store.rule_state.load()
        except StoreError as exc:
            _log.error("rule_state_not_loaded", error=str(exc))
            saved = {}
        self._rule_state_saved = bool(saved)
        self._restore_rule_state(saved)
        _log.info("took_over", rules_restored=len(saved))
        await self.executor.take_over()

    def _leading(self) -> tuple[bool, str]:
        elector = self._elector
        if elector is None:
            return True, "ok"
        return (True, "leader") if elector.is_leader else (False, f"follower (leader: {elector.holder})")

    def store_error(self) -> str:
        """The last failed write's error (kept after writes resume)."""
        return self.store.health.last_error

    def store_failures(self) -> int:
        """Failed writes of the state database so far: ingest compares it before and after a batch."""
        return self.store.health.failures + self.store.health.fenced  # fenced: not recorded either

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
            self.executor.redrive_stale()  # what could not be finished is finished and audited now
        elif not ok and was:
            _log.error("state_unwritable", path=self.store.path, reason=self.store.health.reason)

    def held(self) -> list[dict[str, Any]]:
        return self.status_model.held()

    async def release(self, held_id: int, by: str) -> dict[str, str]:
        result = await self.executor.release(held_id, by)
        return {"outcome": result.outcome, "detail": result.detail}

    def discard(self, held_id: int, by: str) -> dict[str, str]:
        result = self.executor.discard(held_id, by)
        return {"outcome": result.outcome, "detail": result.detail}

    async def resume(self, node: str, by: str) -> dict[str, str]:
        """An operator's resume of ``node``, through the executor (audited; a node watchd did not drain is
        refused by the scheduler)."""
        result = await self.executor.operator_resume(node, by)
        if result.outcome == "resumed":
            self.reliability.restored(node, self.clock.now())
        return {"outcome": result.outcome, "detail": result.detail}

    async def validate(self, node: str, note: str, mode: Mode | None = "enforce") -> dict[str, Any]:
        """``watchd node validate`` (an operator: enforce), or ``checks.auto_validate`` (the engine's mode):
        the ``validate`` action, the check suite, then back to service only if every check passed."""
        params = {"round": f"validate:{uuid.uuid4().hex[:8]}"}
        result = await self.executor.act(VALIDATE.kind, node, params, rule="validate", note=note, mode=mode)
        return {"outcome": result.outcome.value, "detail": result.detail, **result.data}

    def evaluated(self, event: Event) -> asyncio.Future[None]:
        """Done once ``event`` has been evaluated and the decisions handed to the executor until then have
        run (their intents and audit records written, or failed to be)."""
        fut = self._acks.get(id(event))  # the queue holds the event: its id is not reused meanwhile
        if fut is None:
            fut = self._acks[id(event)] = asyncio.get_running_loop().create_future()
        return fut

    def recent_actions(self, limit: int) -> list[dict[str, Any]]:
        return self.status_model.recent_actions(limit)

    # ---------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open, load, restore and build; start the tasks and the periodic jobs; serve. Any failure undoes
        what was done, in reverse order, and is raised (a ConfigError names the file and the key)."""
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
        self.token = config.auth.resolve()
        credentials = engine_credentials(config.auth)  # issue 22: tokens by role, TLS
        tls = listener_tls(config.listen, "listen")
        self.rules = load_rules(config.rules)
        self.evaluator = self.rules.engine()
        self._rule_mtimes = self._mtimes()
        self.metrics.rules_loaded.set(len(self.rules.rules))
        self.metrics.rules_reload_ok.set(1)
        self.store = open_store(config)
        stack.callback(self.store.close)
        self.metrics.store_writable.set_function(lambda: 1.0 if self.store.health.writable else 0.0)
        self.store.on_error(self._store_failed)
        saved = self.store.rule_state.load()
        self._rule_state_saved = bool(saved)  # a saved state must be replaced, even by none
        self._restore_rule_state(saved)
        stack.callback(self._save_rule_state_now)  # after the processor stopped, before the close
        if self._scheduler_from_config:
            self._elector = build_leadership(config)
            self.scheduler = build_scheduler(config)
        if self._elector is not None:
            self.leadership = self._elector
            if self.store.shared:  # issue 22: the database lease's token fences every write
                from watchd.integrations.dblease import DatabaseLease

                if isinstance(self._elector, DatabaseLease):
                    self.store.connection.fence = self._elector
                    self._elector.on_change = self._leadership_changed
                    self._fenced = True
        aclose = getattr(self.scheduler, "aclose", None)
        if aclose is not None:
            stack.push_async_callback(aclose)  # runs late: after the executor and processor stopped
        self.job_providers = (
            self._job_providers if self._job_providers is not None else job_providers_of(self.scheduler)
        )
        self.alerts = (
            AlertmanagerNotifier(
                config.alertmanager.urls,
                registry=self.metrics.registry,
                clock=self.clock,
                resend_interval=config.alertmanager.resend_interval_s,
                timeout=config.alertmanager.timeout_s,
                periodic=self.periodic,
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
            feedback=self._feed_back,
            generator_url=config.external_url.rstrip("/"),
            leadership=self.leadership,
            recover_at_start=not self._fenced,
        )
        self.status_model = EngineStatus(
            clock=self.clock,
            store=self.store,
            executor=self.executor,
            correlator=self.correlator,
            findings=self.findings,
            queue=self.queue,
            rule_names=lambda: self.rules.names,
            scheduler=self.scheduler.name if self.scheduler is not None else None,
            alerts=self.alerts,
            breaker_window_s=safety.window_s,
            reliability=lambda: self.reliability.summary(),
        )
        # issue 17: reliability accounting and checkpoint advice (docs/reliability.md)
        self.reliability = Reliability(
            config.reliability,
            self.store,
            self.clock,
            self.correlator.topology,
            lambda node: self.executor.pools.of_node.get(node, []),
        )
        self.metrics.registry.register(self.reliability.metrics_collector)
        stack.callback(self.metrics.registry.unregister, self.reliability.metrics_collector)
        stack.callback(self.reliability.flush_now)  # runs before the store closes
        # issue 17: the whole fleet's drains and the hot spares
        gate = self.executor.leader_gate
        backends: list[FleetBackend] = []
        for backend in fleet_backends(self.scheduler):
            if hasattr(backend, "reservation_users"):  # Slurm: the Users= of the spares' reservation
                backend.reservation_users = config.spares.slurm_users
            backends.append(GatedFleet(backend, gate))

        async def spare_action(kind: str, node: str, params: Mapping[str, Any]) -> ActionResult:
            return await self.executor.act(kind, node, params, rule="spares")

        self.fleet = FleetWatch(
            backends,
            drains=config.drains,
            spares=config.spares,
            clock=self.clock,
            registry=self.metrics.registry,
            store=self.store,
            emit=self._feed_back,
            act=spare_action,
            leading=lambda: self._leading()[0],
        )
        if config.checks.enabled:  # issue 21: scheduled checks, validated return to service
            from watchd.engine import checks_api

            self.checks = checks_api.build_service(self)
            self.checks.gate(gate.now)
        # before the executor starts: its recovery may re-drive a spare change or a validation
        self.executor.attach(
            spares=self.fleet, validation=self.checks, keep_spare_s=config.spares.keep_for_requeued_s
        )
        await stack.enter_async_context(self.webhooks)
        if self.alerts is not None:
            await stack.enter_async_context(self.alerts)
        if self._elector is not None:
            self._elector.start()  # campaigns from now on; stopped (the Lease handed over) after the executor
            stack.push_async_callback(self._elector.stop)
            if self._fenced:
                stack.callback(self._save_rule_state_now)  # the last snapshot, while still the leader
        await self._refresh_pools()
        await stack.enter_async_context(self.executor)
        self._executor_ready.set()
        self._processor = asyncio.create_task(self._process(), name="engine-processor")
        periodic = self.periodic
        periodic.every(safety.pools_refresh_s, self._refresh_pools, "pools")
        periodic.every(3600.0, self._prune, "prune")
        periodic.every(config.state.rules_snapshot_s, self._save_rule_state, "rule-state")
        await self._refresh_jobs()
        periodic.every(config.jobs.refresh_s, self._refresh_jobs, "jobs")
        periodic.every(config.detectors.interval_s, self._detect, "detectors")
        periodic.every(60.0, self._prune_fleet, "fleet-prune")
        periodic.every(STORE_PROBE_S, self._probe_store, "store-probe")
        periodic.every(config.reliability.flush_s, self.reliability.flush, "reliability-flush")
        periodic.every(config.reliability.interval_s, self._reliability_cycle, "reliability")
        if config.drains.enabled and backends:
            try:
                await self.fleet.poll()
            except Exception:  # the periodic job tries again; the engine starts either way
                _log.exception("fleet_poll_failed")
            periodic.every(config.drains.poll_s, self.fleet.poll, "drains")
        if config.reload.watch_files and config.rules:
            periodic.every(config.reload.poll_interval_s, self._check_rule_files, "rules-watch")
        if self.checks is not None:
            await self.checks.start()
            stack.push_async_callback(self.checks.stop)
        self.usage.attach(self.store, config.state.path)  # issue 18: the usage report's observations
        periodic.every(USAGE_FLUSH_S, self.usage.flush, "usage-flush")
        periodic.every(3600.0, self.usage.prune, "usage-prune")
        if config.reports.metrics:
            periodic.every(config.reports.metrics_interval_s, self.usage.refresh_metrics, "usage-metrics")
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
        )
        self.port = await stack.enter_async_context(
            serve(app, config.listen.host, config.listen.port, HttpLimits.of(config.http), tls)
        )

    def _store_failed(self, operation: str, error: Exception) -> None:
        self.metrics.store_errors.labels(operation).inc()

    async def cleanup(self) -> None:
        """Stop serving, evaluate what was accepted (bounded), stop the jobs and the executor (bounded), hand
        over the lead, close the integrations, save what the rules remember, close the state: the reverse of
        :meth:`start`."""
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
        await self.usage.flush()
        if self._processor is not None:
            self._processor.cancel()
            await asyncio.gather(self._processor, return_exceptions=True)
            self._processor = None
        for task in [*self._takeovers, *self._background]:
            task.cancel()
        await asyncio.gather(*self._takeovers, *self._background, return_exceptions=True)

    async def _refresh_pools(self) -> None:
        if self.scheduler is None:
            return
        try:
            self.executor.pools = Pools.from_members(await self.scheduler.pools())
        except SchedulerError as exc:
            _log.warning("pools_unavailable", error=str(exc))

    async def _prune(self) -> None:
        if self.following() is not None:
            return  # the leader prunes the shared store
        now = self.clock.now()
        self.store.audit.prune(now - self.config.state.audit_retention_days * 86400)
        self.store.breaker.prune(now - max(self.config.safety.window_s, 86400.0))
        self.store.intents.prune_cooldowns(now)
        # resolved held actions and finished intents past the audit's retention (held ones and unfinished
        # intents are never pruned): the tables stay bounded by the rate of actions, not by uptime
        retention = now - self.config.state.audit_retention_days * 86400
        self.store.held.prune(retention)
        self.store.intents.prune(retention)
        self.store.checks.prune(retention)
        self.reliability.prune(now)

    async def _refresh_jobs(self) -> None:
        self._jobs_refreshed_at = self.clock.monotonic()
        for provider in self.job_providers:
            try:
                jobs = await provider.running_jobs()
            except JobProviderError as exc:
                self.metrics.job_provider_up.labels(provider.name).set(0)
                _log.warning("jobs_unavailable", provider=provider.name, error=str(exc))
                continue
            self.correlator.topology.replace(provider.name, jobs)
            self.metrics.job_provider_up.labels(provider.name).set(1)

    async def _detect(self) -> None:
        """One cycle of the detectors; findings go to the rules like any other event."""
        self._count_evictions()
        topology = self.correlator.topology
        if (
            topology.take_unknown()
            and self.clock.monotonic() - self._jobs_refreshed_at >= self.config.jobs.min_refresh_s
        ):
            await self._refresh_jobs()  # agents report a job the scheduler did not list yet
        started = time.perf_counter()
        findings = self.correlator.run(self.clock.now())
        self.metrics.detector_cycle.observe(time.perf_counter() - started)
        self.metrics.jobs_tracked.set(self.correlator.last_cycle_jobs)
        for finding in findings:
            self.findings.append(finding)
            self.metrics.findings.labels(finding.kind, str(finding.hardware).lower()).inc()
            _log.warning(
                "finding", kind=finding.kind, job=finding.job, node=finding.node, summary=finding.summary
            )
            await self.queue.put((finding.to_event(), self.clock.monotonic()))  # waits, never drops

    async def _reliability_cycle(self) -> None:
        """The reliability report and checkpoint advice; a job far off the advice becomes a finding."""
        for event in await self.reliability.cycle():
            _log.info("checkpoint_interval", job=event.attrs.get("job"), summary=event.attrs.get("summary"))
            await self.queue.put((event, self.clock.monotonic()))  # waits, never drops

    def reliability_document(self, query: Mapping[str, str]) -> dict[str, Any]:
        """``GET /api/v1/reliability`` (raises ValueError for a bad query, LookupError for an unknown job)."""
        return self.reliability.document(query)

    async def _prune_fleet(self) -> None:
        self.correlator.prune(self.clock.now())
        self._count_evictions()

    def _count_evictions(self) -> None:
        """What the fleet state and the rule tables evicted (counted in pure code) into their counters."""
        self.metrics.fleet_state_bytes.set(self.correlator.fleet.bytes)
        for what, n in self.correlator.fleet.evicted.items():
            seen = self._evictions_seen.get(what, 0)
            if n > seen:
                self.metrics.fleet_evicted.labels(what).inc(n - seen)
                self._evictions_seen[what] = n
        evaluator = self.evaluator
        if id(evaluator) != self._groups_evaluator:  # a reload: a new engine counts from 0
            self._groups_evaluator, self._groups_seen = id(evaluator), 0
        n = evaluator.groups_evicted
        if n > self._groups_seen:
            self.metrics.rule_groups_evicted.inc(n - self._groups_seen)
            self._groups_seen = n

    def _ack_when_settled(self, fut: asyncio.Future[None]) -> None:
        """Resolve a batch's reply once the decisions submitted so far have run: the reply then says
        whether they were recorded (a batch is answered once its decisions are recorded)."""
        pending = self.executor.deciding()
        if not pending:
            fut.set_result(None)
            return
        waiter = asyncio.ensure_future(asyncio.wait(pending))
        self._ack_waiters.add(waiter)  # referenced until done (the loop keeps only weak references)
        waiter.add_done_callback(self._ack_waiters.discard)
        waiter.add_done_callback(lambda _: None if fut.done() else fut.set_result(None))

    async def _process(self) -> None:
        queue = self.queue
        observe, with_job, usage = self.correlator.observe, self.correlator.with_job, self.usage.observe
        acks = self._acks
        reliability = self.reliability
        while True:
            event, received_at = await queue.get()
            # then what else is queued, up to a bound: one wake-up and one gauge update per run, not per
            # event; after a full run, sleep(0) lets ingest and the detectors in.
            run = 0
            while True:
                try:
                    observe(event)
                    reliability.observe(event)
                    usage(event)
                    for decision in self.evaluator.evaluate(with_job(event)):
                        reliability.decided(decision)
                        self.metrics.rule_matches.labels(decision.rule).inc()
                        self.executor.submit(decision, received_at)
                    if self._auto_validate and event.kind in self._auto_validate:  # issue 21
                        self._spawn(self.validate(event.node, f"auto: {event.kind} {event.id}", None))
                except Exception:
                    _log.exception("evaluation_failed", event_id=event.id, node=event.node)
                if acks and (fut := acks.pop(id(event), None)) is not None and not fut.done():
                    self._ack_when_settled(fut)
                queue.task_done()
                run += 1
                if run == _PROCESS_RUN or queue.empty():
                    break
                event, received_at = queue.get_nowait()
            self.metrics.queue_depth.set(queue.qsize())
            if run == _PROCESS_RUN:
                await asyncio.sleep(0)
