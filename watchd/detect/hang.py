"""NCCL hangs of one job, from NVML windows and job heartbeats. Pure.

Hang signature (DESIGN.md): waiting ranks spin inside the NCCL kernel, so utilization reads ~100% while
power falls far below the GPU's own running baseline and NVLink/PCIe traffic stops. When most of a job's
GPUs have shown it for ``hang.for_s`` — or most of its ranks' heartbeats stopped advancing — the job hangs,
and the odd one out is the culprit (:mod:`watchd.detect.culprit`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from watchd.detect.culprit import Culprit, find_culprit
from watchd.detect.detector import Cycle, Onset, Sighting
from watchd.detect.finding import Finding
from watchd.detect.members import (
    Member,
    is_spin,
    job_members,
    job_ranks,
    quiet_declared,
    run_start,
    warmed_up,
)
from watchd.detect.params import DetectorParams, HangParams, HeartbeatParams
from watchd.detect.tracks import RankTrack
from watchd.jobs.topology import JobView
from watchd.shortlist import shortlist

KIND = "nccl_hang"


@dataclass(frozen=True, slots=True)
class HangDetectorParams:
    nvml: HangParams  # the ``hang`` section
    heartbeat: HeartbeatParams


@dataclass(frozen=True, slots=True)
class Verdict:
    """A hang as judged in one cycle, and what supports it."""

    onset: float
    signal: str  # nvml, heartbeat or nvml+heartbeat
    culprit: Culprit
    gpus: int
    matching: int  # GPUs spinning


class HangDetector:
    name = KIND

    def params(self, of: DetectorParams) -> HangDetectorParams:
        return HangDetectorParams(of.hang, of.heartbeat)

    def judge(self, cycle: Cycle, job: JobView, params: HangDetectorParams) -> Sequence[Sighting]:
        ranks = job_ranks(cycle.fleet, job)
        if quiet_declared(ranks, cycle.now):
            return []
        ms = job_members(cycle, job, params.nvml)
        verdict = judge(cycle, job, ms, ranks, params)
        if verdict is None:
            return []
        return [Onset((KIND,), to_finding(job, verdict, cycle.now, 0))]


def judge(
    cycle: Cycle, job: JobView, ms: list[Member], ranks: list[RankTrack], params: HangDetectorParams
) -> Verdict | None:
    """Is the job hung at ``cycle.now``?"""
    now, p = cycle.now, params.nvml
    spins: dict[tuple[str, int], tuple[float, float]] = {}
    nvml_onset = None
    if p.enabled and ms and warmed_up(ms, p):
        spins = _spins(ms, now, p)
        nvml_onset = _nvml_onset(ms, spins, p)
    training = [r for r in ranks if r.phase == "train" and r.steps_seen >= params.heartbeat.min_steps]
    hb_onset = _heartbeat_onset(ms, training, now, params.heartbeat, p.enabled and bool(spins))
    # a watchdog timeout in the job's own output is a hang too (it began when that collective did)
    tl_onset = cycle.fleet.training.timeout_onset(job.id, now - cycle.fleet.history_s)
    onsets = (("nvml", nvml_onset), ("heartbeat", hb_onset), ("trainlog", tl_onset))
    if all(x is None for _, x in onsets):
        return None
    onset = min(x for _, x in onsets if x is not None)
    signal = "+".join(s for s, x in onsets if x is not None)
    culprit = find_culprit(cycle.fleet, job, ms, training, onset, now, p)
    return Verdict(onset, signal, culprit, len(ms), len(spins))


def _spins(ms: list[Member], now: float, p: HangParams) -> dict[tuple[str, int], tuple[float, float]]:
    """Each spinning GPU's (start, seen until): from its agent's ``nccl_spin`` (its first spinning sample,
    until now: the agent says at its next sample when it stops), else from its windows (the first of its
    newest run of spinning windows, until the newest's end)."""
    out = {}
    for m in ms:
        if m.state != "spin":
            continue
        spin = m.spin  # members() read the agent's report at ``now``
        if spin is not None:
            out[(m.node, m.gpu)] = (spin.since, now)
        elif m.track is not None:
            start = run_start(m.track, partial(is_spin, track=m.track, p=p))
            if start is not None:
                out[(m.node, m.gpu)] = (start, m.track.windows[-1].end)
    return out


def _nvml_onset(
    ms: list[Member], spins: dict[tuple[str, int], tuple[float, float]], p: HangParams
) -> float | None:
    """At least ``fraction`` of the job's GPUs have spun for ``for_s``: the hang began with the first."""
    need = max(1, math.ceil(p.fraction * len(ms)))
    held = sorted((until - start for start, until in spins.values()), reverse=True)
    if len(held) >= need and held[need - 1] >= p.for_s:
        return min(start for start, _ in spins.values())
    return None


def _heartbeat_onset(
    ms: list[Member], training: list[RankTrack], now: float, hb: HeartbeatParams, spinning: bool
) -> float | None:
    """Most training ranks stopped advancing. Where NVML sees the job's GPUs running it, only while most of
    them spin (or are lost) — ranks stopped with their GPUs idle or gone are a host stall or a job that ended,
    with their GPUs computing a long step or an evaluation — and then a short stall is enough
    (:func:`_corroborated_after`). Where it sees GPUs it cannot attribute to the job (no process mapping),
    while most are busy; with no NVML, always: after ``max(min_stall_s, step_factor x median step)``."""
    if not hb.enabled or not training:
        return None
    if any(m.track is not None and m.track.windows and m.track.job is not None for m in ms):
        hung = sum(1 for m in ms if m.state in ("spin", "lost"))
        if hung * 2 < len(ms) or not spinning:
            return None
        stalled = [r for r in training if now - r.last_advance >= _corroborated_after(r, hb)]
    else:
        # windows the agents could not attribute to a job (no process mapping), or none: the old rule
        busy = sum(1 for m in ms if m.state in ("spin", "compute", "lost"))
        if any(m.track is not None and m.track.windows for m in ms) and busy * 2 < len(ms):
            return None
        stalled = [
            r for r in training if now - r.last_advance >= _stall_after(r, hb.min_stall_s, hb.step_factor)
        ]
    if stalled and len(stalled) >= max(1, math.ceil(hb.fraction * len(training))):
        return min(r.last_advance for r in stalled)
    return None


def _corroborated_after(r: RankTrack, hb: HeartbeatParams) -> float:
    """No progress for ``corroborated_stall_s``, two median steps and two of the rank's usual intervals
    between advancing reports (a rank reporting every 5 s is not stalled after 4)."""
    return max(_stall_after(r, hb.corroborated_stall_s, 2.0), 2.0 * (r.advance_every or 0.0))


def _stall_after(r: RankTrack, min_stall_s: float, step_factor: float) -> float:
    step = r.median_step()
    return max(min_stall_s, step_factor * step) if step is not None else min_stall_s


def to_finding(job: JobView, v: Verdict, now: float, revision: int) -> Finding:
    c = v.culprit
    where = f"{c.node} GPU {c.gpu}" if c.node and c.gpu is not None else c.node
    if c.node is not None:
        summary = f"job {job.id} hangs ({v.signal}): culprit {where} ({c.evidence}: {c.detail})"
    else:
        summary = f"job {job.id} hangs ({v.signal}): no culprit; suspects {shortlist(c.suspects, 8)}"
    return Finding(
        kind=KIND,
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
        extra={
            "gpus": v.gpus,
            "gpus_matching": v.matching,
            "detail": c.detail,
            # which other evidence confirmed the culprit, which named another node
            **({"corroborated": ",".join(c.corroborated)} if c.corroborated else {}),
            **({"contradicted": ",".join(c.contradicted)} if c.contradicted else {}),
        },
    )
