"""The ``checkpoint_interval`` kind: a running job checkpoints far less often than advised.

Raised by the engine's reliability accounting (watchd.reliability, docs/reliability.md) on the job's first
node, source ``reliability``; informational: the shipped rule (findings.yaml) notifies at severity info.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from watchd.model.events import Scalar
from watchd.model.kinds import Attrs

__all__ = ["KIND", "SOURCE", "CheckpointInterval"]

KIND = "checkpoint_interval"
SOURCE = "reliability"
#: The engine's path for one job's checkpoint advice: the agents' token may read it (an agent asks for the
#: ranks of a job on its node), like an operator's or a viewer's.
JOB_ADVICE_PATH = "/api/v1/reliability/job"


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointInterval(Attrs):
    KIND: ClassVar[str] = KIND

    job: str
    nodes: int
    current_interval_s: float  # the job's compute time between checkpoints (or since its last one)
    advised_interval_s: float  # Daly's
    checkpoint_cost_s: float
    job_mtbf_s: float
    waste_current: float  # expected share of compute lost at the current interval
    waste_advised: float  # ... and at the advised one
    summary: str
    partition: str | None = None
    extra: Mapping[str, Scalar] = field(default_factory=dict)
