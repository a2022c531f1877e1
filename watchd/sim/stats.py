"""The counters of a simulator run, as its progress line and its final summary show them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["SimStats"]


@dataclass
class SimStats:
    """Counters of a run, as the progress line and the final summary show them."""

    nodes: int
    gpus: int
    elapsed_s: float = 0.0
    samples: int = 0
    produced: Counter[str] = field(default_factory=Counter)  # events by kind
    shipped: int = 0
    queued: int = 0
    dropped_queue_full: int = 0
    dropped_rejected: int = 0
    undelivered_at_stop: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    behind_s: float = 0.0  # how late the current sampling tick started (0: keeping up)
    max_behind_s: float = 0.0
    faults_started: int = 0

    @property
    def events(self) -> int:
        return sum(self.produced.values())

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_rejected + self.undelivered_at_stop

    def progress_line(self) -> str:
        rate = self.events / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return (
            f"sim {self.elapsed_s:6.0f}s  nodes {self.nodes}  samples {self.samples}  "
            f"events {self.events} ({rate:.0f}/s)  shipped {self.shipped}  queue {self.queued}  "
            f"dropped {self.dropped}  faults {self.faults_started}  behind {self.behind_s:.2f}s"
        )

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.produced.items())) or "none"
        reqs = ", ".join(f"{k} {n}" for k, n in sorted(self.requests.items())) or "none"
        return "\n".join(
            [
                f"sim: stopped after {self.elapsed_s:.1f} s: {self.nodes} nodes, {self.gpus} GPUs, "
                f"{self.samples} GPU samples, {self.faults_started} faults started",
                f"  events:   {self.events} produced ({kinds})",
                f"            {self.shipped} shipped, {self.queued} still queued, {self.dropped} dropped "
                f"(queue full {self.dropped_queue_full}, rejected {self.dropped_rejected}, "
                f"undelivered at stop {self.undelivered_at_stop})",
                f"  requests: {reqs}",
                f"  sampling: at most {self.max_behind_s:.2f} s behind schedule",
            ]
        )
