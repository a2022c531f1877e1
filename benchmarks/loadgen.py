"""A load generator that stands in for thousands of watchd agents on one machine.

Each simulated node is what a real agent on an 8-GPU node sends, byte for byte, on its own keep-alive
connection:

- **the events**: one ``gpu_summary`` per GPU per 5 s window, made once by the agent's own code (the fake
  GPU backend's training or idle load through :class:`~watchd.gpu.sampler.GpuSampler`, the window
  summarizer, ``Event.to_wire``) and kept as JSON templates; per window only the id
  (``stable_id(node, kind, uuid, window_start)``, as the summarizer makes it), the time (the window's end)
  and ``window_start`` are spliced in. Every node has GPUs of its own (UUIDs), most nodes are in a job
  (jobs of 1 to 64 nodes, ``job`` on every summary), a tenth idle;
- **the request**: the real :class:`~watchd.agent.shipper.Shipper` posts one batch to a capture server at
  start, and every request is that request's head (its headers, in its order: ``Authorization``,
  ``Content-Type``, aiohttp's own) with this body's ``Content-Length``; the body is ``batch_to_wire`` with
  the shipper's compact separators. The agent sends no compression; neither does this;
- **the schedule**: windows are aligned to the epoch (as the agent's summarizer aligns them) and a window's
  summaries leave at the node's first sample after its end (the agent samples every ``sample_s``, 2 s by
  default, each node at its own phase): the whole fleet's summaries arrive within ``sample_s`` of each
  window's end, as a fleet of agents on NTP-synchronized clocks sends them;
- **the shipper's behaviour**: one request in flight per node; a window due while one is in flight waits and
  goes out with the next request (merged, as the shipper batches what accumulated) — counted as
  ``deferred``: the engine did not keep up with the schedule; 408/429/5xx, a lost connection or no answer
  in 5 s keep the events and retry (0.2 s, doubling); another status drops them (counted).

The connections are raw asyncio protocols (HTTP/1.1 with keep-alive, the pre-built bytes written as one
``write``), so that one process can hold 12,500 of them and keep to the schedule: an aiohttp client costs
several times more CPU per request. ``--procs`` splits the nodes over processes. Each process raises its
open-files limit to the hard limit.

What it reports: how far behind schedule it ran (a timer's lateness at every send: the generator's own
delay), the deferred windows (the engine's), per-window ingest lag (the reply, which the engine sends
once the batch is evaluated, less the events' time) and request round trips, the events the engine
accepted against those sent, errors by kind, and its own CPU. **A run whose generator fell behind is not a
measurement**: it says so and the CLI exits 1 (max lateness over ``--max-behind`` s, default 1.0, or p99
over a quarter of it).

    python benchmarks/loadgen.py --url http://127.0.0.1:9120 --token-file TOKEN --nodes 12500 \\
        --duration 60 --procs 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import re
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from watchd.agent.metrics import AgentMetrics  # noqa: E402
from watchd.agent.shipper import Shipper  # noqa: E402
from watchd.gpu.jobs import JobRef, JobResolver  # noqa: E402
from watchd.gpu.sampler import GpuSampler  # noqa: E402
from watchd.model.events import INGEST_PATH, WIRE_VERSION, Event, stable_id  # noqa: E402
from watchd.model.gpu import SUMMARY_KIND  # noqa: E402
from watchd.sim.fleet import parse_fleet  # noqa: E402
from watchd.sim.gpu import FakeGpuBackend  # noqa: E402

#: Jobs the nodes run, in nodes per job, cycled over the fleet (mean ~12 nodes; the largest 64 = 512 GPUs)
JOB_SIZES = (64, 32, 16, 8, 8, 4, 4, 2, 2, 1, 1, 1)
IDLE_EVERY = 10  # every tenth node runs no job
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
REQUEST_TIMEOUT_S = 5.0  # the shipper's default
RETRY_INITIAL_S = 0.2  # the shipper's default backoff


# ------------------------------------------------------------------------------------------- the fleet


def node_name(i: int, prefix: str = "gpu-") -> str:
    return f"{prefix}{i:05d}"


def fleet_jobs(nodes: int, first_job: int = 700_000) -> list[str | None]:
    """The job label of each node (``slurm:<id>``), or None for an idle one."""
    out: list[str | None] = []
    job, left, k = first_job, 0, 0
    for i in range(nodes):
        if i % IDLE_EVERY == IDLE_EVERY - 1:
            out.append(None)
            continue
        if left == 0:
            job += 1
            left = JOB_SIZES[k % len(JOB_SIZES)]
            k += 1
        out.append(f"slurm:{job}")
        left -= 1
    return out


class _Fixed(JobResolver):
    def __init__(self, ref: JobRef) -> None:
        super().__init__()
        self._ref = ref

    def jobs_for(self, pids: Iterable[int]) -> JobRef | None:
        return self._ref


def agent_summaries(gpus: int = 8, sample_s: float = 2.0, window_s: float = 5.0) -> dict[bool, list[Event]]:
    """One window's ``gpu_summary`` events of a training node (True) and of an idle one (False), made by the
    agent's own sampler over the fake GPU backend."""
    t0 = 1_760_000_000.0
    fleet = parse_fleet(
        {
            "seed": 1,
            "nodes": {"count": 2, "name": "tpl-{i}", "start": 1},
            "gpus": {"model": "H100-SXM", "count": gpus},
            "interval_s": sample_s,
            "summary_window_s": window_s,
            "jobs": [{"id": 4242, "nodes": "tpl-1"}],
        },
        "<loadgen>",
    )
    jobs = fleet.jobs_by_node()
    out: dict[bool, list[Event]] = {}
    for index, name in enumerate(fleet.node_names()):
        job = jobs.get(name)
        events: list[Event] = []
        backend = FakeGpuBackend(fleet.scenario(index, name, job is not None), t0)
        sampler = GpuSampler(
            backend,
            name,
            events.append,
            interval_s=sample_s,
            summary_window_s=window_s,
            jobs=_Fixed(job) if job is not None else None,
        )
        for k in range(int(3 * window_s / sample_s) + 1):  # past the first window's warm-up
            now = t0 + k * sample_s
            sampler.observe([backend.sample(gpu, now) for gpu in backend.gpus])
        summaries = [e for e in events if e.kind == SUMMARY_KIND]
        last = max(e.time for e in summaries)
        out[job is not None] = sorted(
            (e for e in summaries if e.time == last), key=lambda e: int(e.attrs["gpu"] or 0)
        )
    return out


_SLOT = re.compile(r'"@@(I\d+|T|S)@@"')


class NodeEncoder:
    """One node's summaries as JSON with the id, time and window start of each window spliced in."""

    __slots__ = ("_parts", "_uuids", "node", "prefix")

    def __init__(self, node: str, job: str | None, template: Sequence[Event], node_index: int) -> None:
        self.node = node
        self.prefix = json.dumps({"version": WIRE_VERSION, "node": node}, separators=(",", ":"))[:-1].encode()
        self._uuids: list[str] = []
        encoded: list[str] = []
        for g, event in enumerate(template):
            uuid = f"GPU-{node_index:08x}-{g:04x}-4000-8000-{node_index * 8 + g:012x}"
            self._uuids.append(uuid)
            attrs = dict(event.attrs)
            attrs.update(uuid=uuid, window_start="@@S@@")
            if job is not None:
                attrs["job"] = job
            else:
                attrs.pop("job", None)
            wire: dict[str, Any] = {"id": f"@@I{g}@@", "node": node, "source": "nvml", "kind": event.kind}
            wire.update(time="@@T@@", attrs=attrs)
            encoded.append(json.dumps(wire, separators=(",", ":")))
        pieces = _SLOT.split(",".join(encoded))
        # even indices: literal JSON; odd: a slot name
        self._parts: list[tuple[bool, str]] = [(i % 2 == 1, p) for i, p in enumerate(pieces)]

    def events(self, window_end: float, window_s: float) -> str:
        """The node's summaries of the window ending at ``window_end``, comma-joined."""
        start = window_end - window_s
        start_s = repr(start)
        values = {"T": repr(window_end), "S": start_s}
        out: list[str] = []
        for slot, text in self._parts:
            if not slot:
                out.append(text)
            elif text[0] == "I":
                uuid = self._uuids[int(text[1:])]
                out.append(f'"{stable_id(self.node, SUMMARY_KIND, uuid, start)}"')
            else:
                out.append(values[text])
        return "".join(out)

    def body(self, windows: Sequence[float], window_s: float) -> bytes:
        events = ",".join(self.events(w, window_s) for w in windows)
        return self.prefix + b',"events":[' + events.encode() + b"]}"


# ------------------------------------------------------------------------ the agent's request, captured


async def _capture_head(token: str | None) -> bytes:
    """The head of the request the real shipper sends (one batch to a capture server on loopback)."""
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        await reader.readexactly(length)
        reply = b'{"accepted":1,"duplicates":0}'
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(reply)).encode()
            + b"\r\n\r\n"
            + reply
        )
        await writer.drain()
        writer.close()
        if not got.done():
            got.set_result(head)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    shipper = Shipper("capture", f"http://127.0.0.1:{port}", token, AgentMetrics())
    task = asyncio.create_task(shipper.run())
    try:
        shipper.offer(Event("capture", "capture", "nvml", SUMMARY_KIND, time.time(), {"gpu": 0}))
        return await asyncio.wait_for(got, 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.close()
        await server.wait_closed()


def request_head(token: str | None, host: str, port: int) -> tuple[bytes, bytes]:
    """(the head up to ``Content-Length: ``, the rest): the shipper's request head for ``host:port``."""
    head = asyncio.run(_capture_head(token))
    head = re.sub(rb"(?i)\r\nhost: *[^\r]*", b"\r\nHost: " + f"{host}:{port}".encode(), head, count=1)
    head = re.sub(rb"(?i)\r\ncontent-length: *\d+", b"", head, count=1)
    assert head.endswith(b"\r\n\r\n") and head.startswith(f"POST {INGEST_PATH} HTTP/1.1".encode()), head
    return head[:-2] + b"Content-Length: ", b"\r\n\r\n"


# ------------------------------------------------------------------------------------------ the nodes


@dataclass
class Stats:
    """What one process saw; merged across processes by :func:`merge`."""

    nodes: int = 0
    due: int = 0  # windows due in the measured span
    late_s: list[float] = field(default_factory=list)  # the generator's delay at each due send (measured)
    deferred: int = 0  # windows that waited for an unanswered request of their node (the engine's delay)
    lag_s: list[float] = field(default_factory=list)  # reply time - event time, per delivered window
    phase_s: list[float] = field(default_factory=list)  # due send time - event time: the agent's own delay
    rtt_s: list[float] = field(default_factory=list)  # request written -> reply read
    windows_delivered: int = 0
    events_sent: int = 0  # in delivered requests
    accepted: int = 0
    duplicates: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    dropped_events: int = 0  # refused with a status the shipper does not retry
    conn_errors: int = 0
    timeouts: int = 0
    retries: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    undelivered_at_end: int = 0  # windows still queued or in flight when the run ended
    connections_peak: int = 0
    closed_by_server: int = 0  # connections the engine closed after a reply (Connection: close)
    nofile: int = 0


class _Conn(asyncio.Protocol):
    __slots__ = ("buf", "gen", "node", "transport")

    def __init__(self, node: _Node) -> None:
        self.node = node
        self.gen = node.gen
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        gen = self.gen
        gen.open_conns += 1
        gen.stats.connections_peak = max(gen.stats.connections_peak, gen.open_conns)
        self.node.connected(self)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end]
            m = _CONTENT_LENGTH.search(head)
            length = int(m.group(1)) if m else 0
            if len(buf) < end + 4 + length:
                break
            body = buf[end + 4 : end + 4 + length]
            buf = buf[end + 4 + length :]
            status = int(head[9:12])
            closing = self.transport if _CLOSE.search(head) is not None else None
            if closing is not None:  # the server closes it: the node's next request takes a new one
                self.transport = None
                self.gen.stats.closed_by_server += 1
            self.node.replied(status, body)
            if closing is not None:
                closing.close()
        self.buf = buf

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.gen.open_conns -= 1
        self.node.lost(self)


_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")
_CLOSE = re.compile(rb"(?i)\r\nconnection: *close")
_ACCEPTED = re.compile(rb'"accepted": *(\d+)')
_DUPLICATES = re.compile(rb'"duplicates": *(\d+)')


class _Node:
    __slots__ = (
        "backoff",
        "conn",
        "connecting",
        "enc",
        "gen",
        "in_flight",
        "pending",
        "phase",
        "ready",
        "ready_for",
        "retry_handle",
        "sent_at",
    )

    def __init__(self, gen: _Generator, enc: NodeEncoder, phase: float) -> None:
        self.gen = gen
        self.enc = enc
        self.phase = phase
        self.conn: _Conn | None = None
        self.connecting = False
        self.pending: list[float] = []  # window ends waiting to be sent
        self.in_flight: list[float] = []
        self.sent_at = 0.0
        self.backoff = RETRY_INITIAL_S
        self.retry_handle: asyncio.TimerHandle | None = None
        self.ready: bytes | None = None  # the body of window ``ready_for``, encoded ahead
        self.ready_for = 0.0

    def prepare(self, window_end: float) -> None:
        """Encode the body of window ``window_end`` ahead of its send, while the fleet is quiet."""
        self.ready = self.enc.body([window_end], self.gen.window_s)
        self.ready_for = window_end

    def send_time(self, window_end: float) -> float:
        """The node's first sample at or after ``window_end`` (samples every sample_s from its phase)."""
        s = self.gen.sample_s
        return window_end + ((self.phase - window_end) % s)

    def due(self, window_end: float, at: float) -> None:
        gen = self.gen
        now = gen.wall()
        if gen.measuring(at):
            gen.stats.due += 1
            gen.stats.late_s.append(now - at)
        if not gen.stopping:
            nxt = window_end + gen.window_s
            gen.loop.call_at(gen.to_loop(self.send_time(nxt)), self.due, nxt, self.send_time(nxt))
            # the fleet sends within sample_s of each window's end: encode the next body in the quiet rest
            quiet = max(0.0, gen.window_s - gen.sample_s)
            prepare_at = window_end + gen.sample_s + quiet * (self.phase / gen.sample_s)
            if prepare_at < self.send_time(nxt):
                gen.loop.call_at(gen.to_loop(prepare_at), self.prepare, nxt)
        if self.in_flight and gen.measuring(at):
            gen.stats.deferred += 1
        self.pending.append(window_end)
        self.kick()

    def kick(self) -> None:
        if self.in_flight or not self.pending or self.retry_handle is not None:
            return
        if self.conn is None or self.conn.transport is None:
            if not self.connecting:
                self.connecting = True
                self.gen.connect(self)
            return
        windows, self.pending = self.pending, []
        if self.ready is not None and len(windows) == 1 and windows[0] == self.ready_for:
            body = self.ready
        else:
            body = self.enc.body(windows, self.gen.window_s)
        self.ready = None
        head, tail = self.gen.head
        self.conn.transport.write(head + str(len(body)).encode() + tail + body)
        self.in_flight = windows
        self.sent_at = self.gen.loop.time()
        self.gen.in_flight.add(self)

    def connected(self, conn: _Conn) -> None:
        self.conn = conn
        self.connecting = False
        self.kick()

    def connect_failed(self) -> None:
        self.connecting = False
        self.gen.stats.conn_errors += 1
        self._retry()

    def lost(self, conn: _Conn) -> None:
        if self.conn is not conn:
            return
        self.conn = None
        if self.in_flight:
            self.gen.stats.conn_errors += 1
            self._requeue()

    def timed_out(self) -> None:
        self.gen.stats.timeouts += 1
        conn, self.conn = self.conn, None
        if conn is not None and conn.transport is not None:
            conn.node = _DETACHED  # its late reply or loss is no longer ours
            conn.transport.abort()
        self._requeue()

    def _requeue(self) -> None:
        self.pending = self.in_flight + self.pending
        self.in_flight = []
        self.gen.in_flight.discard(self)
        self._retry()

    def _retry(self) -> None:
        self.gen.stats.retries += 1
        if self.retry_handle is None:
            self.retry_handle = self.gen.loop.call_later(self.backoff, self._retry_now)
            self.backoff = min(30.0, self.backoff * 2)

    def _retry_now(self) -> None:
        self.retry_handle = None
        self.kick()

    def replied(self, status: int, body: bytes) -> None:
        gen = self.gen
        if not self.in_flight:
            return
        stats = gen.stats
        now_loop = gen.loop.time()
        windows, self.in_flight = self.in_flight, []
        gen.in_flight.discard(self)
        stats.statuses[status] += 1
        if 200 <= status < 300:
            now = gen.wall()
            n_events = len(windows) * gen.gpus
            stats.events_sent += n_events
            m = _ACCEPTED.search(body)
            stats.accepted += int(m.group(1)) if m else 0
            m = _DUPLICATES.search(body)
            stats.duplicates += int(m.group(1)) if m else 0
            stats.rtt_s.append(now_loop - self.sent_at)
            for w in windows:
                if gen.measuring(self.send_time(w)):
                    stats.windows_delivered += 1
                    stats.lag_s.append(now - w)
                    stats.phase_s.append(self.send_time(w) - w)
            self.backoff = RETRY_INITIAL_S
            self.kick()
        elif status in RETRYABLE or status in (401, 403):
            self.pending = windows + self.pending
            self._retry()
        else:
            stats.dropped_events += len(windows) * gen.gpus
            self.kick()


class _Detached:
    def replied(self, status: int, body: bytes) -> None:
        pass

    def lost(self, conn: _Conn) -> None:
        pass

    def connected(self, conn: _Conn) -> None:
        if conn.transport is not None:
            conn.transport.close()


_DETACHED: Any = _Detached()


class _Generator:
    def __init__(
        self,
        host: str,
        port: int,
        head: tuple[bytes, bytes],
        indices: Sequence[int],
        nodes_total: int,
        window_s: float,
        sample_s: float,
        gpus: int,
        start: float,
        measure_from: float,
        measure_to: float,
        prefix: str,
    ) -> None:
        self.host, self.port, self.head = host, port, head
        self.window_s, self.sample_s, self.gpus = window_s, sample_s, gpus
        self.start, self.measure_from, self.measure_to = start, measure_from, measure_to
        self.stats = Stats(nodes=len(indices))
        self.stopping = False
        self.open_conns = 0
        self.in_flight: set[_Node] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        templates = agent_summaries(gpus, sample_s, window_s)
        jobs = fleet_jobs(nodes_total)
        self.nodes = [
            _Node(
                self,
                NodeEncoder(node_name(i, prefix), jobs[i], templates[jobs[i] is not None], i),
                # the sampling phases of the fleet's agents, spread evenly (golden-ratio sequence)
                ((i * 0.6180339887498949) % 1.0) * sample_s,
            )
            for i in indices
        ]
        self.loop = asyncio.get_running_loop()
        self._offset = time.time() - self.loop.time()

    def wall(self) -> float:
        return self.loop.time() + self._offset

    def to_loop(self, wall: float) -> float:
        return wall - self._offset

    def measuring(self, at: float) -> bool:
        return self.measure_from <= at < self.measure_to

    def connect(self, node: _Node) -> None:
        async def go() -> None:
            try:
                await self.loop.create_connection(lambda: _Conn(node), self.host, self.port)
            except OSError:
                node.connect_failed()

        task = self.loop.create_task(go())
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def run(self) -> None:
        first = math.floor(self.start / self.window_s) * self.window_s + self.window_s
        for node in self.nodes:
            w = first
            while node.send_time(w) < self.start:
                w += self.window_s
            self.loop.call_at(self.to_loop(node.send_time(w)), node.due, w, node.send_time(w))
        sweep = asyncio.create_task(self._sweep())
        await asyncio.sleep(max(0.0, self.measure_from - self.wall()))
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        w0 = time.monotonic()
        await asyncio.sleep(max(0.0, self.measure_to - self.wall()))
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        self.stats.wall_s = time.monotonic() - w0
        self.stats.cpu_s = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        self.stopping = True
        # what was due in the measured span gets the shipper's time to be answered
        for _ in range(int((REQUEST_TIMEOUT_S + 2) / 0.1)):
            if not self._owed():
                break
            await asyncio.sleep(0.1)
        self.stats.undelivered_at_end = self._owed()
        sweep.cancel()
        for task in list(self._connecting):
            task.cancel()
        for node in self.nodes:
            if node.retry_handle is not None:
                node.retry_handle.cancel()
            if node.conn is not None and node.conn.transport is not None:
                node.conn.node = _DETACHED
                node.conn.transport.close()
        await asyncio.sleep(0.2)

    def _owed(self) -> int:
        """Windows due in the measured span not delivered yet."""
        return sum(1 for n in self.nodes for w in n.pending + n.in_flight if self.measuring(n.send_time(w)))

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            limit = self.loop.time() - REQUEST_TIMEOUT_S
            for node in [n for n in self.in_flight if n.sent_at < limit]:
                node.timed_out()


# --------------------------------------------------------------------------------------- processes


def raise_nofile(need: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _worker(conn: multiprocessing.connection.Connection, args: dict[str, Any]) -> None:
    nofile = raise_nofile(len(args["indices"]) + 256)
    if nofile < len(args["indices"]) + 64:
        conn.send({"error": f"open-files limit {nofile} is below {len(args['indices'])} connections"})
        return

    async def main() -> Stats:
        gen = _Generator(**args)
        gen.stats.nofile = nofile
        await gen.run()
        return gen.stats

    try:
        conn.send({"stats": asyncio.run(main())})
    except BaseException as exc:  # the parent reports it
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        raise


@dataclass(frozen=True)
class Plan:
    url: str
    token: str | None
    nodes: int
    duration_s: float
    warmup_s: float = 15.0
    procs: int = 2
    gpus: int = 8
    window_s: float = 5.0
    sample_s: float = 2.0
    prefix: str = "gpu-"
    first: int = 0  # the fleet's slice from this node on (a shard's nodes): names and jobs as in the fleet


class Run:
    """The worker processes of one run, started at once; :meth:`result` waits for them."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        host, _, port = plan.url.removeprefix("http://").rstrip("/").partition(":")
        head = request_head(plan.token, host, int(port or 80))
        self.start = time.time() + 1.0  # the workers build their nodes meanwhile
        self.measure_from = self.start + plan.warmup_s
        self.measure_to = self.measure_from + plan.duration_s
        ctx = multiprocessing.get_context("fork")
        self._procs: list[tuple[multiprocessing.process.BaseProcess, Any]] = []
        for w in range(plan.procs):
            parent, child = ctx.Pipe(duplex=False)
            args = {
                "host": host,
                "port": int(port or 80),
                "head": head,
                "indices": list(range(plan.first + w, plan.first + plan.nodes, plan.procs)),
                "nodes_total": plan.first + plan.nodes,
                "window_s": plan.window_s,
                "sample_s": plan.sample_s,
                "gpus": plan.gpus,
                "start": self.start,
                "measure_from": self.measure_from,
                "measure_to": self.measure_to,
                "prefix": plan.prefix,
            }
            proc = ctx.Process(target=_worker, args=(child, args), name=f"loadgen-{w}", daemon=True)
            proc.start()
            child.close()
            self._procs.append((proc, parent))

    @property
    def pids(self) -> list[int]:
        return [p.pid for p, _ in self._procs if p.pid is not None]

    def result(self) -> Report:
        stats: list[Stats] = []
        errors: list[str] = []
        for proc, pipe in self._procs:
            timeout = self.measure_to - time.time() + REQUEST_TIMEOUT_S + 60
            if pipe.poll(max(1.0, timeout)):
                msg = pipe.recv()
                if "error" in msg:
                    errors.append(msg["error"])
                else:
                    stats.append(msg["stats"])
            else:
                errors.append(f"{proc.name} gave no result")
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        return Report(self.plan, merge(stats), errors)

    def stop(self) -> None:
        for proc, _ in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join()


def merge(parts: Sequence[Stats]) -> Stats:
    out = Stats()
    for s in parts:
        out.nodes += s.nodes
        out.due += s.due
        out.late_s += s.late_s
        out.deferred += s.deferred
        out.lag_s += s.lag_s
        out.phase_s += s.phase_s
        out.rtt_s += s.rtt_s
        out.windows_delivered += s.windows_delivered
        out.events_sent += s.events_sent
        out.accepted += s.accepted
        out.duplicates += s.duplicates
        out.statuses.update(s.statuses)
        out.dropped_events += s.dropped_events
        out.conn_errors += s.conn_errors
        out.timeouts += s.timeouts
        out.retries += s.retries
        out.cpu_s += s.cpu_s
        out.wall_s = max(out.wall_s, s.wall_s)
        out.undelivered_at_end += s.undelivered_at_end
        out.connections_peak += s.connections_peak
        out.closed_by_server += s.closed_by_server
        out.nofile = max(out.nofile, s.nofile)
    return out


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


@dataclass
class Report:
    plan: Plan
    stats: Stats
    errors: list[str]
    max_behind_s: float = 1.0

    @property
    def behind(self) -> bool:
        """The generator fell behind its schedule: not a measurement."""
        s = self.stats
        return (
            bool(self.errors)
            or not s.late_s
            or max(s.late_s) > self.max_behind_s
            or pct(s.late_s, 0.99) > self.max_behind_s / 4
        )

    @property
    def complete(self) -> bool:
        """Every window due in the measured span delivered and accepted, nothing refused or dropped."""
        s = self.stats
        return (
            s.windows_delivered == s.due
            and s.dropped_events == 0
            and s.undelivered_at_end == 0
            and s.accepted + s.duplicates == s.events_sent
        )

    def figures(self) -> dict[str, Any]:
        s, p = self.stats, self.plan
        wall = s.wall_s or p.duration_s
        return {
            "nodes": p.nodes,
            "gpus": p.nodes * p.gpus,
            "procs": p.procs,
            "measured_s": round(wall, 1),
            "windows_due": s.due,
            "windows_delivered": s.windows_delivered,
            "events_per_s": round(s.events_sent / wall, 1),
            "requests_per_s": round(sum(s.statuses.values()) / wall, 1),
            "behind_p99_s": round(pct(s.late_s, 0.99), 4),
            "behind_max_s": round(max(s.late_s, default=float("nan")), 4),
            "deferred_windows": s.deferred,
            "lag_p50_s": round(pct(s.lag_s, 0.50), 4),
            "lag_p95_s": round(pct(s.lag_s, 0.95), 4),
            "lag_max_s": round(max(s.lag_s, default=float("nan")), 4),
            "floor_lag_p50_s": round(pct(s.phase_s, 0.50), 4),
            "floor_lag_p95_s": round(pct(s.phase_s, 0.95), 4),
            "rtt_p50_s": round(pct(s.rtt_s, 0.50), 4),
            "rtt_p95_s": round(pct(s.rtt_s, 0.95), 4),
            "rtt_p99_s": round(pct(s.rtt_s, 0.99), 4),
            "accepted": s.accepted,
            "duplicates": s.duplicates,
            "events_sent": s.events_sent,
            "dropped_events": s.dropped_events,
            "undelivered_at_end": s.undelivered_at_end,
            "statuses": {str(k): v for k, v in sorted(s.statuses.items())},
            "conn_errors": s.conn_errors,
            "timeouts": s.timeouts,
            "connections_peak": s.connections_peak,
            "closed_by_server": s.closed_by_server,
            "open_files_limit": s.nofile,
            "cpu_cores": round(s.cpu_s / wall, 3),
            "behind": self.behind,
            "complete": self.complete,
            "errors": self.errors,
        }

    def lines(self) -> list[str]:
        f = self.figures()
        out = [
            f"load generator: {f['nodes']:,} agents ({f['gpus']:,} GPUs) in {f['procs']} processes, "
            f"{f['connections_peak']:,} connections, measured {f['measured_s']} s",
            f"  sent      {f['events_per_s']:,.0f} events/s in {f['requests_per_s']:,.0f} requests/s; "
            f"{f['windows_delivered']:,} of {f['windows_due']:,} windows delivered; engine accepted "
            f"{f['accepted']:,} + {f['duplicates']:,} duplicates of {f['events_sent']:,}",
            f"  schedule  generator behind p99 {f['behind_p99_s']:.3f} s, max {f['behind_max_s']:.3f} s; "
            f"windows deferred by an unanswered request (the engine's delay): {f['deferred_windows']:,}",
            f"  lag       event time -> reply (evaluated) p50 {f['lag_p50_s']:.3f} s, "
            f"p95 {f['lag_p95_s']:.3f} s, max {f['lag_max_s']:.3f} s; round trip p50 {f['rtt_p50_s']:.3f} s, "
            f"p95 {f['rtt_p95_s']:.3f} s",
            f"            floor: the agent's own delay (window end -> its next sample) p50 "
            f"{f['floor_lag_p50_s']:.3f} s, p95 {f['floor_lag_p95_s']:.3f} s",
            f"  errors    statuses {f['statuses']}, connection errors {f['conn_errors']}, timeouts "
            f"{f['timeouts']}, dropped {f['dropped_events']}, undelivered at end {f['undelivered_at_end']}, "
            f"connections closed by the engine {f['closed_by_server']}",
            f"  itself    {f['cpu_cores']:.3f} cores (all processes), "
            f"open-files limit {f['open_files_limit']:,}",
        ]
        if self.errors:
            out.append(f"  FAILED    {'; '.join(self.errors)}")
        if self.behind:
            out.append(
                "  NOT A MEASUREMENT: the load generator fell behind its schedule "
                f"(max {f['behind_max_s']:.3f} s > {self.max_behind_s} s or p99 > {self.max_behind_s / 4} s)"
            )
        return out


def run(plan: Plan) -> Report:
    return Run(plan).result()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--token-file", type=Path, help="the engine's agent token (default: $WATCHD_TOKEN)")
    ap.add_argument("--nodes", type=int, default=12_500)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--max-behind", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    token = args.token_file.read_text().strip() if args.token_file else os.environ.get("WATCHD_TOKEN")
    report = run(Plan(args.url, token, args.nodes, args.duration, args.warmup, args.procs))
    report.max_behind_s = args.max_behind
    print("\n".join(report.lines()))
    if args.json:
        print(json.dumps(report.figures()))
    return 1 if report.behind else 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["Plan", "Report", "Run", "agent_summaries", "fleet_jobs", "node_name", "run"]
