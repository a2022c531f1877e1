"""The finding kinds (``nccl_hang``, ``host_stall``, ``straggler``): what a detector concludes about one
job, as the rules see it, each kind its own class (:class:`NcclHang`, :class:`HostStall`,
:class:`Straggler`) on the attributes they share (:class:`Detection`). Built by
:meth:`watchd.detect.finding.Finding.to_event`.

On the culprit's node, or the first suspect's when there is no culprit; ``source`` ``detector``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from watchd.model.events import Event, Scalar
from watchd.model.kinds import Attrs

__all__ = ["CLASSES", "KINDS", "MEASUREMENTS", "SOURCE", "Detection", "HostStall", "NcclHang", "Straggler"]

KINDS = ("nccl_hang", "host_stall", "straggler")
SOURCE = "detector"


@dataclass(frozen=True, slots=True, kw_only=True)
class Detection(Attrs):
    """A finding's attributes. ``hardware`` is true only with hardware attribution (the shipped rules drain
    only then); ``suspects`` lists the nodes (comma-joined on the wire, version 1); ``gpu`` repeats
    ``culprit_gpu``."""

    KIND: ClassVar[str] = KINDS[0]  # the base: to_event names the kind (a kind's class knows its own)
    EXTRA_BEFORE: ClassVar[str | None] = "partition"

    job: str
    evidence: str  # how the culprit was found ("none")
    hardware: bool
    confidence: float  # 0-1
    suspects: tuple[str, ...]
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
        """The finding's event; ``kind`` (one of :data:`KINDS`) is required of the base class."""
        kind = kind or (self.KIND if type(self) is not Detection else None)
        if kind not in KINDS:
            raise ValueError(f"a finding's kind is one of {', '.join(KINDS)}, not {kind!r}")
        return Attrs.to_event(self, id=id, node=node, source=source, time=time, kind=kind)


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclHang(Detection):
    """A job whose collectives stopped (NVML's spin signature, the ranks' heartbeats)."""

    KIND: ClassVar[str] = "nccl_hang"


@dataclass(frozen=True, slots=True, kw_only=True)
class HostStall(Detection):
    """A job whose GPUs idle after it computed: the hosts (data loader, storage), never the GPUs."""

    KIND: ClassVar[str] = "host_stall"


@dataclass(frozen=True, slots=True, kw_only=True)
class Straggler(Detection):
    """One GPU (clock) or rank (compute time) of a job far slower than the job's median."""

    KIND: ClassVar[str] = "straggler"


#: kind -> its class
CLASSES: Mapping[str, type[Detection]] = MappingProxyType(
    {c.KIND: c for c in (NcclHang, HostStall, Straggler)}
)
assert tuple(CLASSES) == KINDS

#: The detector-specific measurements, by name.
MEASUREMENTS = Detection.fields()[Detection.fields().index("gpus") : Detection.fields().index("partition")]
