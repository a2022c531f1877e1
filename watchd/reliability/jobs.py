"""Each running job's checkpoints, from its heartbeats: how long one takes and how often it is taken.

The training loop wraps its save in ``hb.phase("checkpoint")`` (watchd.client); the agent forwards a phase
change at once, so the engine sees the reference rank (the lowest rank that reports) enter ``checkpoint`` at
``t0`` and leave it at ``t1``: ``t1 - t0`` is one checkpoint's cost, and the time from one checkpoint's end
to the next one's start is the compute interval ``tau`` the job runs at. The medians of the last
:data:`KEEP` are used (one slow save does not move them).

Pure and bounded: at most ``max_jobs`` jobs (the least recently seen go first), :data:`KEEP` samples each.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field

__all__ = ["CHECKPOINT_PHASE", "KEEP", "JobCheckpoints", "JobTracker"]

CHECKPOINT_PHASE = "checkpoint"
KEEP = 16


@dataclass(slots=True)
class JobCheckpoints:
    job: str
    first_seen: float
    last_seen: float
    rank: int  # the reference rank
    nodes: set[str] = field(default_factory=set)  # nodes its ranks reported from (capped)
    in_checkpoint_since: float | None = None
    last_end: float | None = None  # when the last checkpoint ended
    costs: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))
    done: bool = False

    @property
    def cost_s(self) -> float | None:
        """The median checkpoint cost, None before the first checkpoint ended."""
        return statistics.median(self.costs) if self.costs else None

    @property
    def interval_s(self) -> float | None:
        """The median compute time between checkpoints, None before the second checkpoint."""
        return statistics.median(self.intervals) if self.intervals else None

    def since_checkpoint(self, now: float) -> float:
        """Compute time since the last checkpoint ended (or since the job was first seen, without one)."""
        if self.in_checkpoint_since is not None:
            return 0.0
        return max(0.0, now - (self.last_end if self.last_end is not None else self.first_seen))


class JobTracker:
    def __init__(self, max_jobs: int = 10_000, max_nodes_per_job: int = 100_000) -> None:
        self.max_jobs = max_jobs
        self.max_nodes_per_job = max_nodes_per_job
        self.jobs: OrderedDict[str, JobCheckpoints] = OrderedDict()
        self.evicted = 0

    def heartbeat(self, job: str, rank: int, phase: str, t: float, node: str) -> None:
        """One forwarded heartbeat of ``job``'s ``rank``, observed at ``t`` on ``node``."""
        state = self.jobs.get(job)
        if state is None:
            state = self.jobs[job] = JobCheckpoints(job, t, t, rank)
            while len(self.jobs) > self.max_jobs:
                self.jobs.popitem(last=False)
                self.evicted += 1
        else:
            self.jobs.move_to_end(job)
        if len(state.nodes) < self.max_nodes_per_job:
            state.nodes.add(node)
        if phase == "done":
            state.done = True
        if rank < state.rank:  # a lower rank: it becomes the reference; what the other showed is kept
            state.rank, state.in_checkpoint_since = rank, None
        if rank != state.rank or t < state.last_seen:
            state.last_seen = max(state.last_seen, t)
            return
        state.last_seen = t
        if phase == CHECKPOINT_PHASE:
            if state.in_checkpoint_since is None:
                state.in_checkpoint_since = t
                if state.last_end is not None and t > state.last_end:
                    state.intervals.append(t - state.last_end)
        elif state.in_checkpoint_since is not None:
            cost = t - state.in_checkpoint_since
            if cost > 0:
                state.costs.append(cost)
            state.in_checkpoint_since = None
            state.last_end = t

    def forget(self, job: str) -> None:
        self.jobs.pop(job, None)

    def prune(self, now: float, idle_s: float) -> None:
        """Forget jobs not heard from for ``idle_s`` (finished, or gone)."""
        for job in [j for j, s in self.jobs.items() if now - s.last_seen > idle_s]:
            del self.jobs[job]
