"""The agents' sub-window hang signature as the detectors keep it (``gpu_health`` ``nccl_spin``).
Pure.

An agent reports ``nccl_spin`` on a GPU a couple of samples after it starts spinning (utilization high, power
collapsed against its computing baseline, links idle: :mod:`watchd.gpu.health`), with ``since`` its first
spinning sample, again every report interval while it spins, and with ``value`` 0 when it stops. So the hang
detector knows a GPU spins seconds after it started, not a window or two later, and until when: until now,
unless the agent said otherwise (it says so at its next sample) or went quiet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from watchd.detect import fleet_bytes as cost

__all__ = ["SPIN_CONDITION", "SPIN_STALE_S", "Spin", "Spins"]

SPIN_CONDITION = "nccl_spin"
SPIN_STALE_S = (
    75.0  # an agent re-reports a held condition every 30 s: a spin not re-reported this long is gone
)


@dataclass(slots=True)
class Spin:
    """Spinning since ``since`` (the agent's first spinning sample), last reported at ``reported``."""

    since: float
    reported: float


class Spins:
    """``(node, gpu) -> Spin`` for the GPUs whose agents say they spin. Each change returns what it adds to
    the state's byte count (:mod:`watchd.detect.fleet_bytes`)."""

    def __init__(self) -> None:
        self.table: dict[tuple[str, int], Spin] = {}

    def __bool__(self) -> bool:
        return bool(self.table)

    def __len__(self) -> int:
        return len(self.table)

    def report(self, node: str, gpu: int, value: float, since: object, at: float) -> int:
        """A report of ``nccl_spin``: it starts or holds (``value`` not 0), or clears."""
        key = (node, gpu)
        if not value:
            return -cost.SPIN if self.table.pop(key, None) is not None else 0
        start = float(since) if isinstance(since, int | float) and since <= at else at
        spin = self.table.get(key)
        if spin is None:
            self.table[key] = Spin(start, at)
            return cost.SPIN
        if at >= spin.reported:
            spin.since, spin.reported = start, at
        return 0

    def fresh(self, node: str, gpu: int, now: float) -> Spin | None:
        spin = self.table.get((node, gpu))
        return spin if spin is not None and now - spin.reported <= SPIN_STALE_S else None

    def jobs(self, now: float, job_of: Callable[[str, int, float], str | None]) -> set[str]:
        """The jobs of the GPUs that spin (``job_of``: the topology's)."""
        out = set()
        for (node, gpu), spin in self.table.items():
            if now - spin.reported <= SPIN_STALE_S and (job := job_of(node, gpu, now)) is not None:
                out.add(job)
        return out

    def forget_node(self, node: str, max_gpus: int) -> int:
        return -cost.SPIN * sum(1 for gpu in range(max_gpus) if self.table.pop((node, gpu), None) is not None)

    def prune(self, now: float) -> list[str]:
        """Drop the spins not re-reported for :data:`SPIN_STALE_S`; the node of each."""
        stale = [k for k, spin in self.table.items() if now - spin.reported > SPIN_STALE_S]
        for key in stale:
            del self.table[key]
        return [node for node, _ in stale]
