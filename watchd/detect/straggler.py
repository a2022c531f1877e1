"""Stragglers: one GPU (or rank, or node) persistently slower than its job peers. Pure.

In a synchronous job every rank's step time is equal, so the slow one is found by per-GPU evidence: robust
outlier tests across the job's GPUs (:mod:`watchd.detect.outliers`) on each GPU's median SM clock over
``straggler.window_s``, on per-rank compute time from heartbeats, and on each node's median clock against
the other nodes' (a whole node slow at once, a node-wide power brake, is too large a share of a job of few
nodes for the per-GPU test); such a node is reported only with hardware attribution on most of its GPUs.

Drain-worthy only with hardware attribution: clock-event reasons (HW slowdown, thermal, power brake) in
most of the window's samples, a clock below the fleet median for the GPU's model, or a hardware event
(PCIe downtrain, ECC, NVLink) on that GPU. Otherwise the finding says "software imbalance" (most slow jobs
are) and the default rules only alert. Reported once an outlier persisted ``straggler.for_s``, then every
``straggler.report_every_s``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from watchd.detect.detector import Cycle, Persisting, Sighting
from watchd.detect.finding import Finding
from watchd.detect.fleet import FleetState
from watchd.detect.members import job_ranks, quiet_declared
from watchd.detect.outliers import (
    Outlier,
    clock_outliers,
    compute_outliers,
    node_outliers,
    whole_nodes,
    window_clock,
)
from watchd.detect.params import DetectorParams, StragglerParams
from watchd.detect.tracks import median
from watchd.jobs.topology import JobView

KIND = "straggler"
_EVENT_LOOKBACK_S = 600.0
STEP = 2_000  # GPUs per step of the fleet-wide pass (prepare)
_FLEET_CLOCKS = "straggler.fleet_clocks"
_FLEET_MEDIANS = "straggler.fleet_medians"


class StragglerDetector:
    name = KIND

    def params(self, of: DetectorParams) -> StragglerParams:
        return of.straggler

    def prepare(self, cycle: Cycle) -> Iterator[None]:
        """Every GPU's window clock and the fleet's median per model, in pages of :data:`STEP` GPUs."""
        window = cycle.defaults.straggler.window_s
        now = cycle.now
        tracks = list(cycle.fleet.gpus.items())  # ingest may add or drop GPUs between pages
        clocks: dict[tuple[str, int], float] = {}
        by_model: dict[str, list[float]] = {}
        for i in range(0, len(tracks), STEP):
            for key, track in tracks[i : i + STEP]:
                c = window_clock(track, now, window)
                if c is not None:
                    clocks[key] = c
                    if track.model is not None:
                        by_model.setdefault(track.model, []).append(c)
            yield
        del tracks
        cycle.keep(_FLEET_CLOCKS, clocks)
        cycle.keep(_FLEET_MEDIANS, {m: median(v) for m, v in by_model.items() if len(v) >= 3})

    def judge(self, cycle: Cycle, job: JobView, p: StragglerParams) -> Sequence[Sighting]:
        ranks = job_ranks(cycle.fleet, job)
        if not p.enabled or quiet_declared(ranks, cycle.now):
            return []
        if len(ranks) < p.min_gpus and sum(len(g) for g in job.gpus.values()) < p.min_gpus:
            return []  # too small for any of the outlier tests (each needs min_gpus GPUs or ranks)
        clocks = job_clocks(cycle, job, p.window_s)
        outliers = whole_nodes(clock_outliers(clocks, p), clocks)
        flagged = {(o.node, o.gpu) for o in outliers}
        whole = {o.node for o in outliers if o.gpu is None}
        outliers += [
            o for o in compute_outliers(ranks, p) if (o.node, o.gpu) not in flagged and o.node not in whole
        ]
        outliers += [o for o in node_outliers(clocks, p) if o.node not in {x.node for x in outliers}]
        evidence = Evidence(cycle.fleet, cycle.now, p, clocks, fleet_references(cycle))
        return [
            Persisting(
                (KIND, o.node, _unit(o)),
                p.for_s,
                p.report_every_s,
                partial(_finding, job, o, evidence),
            )
            for o in outliers
        ]


def _unit(o: Outlier) -> str:
    return str(o.gpu) if o.gpu is not None else f"rank{o.rank}" if o.rank is not None else "node"


def fleet_clocks(cycle: Cycle) -> dict[tuple[str, int], float]:
    """Every GPU's window clock over the top-level ``straggler.window_s``, once per cycle (computed by
    :meth:`StragglerDetector.prepare` in a cycle that ran it)."""
    window = cycle.defaults.straggler.window_s

    def compute() -> dict[tuple[str, int], float]:
        gpus = cycle.fleet.gpus.items()
        return {key: c for key, t in gpus if (c := window_clock(t, cycle.now, window)) is not None}

    return cycle.once(_FLEET_CLOCKS, compute)


def fleet_references(cycle: Cycle) -> dict[str, float]:
    """Per GPU model, the fleet's median clock (what a weak GPU falls below), once per cycle."""
    return cycle.once(_FLEET_MEDIANS, lambda: fleet_clock_medians(cycle.fleet, fleet_clocks(cycle)))


def job_clocks(cycle: Cycle, job: JobView, window_s: float) -> dict[tuple[str, int], float]:
    """The job's GPUs' window clocks: taken from the fleet's when computed over the same window, else over
    the job's own (a partition may set another ``straggler.window_s``)."""
    keys = [(node, gpu) for node in job.nodes for gpu in job.gpus.get(node, ())]
    if window_s == cycle.defaults.straggler.window_s:
        clocks = fleet_clocks(cycle)
        return {k: clocks[k] for k in keys if k in clocks}
    out = {}
    for key in keys:
        track = cycle.fleet.gpus.get(key)
        c = window_clock(track, cycle.now, window_s) if track is not None else None
        if c is not None:
            out[key] = c
    return out


def _finding(job: JobView, o: Outlier, ev: Evidence, onset: float, revision: int) -> Finding | None:
    hardware, why = attribution(o, ev)
    unit = _unit(o)
    if unit == "node" and not hardware:
        return None  # a slow node without a cause: in a job of two nodes, either could be the odd one
    if unit == "node":
        where = f"{o.node} (the whole node)"
    elif o.gpu is not None:
        where = f"{o.node} GPU {o.gpu}"
    else:
        where = f"{o.node} rank {o.rank}"
    kind = "hardware" if hardware else "software imbalance"
    return Finding(
        kind=KIND,
        job=job.id,
        time=ev.now,
        onset=onset,
        summary=f"job {job.id}: {where} {o.metric} {o.deviation:+.0%} vs the job's median ({kind}: {why})",
        confidence=0.9 if hardware else 0.6,
        evidence=why,
        hardware=hardware,
        culprit_node=o.node,
        culprit_gpu=o.gpu,
        suspects=(o.node,),
        partition=job.partition,
        signal="heartbeat" if o.metric == "compute_time" else "nvml",
        revision=revision,
        extra={
            "metric": o.metric,
            "value": round(o.value, 3),
            "job_median": round(o.job_median, 3),
            "deviation": round(o.deviation, 4),
            **({"rank": o.rank} if o.rank is not None else {}),
        },
    )


def fleet_clock_medians(fleet: FleetState, clocks: Mapping[tuple[str, int], float]) -> dict[str, float]:
    """Per GPU model, the median computing clock across the fleet (the reference a weak GPU falls below)."""
    by_model: dict[str, list[float]] = {}
    for key, c in clocks.items():
        track = fleet.gpus.get(key)
        if track is not None and track.model is not None:
            by_model.setdefault(track.model, []).append(c)
    return {m: median(v) for m, v in by_model.items() if len(v) >= 3}


@dataclass(frozen=True, slots=True)
class Evidence:
    """What attribution reads, gathered once per job and cycle."""

    fleet: FleetState
    now: float
    p: StragglerParams
    clocks: Mapping[tuple[str, int], float]  # the job's GPUs' window clocks
    fleet_medians: Mapping[str, float]


def attribution(o: Outlier, ev: Evidence) -> tuple[bool, str]:
    """(hardware?, the evidence) for an outlier; a whole node's (no GPU, no rank): its GPUs' majority."""
    if o.gpu is not None or o.rank is not None:
        return _gpu_attribution(o.node, o.gpu, ev)
    gpus = sorted(g for n, g in ev.clocks if n == o.node)
    causes = [why for g in gpus for hardware, why in [_gpu_attribution(o.node, g, ev)] if hardware]
    if gpus and len(causes) * 2 > len(gpus):
        return True, f"{causes[0]} (on {len(causes)} of the node's {len(gpus)} GPUs)"
    return False, "no hardware cause on most of the node's GPUs"


def _gpu_attribution(node: str, gpu: int | None, ev: Evidence) -> tuple[bool, str]:
    p = ev.p
    track = ev.fleet.gpus.get((node, gpu)) if gpu is not None else None
    if track is not None:
        recent = [w for w in track.windows if w.end >= ev.now - p.window_s]
        if recent:
            for name, frac in (
                ("power_brake", sum(w.power_brake for w in recent) / len(recent)),
                ("thermal", sum(w.thermal for w in recent) / len(recent)),
                ("hw_slowdown", sum(w.hw_slowdown for w in recent) / len(recent)),
            ):
                if frac >= p.reason_frac:
                    return True, f"{name} clock-event reason in {frac:.0%} of samples"
        clock = ev.clocks.get((node, track.gpu))
        reference = ev.fleet_medians.get(track.model or "")
        if clock is not None and reference is not None and clock <= reference * (1 - p.fleet_clock_drop):
            return (
                True,
                f"SM clock {clock:.0f} MHz, {1 - clock / reference:.0%} below the fleet median for its model",
            )
    for h in ev.fleet.hardware_events(node, ev.now - _EVENT_LOOKBACK_S):
        # a NIC's fault slows a rank's collectives, not its SM clock or compute time: no cause here
        if h.hardware and (h.gpu is None or h.gpu == gpu) and not h.condition.startswith("ib_"):
            return True, h.what
    return False, "no hardware cause: software imbalance"
