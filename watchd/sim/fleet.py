"""``watchd sim``: a fleet of simulated GPU nodes, all in one process, shipping to a real engine.

Each simulated node is what an agent with the fake GPU backend would be: a
:class:`~watchd.sim.gpu.FakeGpuBackend` over a scenario of its own (training load when the node is in a job,
idle otherwise, plus its faults), a :class:`~watchd.gpu.sampler.GpuSampler` fed through ``observe()``
(health events and window summaries, tagged with the node's job), the fake's kernel-log lines through an
:class:`~watchd.xid.XidParser` into ``xid`` events, and a :class:`~watchd.agent.shipper.Shipper` to the
engine. The shippers share one HTTP session (a bounded connection pool), not one connection each.

There is no task or thread per node: one ticker wakes ``slots`` times per sampling interval and samples the
nodes of that slot (the nodes are spread evenly over the interval, so the load is smooth), inline in the
event loop by default: with 1,000 nodes x 8 GPUs every 5 s (20 nodes a tick) inline used 0.186 cores and
delivered in ~0.02 s, a worker thread 0.193 cores and ~0.06 s (the GIL serializes the work either way; a
tick's sampling and derivation take ~10 ms, short enough not to hold up the shippers);
``sample_in_thread=True`` keeps the option.

A fleet file (validated strictly; errors name the file and the key path)::

    seed: 7
    duration: 600                                  # seconds (default: until stopped)
    nodes: {count: 1000, name: "sim-{i}", start: 1}
    gpus: {model: H100-SXM, count: 8}
    interval_s: 5                                  # GPU sampling interval
    summary_window_s: 5
    jobs:
      - {id: 1001, nodes: "sim-[1-512]"}           # a Slurm job id (or "slurm:<id>", "k8s:<pod uid>")
      - {id: 1002, nodes: [sim-600, "sim-[601-700]"]}
    faults:                                         # any fault of watchd/gpu/scenario.py, plus its node(s)
      - {node: sim-3, at: 30, kind: ecc_dbe, gpu: 3}
      - {node: "sim-[10-12]", at: 60, kind: thermal, gpu: all, duration: 120}
      - {node: sim-40, at: 90, kind: xid, code: 13}
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import resource
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any, TextIO

import aiohttp
from pydantic import Field, ValidationError, field_validator, model_validator

from watchd.agent.metrics import AgentMetrics
from watchd.agent.runner import xid_event
from watchd.agent.shipper import Shipper
from watchd.config import load_yaml
from watchd.errors import ConfigError, UsageError
from watchd.gpu.jobs import JobRef, JobResolver, parse_job_label
from watchd.gpu.model import GpuLostError, GpuSample
from watchd.gpu.sampler import GpuSampler
from watchd.logs import configure_logging, get_logger
from watchd.model.events import Event
from watchd.sim.gpu import FakeGpuBackend
from watchd.sim.scenario import FAULT_KINDS, Fault, GpuSpec, Scenario, check_faults
from watchd.sources.base import LogLine
from watchd.strict import Strict as _Strict
from watchd.xid import XidParser

__all__ = [
    "Fleet",
    "FleetFault",
    "FleetJob",
    "NodeNames",
    "SimStats",
    "Simulator",
    "expand_hostlist",
    "load_fleet",
    "parse_fleet",
    "raise_nofile_limit",
    "run_sim",
]

_log = get_logger("watchd.sim.fleet")

Seconds = Annotated[float, Field(gt=0)]
_MAX_NODES = 100_000


# ------------------------------------------------------------------------------------------ host lists

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(expr: str) -> list[str]:
    """Slurm-style host lists: ``sim-3``, ``sim-[1-4,7]``, ``a-[01-10]``, ``sim-1,sim-5`` (in order, no
    duplicates). Raises ValueError on a malformed expression."""
    out: list[str] = []
    depth, part = 0, ""
    for ch in expr + ",":
        if ch == "," and depth == 0:
            if not part.strip():
                raise ValueError(f"empty name in {expr!r}")
            out.extend(_expand_one(part.strip()))
            part = ""
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in {expr!r}")
        part += ch
    if depth:
        raise ValueError(f"unbalanced brackets in {expr!r}")
    return list(dict.fromkeys(out))


def _expand_one(part: str) -> list[str]:
    m = _BRACKET.search(part)
    if m is None:
        if "[" in part or "]" in part:
            raise ValueError(f"unbalanced brackets in {part!r}")
        return [part]
    head, tail = part[: m.start()], part[m.end() :]
    out: list[str] = []
    for item in m.group(1).split(","):
        lo, sep, hi = item.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {item!r} in {part!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"range {item!r} goes backwards in {part!r}")
        if last - first >= _MAX_NODES:
            raise ValueError(f"range {item!r} is too large in {part!r}")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        for i in range(first, last + 1):
            out.extend(_expand_one(f"{head}{i:0{width}d}{tail}"))
    return out


# ------------------------------------------------------------------------------------------ the fleet file


class NodeNames(_Strict):
    """``count`` nodes named ``name.format(i=i)`` for i from ``start``: ``sim-{i}`` gives sim-1, sim-2, ..."""

    count: Annotated[int, Field(ge=1, le=_MAX_NODES)]
    name: str = "sim-{i}"
    start: Annotated[int, Field(ge=0)] = 1

    @field_validator("name")
    @classmethod
    def _pattern(cls, name: str) -> str:
        try:
            first, second = name.format(i=1), name.format(i=2)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"bad pattern {name!r} (use {{i}}, e.g. sim-{{i}}): {exc}") from None
        if first == second:
            raise ValueError(f"pattern {name!r} must contain {{i}} (e.g. sim-{{i}})")
        return name

    def names(self) -> list[str]:
        return [self.name.format(i=i) for i in range(self.start, self.start + self.count)]


NodeSelector = str | tuple[str, ...]


def _select(selector: NodeSelector) -> list[str]:
    parts = [selector] if isinstance(selector, str) else list(selector)
    return list(dict.fromkeys(n for p in parts for n in expand_hostlist(p)))


class FleetJob(_Strict):
    """A job running on some nodes: their GPUs train, and their summaries carry the job."""

    id: int | str
    nodes: NodeSelector

    def ref(self) -> JobRef | None:
        if isinstance(self.id, int):
            return JobRef("slurm", str(self.id)) if self.id >= 0 else None
        if self.id.isascii() and self.id.isdigit():
            return JobRef("slurm", self.id)
        return parse_job_label(self.id)


class FleetFault(_Strict):
    """A fault of :mod:`watchd.sim.scenario` on one or more nodes (``node``: a name or a host list). Written
    flat in the file: ``{node: sim-3, at: 30, kind: ecc_dbe, gpu: 3}``."""

    node: NodeSelector
    fault: Fault

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "fault" not in data:
            rest = dict(data)
            node = rest.pop("node", None)
            return {"fault": rest} if node is None else {"node": node, "fault": rest}
        return data


class Fleet(_Strict):
    seed: int = 0
    duration: Seconds | None = None
    nodes: NodeNames
    gpus: GpuSpec = GpuSpec()
    interval_s: Seconds = 5.0
    summary_window_s: Seconds = 5.0
    health_report_interval_s: Seconds = 30.0
    jobs: tuple[FleetJob, ...] = ()
    faults: tuple[FleetFault, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> Fleet:
        names = self.nodes.names()
        known = set(names)
        where = f"nodes are {names[0]}..{names[-1]}" if len(names) > 1 else f"the node is {names[0]}"
        if len(known) != len(names):
            raise ValueError(f"nodes.name: pattern {self.nodes.name!r} gives duplicate names")
        owner: dict[str, int] = {}
        for n, job in enumerate(self.jobs):
            if job.ref() is None:
                raise ValueError(
                    f"jobs.{n}.id: {job.id!r} is not a Slurm job id (digits) or a label slurm:<id>, k8s:<uid>"
                )
            for node in _checked(f"jobs.{n}.nodes", job.nodes, known, where):
                if node in owner:
                    raise ValueError(f"jobs.{n}.nodes: {node} is already in jobs.{owner[node]}")
                owner[node] = n
        for n, ff in enumerate(self.faults):
            _checked(f"faults.{n}.node", ff.node, known, where)
            problem = check_faults(self.gpus, [ff.fault])
            if problem is not None:
                raise ValueError(problem.replace("faults.0.", f"faults.{n}.", 1))
        return self

    def node_names(self) -> list[str]:
        return self.nodes.names()

    def jobs_by_node(self) -> dict[str, JobRef]:
        out: dict[str, JobRef] = {}
        for job in self.jobs:
            ref = job.ref()
            assert ref is not None  # validated
            for node in _select(job.nodes):
                out[node] = ref
        return out

    def faults_by_node(self) -> dict[str, list[Fault]]:
        out: dict[str, list[Fault]] = {}
        for ff in self.faults:
            for node in _select(ff.node):
                out.setdefault(node, []).append(ff.fault)
        return out

    def scenario(self, index: int, node: str, training: bool, faults: Iterable[Fault] = ()) -> Scenario:
        """The scenario of the ``index``-th node (its own seed: GPU UUIDs and serials differ across nodes)."""
        return Scenario(
            seed=self.seed * 1_000_003 + index,
            gpus=self.gpus,
            load="training" if training else "idle",
            faults=tuple(faults),
        )


def _checked(path: str, selector: NodeSelector, known: set[str], where: str) -> list[str]:
    try:
        nodes = _select(selector)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not nodes:
        raise ValueError(f"{path}: no nodes")
    unknown = [n for n in nodes if n not in known]
    if unknown:
        raise ValueError(f"{path}: unknown node {unknown[0]!r} ({where})")
    return nodes


def _format(source: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = list(err["loc"])
        # a flat fault is validated as {node, fault: {...}} and a discriminated union puts the tag in the
        # path (faults.0.fault.thermal.bogus): show faults.0.bogus
        if len(loc) >= 3 and loc[0] == "faults" and isinstance(loc[1], int) and loc[2] == "fault":
            del loc[2]
            if len(loc) >= 3 and loc[2] in FAULT_KINDS:
                del loc[2]
        # str | tuple selectors name the union member tried (nodes.str, nodes.tuple[str, ...]): drop it
        loc = [p for p in loc if not (isinstance(p, str) and (p in ("str", "int") or p.startswith("tuple[")))]
        kind = err["type"]
        msg = "unknown key" if kind == "extra_forbidden" else err["msg"]
        if kind == "union_tag_not_found":
            loc.append("kind")
            msg = f"missing (one of {', '.join(FAULT_KINDS)})"
        elif kind == "union_tag_invalid":
            loc.append("kind")
            tag = (err.get("ctx") or {}).get("tag", "?")
            msg = f"unknown fault kind {tag!r} (one of {', '.join(FAULT_KINDS)})"
        if kind == "value_error":
            msg = msg.removeprefix("Value error, ")
            if not loc:  # the fleet's own checks name the path themselves
                problems.append(f"{source}: {msg}")
                continue
        path = ".".join(str(p) for p in loc) or "(top level)"
        line = f"{source}: {path}: {msg}"
        if line not in problems:
            problems.append(line)
    return "\n".join(problems)


def parse_fleet(data: Any, source: str = "<fleet>") -> Fleet:
    """Validate parsed YAML into a :class:`Fleet`; :class:`ConfigError` names the key path."""
    if not isinstance(data, dict):
        got = "nothing" if data is None else type(data).__name__
        raise ConfigError(f"{source}: expected a mapping at the top level, got {got}")
    try:
        return Fleet.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(source, exc)) from None


def load_fleet(path: Path) -> Fleet:
    return parse_fleet(load_yaml(path), str(path))


# ------------------------------------------------------------------------------------------ the simulator


class _FixedJob(JobResolver):
    """Every GPU process of a simulated node belongs to the node's job."""

    def __init__(self, ref: JobRef) -> None:
        super().__init__()
        self._ref = ref

    def jobs_for(self, pids: Iterable[int]) -> JobRef | None:
        return self._ref


class _Node:
    __slots__ = ("backend", "emit", "lines", "name", "parser", "sampler", "seq", "shipper")

    def __init__(
        self,
        name: str,
        backend: FakeGpuBackend,
        sampler: GpuSampler,
        shipper: Shipper,
        emit: Callable[[Event], None],
        lines: list[str],
    ) -> None:
        self.name = name
        self.backend = backend
        self.sampler = sampler
        self.shipper = shipper
        self.emit = emit
        self.parser = XidParser()
        self.lines = lines  # kernel lines the fake wrote during the last sample()
        self.seq = itertools.count(1)

    def sample(self, now: float) -> list[GpuSample]:
        out = []
        for gpu in self.backend.gpus:
            try:
                out.append(self.backend.sample(gpu, now))
            except GpuLostError:
                out.append(GpuSample(time=now, gpu=gpu, lost=True))
        return out

    def take(self, samples: list[GpuSample], now: float, run_id: str) -> None:
        """On the event loop: kernel lines through the Xid parser, then the samples through the sampler."""
        lines = self.lines[:]
        self.lines.clear()
        for text in lines:
            line = LogLine(text, now, f"kmsg:{run_id}:{next(self.seq)}")
            for index, record in enumerate(self.parser.feed(text)):
                self.emit(xid_event(self.name, "kmsg", line, record, index))
        self.sampler.observe(samples)


@dataclass
class SimStats:
    """Counters of a run, as the progress line and the final summary show them."""

    nodes: int
    gpus: int
    elapsed_s: float = 0.0
    samples: int = 0
    produced: Counter[str] = field(default_factory=Counter)  # events by kind
    shipped: int = 0
    queued: int = 0
    dropped_queue_full: int = 0
    dropped_rejected: int = 0
    undelivered_at_stop: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    behind_s: float = 0.0  # how late the current sampling tick started (0: keeping up)
    max_behind_s: float = 0.0
    faults_started: int = 0

    @property
    def events(self) -> int:
        return sum(self.produced.values())

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_rejected + self.undelivered_at_stop

    def progress_line(self) -> str:
        rate = self.events / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return (
            f"sim {self.elapsed_s:6.0f}s  nodes {self.nodes}  samples {self.samples}  "
            f"events {self.events} ({rate:.0f}/s)  shipped {self.shipped}  queue {self.queued}  "
            f"dropped {self.dropped}  faults {self.faults_started}  behind {self.behind_s:.2f}s"
        )

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.produced.items())) or "none"
        reqs = ", ".join(f"{k} {n}" for k, n in sorted(self.requests.items())) or "none"
        return "\n".join(
            [
                f"sim: stopped after {self.elapsed_s:.1f} s: {self.nodes} nodes, {self.gpus} GPUs, "
                f"{self.samples} GPU samples, {self.faults_started} faults started",
                f"  events:   {self.events} produced ({kinds})",
                f"            {self.shipped} shipped, {self.queued} still queued, {self.dropped} dropped "
                f"(queue full {self.dropped_queue_full}, rejected {self.dropped_rejected}, "
                f"undelivered at stop {self.undelivered_at_stop})",
                f"  requests: {reqs}",
                f"  sampling: at most {self.max_behind_s:.2f} s behind schedule",
            ]
        )


def raise_nofile_limit() -> int:
    """Raise the soft open-files limit to the hard one (many connections); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Simulator:
    """The fleet, as an async context manager: entering starts sampling and shipping, leaving stops sampling,
    flushes the open summary windows, gives the shippers ``shutdown_flush_s`` to deliver, then stops them."""

    def __init__(
        self,
        fleet: Fleet,
        url: str,
        token: str | None,
        *,
        start_time: float | None = None,
        sample_in_thread: bool = False,
        tick_s: float = 0.1,
        connections: int = 64,
        queue_size: int = 100_000,
        max_batch: int = 1000,
        timeout_s: float = 5.0,
        shutdown_flush_s: float = 5.0,
        tap: Callable[[Event], None] | None = None,
    ) -> None:
        self.fleet = fleet
        self.url = url
        self.token = token
        self.sample_in_thread = sample_in_thread
        self.connections = connections
        self.shutdown_flush_s = shutdown_flush_s
        self.start_time = start_time if start_time is not None else time.time()
        self._run_id = f"{self.start_time:.3f}"
        self._tap = tap
        self.metrics = AgentMetrics()  # shared by every node's shipper: fleet-wide counters
        self.produced: Counter[str] = Counter()
        self.samples = 0
        self.behind_s = 0.0
        self.max_behind_s = 0.0
        self.undelivered_at_stop = 0
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ticker: asyncio.Task[None] | None = None
        self._started_mono = 0.0
        self._stopped_mono: float | None = None
        self._fault_times = sorted(ff.fault.at for ff in fleet.faults for _ in _select(ff.node))

        self.nodes: list[_Node] = []
        self._shipper_options: dict[str, Any] = {
            "queue_size": queue_size,
            "max_batch": max_batch,
            "timeout": timeout_s,
        }
        # spread the nodes evenly over the interval: node k samples in slot k * slots // N
        self.slots = max(1, round(fleet.interval_s / tick_s))
        self.tick_s = fleet.interval_s / self.slots
        self._groups: list[list[_Node]] = [[] for _ in range(self.slots)]

    def _build(self, session: aiohttp.ClientSession) -> None:
        fleet = self.fleet
        jobs = fleet.jobs_by_node()
        faults = fleet.faults_by_node()
        names = fleet.node_names()
        for index, name in enumerate(names):
            job = jobs.get(name)
            scenario = fleet.scenario(index, name, job is not None, faults.get(name, ()))
            shipper = Shipper(
                name, self.url, self.token, self.metrics, session=session, **self._shipper_options
            )
            emit = self._emitter(shipper)
            lines: list[str] = []  # the fake calls lines.append outside its lock, from the sampling thread
            backend = FakeGpuBackend(scenario, self.start_time, on_kernel_log=lines.append)
            sampler = GpuSampler(
                backend,
                name,
                emit,
                interval_s=fleet.interval_s,
                summary_window_s=fleet.summary_window_s,
                health_report_interval_s=fleet.health_report_interval_s,
                jobs=_FixedJob(job) if job is not None else None,
            )
            node = _Node(name, backend, sampler, shipper, emit, lines)
            self.nodes.append(node)
            self._groups[index * self.slots // len(names)].append(node)

    def _emitter(self, shipper: Shipper) -> Callable[[Event], None]:
        produced, tap = self.produced, self._tap

        def emit(event: Event) -> None:
            produced[event.kind] += 1
            if tap is not None:
                tap(event)
            shipper.offer(event)

        return emit

    # -------------------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Simulator:
        raise_nofile_limit()
        connector = aiohttp.TCPConnector(limit=self.connections)
        self._session = aiohttp.ClientSession(connector=connector)
        self._build(self._session)
        for node in self.nodes:
            self._tasks.append(asyncio.create_task(node.shipper.run(), name=f"ship-{node.name}"))
        self._started_mono = time.monotonic()
        self._ticker = asyncio.create_task(self._tick(), name="sim-ticker")
        _log.info("sim_started", nodes=len(self.nodes), engine=self.url, slots=self.slots)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        if self._ticker is None:
            return
        ticker, self._ticker = self._ticker, None
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        self._stopped_mono = time.monotonic()
        for node in self.nodes:  # the open windows, as an agent that stops sends them
            for event in node.sampler.summaries.flush(node.name):
                node.emit(event)
        deadline = time.monotonic() + self.shutdown_flush_s
        for node in self.nodes:
            if len(node.shipper) and not await node.shipper.wait_idle(max(0.0, deadline - time.monotonic())):
                break
        self.undelivered_at_stop = sum(len(n.shipper) for n in self.nodes)
        if self.undelivered_at_stop:
            self.metrics.dropped.labels("shutdown").inc(self.undelivered_at_stop)
            _log.error("events_undelivered_at_shutdown", count=self.undelivered_at_stop)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for k in itertools.count():
            target = t0 + k * self.tick_s
            delay = target - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                self.behind_s = 0.0
            else:
                self.behind_s = -delay
                self.max_behind_s = max(self.max_behind_s, -delay)
                await asyncio.sleep(0)  # let the shippers and the HTTP client run
            group = self._groups[k % self.slots]
            if not group:
                continue
            now = time.time()
            if self.sample_in_thread:
                rounds = await asyncio.to_thread(_sample_group, group, now)
            else:
                rounds = _sample_group(group, now)
            for node, samples in rounds:
                self.samples += len(samples)
                node.take(samples, now, self._run_id)

    # -------------------------------------------------------------------------------------- reporting

    def elapsed(self) -> float:
        end = self._stopped_mono if self._stopped_mono is not None else time.monotonic()
        return end - self._started_mono if self._started_mono else 0.0

    def stats(self) -> SimStats:
        reg = self.metrics.registry
        requests = {}
        for outcome in ("delivered", "retry", "unreachable", "unauthorized", "too_large", "rejected"):
            value = reg.get_sample_value("watchd_agent_ship_requests_total", {"outcome": outcome})
            if value:
                requests[outcome] = int(value)
        elapsed = self.elapsed()
        return SimStats(
            nodes=self.fleet.nodes.count,
            gpus=self.fleet.nodes.count * self.fleet.gpus.count,
            elapsed_s=elapsed,
            samples=self.samples,
            produced=Counter(self.produced),
            shipped=int(reg.get_sample_value("watchd_agent_events_shipped_total") or 0),
            queued=sum(len(n.shipper) for n in self.nodes),
            dropped_queue_full=sum(n.shipper.dropped for n in self.nodes),
            dropped_rejected=int(
                reg.get_sample_value("watchd_agent_events_dropped_total", {"reason": "rejected"}) or 0
            ),
            undelivered_at_stop=self.undelivered_at_stop,
            requests=requests,
            behind_s=self.behind_s,
            max_behind_s=self.max_behind_s,
            faults_started=sum(1 for at in self._fault_times if at <= elapsed),
        )


def _sample_group(group: Sequence[_Node], now: float) -> list[tuple[_Node, list[GpuSample]]]:
    return [(node, node.sample(now)) for node in group]


# ------------------------------------------------------------------------------------------ the command


def _token(token_file: Path | None) -> str | None:
    if token_file is not None:
        try:
            value = token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(f"--token-file {token_file}: {exc.strerror}") from None
        if not value:
            raise UsageError(f"--token-file {token_file}: the file is empty")
        return value
    return os.environ.get("WATCHD_TOKEN") or None


def run_sim(
    fleet_path: Path,
    url: str,
    token_file: Path | None,
    duration: float | None,
    progress_s: float,
    check: bool,
    log_level: str,
    out: TextIO,
) -> int:
    fleet = load_fleet(fleet_path)
    if duration is not None and duration <= 0:
        raise UsageError("--duration must be positive")
    if progress_s < 0:
        raise UsageError("--progress must be 0 (none) or positive")
    if check:
        jobs = len(fleet.jobs_by_node())
        print(
            f"ok: {fleet.nodes.count} nodes ({fleet.node_names()[0]}..{fleet.node_names()[-1]}) x "
            f"{fleet.gpus.count} {fleet.gpus.model}, {jobs} in jobs, {len(fleet.faults)} faults, "
            f"interval {fleet.interval_s:g} s",
            file=out,
        )
        return 0
    token = _token(token_file)
    configure_logging(log_level, "auto")
    stats = asyncio.run(_run(fleet, url, token, duration or fleet.duration, progress_s, out))
    print(stats.summary(), file=out, flush=True)
    return 0 if stats.dropped == 0 else 1


async def _run(
    fleet: Fleet, url: str, token: str | None, duration: float | None, progress_s: float, out: TextIO
) -> SimStats:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    deadline = loop.time() + duration if duration is not None else None
    sim = Simulator(fleet, url, token)
    print(
        f"sim: {fleet.nodes.count} nodes x {fleet.gpus.count} GPUs -> {url}, sampling every "
        f"{fleet.interval_s:g} s in {sim.slots} slots, "
        + (f"for {duration:g} s" if duration is not None else "until stopped (Ctrl-C)"),
        file=out,
        flush=True,
    )
    async with sim:
        next_progress = loop.time() + progress_s if progress_s else None
        while not stop.is_set():
            wake = [t for t in (deadline, next_progress) if t is not None]
            timeout = max(0.0, min(wake) - loop.time()) if wake else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout)
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            if next_progress is not None and now >= next_progress:
                print(sim.stats().progress_line(), file=out, flush=True)
                next_progress += progress_s
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    return sim.stats()
