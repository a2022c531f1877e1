"""The engine's view of the whole fleet: ``watchd drains`` and the hot spares.

Every ``drains.poll_s`` (a periodic job) it lists every node of every scheduler
(:mod:`watchd.integrations.fleet`), classifies the ones out of service (:mod:`watchd.fleetview.drains`),
sets the metrics, and sends ``node_unavailable`` events (:mod:`watchd.model.unavailable`) to the rules: once
for each drain watchd did not make, and again every ``drains.remind_every_s`` with ``overdue=true`` for any
drain (watchd's too) older than ``drains.alert_after_s`` (the default pack pages on those). Then it tops the
hot spares up (``spares.partitions``) from idle nodes, nodes watchd resumed first.

Every change to the spares is an action through the executor's pipeline (``spare``: set a partition's
spares; ``spare_release``: the follow-up of a requeue that took jobs off a node), so it has an intent, the
engine's mode, the leadership gate with its fencing, and its audit record. This class is the
:class:`~watchd.actions.runtime.SparePool` those actions call. While jobs a spare was released for wait to
run again (``spares.keep_for_requeued_s`` at most), their partition is not topped up."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from watchd.actions.executor import ActionExecutor
from watchd.actions.handlers.spare import HANDLER as SPARE
from watchd.actions.handlers.spare_release import HANDLER as SPARE_RELEASE
from watchd.actions.outcome import TOOK_OUT, ActionResult, Outcome
from watchd.clock import Clock
from watchd.fleetview.drains import FleetNode, Unavailable, availability, unavailable_nodes
from watchd.fleetview.settings import DrainsConfig, SparesConfig
from watchd.fleetview.spares import SparePlan, pick_release, plan
from watchd.httputil import json_response
from watchd.integrations.base import SchedulerError
from watchd.integrations.fleet import FLEET_VERBS, FleetBackend, fleet_backends
from watchd.logs import get_logger
from watchd.model.events import Event, stable_id
from watchd.model.nodes import WATCHD_REASON_PREFIX
from watchd.model.unavailable import SOURCE, NodeUnavailable
from watchd.port import gated
from watchd.store.connection import StoreError
from watchd.store.database import Store
from watchd.subsystem import Component, Job, Operator

_log = get_logger("watchd.fleet")

#: runs one action no rule decided through the executor's pipeline: (kind, node, params) -> its result
Act = Callable[[str, str, Mapping[str, Any]], Awaitable[ActionResult]]


class FleetMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.unavailable = Gauge(
            "watchd_unavailable_nodes",
            "Nodes out of service (drained, down, failed, cordoned), by partition, owner class (watchd, nhc, "
            "scheduler, admin, other) and reason class.",
            ["partition", "owner", "reason_class"],
            registry=r,
        )
        self.by_age = Gauge(
            "watchd_unavailable_nodes_by_age",
            "Nodes out of service by partition, owner class and how long they have been out (age bucket: "
            "under 1h, 6h, 1d, 7d, 30d, older, unknown).",
            ["partition", "owner", "age"],
            registry=r,
        )
        self.oldest = Gauge(
            "watchd_unavailable_oldest_seconds",
            "How long the longest-out node of a partition and owner class has been out.",
            ["partition", "owner"],
            registry=r,
        )
        self.available_ratio = Gauge(
            "watchd_partition_available_ratio",
            "Share of a partition's nodes in service (hot spares count as in service).",
            ["partition"],
            registry=r,
        )
        self.nodes = Gauge("watchd_partition_nodes", "Nodes of a partition.", ["partition"], registry=r)
        self.spares = Gauge("watchd_spare_nodes", "Hot spares held, by partition.", ["partition"], registry=r)
        self.spares_wanted = Gauge(
            "watchd_spare_nodes_wanted", "Hot spares configured, by partition.", ["partition"], registry=r
        )
        self.spares_released = Counter(
            "watchd_spares_released",
            "Hot spares handed back to scheduling, by partition and why (requeue: a drained node's jobs were "
            "requeued; trim: over the count or no longer fit).",
            ["partition", "why"],
            registry=r,
        )
        self.spares_taken = Counter(
            "watchd_spares_taken", "Idle nodes made hot spares, by partition.", ["partition"], registry=r
        )
        self.poll_ok = Gauge(
            "watchd_fleet_poll_up",
            "1 when the last listing of the fleet succeeded, by scheduler.",
            ["scheduler"],
            registry=r,
        )
        self.poll_errors = Counter(
            "watchd_fleet_poll_errors",
            "Failed listings of the fleet or spare changes, by scheduler.",
            ["scheduler"],
            registry=r,
        )


class FleetWatch(Component):
    """Polls the fleet, serves ``/api/v1/drains``, keeps the spares: one subsystem of the engine
    (:mod:`watchd.subsystem`). ``emit`` puts an event on the engine's queue; ``act`` runs a spare change
    through the executor (None: the spares are never changed)."""

    name = "drains"

    def __init__(
        self,
        backends: Sequence[FleetBackend],
        *,
        drains: DrainsConfig,
        spares: SparesConfig,
        clock: Clock,
        registry: CollectorRegistry,
        store: Store | None,
        emit: Callable[[Event], None],
        act: Act | None,
        prefix: str = WATCHD_REASON_PREFIX,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self.backends = list(backends)
        self.drains_config = drains
        self.spares_config = spares
        self.clock = clock
        self.metrics = FleetMetrics(registry)
        self.store = store
        self.emit = emit
        self.act = act
        self.prefix = prefix
        self.leading = leading  # spares are changed by the leader only (replicas: the Lease holder)
        self.nodes: list[FleetNode] = []
        self.listed_at: float | None = None
        self.errors: dict[str, str] = {}
        self._reported: dict[str, tuple[tuple[object, ...], float | None]] = {}  # node -> (key, overdue sent)
        self._lock = asyncio.Lock()

    @classmethod
    def of_engine(
        cls,
        scheduler: object,
        executor: ActionExecutor,
        *,
        drains: DrainsConfig,
        spares: SparesConfig,
        clock: Clock,
        registry: CollectorRegistry,
        emit: Callable[[Event], None],
        leading: Callable[[], bool],
    ) -> FleetWatch:
        """The engine's: the fleet backends of its scheduler, each change to the spares asked through its
        leadership gate and made as an action by its executor (audited under rule ``spares``)."""
        backends: list[FleetBackend] = []
        for backend in fleet_backends(scheduler):
            if hasattr(backend, "reservation_users"):  # Slurm: the Users= of the spares' reservation
                backend.reservation_users = spares.slurm_users
            backends.append(gated(backend, FLEET_VERBS, executor.leader_gate.now))

        async def act(kind: str, node: str, params: Mapping[str, Any]) -> ActionResult:
            return await executor.act(kind, node, params, rule="spares")

        return cls(
            backends,
            drains=drains,
            spares=spares,
            clock=clock,
            registry=registry,
            store=executor.store,
            emit=emit,
            act=act,
            leading=leading,
        )

    # ------------------------------------------------------------------------------------ the subsystem
    @property
    def polling(self) -> bool:
        return self.drains_config.enabled and bool(self.backends)

    def jobs(self) -> Sequence[Job]:
        return (Job("drains", self.drains_config.poll_s, self.poll),) if self.polling else ()

    async def start(self) -> None:
        if not self.polling:
            return
        try:
            await self.poll()
        except Exception:  # the periodic job tries again; the engine starts either way
            _log.exception("fleet_poll_failed")

    def status(self) -> dict[str, Any]:
        return self.summary()

    def routes(self, app: web.Application, operator: Operator) -> None:
        async def drains(request: web.Request) -> web.Response:
            if request.query.get("refresh") in ("1", "true"):  # list now
                await self.poll()
            return json_response(self.document())

        app.router.add_get("/api/v1/drains", drains)

    # ------------------------------------------------------------------------------------ polling
    async def poll(self) -> None:
        async with self._lock:
            nodes: list[FleetNode] = []
            for backend in self.backends:
                try:
                    nodes.extend(await backend.fleet_nodes())
                except SchedulerError as exc:
                    self.errors[backend.name] = str(exc)
                    self.metrics.poll_ok.labels(backend.name).set(0)
                    self.metrics.poll_errors.labels(backend.name).inc()
                    _log.warning("fleet_unavailable", scheduler=backend.name, error=str(exc))
                    return  # keep the last listing: a partial one would read as nodes come back
                self.errors.pop(backend.name, None)
                self.metrics.poll_ok.labels(backend.name).set(1)
            self.nodes, self.listed_at = nodes, self.clock.now()
            out = unavailable_nodes(nodes, self.listed_at, self.prefix)
            self._set_metrics(nodes, out)
            self._report(out)
            await self._keep_spares(nodes)

    def _set_metrics(self, nodes: list[FleetNode], out: list[Unavailable]) -> None:
        m = self.metrics
        for gauge in (m.unavailable, m.by_age, m.oldest, m.available_ratio, m.nodes, m.spares):
            gauge.clear()
        counts: dict[tuple[str, str, str], int] = {}
        ages: dict[tuple[str, str, str], int] = {}
        oldest: dict[tuple[str, str], float] = {}
        for u in out:
            for p in u.partitions or ("(none)",):
                key: tuple[str, str, str] = (p, u.owner, u.reason_class)
                counts[key] = counts.get(key, 0) + 1
                bucket: tuple[str, str, str] = (p, u.owner, u.age_bucket)
                ages[bucket] = ages.get(bucket, 0) + 1
                if u.age_s is not None:
                    oldest[(p, u.owner)] = max(oldest.get((p, u.owner), 0.0), u.age_s)
        for key, n in counts.items():
            m.unavailable.labels(*key).set(n)
        for bucket, n in ages.items():
            m.by_age.labels(*bucket).set(n)
        for o, age in oldest.items():
            m.oldest.labels(*o).set(age)
        for part in availability(nodes, self.prefix):
            m.nodes.labels(part.partition).set(part.total)
            m.available_ratio.labels(part.partition).set(part.available_share)
            m.spares.labels(part.partition).set(part.spares)
        for p, want in self.spares_config.partitions.items():
            m.spares_wanted.labels(p).set(want)

    def _report(self, out: list[Unavailable]) -> None:
        now = self.clock.now()
        cfg = self.drains_config
        current = {u.node for u in out}
        for node in list(self._reported):
            if node not in current:
                del self._reported[node]
        for u in out:
            key = (u.reason, u.since, u.owner)
            seen = self._reported.get(u.node)
            if seen is None or seen[0] != key:
                self._reported[u.node] = (key, None)
                if u.owner != "watchd":
                    self._send(u, now, reminder=False, overdue=False)
                seen = self._reported[u.node]
            overdue = u.age_s is not None and u.age_s >= cfg.alert_after_s
            if overdue and (seen[1] is None or now - seen[1] >= cfg.remind_every_s):
                self._reported[u.node] = (key, now)
                self._send(u, now, reminder=True, overdue=True)

    def _send(self, u: Unavailable, now: float, *, reminder: bool, overdue: bool) -> None:
        attrs = NodeUnavailable(
            owner=u.owner,
            reason_class=u.reason_class,
            reason=u.reason,
            state=u.state,
            scheduler=u.scheduler,
            partition=u.partitions[0] if u.partitions else None,
            user=u.user,
            since=u.since,
            age_s=None if u.age_s is None else round(u.age_s, 1),
            reminder=reminder,
            overdue=overdue,
        )
        event = attrs.to_event(
            id=stable_id("unavailable", u.node, u.reason, u.since, now if reminder else 0),
            node=u.node,
            source=SOURCE,
            time=now,
        )
        self.emit(event)

    # ------------------------------------------------------------------------------------ the listing
    def document(self, now: float | None = None) -> dict[str, Any]:
        """``GET /api/v1/drains``: every node out of service, classified, with watchd's evidence for its
        own; the partitions' availability and spares; the listing's time and errors."""
        now = self.clock.now() if now is None else now
        out = unavailable_nodes(self.nodes, now, self.prefix)
        rows = []
        held: dict[str, list[Any]] | None = None
        for u in out:
            row = u.to_dict()
            if u.owner == "watchd":
                if held is None:
                    held = self._held_by_node()
                row["watchd"] = self._evidence(u.node, held.get(u.node, []))
            rows.append(row)
        return {
            "listed_at": self.listed_at,
            "errors": dict(self.errors),
            "unavailable": rows,
            "partitions": [
                {
                    "partition": p.partition,
                    "nodes": p.total,
                    "unavailable": p.unavailable,
                    "available_share": round(p.available_share, 4),
                    "spares": p.spares,
                    "spares_wanted": self.spares_config.partitions.get(p.partition, 0),
                    "by_owner": dict(p.by_owner),
                }
                for p in availability(self.nodes, self.prefix)
            ],
            "spares": {
                p: sorted(n.name for n in self.nodes if n.spare and p in n.partitions)
                for p in self.spares_config.partitions
            },
        }

    def summary(self) -> dict[str, Any]:
        """For the status document: how many nodes are out, by owner class, and the spares held."""
        out = unavailable_nodes(self.nodes, self.clock.now(), self.prefix) if self.nodes else []
        by_owner: dict[str, int] = {}
        for u in out:
            by_owner[u.owner] = by_owner.get(u.owner, 0) + 1
        return {
            "listed_at": self.listed_at,
            "unavailable": len(out),
            "by_owner": by_owner,
            "spares": {
                p: sum(1 for n in self.nodes if n.spare and p in n.partitions)
                for p in self.spares_config.partitions
            },
            "errors": dict(self.errors),
        }

    def _held_by_node(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        if self.store is None:
            return out
        try:
            for h in self.store.held.list("held"):
                out.setdefault(h.node, []).append(h)
        except StoreError as exc:
            _log.error("held_unreadable", error=str(exc), rate_limited=True)
        return out

    def _evidence(self, node: str, held: list[Any]) -> dict[str, Any]:
        """From the audit trail: the rule and event of the drain, the jobs requeued after it, and the
        actions held for the node."""
        found: dict[str, Any] = {"rule": None, "event_id": None, "evidence": None, "requeued": [], "held": []}
        if self.store is None:
            return found
        try:
            records = self.store.audit.recent(200, node=node)
        except StoreError as exc:
            found["error"] = str(exc)
            return found
        drain = None
        for rec in reversed(records):
            if rec.action == "drain" and rec.outcome in TOOK_OUT:
                drain = rec
                break
        if drain is not None:
            found.update(
                rule=drain.rule, event_id=drain.event_id, evidence=drain.detail, drained_at=drain.time
            )
            jobs: list[str] = []
            for rec in records:
                if rec.time < drain.time - 60:
                    continue
                if rec.action == "requeue" and rec.outcome in (Outcome.REQUEUED, Outcome.PARTIAL):
                    jobs.extend(str(j) for j in rec.result.get("requeued", ()))
                elif rec.action == SPARE_RELEASE.kind and rec.outcome == Outcome.RELEASED:
                    found["spare"] = rec.result.get("spare")
            found["requeued"] = list(dict.fromkeys(jobs))
        found["held"] = [{"id": h.id, "kind": h.kind, "rule": h.rule, "reason": h.reason} for h in held]
        return found

    # ------------------------------------------------------------------------------------ spares
    def _backend_where(self, listed: Callable[[FleetNode], bool]) -> FleetBackend | None:
        """The backend of the first listed node ``listed`` picks; the only backend when none is picked."""
        scheduler = next((n.scheduler for n in self.nodes if listed(n)), None)
        found = next((b for b in self.backends if b.name == scheduler), None)
        return found or (self.backends[0] if len(self.backends) == 1 else None)

    def _backend_of(self, node: str) -> FleetBackend | None:
        return self._backend_where(lambda n: n.name == node)

    async def _keep_spares(self, nodes: list[FleetNode]) -> None:
        want = self.spares_config.partitions
        if not want or self.act is None or not self.leading():
            return
        paused = await self._kept_for_requeued()
        for backend in self.backends:
            mine = [n for n in nodes if n.scheduler == backend.name]
            held: dict[str, list[str]] = {}
            for n in mine:
                if n.spare:
                    for p in n.partitions[:1]:
                        held.setdefault(p, []).append(n.name)
            decided = plan(want, held, mine, self._resumed_by_watchd(), paused)
            await self._apply(held, decided)

    def _resumed_by_watchd(self) -> list[str]:
        if self.store is None:
            return []
        try:
            return [
                r.node
                for r in self.store.audit.recent(500)
                if r.action == "resume" and r.outcome == Outcome.RESUMED
            ]
        except StoreError:
            return []

    async def _kept_for_requeued(self) -> dict[str, list[str]]:
        """partition -> the jobs a spare was released for that have not started again (within
        ``keep_for_requeued_s``): from the ``spare_release`` actions' results, asked of the scheduler."""
        if self.store is None:
            return {}
        now = self.clock.now()
        keep = self.spares_config.keep_for_requeued_s
        try:
            released = self.store.intents.since(SPARE_RELEASE.kind, now - keep)
        except StoreError as exc:
            _log.error("spare_releases_unreadable", error=str(exc), rate_limited=True)
            return {}
        waiting: dict[str, list[str]] = {}
        for intent in released:
            r = intent.result
            jobs = [str(j) for j in r.get("jobs", ())]
            if intent.outcome != Outcome.RELEASED or not jobs or float(r.get("until", 0)) <= now:
                continue
            backend = self._backend_of(intent.node)
            try:
                pending = await backend.pending(jobs) if backend is not None else set()
            except SchedulerError as exc:  # unknown: keep the pause (a spare less, never a job stranded)
                _log.warning("requeued_jobs_unknown", error=str(exc))
                pending = set(jobs)
            if pending:
                waiting.setdefault(str(r.get("partition")), []).extend(sorted(pending))
        for partition, jobs in waiting.items():
            _log.info("spares_not_topped_up", partition=partition, waiting_jobs=jobs)
        return waiting

    async def _apply(self, held: dict[str, list[str]], decided: SparePlan) -> None:
        assert self.act is not None
        for partition in sorted(set(decided.add) | set(decided.remove)):
            add = list(decided.add.get(partition, ()))
            remove = sorted(decided.remove.get(partition, ()))
            new = [n for n in held.get(partition, []) if n not in remove] + add
            params = {"partition": partition, "nodes": new, "taken": add, "released": remove}
            result = await self.act(SPARE.kind, ",".join(add + remove) or partition, params)
            if result.outcome == Outcome.CHANGED:
                if add:
                    self.metrics.spares_taken.labels(partition).inc(len(add))
                if remove:
                    self.metrics.spares_released.labels(partition, "trim").inc(len(remove))
            elif result.outcome == Outcome.FAILED:
                self.metrics.poll_errors.labels(self._backend_of_partition(partition).name).inc()

    def _backend_of_partition(self, partition: str) -> FleetBackend:
        return self._backend_where(lambda n: partition in n.partitions) or self.backends[0]

    # ------------------------------------------------------------------ the SparePool the actions call
    @property
    def configured(self) -> bool:
        return bool(self.spares_config.partitions)

    async def set_spares(self, partition: str, nodes: Sequence[str]) -> None:
        await self._backend_of_partition(partition).set_spares(partition, nodes)

    async def release_for(self, node: str) -> tuple[str, str] | None:
        """Hand back one spare of ``node``'s partition (the drained node's jobs were requeued): the
        requeued job can start on it. Returns (partition, the node released), or None."""
        async with self._lock:
            entry = next((n for n in self.nodes if n.name == node), None)
            backend = self._backend_of(node)
            if backend is None:
                return None
            held = await backend.spares()
            partitions = entry.partitions if entry is not None else tuple(held)
            for p in partitions:
                if held.get(p):
                    chosen = pick_release(held[p])
                    await backend.set_spares(p, [n for n in held[p] if n not in chosen])
                    self.metrics.spares_released.labels(p, "requeue").inc(len(chosen))
                    self.nodes = [replace(n, spare=False) if n.name in chosen else n for n in self.nodes]
                    return p, chosen[0]
            return None
