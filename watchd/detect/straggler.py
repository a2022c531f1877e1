"""Stragglers: one GPU (or rank) persistently slower than its job peers. Pure.

In a synchronous job every rank's step time is equal, so the slow one is found by per-GPU evidence: each
GPU's median SM clock over ``straggler.window_s`` (computing windows only), compared with the job's median
across its GPUs by a robust outlier test (at least ``clock_drop`` below the median and ``mad_k`` scaled
MADs). With heartbeats, per-rank compute time is compared the same way (above the median). A whole node
slow at once (a node-wide power brake) is too large a share of a job of few nodes for that test, so each
node's median clock is also compared with the other nodes'; such a node is reported only with hardware
attribution on most of its GPUs.

Drain-worthy only with hardware attribution: clock-event reasons (HW slowdown, thermal, power brake) in
most of the window's samples, a clock below the fleet median for the GPU's model, or a hardware event
(PCIe downtrain, ECC, NVLink) on that GPU. Otherwise the finding says "software imbalance" (most slow jobs
are) and the default rules only alert.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from watchd.detect.fleet import FleetState, GpuTrack, RankTrack, median
from watchd.detect.params import StragglerParams

_MAD_SCALE = 1.4826  # MAD to standard deviation, for normally distributed noise
_EVENT_LOOKBACK_S = 600.0


def mad(values: Sequence[float], center: float) -> float:
    return median([abs(v - center) for v in values])


@dataclass(frozen=True, slots=True)
class Outlier:
    node: str
    gpu: int | None
    rank: int | None
    metric: str  # "sm_clock" or "compute_time"
    value: float
    job_median: float
    deviation: float  # relative to the median (negative: below)


def window_clock(track: GpuTrack, now: float, window_s: float) -> float | None:
    """The GPU's median SM clock over its computing windows of the last ``window_s``."""
    clocks = [
        w.clock
        for w in track.windows
        if w.end >= now - window_s and w.clock is not None and w.util is not None and w.util >= 50
    ]
    return median(clocks) if len(clocks) >= 3 else None


def clock_outliers(clocks: Mapping[tuple[str, int], float], p: StragglerParams) -> list[Outlier]:
    """``clocks``: each of the job's GPUs' window clock (:func:`window_clock`)."""
    if len(clocks) < p.min_gpus:
        return []
    values = list(clocks.values())
    center = median(values)
    spread = _MAD_SCALE * mad(values, center)
    out = []
    for (node, gpu), c in clocks.items():
        if c <= center * (1 - p.clock_drop) and center - c >= p.mad_k * spread:
            out.append(Outlier(node, gpu, None, "sm_clock", c, center, c / center - 1))
    return _few(out, len(values))


def _few(out: list[Outlier], n: int) -> list[Outlier]:
    # One slow GPU is a straggler even in a 4-GPU job; several are while under a quarter of the job (a
    # quarter or more slow at once is the job's own behaviour, or a shared cause, not one bad GPU).
    return out if len(out) == 1 or len(out) * 4 < n else []


def compute_outliers(ranks: Sequence[RankTrack], p: StragglerParams) -> list[Outlier]:
    times = {r.rank: (r, t) for r in ranks if r.phase == "train" and (t := r.median_compute()) is not None}
    if len(times) < p.min_gpus:
        return []
    values = [t for _, t in times.values()]
    center = median(values)
    spread = _MAD_SCALE * mad(values, center)
    if center <= 0:
        return []
    out = [
        Outlier(r.node, r.gpu, r.rank, "compute_time", t, center, t / center - 1)
        for r, t in times.values()
        if t >= center * (1 + p.compute_drop) and t - center >= p.mad_k * spread
    ]
    return _few(out, len(values))


def node_outliers(clocks: Mapping[tuple[str, int], float], p: StragglerParams) -> list[Outlier]:
    """The one node whose median clock is ``clock_drop`` below the median of the job's other nodes."""
    per_node: dict[str, list[float]] = {}
    for (node, _), c in clocks.items():
        per_node.setdefault(node, []).append(c)
    if len(per_node) < 2 or len(clocks) < p.min_gpus:
        return []
    medians = {n: median(v) for n, v in per_node.items()}
    out = []
    for node, m in medians.items():
        peers = median([v for n, v in medians.items() if n != node])
        if m <= peers * (1 - p.clock_drop):
            out.append(Outlier(node, None, None, "node_sm_clock", m, peers, m / peers - 1))
    return out if len(out) == 1 else []  # several slow nodes: a shared cause, not one bad node


def whole_nodes(outliers: list[Outlier], clocks: Mapping[tuple[str, int], float]) -> list[Outlier]:
    """Clock outliers on most of one node's GPUs become one outlier for the node: one finding, not eight."""
    gpus_of: dict[str, int] = {}
    for node, _ in clocks:
        gpus_of[node] = gpus_of.get(node, 0) + 1
    slow: dict[str, list[Outlier]] = {}
    for o in outliers:
        if o.metric == "sm_clock":
            slow.setdefault(o.node, []).append(o)
    merged = {n for n, os in slow.items() if len(os) >= 2 and len(os) * 2 > gpus_of.get(n, 0)}
    out = [o for o in outliers if o.node not in merged or o.metric != "sm_clock"]
    for node in sorted(merged):
        value, center = median([o.value for o in slow[node]]), slow[node][0].job_median
        out.append(Outlier(node, None, None, "node_sm_clock", value, center, value / center - 1))
    return out


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
        if h.hardware and (h.gpu is None or h.gpu == gpu):
            return True, h.what
    return False, "no hardware cause: software imbalance"
