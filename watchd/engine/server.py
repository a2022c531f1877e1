"""The engine's HTTP surface: authenticated ingest, /metrics, /healthz and the recent actions."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from watchd.clock import Clock
from watchd.engine.audit import MemoryAudit
from watchd.engine.dedup import SeenIds
from watchd.engine.metrics import EngineMetrics
from watchd.events import INGEST_PATH, Event, WireError, batch_from_wire
from watchd.httputil import metrics_handler
from watchd.logs import get_logger

_log = get_logger("watchd.ingest")

Accepted = tuple[Event, float]  # the event and its arrival time (monotonic)


def _reject(status: int, reason: str, metrics: EngineMetrics, label: str) -> web.Response:
    metrics.ingest_rejected.labels(label).inc()
    return web.json_response({"error": reason}, status=status)


def make_app(
    *,
    token: str | None,
    queue: asyncio.Queue[Accepted],
    seen: SeenIds,
    metrics: EngineMetrics,
    audit: MemoryAudit,
    clock: Clock,
    max_body_bytes: int,
    max_events: int,
    status: Callable[[], dict[str, object]],
) -> web.Application:
    expected = f"Bearer {token}".encode() if token is not None else None

    async def ingest(request: web.Request) -> web.Response:
        if expected is not None:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return _reject(401, "missing or wrong bearer token", metrics, "unauthorized")
        if request.content_length is not None and request.content_length > max_body_bytes:
            return _reject(413, f"body larger than {max_body_bytes} bytes", metrics, "too_large")
        try:
            raw = await request.content.read(max_body_bytes + 1)
        except (TimeoutError, ConnectionError):
            return _reject(400, "body could not be read", metrics, "unreadable")
        if len(raw) > max_body_bytes:
            return _reject(413, f"body larger than {max_body_bytes} bytes", metrics, "too_large")
        try:
            decoded = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return _reject(400, f"malformed JSON: {exc}", metrics, "malformed")
        try:
            events = batch_from_wire(decoded, max_events)
        except WireError as exc:
            return _reject(400, f"invalid batch: {exc}", metrics, "invalid")
        fresh = [e for e in events if seen.first_time(e.id)]
        if len(fresh) > queue.maxsize - queue.qsize():
            # Refuse the whole batch rather than lose part of it: the agent keeps it and retries.
            for e in fresh:
                seen.forget(e.id)
            return _reject(503, "engine queue full, retry later", metrics, "busy")
        arrived = clock.monotonic()
        wall = clock.now()
        for event in fresh:
            metrics.events_received.labels(event.source.split(":", 1)[0], event.kind).inc()
            metrics.event_age.observe(max(0.0, wall - event.time))
            queue.put_nowait((event, arrived))
        duplicates = len(events) - len(fresh)
        if duplicates:
            metrics.events_duplicate.inc(duplicates)
        metrics.queue_depth.set(queue.qsize())
        return web.json_response({"accepted": len(fresh), "duplicates": duplicates})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def actions(request: web.Request) -> web.Response:
        try:
            limit = min(10_000, max(1, int(request.query.get("limit", "100"))))
        except ValueError:
            return web.json_response({"error": "limit: expected an integer"}, status=400)
        return web.json_response({"actions": [a.to_dict() for a in audit.recent(limit)]})

    async def status_handler(_: web.Request) -> web.Response:
        return web.json_response(status())

    app = web.Application(client_max_size=max_body_bytes, middlewares=[_errors_as_json])
    app.router.add_post(INGEST_PATH, ingest)
    app.router.add_get("/metrics", metrics_handler(metrics.registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/v1/actions", actions)
    app.router.add_get("/api/v1/status", status_handler)
    return app


@web.middleware
async def _errors_as_json(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        return web.json_response({"error": exc.reason}, status=exc.status)
    except Exception:
        _log.exception("request_failed", path=request.path)
        return web.json_response({"error": "internal error"}, status=500)
