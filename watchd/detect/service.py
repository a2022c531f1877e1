"""The detectors in the engine, as one subsystem (:mod:`watchd.subsystem`): the fleet state every event
feeds, the job topology refreshed from the job providers (Slurm ``squeue``, Kubernetes pods), and every
``detectors.interval_s`` one cycle of the detectors over each running job, whose findings go to the rules
like any other event. The correlation itself is plain code (:mod:`watchd.detect.correlator`); a cycle runs
in slices of :data:`~watchd.slices.SLICE_S` on the event loop (:mod:`watchd.slices`): at 100,000 jobs a
cycle computes for seconds, and ingest, ``/healthz`` and the API are served between its slices."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry

from watchd.clock import Clock
from watchd.detect.correlator import Correlator
from watchd.detect.finding import Finding
from watchd.detect.metrics import DetectorMetrics
from watchd.detect.params import DetectorsConfig
from watchd.jobs.model import JobProvider, JobProviderError
from watchd.jobs.settings import JobsConfig
from watchd.jobs.topology import JobTopology
from watchd.logs import get_logger
from watchd.model.events import Event
from watchd.slices import SLICE_S, SliceStats, run_sliced
from watchd.subsystem import Component, Handler, Job

__all__ = ["Detectors"]

_log = get_logger("watchd.engine")
FINDINGS_KEPT = 200  # the newest findings, for the status document


class Detectors(Component):
    """Inert until started; ``providers`` are set by the engine once its scheduler is built."""

    name = "detectors"

    def __init__(
        self,
        detectors: DetectorsConfig,
        jobs: JobsConfig,
        clock: Clock,
        registry: CollectorRegistry,
        emit: Callable[[Event], Awaitable[None]],
    ) -> None:
        self.config = detectors
        self.jobs_config = jobs
        self.clock = clock
        self.emit = emit  # waits, never drops
        self.correlator = Correlator(detectors, JobTopology(jobs.member_ttl_s))
        self.findings: deque[Finding] = deque(maxlen=FINDINGS_KEPT)
        self.providers: list[JobProvider] = []
        self.metrics = DetectorMetrics(registry)
        self.with_job = self.correlator.with_job
        self._refreshed_at = -1e18
        self._evictions_seen: dict[str, int] = {}  # fleet evictions already counted, by what
        self.last_cycle = SliceStats()  # how the last cycle went: computing time, slices, the longest

    def subscriptions(self) -> Mapping[str, Handler]:
        """The fleet state's kinds: its handlers, called by the engine's dispatch with no indirection."""
        return self.correlator.fleet.subscriptions()

    def jobs(self) -> Sequence[Job]:
        watch = self.config.watch_interval_s
        return (
            Job("jobs", self.jobs_config.refresh_s, self.refresh_jobs),
            Job("detectors", self.config.interval_s, self.detect),
            *((Job("detectors-watch", watch, self.watch),) if watch > 0 else ()),
            Job("fleet-prune", 60.0, self.prune),
        )

    async def start(self) -> None:
        await self.refresh_jobs()

    async def refresh_jobs(self) -> None:
        self._refreshed_at = self.clock.monotonic()
        for provider in self.providers:
            try:
                jobs = await provider.running_jobs()
            except JobProviderError as exc:
                self.metrics.job_provider_up.labels(provider.name).set(0)
                _log.warning("jobs_unavailable", provider=provider.name, error=str(exc))
                continue
            self.correlator.topology.replace(provider.name, jobs)
            self.metrics.job_provider_up.labels(provider.name).set(1)

    async def detect(self) -> None:
        """One cycle of the detectors; findings go to the rules like any other event."""
        self.count_evictions()
        topology = self.correlator.topology
        if (
            topology.take_unknown()
            and self.clock.monotonic() - self._refreshed_at >= self.jobs_config.min_refresh_s
        ):
            await self.refresh_jobs()  # agents report a job the scheduler did not list yet
        stats = SliceStats()
        findings = await run_sliced(self.correlator.steps(self.clock.now()), SLICE_S, stats)
        self.last_cycle = stats
        self.metrics.detector_cycle.observe(stats.busy_s)
        self.metrics.detector_slice.set(stats.longest_s)
        self.metrics.jobs_tracked.set(self.correlator.last_cycle_jobs)
        await self._report(findings)

    async def watch(self) -> None:
        """Between cycles: the jobs whose GPUs their agents say spin, judged for a hang (most of the time
        there are none, and this returns at once)."""
        if not self.correlator.fleet.spinning:
            return
        await self._report(await run_sliced(self.correlator.watched_steps(self.clock.now()), SLICE_S))

    async def _report(self, findings: list[Finding]) -> None:
        for finding in findings:
            self.findings.append(finding)
            self.metrics.findings.labels(finding.kind, str(finding.hardware).lower()).inc()
            _log.warning(
                "finding", kind=finding.kind, job=finding.job, node=finding.node, summary=finding.summary
            )
            await self.emit(finding.to_event())

    async def prune(self) -> None:
        await run_sliced(self.correlator.prune_steps(self.clock.now()), SLICE_S)
        self.count_evictions()

    def count_evictions(self) -> None:
        """What the fleet state evicted (counted in pure code) into its counter."""
        fleet = self.correlator.fleet
        self.metrics.fleet_state_bytes.set(fleet.bytes)
        for what, n in fleet.evicted.items():
            seen = self._evictions_seen.get(what, 0)
            if n > seen:
                self.metrics.fleet_evicted.labels(what).inc(n - seen)
                self._evictions_seen[what] = n
