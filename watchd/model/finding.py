"""The finding kinds (``nccl_hang``, ``host_stall``, ``straggler``): what a detector concludes about one
job, as the rules see it. Built by :meth:`watchd.detect.finding.Finding.to_event`.

On the culprit's node, or the first suspect's when there is no culprit; ``source`` ``detector``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from watchd.model.events import Event, Scalar
from watchd.model.kinds import Attrs

__all__ = ["KINDS", "MEASUREMENTS", "SOURCE", "Detection"]

KINDS = ("nccl_hang", "host_stall", "straggler")
SOURCE = "detector"


@dataclass(frozen=True, slots=True, kw_only=True)
class Detection(Attrs):
    """A finding's attributes. ``hardware`` is true only with hardware attribution (the shipped rules drain
    only then); ``suspects`` is a comma-separated list of nodes; ``gpu`` repeats ``culprit_gpu``."""

    KIND: ClassVar[str] = KINDS[0]  # the class stands for every one of KINDS: to_event names the kind
    EXTRA_BEFORE: ClassVar[str | None] = "partition"

    job: str
    evidence: str  # how the culprit was found ("none")
    hardware: bool
    confidence: float  # 0-1
    suspects: str
    onset: float  # when the condition began
    duration_s: float
    signal: str  # nvml | heartbeat | nvml+heartbeat
    summary: str  # one readable line
    revision: int
    # detector-specific measurements (hang and host stall: gpus, gpus_matching, detail; straggler: metric,
    # value, job_median, deviation, rank)
    gpus: int | None = None
    gpus_matching: int | None = None
    detail: str | None = None
    metric: str | None = None
    value: float | None = None
    job_median: float | None = None
    deviation: float | None = None
    rank: int | None = None
    partition: str | None = None
    culprit_node: str | None = None
    culprit_gpu: int | None = None
    gpu: int | None = None
    extra: Mapping[str, Scalar] = field(default_factory=dict)

    def to_event(self, *, id: str, node: str, source: str, time: float, kind: str | None = None) -> Event:
        """The finding's event; ``kind`` is required (one of :data:`KINDS`)."""
        if kind not in KINDS:
            raise ValueError(f"a finding's kind is one of {', '.join(KINDS)}, not {kind!r}")
        return Attrs.to_event(self, id=id, node=node, source=source, time=time, kind=kind)


#: The detector-specific measurements, by name.
MEASUREMENTS = Detection.fields()[Detection.fields().index("gpus") : Detection.fields().index("partition")]
