"""Host-side stalls: all of a job's GPUs idle at once after it computed (data loader, storage). Pure.

A finding of its own, for alerting only: it names no culprit. Judged on the GPUs as the hang detector
classifies them (the ``hang`` section's thresholds and ``warmup_s``), only in a job that does not hang.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from watchd.detect.detector import Cycle, Onset, Sighting
from watchd.detect.finding import Finding
from watchd.detect.members import (
    job_members,
    job_ranks,
    quiet_declared,
    run_start,
    sustained_since,
    warmed_up,
)
from watchd.detect.params import DetectorParams, HangParams, HostStallParams
from watchd.jobs.topology import JobView

KIND = "host_stall"


@dataclass(frozen=True, slots=True)
class HostStallDetectorParams:
    stall: HostStallParams  # the ``host_stall`` section
    gpus: HangParams  # the ``hang`` section: how GPUs are classified, warm-up


class HostStallDetector:
    name = KIND

    def params(self, of: DetectorParams) -> HostStallDetectorParams:
        return HostStallDetectorParams(of.host_stall, of.hang)

    def judge(self, cycle: Cycle, job: JobView, params: HostStallDetectorParams) -> Sequence[Sighting]:
        stall = params.stall
        if not stall.enabled or quiet_declared(job_ranks(cycle.fleet, job), cycle.now):
            return []
        ms = job_members(cycle, job, params.gpus)
        if not ms or not warmed_up(ms, params.gpus):
            return []
        idle = [m.track for m in ms if m.state == "idle" and m.track is not None]
        need = max(1, math.ceil(stall.fraction * len(ms)))
        starts = [run_start(t, lambda w: w.util is not None and w.util <= stall.idle_util) for t in idle]
        since = sustained_since(starts, need)
        if since is None or cycle.now - since < stall.for_s:
            return []
        nodes = tuple(sorted({m.node for m in ms}))
        detail = "all ranks idle at once"
        finding = Finding(
            kind=KIND,
            job=job.id,
            time=cycle.now,
            onset=since,
            summary=f"job {job.id}: all {len(ms)} GPUs idle since {cycle.now - since:.0f}s (host-side stall)",
            confidence=0.6,
            evidence="none",
            hardware=False,
            suspects=nodes,
            partition=job.partition,
            signal="nvml",
            extra={"gpus": len(ms), "gpus_matching": len(idle), "detail": detail},
        )
        return [Onset((KIND,), finding)]
