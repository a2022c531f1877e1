"""The checks in the engine, as one subsystem (:mod:`watchd.subsystem`): the service (rounds on the engine's
APScheduler, runs followed across restarts), its HTTP routes (``/api/v1/checks``, ``/api/v1/checks/run``,
``/api/v1/checks/history/{node}``, ``/api/v1/checks/plan``: the order a round takes and why, read-only;
``/api/v1/nodes/{node}/validate``: the ``validate`` action, through the executor), the risk planner (fed
the events that can be evidence; :mod:`watchd.checks.riskplan`), and ``checks.auto_validate``: an event of
such a kind (a repair system's ``node_repaired``) validates its node, in the background.

A validation that could not check a node's links (no known-good partner idle) is tried again as soon as the
fleet listing the engine keeps (``drains.poll_s``) shows a partner idle, and paged about once past
``checks.partner_wait`` (:mod:`watchd.checks.waiting`). The plan (``GET /api/v1/checks/plan``) asks the
scheduler several times: it is kept :data:`PLAN_TTL_S` seconds, concurrent readers sharing one read."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from aiohttp import web

from watchd.checks import plan
from watchd.checks.riskplan import RiskPlanner
from watchd.checks.runner import RunnerError
from watchd.checks.service import CheckService
from watchd.checks.waiting import free_partners
from watchd.httputil import BodyError, error_response, json_response, read_json
from watchd.logs import get_logger
from watchd.model.events import Event
from watchd.model.fleet import FleetNode
from watchd.subsystem import Component, Handler, Job, Operator

__all__ = ["Checks", "Validate"]

_log = get_logger("watchd.engine.checks")
_MAX_NODES = 1000
_MAX_BODY_BYTES = 1024 * 1024  # 1,000 node names and the checks' names fit many times over
_BAD_RUN = f"nodes: 1 to {_MAX_NODES} node names; checks: a list of check names"
#: how long a read of the plan is served again (it costs several scheduler calls)
PLAN_TTL_S = 5.0
#: how often the validations waiting for a partner are looked at (the fleet listing: no scheduler call)
PARTNER_TICK_S = 15.0
#: without a fleet listing, the scheduler is asked for idle partners at most this often
PARTNER_READ_S = 60.0
#: a node validated again for a partner that was gone by then waits this long before the next try (each try
#: lifts its drain and runs its node checks again)
RETRY_AFTER_S = 60.0
#: the validation outcomes after which a node no longer waits for a partner (not watchd's to validate)
_NOT_MINE = frozenset({"not_drained", "refused", "no_checks", "no_scheduler"})

#: (node, who asked as the audit says it, "enforce" for an operator or None for the engine's mode) -> the
#: ``validate`` action's outcome, detail and result data
Validate = Callable[[str, str, Literal["dry-run", "enforce"] | None], Awaitable[dict[str, Any]]]

_VALIDATE_STATUS = {
    "refused": 409,
    "deduplicated": 409,  # a validation of the node is in progress
    "failed": 502,
    "interrupted": 502,
    "no_scheduler": 503,
    "no_checks": 503,
}


def _both(first: Handler, then: Handler) -> Handler:
    def both(event: Event) -> None:
        first(event)
        then(event)

    return both


class Checks(Component):
    name = "checks"

    def __init__(self, service: CheckService, validate: Validate, auto_validate: frozenset[str]) -> None:
        self.service = service
        self.validate = validate
        self.auto_validate = auto_validate
        self._background: set[asyncio.Task[Any]] = set()
        self.planner = RiskPlanner(service.config, service.store, service.clock)
        service.order = self.planner.order
        service.nic_seen = lambda node: max(self.planner.evidence.of(node, "nic"), default=None)
        #: the engine's last fleet listing (None: none yet, or no fleet poll): where idle partners are seen
        self.fleet_nodes: Callable[[], Sequence[FleetNode] | None] = lambda: None
        self.leading: Callable[[], bool] = lambda: True  # only the leader pages and validates again
        self._plans: dict[str | None, tuple[float, asyncio.Future[list[dict[str, Any]]]]] = {}
        self._partners_read_at: float | None = None
        self._tried: dict[str, float] = {}  # node -> when it was last validated again for a partner

    def subscriptions(self) -> Mapping[str, Handler]:
        """The risk planner's evidence, and the kinds of ``checks.auto_validate`` (after the evidence)."""
        subscribed = dict(self.planner.evidence.subscriptions())
        for kind in self.auto_validate:
            evidence = subscribed.get(kind)
            auto = self._auto_validate
            subscribed[kind] = auto if evidence is None else _both(evidence, auto)
        return subscribed

    def _auto_validate(self, event: Event) -> None:
        task = asyncio.ensure_future(self._auto(event))
        self._background.add(task)  # referenced until done (the loop keeps only weak references)
        task.add_done_callback(self._background.discard)

    async def _auto(self, event: Event) -> None:
        result = await self.validate(event.node, f"auto: {event.kind} {event.id}", None)
        _log.info("auto_validation", node=event.node, kind=event.kind, outcome=result["outcome"])

    def jobs(self) -> Sequence[Job]:
        return (Job("validation-partners", PARTNER_TICK_S, self._tick),)

    async def _tick(self) -> None:
        await self.partners_tick()

    async def partners_tick(self) -> list[str]:
        """Page about the nodes waiting too long for a partner; validate again each one a partner is idle
        for (in the background). Returns the nodes validated again."""
        s = self.service
        if not s.waiting or not self.leading():
            return []
        await s.page_waiting()
        free = await self._free_partners()
        now = s.clock.monotonic()
        again = [
            n
            for n in free
            if n not in s.waiting_validation() and now - self._tried.get(n, -RETRY_AFTER_S) >= RETRY_AFTER_S
        ]
        self._tried = {n: t for n, t in self._tried.items() if n in s.waiting}
        for node in again:
            self._tried[node] = now
            self._spawn(self._again(node, free[node]))
        return again

    async def _free_partners(self) -> dict[str, str]:
        s = self.service
        state = {w.check: s.store.checks.nodes(w.check) for w in s.waiting.values()}
        parts = {c.name: c.partitions for c in s.config.items}
        listing = self.fleet_nodes()
        if listing is None:  # no fleet listing: the scheduler is asked, seldom
            now = s.clock.monotonic()
            if self._partners_read_at is not None and now - self._partners_read_at < PARTNER_READ_S:
                return {}
            self._partners_read_at = now
            try:
                listing = await self._listing(state)
            except RunnerError as exc:
                _log.warning("validation_partners_unread", error=str(exc))
                return {}
        return free_partners(s.waiting, listing, state, parts, busy=s.busy_nodes())

    async def _listing(self, state: Mapping[str, Mapping[str, Any]]) -> list[FleetNode]:
        """The waiting nodes and the known-good ones as a listing, from the runner (idle = it may be lent)."""
        s = self.service
        members = await s.runner.members(())
        parts: dict[str, list[str]] = {}
        for p, nodes in members.items():
            for n in nodes:
                parts.setdefault(n, []).append(p)
        wanted = sorted(set(s.waiting) | {n for good in state.values() for n in good})
        avail = await s.runner.availability([n for n in wanted if n in parts], 60.0)
        return [
            FleetNode(n, s.runner.name, tuple(parts[n]), "idle" if a.idle else "busy")
            for n, a in avail.items()
        ]

    async def _again(self, node: str, partner: str) -> None:
        result = await self.validate(node, f"auto: {partner} is idle to pair with", None)
        _log.info("validation_retried", node=node, partner=partner, outcome=result["outcome"])
        if result["outcome"] in _NOT_MINE:
            self.service.stop_waiting(node)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def start(self) -> None:
        await self.service.start()

    async def stop(self) -> None:
        for task in list(self._background):
            task.cancel()  # the action's intent stays open: the next start finishes it or puts the drain back
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.service.stop()

    def status(self) -> Mapping[str, Any]:
        return self.service.status()

    async def plans(self, name: str | None) -> list[dict[str, Any]]:
        """``watchd checks plan``: each scheduled check's order now (or the named check's), and why; one read
        serves every caller for :data:`PLAN_TTL_S` seconds (those asking meanwhile share it)."""
        now = self.service.clock.monotonic()
        cached = self._plans.get(name)
        if cached is not None and (not cached[1].done() or now - cached[0] < PLAN_TTL_S):
            return await asyncio.shield(cached[1])
        future: asyncio.Future[list[dict[str, Any]]] = asyncio.ensure_future(self._read_plans(name))
        self._plans = {k: v for k, v in self._plans.items() if now - v[0] < PLAN_TTL_S}  # bounded
        self._plans[name] = (now, future)
        try:
            return await asyncio.shield(future)
        except Exception:
            if self._plans.get(name, (0.0, None))[1] is future:
                del self._plans[name]  # a failed read is not served again
            raise

    async def _read_plans(self, name: str | None) -> list[dict[str, Any]]:
        s = self.service
        if name is not None and s.config.check(name) is None:
            raise KeyError(f"no check named {name!r}")
        specs = [c for c in s.config.items if c.name == name or (name is None and c.schedule is not None)]
        out = []
        for spec in specs:
            members = await s.runner.members(spec.partitions)
            cands = plan.candidates(spec, members)
            avail = await s.runner.availability(list(cands), spec.time_limit) if cands else {}
            out.append(self.planner.document(spec, cands, avail, s.store.checks.nodes(spec.name)))
        return out

    def routes(self, app: web.Application, operator: Operator) -> None:
        """Who may call them is the server's auth middleware's to say (reads: a viewer, POSTs: an operator);
        ``operator`` names the caller as the audit records it."""
        s = self.service

        async def listing(_: web.Request) -> web.Response:
            return json_response({"checks": s.listing()})

        async def history(request: web.Request) -> web.Response:
            try:
                limit = min(1000, max(1, int(request.query.get("limit", "20"))))
            except ValueError:
                return error_response(400, "limit: expected an integer")
            node = request.match_info["node"]
            return json_response({"node": node, "runs": s.history(node, limit)})

        async def run(request: web.Request) -> web.Response:
            try:
                body = await read_json(request, _MAX_BODY_BYTES)
            except BodyError as exc:  # too large, too slow, not what its Content-Encoding says
                return error_response(exc.status, exc.reason)
            except ValueError as exc:
                return error_response(400, f'{exc}: expected a JSON body {{"nodes": [...], "checks": [...]}}')
            nodes = body.get("nodes") if isinstance(body, dict) else None
            names = body.get("checks", []) if isinstance(body, dict) else None
            if (
                not isinstance(nodes, list)
                or not nodes
                or len(nodes) > _MAX_NODES
                or not all(isinstance(n, str) and n.isprintable() and n for n in nodes)
                or not isinstance(names, list)
                or not all(isinstance(n, str) for n in names)
            ):
                return error_response(
                    400, f"nodes: 1 to {_MAX_NODES} node names; checks: a list of check names"
                )
            try:
                results = await s.run_now(nodes, names)
            except KeyError as exc:
                return error_response(400, str(exc.args[0]))
            return json_response({"results": results})

        async def validate_node(request: web.Request) -> web.Response:
            node = request.match_info["node"]
            if not node.isprintable():
                return error_response(400, "node: expected a printable name")
            result = await asyncio.shield(self.validate(node, f"by {operator(request)}", "enforce"))
            return json_response(result, status=_VALIDATE_STATUS.get(result["outcome"], 200))

        app.router.add_get("/api/v1/checks", listing)
        app.router.add_post("/api/v1/checks/run", run)

        async def plans(request: web.Request) -> web.Response:
            try:
                return json_response({"plans": await self.plans(request.query.get("check") or None)})
            except KeyError as exc:
                return error_response(404, str(exc.args[0]))
            except RunnerError as exc:
                return error_response(502, f"the scheduler did not answer: {exc}")

        app.router.add_get("/api/v1/checks/history/{node}", history)
        app.router.add_get("/api/v1/checks/plan", plans)
        app.router.add_post("/api/v1/nodes/{node}/validate", validate_node)
