"""What the fleet state keeps: one GPU's recent windows (:class:`GpuTrack` of :class:`Window`), one training
rank's reports (:class:`RankTrack`), a hardware event; plain records the detectors read."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)  # not frozen: one is made per summary ingested, and a frozen init is 6x slower
class Window:
    """One ``gpu_summary``, reduced to what the detectors use; never changed once made."""

    end: float
    util: float | None
    power: float | None
    clock: float | None
    link: float | None  # NVLink + PCIe bytes/s, both directions
    hw_slowdown: float
    thermal: float
    power_brake: float


@dataclass(slots=True)
class GpuTrack:
    node: str
    gpu: int
    model: str | None = None
    job: str | None = None
    windows: list[Window] = field(default_factory=list)  # oldest first (a list: an empty deque costs 600 B)
    power_base: float | None = None  # running baseline while computing (never fed by spin windows)
    link_base: float | None = None
    computed_s: float = 0.0  # time spent computing under the current job
    last_seen: float = 0.0

    def latest(self) -> Window | None:
        return self.windows[-1] if self.windows else None


@dataclass(frozen=True, slots=True)
class HardwareEvent:
    time: float
    node: str
    gpu: int | None
    what: str  # "xid 79 (RESTART_BM)", "gpu_lost", ...
    hardware: bool  # False: an application Xid (evidence of a culprit, not of a fault)
    condition: str  # xid bucket or gpu_health condition


@dataclass(slots=True)
class RankTrack:
    job: str
    rank: int
    node: str
    gpu: int | None = None
    step: int = -1
    steps_seen: int = 0
    phase: str = "train"
    collective_seq: int | None = None
    last_report: float = 0.0
    last_advance: float = 0.0
    advance_every: float | None = None  # running average of the time between advancing reports
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=16))
    compute_times: deque[float] = field(default_factory=lambda: deque(maxlen=16))

    def median_step(self) -> float | None:
        return _median(self.step_times)

    def median_compute(self) -> float | None:
        return _median(self.compute_times)


def median(values: Iterable[float]) -> float:
    """The median of a non-empty collection."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _median(values: deque[float]) -> float | None:
    return median(values) if values else None
