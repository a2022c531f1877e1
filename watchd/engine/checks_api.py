"""The checks' part of the engine (issue 21): building the service from the config and the HTTP routes
(``/api/v1/checks``, ``/api/v1/nodes/{node}/validate``: the ``validate`` action, through the executor)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from watchd.checks.metrics import CheckMetrics
from watchd.checks.registry import build_runner
from watchd.checks.service import CheckService
from watchd.httputil import error_response, json_response
from watchd.logs import get_logger
from watchd.model.events import Event

if TYPE_CHECKING:
    from watchd.engine.runner import Engine

__all__ = ["add_routes", "build_service"]

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
        result = await asyncio.shield(engine.validate(node, f"by {operator(request)}"))
        status = {
            "refused": 409,
            "deduplicated": 409,  # a validation of the node is in progress
            "failed": 502,
            "no_scheduler": 503,
            "no_checks": 503,
        }.get(result["outcome"], 200)
        return json_response(result, status=status)

    app.router.add_get("/api/v1/checks", listing)
    app.router.add_post("/api/v1/checks/run", run)
    app.router.add_get("/api/v1/checks/history/{node}", history)
    app.router.add_post("/api/v1/nodes/{node}/validate", validate_node)
