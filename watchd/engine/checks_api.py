"""The checks' part of the engine (issue 21): building the service from the config, the HTTP routes
(``/api/v1/checks``, ``/api/v1/nodes/{node}/validate``) and the validated return to service, audited."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from watchd.actions.audit import AuditRecord
from watchd.actions.trail import AuditTrail
from watchd.checks.metrics import CheckMetrics
from watchd.checks.registry import build_runner
from watchd.checks.service import CheckService
from watchd.httputil import error_response, json_response
from watchd.integrations.base import SchedulerError
from watchd.logs import get_logger
from watchd.model.events import Event
from watchd.model.nodes import drained_by_watchd

if TYPE_CHECKING:
    from watchd.engine.runner import Engine

__all__ = ["add_routes", "build_service", "validate"]

_log = get_logger("watchd.engine.checks")
_MAX_NODES = 1000


def build_service(engine: Engine) -> CheckService:
    config = engine.config

    async def emit(event: Event) -> None:
        await engine.queue.put((event, engine.clock.monotonic()))  # waits, never drops

    runner = build_runner(config.checks.runner, config)
    return CheckService(
        config.checks,
        runner,
        engine.store,
        engine.clock,
        emit,
        CheckMetrics(engine.metrics.registry),
        engine.periodic,
    )


async def validate(engine: Engine, node: str, by: str) -> dict[str, Any]:
    """``watchd node validate``: only a node watchd drained; the suite runs, the node returns to service only
    if every check passed, else it stays drained with the new evidence. Audited either way."""
    service = engine.checks
    if service is None:
        return {"outcome": "no_checks", "detail": "checks are not enabled (checks.enabled)"}
    if engine.scheduler is None:
        return {"outcome": "no_scheduler", "detail": "no scheduler is configured"}
    try:
        st = (await engine.scheduler.node_states([node])).get(node)
    except SchedulerError as exc:
        return {"outcome": "failed", "detail": str(exc)}
    if st is None:
        return {"outcome": "failed", "detail": "unknown node"}
    if not st.drained:
        return {"outcome": "not_drained", "detail": "the node is in service: `watchd checks run` checks it"}
    if not drained_by_watchd(st):
        return {"outcome": "refused", "detail": f"drained by someone else: {st.reason!r}"}
    started = engine.clock.monotonic()
    try:
        passed, results, done = await service.validate(node)
    except (KeyError, RuntimeError) as exc:
        return {"outcome": "refused", "detail": str(exc)}
    except Exception as exc:
        _log.exception("validation_failed", node=node)
        return {"outcome": "failed", "detail": f"{type(exc).__name__}: {exc}"}
    evidence = "; ".join(str(r.get("evidence")) for r in results if not r.get("passed"))
    detail = (
        f"by {by}: every check passed ({', '.join(str(r.get('check')) for r in results)}), was: {st.reason}"
        if passed
        else f"by {by}: validation failed: {evidence}"
    )
    AuditTrail(engine.audit, engine.store).record(
        AuditRecord(
            time=engine.clock.now(),
            rule="validate",
            event_id=f"validate-{node}-{engine.clock.now():.6f}",
            node=node,
            action="resume" if done == "resumed" else "drain",
            mode="enforce",
            outcome=done,
            detail=detail,
            duration_s=engine.clock.monotonic() - started,
        )
    )
    return {"outcome": done, "detail": detail, "results": results}


_auto: set[asyncio.Task[Any]] = set()


def auto_validate(engine: Engine, event: Event) -> None:
    """An event of a kind in ``checks.auto_validate`` (``node_repaired``): validate its node, in the
    background (only a node watchd drained; the outcome is audited as any validation)."""

    async def run() -> None:
        result = await validate(engine, event.node, f"auto: {event.kind} {event.id}")
        _log.info("auto_validation", node=event.node, kind=event.kind, outcome=result["outcome"])

    task = asyncio.ensure_future(run())
    _auto.add(task)
    task.add_done_callback(_auto.discard)


def add_routes(app: web.Application, engine: Engine, operator: Callable[[web.Request], str]) -> None:
    """The checks' routes; who may call them is the server's auth middleware's to say (reads: a viewer,
    POSTs: an operator), and ``operator`` names the caller as the audit records it."""

    def service_or_503() -> CheckService | web.Response:
        if engine.checks is None:
            return error_response(503, "checks are not enabled (checks.enabled)")
        return engine.checks

    async def listing(_: web.Request) -> web.Response:
        s = service_or_503()
        return s if isinstance(s, web.Response) else json_response({"checks": s.listing()})

    async def history(request: web.Request) -> web.Response:
        s = service_or_503()
        if isinstance(s, web.Response):
            return s
        try:
            limit = min(1000, max(1, int(request.query.get("limit", "20"))))
        except ValueError:
            return error_response(400, "limit: expected an integer")
        return json_response(
            {"node": request.match_info["node"], "runs": s.history(request.match_info["node"], limit)}
        )

    async def run(request: web.Request) -> web.Response:
        s = service_or_503()
        if isinstance(s, web.Response):
            return s
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, 'expected a JSON body {"nodes": [...], "checks": [...]}')
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
            return error_response(400, f"nodes: 1 to {_MAX_NODES} node names; checks: a list of check names")
        try:
            results = await s.run_now(nodes, names)
        except KeyError as exc:
            return error_response(400, str(exc.args[0]))
        return json_response({"results": results})

    async def validate_node(request: web.Request) -> web.Response:
        node = request.match_info["node"]
        if not node.isprintable():
            return error_response(400, "node: expected a printable name")
        result = await asyncio.shield(validate(engine, node, operator(request)))
        status = {"refused": 409, "failed": 502, "no_scheduler": 503, "no_checks": 503}.get(
            result["outcome"], 200
        )
        return json_response(result, status=status)

    app.router.add_get("/api/v1/checks", listing)
    app.router.add_post("/api/v1/checks/run", run)
    app.router.add_get("/api/v1/checks/history/{node}", history)
    app.router.add_post("/api/v1/nodes/{node}/validate", validate_node)
