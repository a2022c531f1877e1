"""Ship events to the engine: batched, authenticated, retried with backoff, from a bounded queue.

Events are sent as soon as they are there (no lingering: a batch is what accumulated while the previous
request was in flight). While the engine is unreachable they wait in the queue and are delivered when it
returns. A full queue refuses new events; each refusal is counted and logged, never silent. An event
offered with ``on_settled`` has it called once the event left the queue for good (delivered, or refused as
invalid): that is how the source it was read from learns it (:meth:`~watchd.sources.base.LogSource.ack`).

What is still queued when the agent stops (the engine down or stopping at the same moment) is written to the
spool file (:meth:`Shipper.spill`), one event per line, and queued again at the next start
(:meth:`Shipper.restore`): at most ``queue_size`` events, and the file is removed once they were delivered.
The engine recognises an event it already has by its id, so one delivered just before the stop and spooled
anyway is not counted twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import ssl
from collections import deque
from collections.abc import Callable
from pathlib import Path

import aiohttp

from watchd.agent import engine_call
from watchd.agent.engine_call import call, with_session
from watchd.agent.metrics import AgentMetrics
from watchd.logs import get_logger
from watchd.model.events import INGEST_PATH, Event, WireError, batch_to_wire, event_from_wire, fit_to_wire

_log = get_logger("watchd.shipper")

_INVALID_LOGGED = 10  # per batch: the metric has the count
_DROP_LOG_EVERY = 1000


class Shipper:
    def __init__(
        self,
        node: str,
        url: str,
        token: str | None,
        metrics: AgentMetrics,
        *,
        queue_size: int = 100_000,
        max_batch: int = 1000,
        backoff_initial: float = 0.2,
        backoff_max: float = 30.0,
        timeout: float = 5.0,
        session: aiohttp.ClientSession | None = None,
        tls: ssl.SSLContext | None = None,
        spool: Path | None = None,
    ) -> None:
        """``session``: post through this one (shared by many shippers, e.g. the fleet simulator's) instead
        of a session of its own; the caller opens and closes it. ``spool``: the file the events still queued
        at the stop are kept in (None: they are counted as lost)."""
        self.node = node
        self.endpoint = url.rstrip("/") + INGEST_PATH
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._metrics = metrics
        self._queue: deque[Event] = deque()
        self._queue_size = queue_size
        self._max_batch = max_batch
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session = session
        self._tls = tls  # an https:// engine: its CA, and the agent's certificate for mutual TLS
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.dropped = 0
        self._on_settled: dict[str, Callable[[], None]] = {}  # event id -> its acknowledgement
        self._spool = spool
        self._restored = False  # the spool's events were queued again: the file goes once they are delivered

    def __len__(self) -> int:
        return len(self._queue)

    def offer(self, event: Event, on_settled: Callable[[], None] | None = None) -> bool:
        """Queue ``event``; False when the queue is full (then ``on_settled`` is never called)."""
        if len(self._queue) >= self._queue_size:
            self.dropped += 1
            self._metrics.dropped.labels("queue_full").inc()
            if self.dropped % _DROP_LOG_EVERY == 1:
                _log.error(
                    "event_dropped_queue_full",
                    queue_size=self._queue_size,
                    dropped_total=self.dropped,
                    event_id=event.id,
                    kind=event.kind,
                )
            return False
        self._queue.append(fit_to_wire(event))
        if on_settled is not None:
            self._on_settled[event.id] = on_settled
        self._metrics.queue_depth.set(len(self._queue))
        self._idle.clear()
        self._ready.set()
        return True

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until everything queued so far was delivered (or refused); False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        await with_session(self._session, self._tls, self._timeout, self._ship)

    async def _ship(self, session: aiohttp.ClientSession) -> None:
        backoff = self._backoff_initial
        batch_limit = self._max_batch
        while True:
            if not self._queue:
                if self._restored:
                    self._restored = False
                    self._remove_spool()
                self._idle.set()
                self._ready.clear()
                await self._ready.wait()
                continue
            batch = [self._queue[i] for i in range(min(batch_limit, len(self._queue)))]
            try:
                outcome = await self._post(session, batch)
            except asyncio.CancelledError:
                raise
            except Exception:  # whatever the answer looked like, the events stay queued and are retried
                _log.exception("ship_failed_unexpectedly", events=len(batch))
                self._metrics.requests.labels("error").inc()
                outcome = "retry"
            if outcome == "delivered" or outcome == "rejected":
                for _ in batch:
                    self._queue.popleft()
                self._settled(batch)
                self._metrics.queue_depth.set(len(self._queue))
                backoff = self._backoff_initial
                batch_limit = self._max_batch
                if outcome == "delivered":
                    self._metrics.shipped.inc(len(batch))
                else:
                    self._metrics.dropped.labels("rejected").inc(len(batch))
                continue
            if outcome == "too_large" and len(batch) > 1:
                batch_limit = max(1, len(batch) // 2)
                continue
            # jitter below the step, never above it: the delay doubles up to backoff_max and never exceeds it
            delay = min(self._backoff_max, backoff) * (0.5 + 0.5 * random.random())
            backoff = min(self._backoff_max, backoff * 2)
            await asyncio.sleep(delay)

    def restore(self) -> int:
        """Queue the events the spool kept at the last stop (before anything else is offered); how many."""
        if self._spool is None:
            return 0
        try:
            with open(self._spool, encoding="utf-8", errors="replace") as f:
                lines = [line for _, line in zip(range(self._queue_size), f, strict=False)]
        except FileNotFoundError:
            return 0
        except OSError as exc:
            _log.error("spool_unreadable", path=str(self._spool), error=str(exc))
            return 0
        restored = unreadable = 0
        for number, line in enumerate(lines, 1):
            try:
                self._queue.append(fit_to_wire(event_from_wire(json.loads(line), f"line {number}")))
                restored += 1
            except (ValueError, WireError):
                unreadable += 1
        if unreadable:
            self._metrics.dropped.labels("spool_unreadable").inc(unreadable)
            _log.error("spool_lines_unreadable", path=str(self._spool), count=unreadable)
        if restored:
            self._restored = True
            self._metrics.queue_depth.set(len(self._queue))
            self._idle.clear()
            self._ready.set()
            _log.info("spool_restored", path=str(self._spool), events=restored)
        else:
            self._remove_spool()
        return restored

    def spill(self) -> int:
        """Write what is still queued to the spool (the shipper stopped); the events kept, or 0 when there
        is no spool or it could not be written (then they are counted as lost)."""
        events = list(self._queue)
        if not events:
            self._remove_spool()
            return 0
        if self._spool is not None:
            temporary = self._spool.with_name(self._spool.name + ".tmp")
            try:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                with open(fd, "w", encoding="utf-8") as f:
                    for event in events:
                        f.write(json.dumps(event.to_wire(), separators=(",", ":")) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(temporary, self._spool)
            except OSError as exc:
                _log.error("spool_unwritable", path=str(self._spool), error=str(exc))
            else:
                _log.warning("events_spooled", path=str(self._spool), count=len(events))
                return len(events)
        self._metrics.dropped.labels("shutdown").inc(len(events))
        _log.error("events_undelivered_at_shutdown", count=len(events))
        return 0

    def _remove_spool(self) -> None:
        if self._spool is None:
            return
        try:
            os.unlink(self._spool)
        except FileNotFoundError:
            pass
        except OSError as exc:
            _log.error("spool_unremovable", path=str(self._spool), error=str(exc))

    def _settled(self, batch: list[Event]) -> None:
        for event in batch:
            ack = self._on_settled.pop(event.id, None)
            if ack is not None:
                ack()

    async def _post(self, session: aiohttp.ClientSession, batch: list[Event]) -> str:
        body = json.dumps(batch_to_wire(self.node, batch), separators=(",", ":")).encode()
        reply = await call(
            session, "POST", self.endpoint, data=body, headers=self._headers, timeout=self._timeout
        )
        status, kind = reply.status, reply.kind
        if status is None:
            self._metrics.requests.labels("unreachable").inc()
            self._metrics.engine_up.set(0)
            _log.warning("engine_unreachable", url=self.endpoint, error=reply.error, queued=len(self._queue))
            return "retry"
        self._metrics.engine_up.set(1 if status < 500 else 0)
        if kind == engine_call.OK:
            self._metrics.requests.labels("delivered").inc()
            self._count_invalid(reply.text(), batch)
            return "delivered"
        if kind == engine_call.TOO_LARGE:
            self._metrics.requests.labels("too_large").inc()
            if len(batch) == 1:
                _log.error("event_rejected_too_large", event_id=batch[0].id, response=reply.text(500))
                return "rejected"
            return "too_large"
        if kind == engine_call.BUSY:
            self._metrics.requests.labels("retry").inc()
            _log.warning("engine_busy", status=status, response=reply.text(200), queued=len(self._queue))
            return "retry"
        if kind == engine_call.UNAUTHORIZED:
            # A configuration problem: keep the events, they are delivered once the token is fixed.
            self._metrics.requests.labels("unauthorized").inc()
            _log.error(
                "engine_refused_token", status=status, response=reply.text(200), queued=len(self._queue)
            )
            return "retry"
        self._metrics.requests.labels("rejected").inc()
        _log.error("batch_rejected", status=status, response=reply.text(500), events=len(batch))
        return "rejected"

    def _count_invalid(self, reply: str, batch: list[Event]) -> None:
        """The engine keeps the valid events of a batch and names the others: those are lost, say so."""
        try:
            invalid = json.loads(reply).get("invalid", [])
        except (ValueError, AttributeError):
            return
        if not isinstance(invalid, list) or not invalid:
            return
        self._metrics.dropped.labels("invalid").inc(len(invalid))
        for item in invalid[:_INVALID_LOGGED]:
            index = item.get("index") if isinstance(item, dict) else None
            event_id = batch[index].id if isinstance(index, int) and 0 <= index < len(batch) else None
            _log.error("event_refused_invalid", event_id=event_id, error=item)
