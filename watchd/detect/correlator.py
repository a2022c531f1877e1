"""The detectors over the whole fleet, one cycle at a time, with the memory of what they already reported.

:meth:`Correlator.observe` takes every ingested event; :meth:`Correlator.run` judges every running job at
``now`` with the registered detectors (:mod:`watchd.detect.registry`) and returns the findings to report
(when: :mod:`watchd.detect.episodes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from watchd.detect.detector import AnyDetector, Cycle, Prepares
from watchd.detect.episodes import Episodes
from watchd.detect.finding import Finding
from watchd.detect.fleet import FleetState
from watchd.detect.params import DetectorsConfig
from watchd.detect.registry import DETECTORS
from watchd.jobs.topology import STEP, JobTopology
from watchd.model.events import Event
from watchd.slices import Steps, release, run_all

_GPU_FAULT_KINDS = frozenset({"xid", "gpu_health"})
#: the detectors that judge between cycles the jobs whose GPUs their agents say spin (the first in the
#: registry: a job it finds hung is nothing else that cycle either)
WATCHED = frozenset({"nccl_hang"})


class Correlator:
    def __init__(
        self,
        config: DetectorsConfig | None = None,
        topology: JobTopology | None = None,
        detectors: Sequence[AnyDetector] = DETECTORS,
    ) -> None:
        self.config = config or DetectorsConfig()
        self.detectors = tuple(detectors)
        self.fleet = FleetState(
            topology,
            history_s=self.config.history_s,
            spin_power_ratio=self.config.hang.spin_power_ratio,
            max_nodes=self.config.max_nodes,
            max_bytes=int(self.config.max_state_mib * 1024 * 1024),
        )
        self.episodes = Episodes(self.config.clear_after_s)
        self.last_cycle_jobs = 0

    @property
    def topology(self) -> JobTopology:
        return self.fleet.topology

    def observe(self, event: Event) -> None:
        self.fleet.observe(event)

    def with_job(self, event: Event) -> Event:
        """A GPU fault as the rules see it: with ``job`` (the job running on that GPU, from the agents'
        summaries) when the event does not say; unchanged otherwise. Kernel Xid lines and NVML health
        conditions name a GPU but not the job, which rules like "the same Xid on one GPU across 2 jobs"
        need."""
        if event.kind not in _GPU_FAULT_KINDS or event.attrs.get("job") is not None:
            return event
        job = self.fleet.job_on_gpu(event)
        if job is None:
            return event
        return replace(event, attrs={**event.attrs, "job": job})

    def run(self, now: float) -> list[Finding]:
        """One cycle at once: every running job judged at ``now``; the findings to report."""
        return run_all(self.steps(now))

    def steps(self, now: float) -> Steps[list[Finding]]:
        """:meth:`run` in steps (:mod:`watchd.slices`): the job views in pages, each detector's fleet-wide
        preparation in pages, then one job at a time. Driven at once, the same findings as :meth:`run`;
        driven in slices, each job is judged on the state as it is when its turn comes."""
        jobs = yield from self.topology.job_steps(now)
        self.last_cycle_jobs = len(jobs)
        cycle = Cycle(self.fleet, now, self.config)
        for detector in self.detectors:
            if isinstance(detector, Prepares):
                yield from detector.prepare(cycle)
        by_partition: dict[str | None, list[tuple[AnyDetector, Any]]] = {}
        out: list[Finding] = []
        for job in jobs.values():
            judges = by_partition.get(job.partition)
            if judges is None:
                params = self.config.for_partition(job.partition)
                judges = by_partition[job.partition] = [(d, d.params(params)) for d in self.detectors]
            for detector, p in judges:
                sightings = detector.judge(cycle, job, p)
                for sighting in sightings:
                    finding = self.episodes.sighted(job.id, sighting, now)
                    if finding is not None:
                        out.append(finding)
                if sightings:
                    break  # the first condition found is the job's (registry order)
            yield
        self.episodes.expire(now)
        yield from release(jobs, STEP)  # 100,000 views freed at once would hold the loop
        return out

    def run_watched(self, now: float) -> list[Finding]:
        """Between cycles: the jobs with a GPU whose agent says it spins, judged at ``now`` by the hang
        detector alone; the findings to report (the same episodes as the cycles': nothing twice)."""
        return run_all(self.watched_steps(now))

    def watched_steps(self, now: float) -> Steps[list[Finding]]:
        """:meth:`run_watched` in steps, one job at a time. Its cost grows with the spinning jobs' sizes, not
        with the fleet's: most of the time there is none, and it returns at once."""
        out: list[Finding] = []
        if not self.fleet.spinning:
            return out
        cycle = Cycle(self.fleet, now, self.config)
        detectors = [d for d in self.detectors if d.name in WATCHED]
        for job_id in sorted(self.fleet.spinning.jobs(now, self.topology.job_of)):
            job = self.topology.view(job_id, now)
            if job is None:
                continue  # a job only its agents know: judged in the cycles
            params = self.config.for_partition(job.partition)
            for detector in detectors:
                for sighting in detector.judge(cycle, job, detector.params(params)):
                    finding = self.episodes.sighted(job.id, sighting, now)
                    if finding is not None:
                        out.append(finding)
            yield
        return out

    def prune(self, now: float) -> None:
        self.fleet.prune(now)

    def prune_steps(self, now: float) -> Steps[None]:
        return self.fleet.prune_steps(now)
