"""The detectors over the whole fleet, one cycle at a time, with the memory of what they already reported.

:meth:`Correlator.observe` takes every ingested event; :meth:`Correlator.run` judges every running job at
``now`` and returns the findings to report. A hang or host stall is reported once when it begins and again
only when its culprit becomes better known (a culprit where there was none, hardware where there was not:
``revision`` counts); a straggler once it persisted ``straggler.for_s`` and then every
``straggler.report_every_s`` with its ``duration_s``. A condition gone for ``clear_after_s`` ends; a later
one is a new finding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from watchd.detect.finding import Finding
from watchd.detect.fleet import FleetState
from watchd.detect.hang import judge, quiet_declared, to_finding
from watchd.detect.params import DetectorsConfig, StragglerParams
from watchd.detect.straggler import (
    Evidence,
    Outlier,
    attribution,
    clock_outliers,
    compute_outliers,
    fleet_clock_medians,
    node_outliers,
    whole_nodes,
    window_clock,
)
from watchd.jobs.topology import JobTopology, JobView
from watchd.model.events import Event


@dataclass(slots=True)
class _Episode:
    onset: float
    last_true: float
    last_report: float
    revision: int = 0
    strength: int = 0


def _strength(f: Finding) -> int:
    return 2 if f.hardware else 1 if f.culprit_node is not None else 0


def job_clocks(
    fleet: FleetState,
    job: JobView,
    now: float,
    window_s: float,
    fleet_clocks: dict[tuple[str, int], float] | None,
) -> dict[tuple[str, int], float]:
    """The job's GPUs' window clocks: taken from ``fleet_clocks`` when those were computed over the same
    window, else computed over the job's own (a partition may set another ``straggler.window_s``)."""
    keys = [(node, gpu) for node in job.nodes for gpu in job.gpus.get(node, ())]
    if fleet_clocks is not None:
        return {k: fleet_clocks[k] for k in keys if k in fleet_clocks}
    out = {}
    for key in keys:
        track = fleet.gpus.get(key)
        c = window_clock(track, now, window_s) if track is not None else None
        if c is not None:
            out[key] = c
    return out


_GPU_FAULT_KINDS = frozenset({"xid", "gpu_health"})


class Correlator:
    def __init__(self, config: DetectorsConfig | None = None, topology: JobTopology | None = None) -> None:
        self.config = config or DetectorsConfig()
        self.fleet = FleetState(
            topology, history_s=self.config.history_s, spin_power_ratio=self.config.hang.spin_power_ratio
        )
        self._episodes: dict[tuple[str, ...], _Episode] = {}
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
        jobs = self.topology.jobs(now)
        self.last_cycle_jobs = len(jobs)
        out: list[Finding] = []
        seen: set[tuple[str, ...]] = set()
        window = self.config.straggler.window_s
        clocks = {
            key: c for key, t in self.fleet.gpus.items() if (c := window_clock(t, now, window)) is not None
        }
        fleet_medians = fleet_clock_medians(self.fleet, clocks)
        for job in jobs.values():
            params = self.config.for_partition(job.partition)
            verdict = judge(self.fleet, job, now, params)
            if verdict.kind is not None:
                key = (job.id, verdict.kind)
                seen.add(key)
                finding = to_finding(job, verdict, now, 0)
                ep = self._episodes.get(key)
                if ep is None:
                    self._episodes[key] = _Episode(verdict.onset, now, now, 0, _strength(finding))
                    out.append(finding)
                else:
                    ep.last_true = now
                    if _strength(finding) > ep.strength:
                        ep.revision += 1
                        ep.strength = _strength(finding)
                        ep.last_report = now
                        out.append(to_finding(job, verdict, now, ep.revision))
                continue
            if params.straggler.enabled and not quiet_declared(
                self.fleet.ranks.get(job.id, {}).values(), now
            ):
                own = params.straggler.window_s
                clocks_of_job = job_clocks(self.fleet, job, now, own, clocks if own == window else None)
                out.extend(self._stragglers(job, now, params.straggler, clocks_of_job, fleet_medians, seen))
        self._expire(now, seen)
        return out

    def _stragglers(
        self,
        job: JobView,
        now: float,
        p: StragglerParams,
        clocks: dict[tuple[str, int], float],
        fleet_medians: dict[str, float],
        seen: set[tuple[str, ...]],
    ) -> list[Finding]:
        """``clocks``: the job's GPUs' window clocks."""
        outliers: list[Outlier] = whole_nodes(clock_outliers(clocks, p), clocks)
        ranks = list(self.fleet.ranks.get(job.id, {}).values())
        flagged = {(o.node, o.gpu) for o in outliers}
        whole = {o.node for o in outliers if o.gpu is None}
        outliers += [
            o for o in compute_outliers(ranks, p) if (o.node, o.gpu) not in flagged and o.node not in whole
        ]
        outliers += [o for o in node_outliers(clocks, p) if o.node not in {x.node for x in outliers}]
        evidence = Evidence(self.fleet, now, p, clocks, fleet_medians)
        out = []
        for o in outliers:
            unit = str(o.gpu) if o.gpu is not None else f"rank{o.rank}" if o.rank is not None else "node"
            key = (job.id, "straggler", o.node, unit)
            seen.add(key)
            ep = self._episodes.get(key)
            if ep is None:
                self._episodes[key] = _Episode(now, now, 0.0)
                continue
            ep.last_true = now
            if now - ep.onset < p.for_s or (ep.last_report and now - ep.last_report < p.report_every_s):
                continue
            hardware, why = attribution(o, evidence)
            if unit == "node" and not hardware:
                continue  # a slow node without a cause: in a job of two nodes, either could be the odd one
            first = not ep.last_report
            ep.last_report = now
            ep.revision += 0 if first else 1
            if unit == "node":
                where = f"{o.node} (the whole node)"
            elif o.gpu is not None:
                where = f"{o.node} GPU {o.gpu}"
            else:
                where = f"{o.node} rank {o.rank}"
            kind = "hardware" if hardware else "software imbalance"
            out.append(
                Finding(
                    kind="straggler",
                    job=job.id,
                    time=now,
                    onset=ep.onset,
                    summary=f"job {job.id}: {where} {o.metric} {o.deviation:+.0%} vs the job's median "
                    f"({kind}: {why})",
                    confidence=0.9 if hardware else 0.6,
                    evidence=why,
                    hardware=hardware,
                    culprit_node=o.node,
                    culprit_gpu=o.gpu,
                    suspects=(o.node,),
                    partition=job.partition,
                    signal="heartbeat" if o.metric == "compute_time" else "nvml",
                    revision=ep.revision,
                    extra={
                        "metric": o.metric,
                        "value": round(o.value, 3),
                        "job_median": round(o.job_median, 3),
                        "deviation": round(o.deviation, 4),
                        **({"rank": o.rank} if o.rank is not None else {}),
                    },
                )
            )
        return out

    def _expire(self, now: float, seen: set[tuple[str, ...]]) -> None:
        clear = self.config.clear_after_s
        for key in [k for k, ep in self._episodes.items() if k not in seen and now - ep.last_true >= clear]:
            del self._episodes[key]

    def prune(self, now: float) -> None:
        self.fleet.prune(now)
