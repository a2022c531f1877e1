"""The engine's HTTP surface: authenticated ingest, /metrics, /healthz, /readyz, the status and recent
actions, and the operator's calls (release or discard a held action, resume a node)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from aiohttp import web

from watchd.clock import Clock
from watchd.engine.dedup import SeenIds
from watchd.engine.lanes import Accepted
from watchd.engine.metrics import EngineMetrics
from watchd.httputil import (
    BODY_TIMEOUT,
    PRINCIPAL,
    BodyError,
    Credentials,
    Handler,
    HttpLimits,
    auth_middleware,
    decode_json,
    error_response,
    errors_as_json,
    json_response,
    metrics_handler,
    read_body,
)
from watchd.logs import get_logger
from watchd.model.commands import AGENT_PREFIX
from watchd.model.events import INGEST_PATH, Event, WireError, batch_from_wire, valid_batch_from_json
from watchd.model.registry import ALL_KINDS
from watchd.model.reliability import JOB_ADVICE_PATH
from watchd.store.connection import Fenced, StoreError
from watchd.subsystem import Subsystem

_log = get_logger("watchd.ingest")


# Metric labels come from what clients send: only known values become labels, so a client cannot create
# unbounded series.
SOURCES = frozenset(
    {"kmsg", "file", "nvml", "dcgm", "fake", "watchd", "sim", "detector", "heartbeat", "ib-sysfs"}
)
KINDS = ALL_KINDS
#: Events stamped further ahead than this take their arrival time (one bad clock must not push cooldowns and
#: windows into the future); the node's own stamp is kept in ``attrs["node_time"]``.
MAX_FUTURE_S = 300.0


def _label(value: str, known: frozenset[str]) -> str:
    return value if value in known else "other"


def restamp_future(events: list[Event], now: float, metrics: EngineMetrics) -> list[Event]:
    limit = now + MAX_FUTURE_S
    if all(e.time <= limit for e in events):
        return events
    out: list[Event] = []
    for e in events:
        if e.time <= limit:
            out.append(e)
            continue
        metrics.events_restamped.labels(_label(e.source.split(":", 1)[0], SOURCES)).inc()
        _log.warning("event_time_in_future", node=e.node, event_id=e.id, ahead_s=round(e.time - now, 1))
        out.append(replace(e, time=now, attrs={**e.attrs, "node_time": e.time}))
    return out


class EngineApi(Protocol):
    """What the HTTP API asks of the engine besides ingest (the :class:`~watchd.engine.runner.Engine`)."""

    def status(self, query: Mapping[str, str] | None = None) -> dict[str, Any]: ...

    def recent_actions(self, limit: int) -> list[dict[str, Any]]: ...

    def held(self) -> list[dict[str, Any]]: ...

    def ready(self) -> tuple[bool, str]: ...

    def health(self) -> tuple[bool, str]:
        """Whether the state database takes writes, and why not (in memory: never waits for it)."""
        ...

    def writable(self) -> bool:
        """Whether decisions can be recorded now (an unwritable store is probed again, bounded)."""
        ...

    def following(self) -> str | None:
        """Why this engine may not decide now (a follower of a shared store: the leader's token fences its
        writes), or None."""
        ...

    async def release(self, held_id: int, by: str) -> dict[str, str]: ...

    def discard(self, held_id: int, by: str) -> dict[str, str]: ...

    async def resume(self, node: str, by: str) -> dict[str, str]:
        """An operator's resume of ``node`` through the action executor (audited)."""
        ...

    def evaluated(self, event: Event) -> asyncio.Future[None]:
        """Done once ``event`` (queued) has been evaluated and the decisions made until then have been
        recorded or failed to be."""
        ...

    def unrecorded(self, events: Sequence[Event]) -> str | None:
        """Why a decision made on one of ``events`` could not be recorded, or None (asked once, after
        :meth:`evaluated`)."""
        ...


#: the HTTP status of a resume's outcome (the body always says the outcome and why); others are 200
_RESUME_STATUS = {"refused": 409, "failed": 502, "no_scheduler": 503}


def _reject(status: int, reason: str, metrics: EngineMetrics, label: str) -> web.Response:
    metrics.ingest_rejected.labels(label).inc()
    return error_response(status, reason)


#: SQLite's integers (held action ids) are signed 64-bit
_MAX_ID = 2**63 - 1


def _operator(request: web.Request) -> str:
    """Who the operator is, as text any store or log can take (no lone surrogates): a named operator token's
    name (``X-Watchd-Operator`` is then ignored), else what the header says (docs/security.md)."""
    principal = request.get(PRINCIPAL)
    if principal is not None and principal.bound:
        return str(principal.name)
    by = request.headers.get("X-Watchd-Operator", "api")[:100]
    return by.encode("utf-8", "replace").decode("utf-8")


def make_app(
    *,
    token: str | None,
    queue: asyncio.Queue[Accepted],
    seen: SeenIds,
    metrics: EngineMetrics,
    clock: Clock,
    max_body_bytes: int,
    max_events: int,
    engine: EngineApi,
    ack_timeout_s: float = 5.0,
    limits: HttpLimits | None = None,
    credentials: Credentials | None = None,
    subsystems: Sequence[Subsystem] = (),
) -> web.Application:
    """``credentials``: who may do what (docs/security.md); by default ``token`` does everything."""
    body_timeout_s = (limits or HttpLimits()).body_timeout_s
    credentials = credentials if credentials is not None else Credentials(shared=token)

    received_counters: dict[tuple[str, str], Any] = {}  # (source, kind) as sent -> its counter child

    def denied(request: web.BaseRequest, need: str) -> None:
        if need == "ingest":
            metrics.ingest_rejected.labels("unauthorized").inc()

    async def ingest(request: web.Request) -> web.Response:
        try:
            raw = await read_body(request, max_body_bytes, body_timeout_s)
        except BodyError as exc:
            label = "too_large" if exc.status == 413 else "unreadable"
            return _reject(exc.status, exc.reason, metrics, label)
        wire = valid_batch_from_json(raw, max_events)
        if wire is None:  # not all of it valid: the slow way says what is wrong, and keeps the valid events
            try:
                decoded = decode_json(request, raw)
            except ValueError as exc:
                return _reject(400, str(exc), metrics, "malformed")
            try:
                wire = batch_from_wire(decoded, max_events)
            except WireError as exc:
                return _reject(400, f"invalid batch: {exc}", metrics, "invalid")
        if wire.invalid and not wire.events:
            return _reject(400, f"invalid batch: {wire.invalid[0][1]}", metrics, "invalid")
        if wire.invalid:
            metrics.events_invalid.inc(len(wire.invalid))
            _log.error(
                "events_invalid",
                peer=request.remote,
                invalid=len(wire.invalid),
                accepted=len(wire.events),
                first=wire.invalid[0][1],
            )
        events = restamp_future(wire.events, clock.now(), metrics)
        if len(events) > queue.maxsize:  # could never fit: 413 makes the agent halve its batches
            return _reject(
                413,
                f"{len(events)} events exceed the engine's queue of {queue.maxsize}",
                metrics,
                "too_large",
            )
        if (following := engine.following()) is not None:  # a shared store's follower: it may not decide
            return _reject(503, f"{following}; retry later", metrics, "not_leader")
        if not engine.writable():  # decisions could not be recorded: the agent keeps the batch
            return _reject(503, f"{engine.health()[1]}; retry later", metrics, "unwritable")
        fresh = [e for e in events if seen.first_time(e.id)]
        if len(fresh) > queue.maxsize - queue.qsize():
            # Refuse the whole batch rather than lose part of it: the agent keeps it and retries.
            for e in fresh:
                seen.forget(e.id)
            return _reject(503, "engine queue full, retry later", metrics, "busy")
        arrived = clock.monotonic()
        wall = clock.now()
        received: dict[tuple[str, str], int] = {}  # counted per (source, kind), not per event
        observe_age = metrics.event_age.observe
        for event in fresh:
            key = (event.source, event.kind)
            received[key] = received.get(key, 0) + 1
            observe_age(max(0.0, wall - event.time))
            queue.put_nowait((event, arrived))
        for key, n in received.items():
            counter = received_counters.get(key)
            if counter is None:  # a child per (source, kind) met, bounded by the known labels' product
                source, kind = key
                labels = (_label(source.split(":", 1)[0], SOURCES), _label(kind, KINDS))
                counter = metrics.events_received.labels(*labels)
                if len(received_counters) < 10_000:
                    received_counters[key] = counter
            counter.inc(n)
        duplicates = len(events) - len(fresh)
        if duplicates:
            metrics.events_duplicate.inc(duplicates)
        metrics.queue_depth.set(queue.qsize())
        if fresh:
            # The reply waits until the batch is evaluated: an engine killed before it leaves the batch
            # with the agent, which sends it again; bounded, so a backlog slows agents, never stalls them.
            try:
                await asyncio.wait_for(engine.evaluated(fresh[-1]), ack_timeout_s)
            except TimeoutError:
                metrics.ingest_ack_timeouts.inc()
            why = engine.unrecorded(fresh)
            if why is not None:
                # a decision on one of its events (or its audit) could not be recorded: refuse the batch, so
                # the agent re-sends it; another write's failure is not this batch's
                for e in fresh:
                    seen.forget(e.id)
                return _reject(503, f"decisions not recorded: {why}", metrics, "unrecorded")
        reply: dict[str, Any] = {"accepted": len(fresh), "duplicates": duplicates}
        if wire.invalid:
            reply["invalid"] = [{"index": i, "error": error} for i, error in wire.invalid]
        return json_response(reply)

    async def healthz(_: web.Request) -> web.Response:
        # alive either way (a restart would not make the disk writable): degraded, with the reason
        ok, detail = engine.health()
        return json_response({"status": "ok"} if ok else {"status": "degraded", "detail": detail})

    async def readyz(_: web.Request) -> web.Response:
        # with leader election only the leader is ready: the Service sends the agents' events to it alone;
        # a state database that takes no writes makes it not ready (decisions could not be recorded)
        ok, detail = engine.ready()
        status = "ok" if ok else ("standby" if engine.health()[0] else "degraded")
        return json_response({"status": status, "detail": detail}, status=200 if ok else 503)

    async def actions(request: web.Request) -> web.Response:
        try:
            limit = min(10_000, max(1, int(request.query.get("limit", "100"))))
        except ValueError:
            return error_response(400, "limit: expected an integer")
        return json_response({"actions": engine.recent_actions(limit)})

    async def status_handler(request: web.Request) -> web.Response:
        try:
            document = engine.status(request.query)
        except ValueError as exc:  # ?limit=, ?held_limit=: not a non-negative integer
            return error_response(400, str(exc))
        return json_response(document)

    async def held_handler(_: web.Request) -> web.Response:
        return json_response({"held": engine.held()})

    async def resume_node(request: web.Request) -> web.Response:
        node = request.match_info["node"]
        if not node.isprintable():  # also refuses lone surrogates (category Cs)
            return error_response(400, "node: expected a printable name")
        result = await engine.resume(node, _operator(request))
        return json_response(result, status=_RESUME_STATUS.get(result["outcome"], 200))

    async def resolve_held(request: web.Request) -> web.Response:
        try:
            held_id = int(request.match_info["id"])
        except ValueError:
            return error_response(400, "id: expected an integer")
        if not 0 <= held_id <= _MAX_ID:
            return error_response(400, "id: out of range")
        by = _operator(request)
        if request.match_info["verb"] == "release":
            result = await engine.release(held_id, by)
        else:
            result = engine.discard(held_id, by)
        return json_response(result, status=404 if result["outcome"] == "not_held" else 200)

    @web.middleware
    async def leader_only(request: web.Request, handler: Handler) -> web.StreamResponse:
        """An operator's call (every POST but ingest, which answers for itself) to a follower is 503 naming
        the leader, before its handler runs: it could only be fenced (was 500 with a traceback). A write
        fenced meanwhile (the lease lost during the call) is 503 too, and a state database that takes no
        write 503 with its error: the caller tries again, at the leader."""
        operates = request.method == "POST" and request.path != INGEST_PATH
        if operates and (following := engine.following()) is not None:
            return error_response(503, f"not the leader: {following}; send it to the leader")
        try:
            return await handler(request)
        except Fenced as exc:
            _log.info("request_fenced", path=request.path, error=str(exc))
            return error_response(503, f"not the leader: {exc}; send it to the leader")
        except StoreError as exc:
            _log.error("request_store_error", path=request.path, error=str(exc))
            return error_response(503, f"the state database: {exc}; retry later")

    middlewares = [
        errors_as_json("request_failed"),
        auth_middleware(
            credentials, INGEST_PATH, denied, agent_reads=(JOB_ADVICE_PATH,), agent_prefix=AGENT_PREFIX
        ),
        leader_only,
    ]
    app = web.Application(client_max_size=max_body_bytes, middlewares=middlewares)
    app[BODY_TIMEOUT] = body_timeout_s
    app.router.add_post(INGEST_PATH, ingest)
    app.router.add_get("/metrics", metrics_handler(metrics.registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/v1/actions", actions)
    app.router.add_get("/api/v1/status", status_handler)
    app.router.add_get("/api/v1/held", held_handler)
    app.router.add_post(r"/api/v1/held/{id}/{verb:release|discard}", resolve_held)
    app.router.add_post("/api/v1/nodes/{node}/resume", resume_node)
    for subsystem in subsystems:  # the detectors', reliability's, the fleet view's, the checks' routes
        subsystem.routes(app, _operator)
    return app
