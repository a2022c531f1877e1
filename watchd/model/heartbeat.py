"""The ``heartbeat`` kind: one training rank's latest progress, as the agent's coalescer forwards it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from watchd.model.events import Scalar
from watchd.model.kinds import Attrs

__all__ = ["DEFAULT_PHASE", "KIND", "QUIET_PHASES", "SOURCE", "Heartbeat"]

KIND = "heartbeat"
SOURCE = "heartbeat"
DEFAULT_PHASE = "train"
#: Phases in which a rank declares that it does not step (its silence is no hang).
QUIET_PHASES = frozenset({"checkpoint", "eval", "init", "done"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Attrs):
    KIND: ClassVar[str] = KIND

    job: str  # slurm:<id>, k8s:<uid> or a bare Slurm job id
    rank: int
    step: int
    step_time_s: float | None = None
    compute_time_s: float | None = None
    collective_seq: int | None = None
    local_rank: int | None = None
    gpu: int | None = None
    phase: str | None = None  # DEFAULT_PHASE when absent
    reports: int | None = None  # reports the rank sent since the last forward
    extra: Mapping[str, Scalar] = field(default_factory=dict)
