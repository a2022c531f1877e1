"""Robust outlier tests across one job's GPUs or ranks: who is persistently slower than the median. Pure.

Each GPU's median SM clock over a window (computing windows only) is compared with the job's median across
its GPUs: an outlier is at least ``clock_drop`` below the median and ``mad_k`` scaled MADs. Per-rank compute
time from heartbeats is compared the same way (above the median); each node's median clock with the other
nodes'.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from watchd.detect.params import StragglerParams
from watchd.detect.tracks import GpuTrack, RankTrack, median

_MAD_SCALE = 1.4826  # MAD to standard deviation, for normally distributed noise


def mad(values: Sequence[float], center: float) -> float:
    return median([abs(v - center) for v in values])


@dataclass(frozen=True, slots=True)
class Outlier:
    node: str
    gpu: int | None
    rank: int | None
    metric: str  # "sm_clock", "node_sm_clock" or "compute_time"
    value: float
    job_median: float
    deviation: float  # relative to the median (negative: below)


def window_clock(track: GpuTrack, now: float, window_s: float) -> float | None:
    """The GPU's median SM clock over its computing windows of the last ``window_s``."""
    since = now - window_s
    clocks = []
    for w in reversed(track.windows):  # oldest first: walk back from the newest to the window's start
        if w.end < since:
            break
        if w.clock is not None and w.util is not None and w.util >= 50:
            clocks.append(w.clock)
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
    ordered = sorted(medians.values())
    out = []
    for node, m in medians.items():
        peers = _median_without(ordered, m)
        if m <= peers * (1 - p.clock_drop):
            out.append(Outlier(node, None, None, "node_sm_clock", m, peers, m / peers - 1))
    return out if len(out) == 1 else []  # several slow nodes: a shared cause, not one bad node


def _median_without(ordered: Sequence[float], value: float) -> float:
    """The median of ``ordered`` (sorted, at least 2 values, ``value`` among them) with one ``value`` left
    out: what :func:`median` of the others gives, in O(log n) rather than a sort per node (a job of 1,000
    nodes: a million comparisons a cycle)."""
    i = bisect_left(ordered, value)
    k = len(ordered) - 1  # the others

    def at(j: int) -> float:
        return ordered[j] if j < i else ordered[j + 1]

    mid = k // 2
    return at(mid) if k % 2 else (at(mid - 1) + at(mid)) / 2


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
