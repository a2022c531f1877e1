"""The reliability report (per node, GPU model and partition; the lemon list; GPU-hours lost) and the
checkpoint advice for a running job. Pure: plain data in, plain data out, ``now`` passed in."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from watchd.model.events import Event, stable_id
from watchd.model.reliability import KIND as ADVICE_KIND
from watchd.model.reliability import SOURCE as ADVICE_SOURCE
from watchd.model.reliability import CheckpointInterval
from watchd.reliability.checkpoint import daly, job_mtbf, waste, waste_first_order, young
from watchd.reliability.estimate import MtbfEstimate, mtbf
from watchd.reliability.jobs import JobCheckpoints
from watchd.reliability.service import Interval

__all__ = [
    "ADVICE_DOC",
    "Advice",
    "Failure",
    "NodeInfo",
    "Report",
    "advice_finding",
    "advise",
    "build_report",
    "parse_since",
]

UNKNOWN_MODEL = "unknown"
FLEET = "all"


@dataclass(frozen=True, slots=True)
class Failure:
    time: float
    node: str
    rule: str
    evidence: str
    mode: str
    gpu: int | None = None
    back_at: float | None = None  # when the node was back in service (None: still out)

    def to_dict(self, gpus: int, now: float) -> dict[str, Any]:
        out_s = max(0.0, (self.back_at if self.back_at is not None else now) - self.time)
        return {
            "time": self.time,
            "node": self.node,
            "rule": self.rule,
            "evidence": self.evidence,
            "mode": self.mode,
            "gpu": self.gpu,
            "back_at": self.back_at,
            "out_hours": round(out_s / 3600.0, 3),
            "gpu_hours_lost": round(out_s * gpus / 3600.0, 3),
        }


@dataclass(frozen=True, slots=True)
class NodeInfo:
    model: str | None = None
    gpus: int = 0
    partitions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Report:
    """Everything ``watchd reliability`` shows; :meth:`to_dict` is the API's document."""

    now: float
    since: float
    confidence: float
    fleet: MtbfEstimate
    nodes: Mapping[str, MtbfEstimate]
    models: Mapping[str, MtbfEstimate]
    partitions: Mapping[str, MtbfEstimate]
    failures: Sequence[Failure]
    lemons: Sequence[tuple[str, int]]
    gpu_hours_lost: float
    node_hours_lost: float
    info: Mapping[str, NodeInfo]

    def mtbf_of_partition(self, partition: str | None) -> MtbfEstimate:
        if partition is not None and partition in self.partitions:
            return self.partitions[partition]
        return self.fleet

    def to_dict(self, nodes_limit: int = 1000) -> dict[str, Any]:
        troubled = heapq.nsmallest(nodes_limit, self.nodes.items(), key=lambda kv: (-kv[1].failures, kv[0]))
        return {
            "now": self.now,
            "since": self.since,
            "estimator": ESTIMATOR,
            "confidence": self.confidence,
            "fleet": self.fleet.to_dict(),
            "partitions": {k: v.to_dict() for k, v in sorted(self.partitions.items())},
            "gpu_models": {k: v.to_dict() for k, v in sorted(self.models.items())},
            "nodes": {k: v.to_dict() for k, v in troubled},
            "nodes_total": len(self.nodes),
            "failures": [f.to_dict(self.info.get(f.node, NodeInfo()).gpus, self.now) for f in self.failures],
            "lemons": [{"node": n, "failures": c} for n, c in self.lemons],
            "gpu_hours_lost": round(self.gpu_hours_lost, 3),
            "node_hours_lost": round(self.node_hours_lost, 3),
        }


ESTIMATOR = (
    "MTBF = node-hours in service / failures (exponential failures); exact chi-square (Poisson) interval: "
    "lower = 2T/chi2(1-a/2, 2r+2), upper = 2T/chi2(a/2, 2r); with 0 failures only the lower bound "
    "2T/chi2(1-a, 2). A failure: a watchd drain (drained, or dry_run) on hardware evidence."
)


def _overlap(iv: Interval, since: float, now: float) -> float:
    return max(0.0, min(iv.end, now) - max(iv.start, since))


def build_report(
    *,
    now: float,
    since: float,
    intervals: Iterable[Interval],
    failures: Iterable[Failure],
    info: Mapping[str, NodeInfo],
    confidence: float = 0.9,
    partition: str | None = None,
    lemon_failures: int = 2,
    lemon_window_s: float = 28 * 86400.0,
    lemons_limit: int = 100,
) -> Report:
    """The accounting over ``[since, now]``; with ``partition``, only that partition's nodes."""

    def partitions_of(node: str) -> tuple[str, ...]:
        return info.get(node, NodeInfo()).partitions or (FLEET,)

    def wanted(node: str) -> bool:
        return partition is None or partition in partitions_of(node)

    exposure: dict[str, float] = {}
    for iv in intervals:
        if wanted(iv.node):
            t = _overlap(iv, since, now)
            if t > 0:
                exposure[iv.node] = exposure.get(iv.node, 0.0) + t
    fails = sorted((f for f in failures if since <= f.time <= now and wanted(f.node)), key=lambda f: f.time)
    count: dict[str, int] = {}
    for f in fails:
        count[f.node] = count.get(f.node, 0) + 1
    nodes = sorted(set(exposure) | set(count))
    by_model: dict[str, list[str]] = {}
    by_partition: dict[str, list[str]] = {}
    for n in nodes:
        by_model.setdefault(info.get(n, NodeInfo()).model or UNKNOWN_MODEL, []).append(n)
        for p in partitions_of(n):
            if partition is None or p == partition:
                by_partition.setdefault(p, []).append(n)

    def group(members: Iterable[str]) -> MtbfEstimate:
        ms = list(members)
        return mtbf(sum(exposure.get(n, 0.0) for n in ms), sum(count.get(n, 0) for n in ms), confidence)

    lemon_since = now - lemon_window_s
    recent: dict[str, int] = {}
    for f in fails:
        if f.time >= lemon_since:
            recent[f.node] = recent.get(f.node, 0) + 1
    lemons = sorted(
        ((n, c) for n, c in recent.items() if c >= lemon_failures), key=lambda nc: (-nc[1], nc[0])
    )
    node_lost = gpu_lost = 0.0
    for f in fails:
        out_s = max(0.0, (f.back_at if f.back_at is not None else now) - f.time)
        node_lost += out_s / 3600.0
        gpu_lost += out_s * info.get(f.node, NodeInfo()).gpus / 3600.0
    return Report(
        now=now,
        since=since,
        confidence=confidence,
        fleet=group(nodes),
        nodes={n: mtbf(exposure.get(n, 0.0), count.get(n, 0), confidence) for n in nodes},
        models={m: group(ns) for m, ns in by_model.items()},
        partitions={p: group(ns) for p, ns in by_partition.items()},
        failures=fails,
        lemons=lemons[:lemons_limit],
        gpu_hours_lost=gpu_lost,
        node_hours_lost=node_lost,
        info=info,
    )


@dataclass(frozen=True, slots=True)
class Advice:
    """The checkpoint advice for one job (seconds). ``advised_s`` is Daly's interval; ``far_too_long``: the
    job computes more than ``factor`` times as long as advised between checkpoints."""

    job: str
    nodes: int
    partition: str | None
    node_mtbf_s: float
    mtbf_basis: str  # "estimate" | "lower bound (no failure yet)" | "config"
    job_mtbf_s: float
    cost_s: float
    cost_source: str  # "heartbeats" | "config"
    restart_s: float
    current_s: float | None  # the job's compute interval (median), or the time since its last checkpoint
    current_basis: str  # "median of N" | "since last checkpoint" | "none"
    young_s: float
    daly_s: float
    waste_current: float | None
    waste_advised: float
    waste_current_first_order: float | None
    waste_advised_first_order: float
    far_too_long: bool
    factor: float

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None, n: int = 3) -> float | None:
            return None if x is None else round(x, n)

        return {
            "job": self.job,
            "nodes": self.nodes,
            "partition": self.partition,
            "node_mtbf_hours": r(self.node_mtbf_s / 3600.0),
            "mtbf_basis": self.mtbf_basis,
            "job_mtbf_hours": r(self.job_mtbf_s / 3600.0),
            "checkpoint_cost_s": r(self.cost_s),
            "cost_source": self.cost_source,
            "restart_s": r(self.restart_s),
            "current_interval_s": r(self.current_s),
            "current_basis": self.current_basis,
            "young_interval_s": r(self.young_s),
            "advised_interval_s": r(self.daly_s),
            "waste_current": r(self.waste_current, 5),
            "waste_advised": r(self.waste_advised, 5),
            "waste_current_first_order": r(self.waste_current_first_order, 5),
            "waste_advised_first_order": r(self.waste_advised_first_order, 5),
            "far_too_long": self.far_too_long,
            "factor": self.factor,
            "model": ADVICE_MODEL,
        }


ADVICE_MODEL = (
    "M_job = M_node / N (independent exponential node failures); advised = Daly 2006: "
    "sqrt(2CM)[1 + 1/3 sqrt(C/2M) + 1/9 C/2M] - C (C < 2M, else M); Young = sqrt(2CM); share lost = "
    "1 - tau / (M e^(R/M) (e^((tau+C)/M) - 1)) (Daly's exponential model), first order C/tau + (tau+C)/2M"
)


def advise(
    job: JobCheckpoints,
    *,
    nodes: int,
    partition: str | None,
    estimate: MtbfEstimate,
    now: float,
    default_cost_s: float | None = None,
    assumed_node_mtbf_s: float | None = None,
    restart_s: float = 0.0,
    factor: float = 3.0,
) -> Advice | None:
    """The advice for ``job`` on ``nodes`` nodes, or None without a checkpoint cost or an MTBF to go on.

    The node MTBF is the point estimate of ``estimate``; with no failure yet, its lower bound (the data say
    failures are at least that rare: advising on it checkpoints more often than needed, never less); with
    no exposure either, ``assumed_node_mtbf_s`` from the config."""
    if estimate.mtbf is not None:
        node_m, basis = estimate.mtbf, "estimate"
    elif estimate.lower is not None:
        node_m, basis = estimate.lower, "lower bound (no failure yet)"
    elif assumed_node_mtbf_s is not None:
        node_m, basis = assumed_node_mtbf_s, "config"
    else:
        return None
    cost, source = (job.cost_s, "heartbeats") if job.cost_s is not None else (default_cost_s, "config")
    if cost is None or cost <= 0 or node_m <= 0 or not math.isfinite(node_m):
        return None
    n = max(1, nodes)
    m = job_mtbf(node_m, n)
    advised = daly(cost, m)
    since = job.since_checkpoint(now)
    if job.interval_s is not None:
        current: float | None = job.interval_s
        current_basis = f"median of {len(job.intervals)}"
    elif since > 0:
        current, current_basis = since, "since last checkpoint"
    else:
        current, current_basis = None, "none"
    effective = max(job.interval_s or 0.0, since)
    return Advice(
        job=job.job,
        nodes=n,
        partition=partition,
        node_mtbf_s=node_m,
        mtbf_basis=basis,
        job_mtbf_s=m,
        cost_s=cost,
        cost_source=source,
        restart_s=restart_s,
        current_s=current,
        current_basis=current_basis,
        young_s=young(cost, m),
        daly_s=advised,
        waste_current=waste(cost, current, m, restart_s) if current else None,
        waste_advised=waste(cost, advised, m, restart_s),
        waste_current_first_order=waste_first_order(cost, current, m) if current else None,
        waste_advised_first_order=waste_first_order(cost, advised, m),
        far_too_long=effective > factor * advised,
        factor=factor,
    )


def advice_finding(a: Advice, node: str, now: float) -> Event:
    """The ``checkpoint_interval`` finding of a job checkpointing far off the advice, on ``node``."""
    current = a.current_s or 0.0
    summary = (
        f"job {a.job} computes {current / 60:.0f} min between checkpoints; advised "
        f"{a.daly_s / 60:.0f} min (Daly; checkpoint "
        f" {a.cost_s:.0f} s, job MTBF {a.job_mtbf_s / 3600:.1f} h "
        f"on {a.nodes} nodes): expected loss {100 * (a.waste_current or 0):.1f}% vs "
        f"{100 * a.waste_advised:.1f}%"
    )
    return CheckpointInterval(
        job=a.job,
        nodes=a.nodes,
        current_interval_s=round(current, 3),
        advised_interval_s=round(a.daly_s, 3),
        checkpoint_cost_s=round(a.cost_s, 3),
        job_mtbf_s=round(a.job_mtbf_s, 3),
        waste_current=round(a.waste_current or 0.0, 5),
        waste_advised=round(a.waste_advised, 5),
        summary=summary,
        partition=a.partition,
    ).to_event(id=stable_id(ADVICE_KIND, a.job, int(now)), node=node, source=ADVICE_SOURCE, time=now)


ADVICE_DOC = (
    "per running job: M_job = M_node / N (independent exponential failures), C from its heartbeats' "
    "checkpoint phase (median) or reliability.checkpoint_cost_s; advised interval: Daly 2006"
)


def parse_since(raw: str | None, now: float) -> float:
    """``since``: epoch seconds, or a duration back from ``now`` (``90d``, ``12h``, ``30m``, ``600s``)."""
    if raw is None or raw == "":
        raise ValueError("since: empty")
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
    try:
        if raw[-1] in units:
            value = float(raw[:-1])
            if not math.isfinite(value) or value < 0:
                raise ValueError
            return now - value * units[raw[-1]]
        value = float(raw)
    except ValueError:
        raise ValueError(f"since: expected epoch seconds or a duration like 30d, 12h, got {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"since: expected a finite time, got {raw!r}")
    return value
