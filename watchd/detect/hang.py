"""NCCL hangs and host-side stalls of one job, from NVML windows and job heartbeats. Pure.

Hang signature (DESIGN.md): waiting ranks spin inside the NCCL kernel, so utilization reads ~100% while
power falls far below the GPU's own running baseline and NVLink/PCIe traffic stops. When most of a job's
GPUs have shown it for ``hang.for_s`` — or most of its ranks' heartbeats stopped advancing — the job hangs,
and the odd one out is the culprit. Evidence, strongest first: a hardware event on one of the job's nodes
around the onset (or a GPU NVML reports lost); an application Xid on one node; the odd GPUs out (not
spinning: idle, computing or silent) all on one node; the rank whose collective sequence lags; the first
GPU to go quiet. Without a culprit the finding lists the suspects.

All ranks idle at once, after the job computed, is a host-side stall (data loader, storage): a finding of
its own, for alerting only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

from watchd.detect.finding import Finding
from watchd.detect.fleet import QUIET_PHASES, FleetState, GpuTrack, HardwareEvent, RankTrack, Window, median
from watchd.detect.params import DetectorParams, HangParams
from watchd.jobs.topology import JobView

GpuState = Literal["spin", "idle", "compute", "silent", "lost", "unknown"]
_SILENT_WINDOWS = 3.0  # a GPU whose newest window is older than this many windows has gone quiet


def is_spin(w: Window, track: GpuTrack, p: HangParams) -> bool:
    if w.util is None or w.util < p.spin_util or w.power is None or track.power_base is None:
        return False
    if w.power > p.spin_power_ratio * track.power_base:
        return False
    return w.link is None or track.link_base is None or w.link <= p.spin_link_ratio * track.link_base


def gpu_state(
    fleet: FleetState, track: GpuTrack | None, node: str, gpu: int, now: float, p: HangParams
) -> GpuState:
    if (node, gpu) in fleet.lost:
        return "lost"
    if track is None or not track.windows:
        return "silent"
    w = track.windows[-1]
    if now - w.end > _SILENT_WINDOWS * _window_s(track):
        return "silent"
    if w.util is None:
        return "unknown"
    if is_spin(w, track, p):
        return "spin"
    if w.util <= 10.0:
        return "idle"
    return "compute" if w.util >= 50.0 else "unknown"


def _window_s(track: GpuTrack) -> float:
    ws = track.windows
    return ws[-1].end - ws[-2].end if len(ws) >= 2 and ws[-1].end > ws[-2].end else 5.0


def run_start(track: GpuTrack, holds: Callable[[Window], bool]) -> float | None:
    """When the GPU's newest run of windows for which ``holds`` is true began (its first window's start)."""
    start: float | None = None
    previous_end: float | None = None
    window_s = _window_s(track)
    for w in reversed(track.windows):
        if not holds(w):
            break
        if previous_end is not None and previous_end - w.end > 2.5 * window_s:
            break  # a gap in the history ends the run
        start = w.end - window_s
        previous_end = w.end
    return start


def sustained_since(starts: Sequence[float | None], need: int) -> float | None:
    """The time since which at least ``need`` of the GPUs hold (the need-th earliest run start)."""
    known = sorted(s for s in starts if s is not None)
    if need < 1 or len(known) < need:
        return None
    return known[need - 1]


@dataclass(frozen=True, slots=True)
class Member:
    node: str
    gpu: int
    track: GpuTrack | None
    state: GpuState


def members(fleet: FleetState, job: JobView, now: float, p: HangParams) -> list[Member]:
    out = []
    for node in job.nodes:
        for gpu in job.gpus.get(node, ()):
            track = fleet.gpus.get((node, gpu))
            out.append(Member(node, gpu, track, gpu_state(fleet, track, node, gpu, now, p)))
    return out


@dataclass(frozen=True, slots=True)
class Culprit:
    node: str | None
    gpu: int | None
    evidence: str
    hardware: bool
    confidence: float
    detail: str
    suspects: tuple[str, ...] = ()


def _hardware_culprit(events: list[HardwareEvent], onset: float) -> Culprit | None:
    hardware = [h for h in events if h.hardware]
    chosen = hardware or [h for h in events if not h.hardware]
    if not chosen:
        return None
    nodes = {h.node for h in chosen}
    # The event nearest the onset (before it, or the first after) marks the culprit.
    first = min(chosen, key=lambda h: abs(h.time - onset) if h.time <= onset else (h.time - onset) * 0.5)
    evidence = (
        "gpu_lost"
        if first.condition in ("gpu_lost", "RESTART_BM")
        else "nvlink_down"
        if "NVLINK" in first.condition.upper()
        else "hardware_event"
        if first.hardware
        else "app_xid"
    )
    confidence = (0.95 if first.hardware else 0.8) * (1.0 if len(nodes) == 1 else 0.7)
    return Culprit(
        first.node, first.gpu, evidence, first.hardware, confidence, first.what, tuple(sorted(nodes))
    )


def _odd_one_out(ms: list[Member]) -> Culprit | None:
    odd = [m for m in ms if m.state in ("idle", "compute", "silent", "lost")]
    if not odd or len(odd) * 2 >= len(ms):
        return None
    nodes = sorted({m.node for m in odd})
    states = ",".join(sorted({m.state for m in odd}))
    if len(nodes) == 1:
        gpu = odd[0].gpu if len(odd) == 1 else None
        what = f"{len(odd)} GPU(s) not spinning ({states}) while {len(ms) - len(odd)} spin"
        return Culprit(nodes[0], gpu, "odd_one_out", False, 0.85, what, tuple(nodes))
    return Culprit(None, None, "none", False, 0.3, f"GPUs not spinning on {len(nodes)} nodes", tuple(nodes))


def _heartbeat_lag(ranks: Iterable[RankTrack]) -> Culprit | None:
    ranks = [r for r in ranks if r.collective_seq is not None]
    if len(ranks) < 2:
        return None
    low = min(r.collective_seq or 0 for r in ranks)
    lagging = [r for r in ranks if r.collective_seq == low]
    if len(lagging) * 2 >= len(ranks) or len({r.node for r in lagging}) != 1:
        return None
    r = lagging[0]
    gpu = r.gpu if len(lagging) == 1 else None
    what = f"rank {r.rank} at collective {low}, the others ahead"
    return Culprit(r.node, gpu, "heartbeat_lag", False, 0.8, what, (r.node,))


def _first_quiet(ms: list[Member], spin_starts: dict[tuple[str, int], float]) -> Culprit | None:
    if len(spin_starts) < 2:
        return None
    ordered = sorted(spin_starts.items(), key=lambda kv: kv[1])
    (node, gpu), first = ordered[0]
    second = ordered[1][1]
    by_node = {k[0] for k, t in ordered if t == first}
    if second - first < 1.0 and len(by_node) != 1:
        return None
    gpus_first = [k for k, t in ordered if t == first]
    return Culprit(
        node,
        gpu if len(gpus_first) == 1 else None,
        "first_quiet",
        False,
        0.5,
        f"went quiet first, {second - first:.0f}s before the next",
        (node,),
    )


def find_culprit(
    fleet: FleetState,
    job: JobView,
    ms: list[Member],
    ranks: list[RankTrack],
    onset: float,
    now: float,
    p: HangParams,
    spin_starts: dict[tuple[str, int], float],
) -> Culprit:
    since = onset - p.culprit_lookback_s
    events = [h for node in job.nodes for h in fleet.hardware_events(node, since) if h.time <= now]
    for m in ms:
        if m.state == "lost":
            events.append(
                HardwareEvent(fleet.lost[(m.node, m.gpu)], m.node, m.gpu, "GPU lost", True, "gpu_lost")
            )
    finders: tuple[Callable[[], Culprit | None], ...] = (
        lambda: _hardware_culprit(events, onset),
        lambda: _odd_one_out(ms),
        lambda: _heartbeat_lag(ranks),
        lambda: _first_quiet(ms, spin_starts),
    )
    for finder in finders:
        found = finder()
        if found is not None and found.node is not None:
            return found
    suspects = tuple(sorted({m.node for m in ms if m.state != "spin"})) or job.nodes
    return Culprit(None, None, "none", False, 0.3, "no odd one out", suspects)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One cycle's judgement of a job: the condition (None: healthy) and what supports it."""

    kind: str | None
    onset: float = 0.0
    signal: str = "nvml"
    culprit: Culprit | None = None
    gpus: int = 0
    matching: int = 0


QUIET_VALID_S = 60.0  # a declared pause counts while its rank reported within this long


def quiet_declared(ranks: Iterable[RankTrack], now: float) -> bool:
    """A quiet phase (checkpoint, eval, ...) declared recently: a rank that went silent after declaring one
    does not hide a hang that follows it for long."""
    return any(r.phase in QUIET_PHASES and now - r.last_report <= QUIET_VALID_S for r in ranks)


def judge(fleet: FleetState, job: JobView, now: float, params: DetectorParams) -> Verdict:
    """Is the job hung, stalled on the host, or neither, at ``now``?"""
    p = params.hang
    ranks = list(fleet.ranks.get(job.id, {}).values())
    if quiet_declared(ranks, now):
        return Verdict(None)
    ms = members(fleet, job, now, p)
    tracks = [m.track for m in ms if m.track is not None]
    warmed = bool(tracks) and median([t.computed_s for t in tracks]) >= p.warmup_s

    nvml_onset: float | None = None
    spin_starts: dict[tuple[str, int], float] = {}
    if p.enabled and warmed and ms:
        for m in ms:
            if m.state == "spin" and m.track is not None:
                start = run_start(m.track, partial(is_spin, track=m.track, p=p))
                if start is not None:
                    spin_starts[(m.node, m.gpu)] = start
        need = max(1, math.ceil(p.fraction * len(ms)))
        since = sustained_since(list(spin_starts.values()), need)
        latest = max((m.track.windows[-1].end for m in ms if m.track and m.track.windows), default=now)
        if since is not None and latest - since >= p.for_s:
            nvml_onset = min(spin_starts.values())

    hb = params.heartbeat
    hb_onset: float | None = None
    training = [r for r in ranks if r.phase == "train" and r.steps_seen >= hb.min_steps]
    # Ranks that stopped with their GPUs idle or gone are a host stall or a job that ended, not a hang.
    busy = sum(1 for m in ms if m.state in ("spin", "compute", "lost"))
    if hb.enabled and training and (not ms or busy * 2 >= len(ms)):
        stalled = [
            r for r in training if now - r.last_advance >= _stall_after(r, hb.min_stall_s, hb.step_factor)
        ]
        if stalled and len(stalled) >= max(1, math.ceil(hb.fraction * len(training))):
            hb_onset = min(r.last_advance for r in stalled)

    if nvml_onset is not None or hb_onset is not None:
        onset = min(x for x in (nvml_onset, hb_onset) if x is not None)
        signal = "+".join(s for s, x in (("nvml", nvml_onset), ("heartbeat", hb_onset)) if x is not None)
        culprit = find_culprit(fleet, job, ms, training, onset, now, p, spin_starts)
        return Verdict("nccl_hang", onset, signal, culprit, len(ms), len(spin_starts))

    stall = params.host_stall
    if stall.enabled and warmed and ms:
        idle = [m.track for m in ms if m.state == "idle" and m.track is not None]
        need = max(1, math.ceil(stall.fraction * len(ms)))
        starts = [run_start(t, lambda w: w.util is not None and w.util <= stall.idle_util) for t in idle]
        since = sustained_since(starts, need)
        if since is not None and now - since >= stall.for_s:
            nodes = tuple(sorted({m.node for m in ms}))
            culprit = Culprit(None, None, "none", False, 0.6, "all ranks idle at once", nodes)
            return Verdict("host_stall", since, "nvml", culprit, len(ms), len(idle))
    return Verdict(None)


def _stall_after(r: RankTrack, min_stall_s: float, step_factor: float) -> float:
    step = r.median_step()
    return max(min_stall_s, step_factor * step) if step is not None else min_stall_s


def to_finding(job: JobView, v: Verdict, now: float, revision: int) -> Finding:
    c = v.culprit or Culprit(None, None, "none", False, 0.3, "", job.nodes)
    where = f"{c.node} GPU {c.gpu}" if c.node and c.gpu is not None else c.node
    if v.kind == "host_stall":
        summary = f"job {job.id}: all {v.gpus} GPUs idle since {now - v.onset:.0f}s (host-side stall)"
    elif c.node is not None:
        summary = f"job {job.id} hangs ({v.signal}): culprit {where} ({c.evidence}: {c.detail})"
    else:
        summary = f"job {job.id} hangs ({v.signal}): no culprit; suspects {', '.join(c.suspects[:8])}"
    return Finding(
        kind=v.kind or "nccl_hang",
        job=job.id,
        time=now,
        onset=v.onset,
        summary=summary,
        confidence=c.confidence,
        evidence=c.evidence,
        hardware=c.hardware,
        culprit_node=c.node,
        culprit_gpu=c.gpu,
        suspects=c.suspects or job.nodes,
        partition=job.partition,
        signal=v.signal,
        revision=revision,
        extra={"gpus": v.gpus, "gpus_matching": v.matching, "detail": c.detail},
    )
