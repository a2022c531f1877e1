"""What watchd observes itself for the usage report, pure: each ``gpu_summary`` window of a GPU
that ran a job adds its energy (mean power x window length), its length, and its length again when its
mean utilization was under the idle threshold, to that job's GPU on that day; each rank leaving the
``checkpoint`` phase records a checkpoint of the job (the work up to the phase's start is saved).

The engine feeds it the kinds of its :meth:`UsageLedger.subscriptions` and periodically hands :meth:`take` to
the store (``watchd.store.usage``); memory is bounded by the GPU-job-days seen since the last take and by
``max_jobs`` jobs in a checkpoint phase."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from watchd.model.events import Event
from watchd.model.gpu import SUMMARY_KIND
from watchd.model.heartbeat import KIND as HEARTBEAT_KIND

DAY_S = 86400.0


def job_key(label: str) -> str:
    """The job as accounting names it: ``slurm:123`` -> ``123``; other labels as they are."""
    return label[6:] if label.startswith("slurm:") else label


@dataclass(slots=True)
class GpuDelta:
    job: str
    node: str
    gpu: int
    day: float
    energy_j: float = 0.0
    gpu_s: float = 0.0
    idle_s: float = 0.0
    first: float = 0.0
    last: float = 0.0


class UsageLedger:
    def __init__(self, idle_util_pct: float = 5.0, max_jobs: int = 100_000) -> None:
        self.idle_util_pct = idle_util_pct
        self.max_jobs = max_jobs
        self._gpu: dict[tuple[str, str, int, float], GpuDelta] = {}
        self._in_checkpoint: dict[tuple[str, int], float] = {}  # (job, rank) -> phase start
        self._checkpoints: list[tuple[str, float]] = []
        self.skipped = 0  # windows without a job, power or length

    def subscriptions(self) -> Mapping[str, Callable[[Event], None]]:
        """The kinds the ledger keeps, with their handlers."""
        return {SUMMARY_KIND: self._summary, HEARTBEAT_KIND: self._heartbeat}

    def observe(self, event: Event) -> None:
        """One event, by its kind (what the engine's dispatch does with :meth:`subscriptions`)."""
        handler = self.subscriptions().get(event.kind)
        if handler is not None:
            handler(event)

    def _summary(self, event: Event) -> None:
        a = event.attrs
        job, gpu, length = a.get("job"), a.get("gpu"), a.get("window_s")
        if (
            not isinstance(job, str)
            or not job
            or not isinstance(gpu, int)
            or not isinstance(length, int | float)
        ):
            self.skipped += 1
            return
        if length <= 0:
            self.skipped += 1
            return
        start = a.get("window_start")
        start = float(start) if isinstance(start, int | float) else event.time - float(length)
        key = (job_key(job), event.node, gpu, start - start % DAY_S)
        d = self._gpu.get(key)
        if d is None:
            d = self._gpu[key] = GpuDelta(key[0], event.node, gpu, key[3], first=start, last=event.time)
        power, util = a.get("power_mean"), a.get("util_mean")
        if isinstance(power, int | float):
            d.energy_j += float(power) * float(length)
        d.gpu_s += float(length)
        if isinstance(util, int | float) and util < self.idle_util_pct:
            d.idle_s += float(length)
        d.first = min(d.first, start)
        d.last = max(d.last, event.time)

    def _heartbeat(self, event: Event) -> None:
        a = event.attrs
        job, rank, phase = a.get("job"), a.get("rank"), a.get("phase")
        if not isinstance(job, str) or not isinstance(rank, int):
            return
        key = (job_key(job), rank)
        if phase == "checkpoint":
            if key not in self._in_checkpoint and len(self._in_checkpoint) < self.max_jobs:
                self._in_checkpoint[key] = event.time
            return
        began = self._in_checkpoint.pop(key, None)
        if began is not None and rank == 0:  # one checkpoint per job: rank 0's
            self._checkpoints.append((key[0], began))

    def take(self) -> tuple[list[GpuDelta], list[tuple[str, float]]]:
        """What was observed since the last take (and forget it)."""
        gpus, self._gpu = list(self._gpu.values()), {}
        cps, self._checkpoints = self._checkpoints, []
        return gpus, cps
