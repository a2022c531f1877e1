"""The agent, assembled: sources -> Xid parser -> events -> shipper, plus /metrics and /healthz."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from types import TracebackType

from aiohttp import web

from watchd.agent.advice import EngineAdvice
from watchd.agent.command_memory import CommandMemory
from watchd.agent.commands import CommandRunner
from watchd.agent.gpu_reset import gpu_reset_executor
from watchd.agent.heartbeat_server import HeartbeatServer
from watchd.agent.job_evidence import JobEvidence
from watchd.agent.metrics import AgentMetrics
from watchd.agent.settings import AgentConfig
from watchd.agent.shipper import Shipper
from watchd.agent.xid_dedup import XidDeduplicator
from watchd.clock import SystemClock
from watchd.errors import ConfigError
from watchd.gpu.jobs import JobResolver
from watchd.gpu.metrics import GpuCollector
from watchd.gpu.registry import backend_from_config, resetter_from_config
from watchd.gpu.sampler import GpuSampler
from watchd.httputil import metrics_handler, serve
from watchd.logs import get_logger
from watchd.model.commands import GPU_RESET
from watchd.model.events import Event, stable_id
from watchd.security import engine_client_tls, listener_tls
from watchd.sources.base import LogLine, LogSource
from watchd.sources.flight_recorder import EventSource, FlightRecorderSource
from watchd.sources.job_owners import SlurmJobOwners
from watchd.sources.registry import SourceContext, event_sources_from_config, sources_from_config
from watchd.trainlog.limit import EventLimiter
from watchd.trainlog.parser import parse_line as parse_trainlog_line
from watchd.xid import XidParser, XidRecord
from watchd.xid.render import xid_of_record

_log = get_logger("watchd.agent")

_RESTART_MIN_S = 1.0
_RESTART_MAX_S = 30.0
#: at the stop, how long the sources and then the shipper get to end once cancelled: a task still running
#: after it is left behind (logged), so the stop stays bounded whatever it waits on
_TASK_STOP_S = 2.0


def xid_event(node: str, source: str, line: LogLine, record: XidRecord, index: int) -> Event:
    """The event of one Xid the parser found in a kernel-log line (``index``: its place among the line's)."""
    return xid_of_record(record).to_event(
        id=stable_id(node, source, line.key, index), node=node, source=source, time=line.time
    )


def gpu_sampler_from_config(
    config: AgentConfig,
    metrics: AgentMetrics,
    emit: Callable[[Event], None],
    dedup: XidDeduplicator,
    kernel_log: Callable[[str], None],
) -> GpuSampler | None:
    gpu = config.sources.gpu
    backend = backend_from_config(gpu, kernel_log)
    if backend is None:
        return None
    collector = GpuCollector(job_label=gpu.job_label)
    metrics.registry.register(collector)
    up = metrics.source_up.labels(backend.name)
    return GpuSampler(
        backend,
        config.node,
        emit,
        interval_s=gpu.interval_s,
        summary_window_s=gpu.summary_window_s,
        health_report_interval_s=gpu.health_report_interval_s,
        collector=collector,
        jobs=JobResolver(gpu.proc_root),
        xid_filter=dedup.first,
        on_up=lambda ok: up.set(1 if ok else 0),
    )


@dataclass(frozen=True, slots=True)
class Checked:
    token: str | None  # the engine's ingest token
    engine_tls: ssl.SSLContext | None  # an https:// engine's
    listen_tls: ssl.SSLContext | None  # /metrics and /healthz over TLS


def preflight(config: AgentConfig) -> Checked:
    """The secrets, TLS files and settings the agent needs, read and checked before it opens anything: a
    ConfigError naming the key. The start (:class:`Agent`) begins with it and ``watchd agent --check`` builds
    the agent without starting it, so a config the check accepts is one the agent starts with."""
    e, heartbeat = config.engine, config.heartbeat
    token = e.auth.resolve("engine.auth")
    engine_tls = engine_client_tls(e.url, e.ca_file, e.client_cert, e.client_key)
    listen_tls = listener_tls(config.listen, "listen")
    if heartbeat.enabled:
        heartbeat.token_secret.resolve("heartbeat.token_secret")
    spool = config.shipper.spool_file
    if spool is not None and spool.parent.exists() and not spool.parent.is_dir():
        raise ConfigError(f"shipper.spool_file: {spool.parent} is not a folder")
    return Checked(token, engine_tls, listen_tls)


class Agent:
    def __init__(self, config: AgentConfig, sources: list[LogSource] | None = None) -> None:
        """``sources``: these instead of the configured kmsg and files (a fake GPU's kernel log is added).
        Builds everything and opens nothing (a ConfigError for a config the agent cannot start with)."""
        self.checked = checked = preflight(config)
        self.config = config
        self.node = config.node
        self.metrics = AgentMetrics()
        context = SourceContext(
            on_kmsg_lost=self.metrics.kmsg_lost.inc,
            node=config.node,
            on_file_refused=lambda source, reason: self.metrics.files_refused.labels(source, reason).inc(),
            on_bytes_skipped=lambda source, n: self.metrics.bytes_skipped.labels(source).inc(n),
            ib_ports=self.metrics.ib_ports,
            on_ib_scan=self.metrics.ib_scanned,
            on_ib_unreadable=self.metrics.ib_unreadable.inc,
        )
        if sources is None:
            self.sources = sources_from_config(config.sources, context)
        else:
            self.sources = [*sources, *sources_from_config(config.sources, context, names=["fake"])]
        e = config.engine
        self.shipper = Shipper(
            config.node,
            config.engine.url,
            checked.token,
            self.metrics,
            queue_size=config.shipper.queue_size,
            max_batch=config.shipper.max_batch,
            backoff_initial=config.shipper.backoff_initial_s,
            backoff_max=config.shipper.backoff_max_s,
            timeout=config.engine.timeout_s,
            tls=checked.engine_tls,
            spool=config.shipper.spool_file,
        )
        # training-stack lines (any source) and Flight Recorder dumps, bounded per job and kind
        training = config.sources.training
        self.trainlog_limit = EventLimiter(training.max_events_per_minute, 60.0)
        self.event_sources: list[EventSource] = (
            [
                FlightRecorderSource(
                    config.node,
                    training.flight_recorder_dirs,
                    prefix=training.flight_recorder_prefix,
                    poll_interval_s=training.flight_recorder_poll_s,
                    # a dump is a job's only when Slurm says the job is the file owner's (docs/security.md)
                    job_owners=SlurmJobOwners(
                        training.slurm_node or config.node,
                        env={"SLURM_CONF": str(training.slurm_conf)} if training.slurm_conf else None,
                    ),
                    on_refused=partial(context.on_file_refused, "flight-recorder"),
                )
            ]
            if training.flight_recorder_dirs
            else []
        )
        # event sources by name (the InfiniBand/RoCE ports): shipped as they come, no per-job bound
        self.node_event_sources = event_sources_from_config(config.sources, context)
        self.dedup = XidDeduplicator(SystemClock(), config.sources.gpu.xid_dedup_window_s)
        # A fake GPU writes its kernel-log lines to a source of its own, as a real driver to the kernel log.
        kernel_log = context.fake_kernel_log.inject_log_threadsafe
        self.gpu = gpu_sampler_from_config(config, self.metrics, self._emit, self.dedup, kernel_log)
        # a job's ranks ask the agent for their checkpoint advice; the agent asks the engine with its token
        self.advice = EngineAdvice(e.url, checked.token, e.timeout_s, checked.engine_tls)
        self.commands = self._command_runner(config)
        self.heartbeat = (
            HeartbeatServer(
                config.heartbeat, config.node, SystemClock(), self.metrics, self._emit, advice=self.advice
            )
            if config.heartbeat.enabled
            else None
        )
        self.port = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stack = AsyncExitStack()

    def _command_runner(self, config: AgentConfig) -> CommandRunner | None:
        """What the engine may ask of this node (a GPU reset), polled with the agents' token."""
        commands, e = config.commands, config.engine
        if not commands.enabled:
            return None
        backend = self.gpu.backend if self.gpu is not None else None
        resetter = resetter_from_config(commands.gpu_reset, backend, config.sources.gpu.proc_root)
        evidence = JobEvidence(commands.gpu_reset.proc_root, commands.gpu_reset.cgroup_root)
        return CommandRunner(
            config.node,
            e.url,
            self.checked.token,
            self.metrics,
            {GPU_RESET: gpu_reset_executor(resetter, self.gpu, evidence)},
            poll_s=commands.poll_s,
            timeout_s=e.timeout_s,
            memory=CommandMemory(commands.state_file),
            tls=self.checked.engine_tls,
        )

    async def __aenter__(self) -> Agent:
        await self._stack.__aenter__()
        try:
            self.shipper.restore()  # what the last stop could not deliver goes first
            self._spawn(self.shipper.run(), "shipper")
            if self.commands is not None:
                self._spawn(self.commands.run(), "commands")
            for source in self.sources:
                self._spawn(self._watch(source), f"source-{source.name}")
            for event_source in self.event_sources:
                self._spawn(self._pump(event_source), f"source-{event_source.name}")
            for event_source in self.node_event_sources:
                self._spawn(self._pump(event_source, limited=False), f"source-{event_source.name}")
            if self.gpu is not None:
                self._spawn(self.gpu.run(), "gpu")
            self._stack.push_async_callback(self._stop_tasks)
            if self.heartbeat is not None:
                self._stack.push_async_callback(self.advice.close)
                await self.heartbeat.start()  # stopped before the shipper: its last events are flushed
                self._stack.push_async_callback(self.heartbeat.stop)
            app = web.Application()
            app.router.add_get("/metrics", metrics_handler(self.metrics.registry))
            app.router.add_get("/healthz", self._healthz)
            listen, tls = self.config.listen, self.checked.listen_tls
            self.port = await self._stack.enter_async_context(serve(app, listen.host, listen.port, None, tls))
        except BaseException:
            await self._stack.aclose()
            raise
        _log.info(
            "agent_started",
            node=self.node,
            engine=self.config.engine.url,
            port=self.port,
            sources=[s.name for s in self.sources],
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()
        _log.info("agent_stopped", node=self.node)

    def _spawn(self, coro: object, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))  # type: ignore[arg-type]

    async def _stop_tasks(self) -> None:
        # Stop reading first, give the shipper a bounded time to deliver what was read, then stop it and
        # spool what is left. Every wait is bounded: the stop ends well within the unit's TimeoutStopSec.
        shipper_task, *source_tasks = self._tasks
        for task in source_tasks:
            task.cancel()
        await self._await_stopped(source_tasks)
        flush = self.config.shipper.shutdown_flush_s
        if len(self.shipper):
            await self.shipper.wait_idle(timeout=flush)
        shipper_task.cancel()
        await self._await_stopped([shipper_task])
        self.shipper.spill()

    async def _await_stopped(self, tasks: list[asyncio.Task[None]]) -> None:
        if not tasks:
            return
        _, running = await asyncio.wait(tasks, timeout=_TASK_STOP_S)
        if running:
            names = sorted(t.get_name() for t in running)
            _log.error("tasks_not_stopped", tasks=names, waited_s=_TASK_STOP_S)

    def _emit(self, event: Event, on_settled: Callable[[], None] | None = None) -> None:
        self.metrics.events.labels(event.source.split(":", 1)[0], event.kind).inc()
        self.shipper.offer(event, on_settled)

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"status": "ok", "node": self.node, "queued": len(self.shipper), "dropped": self.shipper.dropped}
        )

    def _trainlog(self, source: LogSource, line: LogLine) -> None:
        """The training-stack event of ``line``, if it is one, within the per-job bound."""
        record = parse_trainlog_line(line.text, job=line.job, gathered=line.gathered)
        if record is None:
            return
        if not self.trainlog_limit.allow(line.job, record.KIND, line.time):
            self.metrics.dropped.labels("trainlog_rate").inc()
            return
        event = record.to_event(
            id=stable_id(self.node, source.name, line.key, "trainlog"),
            node=self.node,
            source=source.name,
            time=line.time,
        )
        self._emit(event)

    async def _pump(self, source: EventSource, limited: bool = True) -> None:
        """Ship the events of an event source (Flight Recorder dumps: ``limited`` per job and kind, as the
        training stack's lines; the InfiniBand ports); restarted with backoff on failure."""
        delay = _RESTART_MIN_S
        while True:
            try:
                async for event in source.events():
                    delay = _RESTART_MIN_S
                    job = event.attrs.get("job")
                    if not limited or self.trainlog_limit.allow(job, event.kind, event.time):  # type: ignore[arg-type]
                        self._emit(event)
                    else:
                        self.metrics.dropped.labels("trainlog_rate").inc()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.source_errors.labels(source.name).inc()
                _log.error("source_failed", source=source.name, error=str(exc) or type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(_RESTART_MAX_S, delay * 2)

    def _refuse_untrusted(self, source: str, records: list[XidRecord]) -> None:
        """Xid lines not known to come from the kernel (docs/security.md): a metric and a log line."""
        for record in records:
            self.metrics.xid_untrusted.labels(source).inc()
            _log.warning(
                "xid_untrusted",
                xid=record.xid,
                pci_bus_id=record.pci_bus_id,
                source=source,
                hint="not written by the kernel (kmsg facility, journald _TRANSPORT) or a file without "
                "trust: any-writer; not evidence",
            )

    async def _watch(self, source: LogSource) -> None:
        """Read one source forever; a failure is logged, counted and the source restarted with backoff."""
        delay = _RESTART_MIN_S
        up = self.metrics.source_up.labels(source.name)
        while True:
            parser = XidParser()
            untrusted = XidParser()  # lines whose writer may not be the kernel: counted, never evidence
            up.set(1)
            try:
                async for line in source.lines():
                    delay = _RESTART_MIN_S
                    self.metrics.lines.labels(source.name).inc()
                    if not line.trusted:
                        self._refuse_untrusted(source.name, untrusted.feed(line.text))
                        # a job's own output is untrusted as kernel evidence, and is what the training
                        # stack says: its lines are read as such
                        self._trainlog(source, line)
                        continue
                    for index, record in enumerate(parser.feed(line.text)):
                        _log.info(
                            "xid_seen",
                            xid=record.xid,
                            pci_bus_id=record.pci_bus_id,
                            gpu_instance=record.gpu_instance,
                            compute_instance=record.compute_instance,
                            source=source.name,
                        )
                        if not self.dedup.first(
                            record.pci_bus_id,
                            record.xid,
                            source.name,
                            record.gpu_instance,
                            record.compute_instance,
                        ):
                            continue  # NVML's event API reported this one already
                        event = xid_event(self.node, source.name, line, record, index)
                        source.hold(line)  # read again after a restart until delivered
                        self._emit(event, partial(source.ack, line))
                    self._trainlog(source, line)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                up.set(0)
                self.metrics.source_errors.labels(source.name).inc()
                _log.error(
                    "source_failed",
                    source=source.name,
                    error=str(exc) or type(exc).__name__,
                    retry_in_s=delay,
                )
                await asyncio.sleep(delay)
                delay = min(_RESTART_MAX_S, delay * 2)
