"""Per-GPU window summaries: one compact ``gpu_summary`` event per GPU per window, whatever the sampling rate.

Windows are aligned to multiples of ``window_s`` since the epoch (a 5 s window covers [10:00:05, 10:00:10)).
A window of a GPU closes when a sample of that GPU falls in another window (or at :meth:`flush`). The
event's ``time`` is the window's end, when its observation is complete (its age at the engine is then the
transport delay plus at most one sampling interval); ``window_start`` is its start. Pure: no I/O, no clock;
memory is constant per open window (running sums, not samples). Lost samples (``sample.lost``) are not
summarized, though they close a window.

Attributes: :class:`watchd.model.gpu.GpuSummary` (a statistic whose inputs were all ``None`` is left out).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from watchd.gpu.model import (
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_SW_THERMAL,
    GpuIdentity,
    GpuSample,
)
from watchd.model.events import Event, stable_id
from watchd.model.gpu import SUMMARY_KIND as KIND
from watchd.model.gpu import GpuSummary


@dataclass(slots=True)
class _Stat:
    n: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    def add(self, value: float | None) -> None:
        if value is None:
            return
        self.n += 1
        self.total += value
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def mean(self) -> float | None:
        return round(self.total / self.n, 3) if self.n else None

    def min(self) -> float | None:
        return self.low if self.n else None

    def max(self) -> float | None:
        return self.high if self.n else None


@dataclass(slots=True)
class _Window:
    start: float
    gpu: GpuIdentity
    samples: int = 0
    util: _Stat = field(default_factory=_Stat)
    power: _Stat = field(default_factory=_Stat)
    sm_clock: _Stat = field(default_factory=_Stat)
    sm_clock_rated: float | None = None
    reasons_n: int = 0
    reasons: int = 0
    hw_slowdown: int = 0
    thermal: int = 0
    power_brake: int = 0
    nvlink_tx: _Stat = field(default_factory=_Stat)
    nvlink_rx: _Stat = field(default_factory=_Stat)
    pcie_tx: _Stat = field(default_factory=_Stat)
    pcie_rx: _Stat = field(default_factory=_Stat)
    temp: _Stat = field(default_factory=_Stat)
    jobs: Counter[str] = field(default_factory=Counter)
    last_job: str | None = None

    def add(self, s: GpuSample, job: str | None) -> None:
        self.samples += 1
        self.gpu = s.gpu
        self.util.add(s.util_gpu)
        self.power.add(s.power_w)
        self.sm_clock.add(s.sm_clock_mhz)
        if s.sm_clock_max_mhz is not None:
            self.sm_clock_rated = s.sm_clock_max_mhz
        if s.clock_event_reasons is not None:
            r = s.clock_event_reasons
            self.reasons_n += 1
            self.reasons |= r
            self.hw_slowdown += bool(r & CLOCK_HW_SLOWDOWN)
            self.thermal += bool(r & (CLOCK_HW_THERMAL | CLOCK_SW_THERMAL))
            self.power_brake += bool(r & CLOCK_HW_POWER_BRAKE)
        self.nvlink_tx.add(s.nvlink_tx_bytes_per_s)
        self.nvlink_rx.add(s.nvlink_rx_bytes_per_s)
        self.pcie_tx.add(s.pcie_tx_bytes_per_s)
        self.pcie_rx.add(s.pcie_rx_bytes_per_s)
        self.temp.add(s.temp_c)
        if job is not None:
            self.jobs[job] += 1
            self.last_job = job

    def job(self) -> str | None:
        """The job seen in most samples of the window; a tie goes to the job seen last."""
        if not self.jobs:
            return None
        most = max(self.jobs.values())
        if self.jobs[self.last_job or ""] == most:
            return self.last_job
        return next(j for j, n in self.jobs.items() if n == most)


class WindowSummarizer:
    """Aggregates each GPU's samples per aligned window into ``gpu_summary`` events."""

    def __init__(self, window_s: float = 5.0, source: str = "nvml") -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self.source = source
        self._open: dict[str, _Window] = {}

    def window_start(self, time: float) -> float:
        return math.floor(time / self.window_s) * self.window_s

    def observe(self, sample: GpuSample, node: str, job: str | None = None) -> list[Event]:
        """Add a sample; returns the GPU's previous window (one event) when this sample starts another."""
        start = self.window_start(sample.time)
        uuid = sample.gpu.uuid
        out: list[Event] = []
        window = self._open.get(uuid)
        if window is not None and window.start != start:
            del self._open[uuid]
            out.extend(self._close(window, node))
            window = None
        if sample.lost:
            return out
        if window is None:
            window = self._open[uuid] = _Window(start, sample.gpu)
        window.add(sample, job)
        return out

    def flush(self, node: str) -> list[Event]:
        """Close every open window (at shutdown, or when the sampler stops)."""
        windows, self._open = list(self._open.values()), {}
        return [e for w in windows for e in self._close(w, node)]

    def _close(self, w: _Window, node: str) -> list[Event]:
        if not w.samples:
            return []
        gpu = w.gpu
        reasons = w.reasons_n
        summary = GpuSummary(
            gpu=gpu.index,
            uuid=gpu.uuid,
            pci_bus_id=gpu.pci_bus_id,
            model=gpu.model,
            job=w.job(),
            window_s=self.window_s,
            window_start=w.start,
            samples=w.samples,
            util_mean=w.util.mean(),
            util_min=w.util.min(),
            util_max=w.util.max(),
            power_mean=w.power.mean(),
            power_min=w.power.min(),
            power_max=w.power.max(),
            sm_clock_mean=w.sm_clock.mean(),
            sm_clock_min=w.sm_clock.min(),
            sm_clock_max=w.sm_clock.max(),
            sm_clock_max_rated=w.sm_clock_rated,
            clock_reasons=w.reasons if reasons else None,
            hw_slowdown_frac=round(w.hw_slowdown / reasons, 4) if reasons else None,
            thermal_frac=round(w.thermal / reasons, 4) if reasons else None,
            power_brake_frac=round(w.power_brake / reasons, 4) if reasons else None,
            nvlink_tx_mean=w.nvlink_tx.mean(),
            nvlink_rx_mean=w.nvlink_rx.mean(),
            pcie_tx_mean=w.pcie_tx.mean(),
            pcie_rx_mean=w.pcie_rx.mean(),
            temp_mean=w.temp.mean(),
        )
        return [
            summary.to_event(
                id=stable_id(node, KIND, gpu.uuid, w.start),
                node=node,
                source=self.source,
                time=w.start + self.window_s,  # when the window's observation is complete
            )
        ]


__all__ = ["KIND", "WindowSummarizer"]
