"""What a detector concludes: a finding about one job, turned into an event the rules can match.

Finding events (``kind`` ``nccl_hang``, ``host_stall`` or ``straggler``, ``source`` ``detector``) are on the
culprit's node, or on the first suspect's when there is no culprit. Attrs: ``job``, ``partition``,
``culprit_node``, ``culprit_gpu`` (absent when unknown), ``evidence`` (how the culprit was found),
``hardware`` (true only with hardware attribution: the default rules drain only then), ``confidence`` (0-1),
``suspects`` (comma-separated nodes), ``onset`` (when the condition began), ``duration_s``, ``signal``
(``nvml``, ``heartbeat`` or ``nvml+heartbeat``), ``summary`` (one readable line) and detector-specific
measurements (``gpus``, ``gpus_spinning``, ``metric``, ``value``, ``job_median`` ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from watchd.model.events import Event, Scalar, stable_id

KINDS = ("nccl_hang", "host_stall", "straggler")
SOURCE = "detector"


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    job: str
    time: float
    onset: float
    summary: str
    confidence: float
    evidence: str = "none"
    hardware: bool = False
    culprit_node: str | None = None
    culprit_gpu: int | None = None
    suspects: tuple[str, ...] = ()
    partition: str | None = None
    signal: str = "nvml"
    revision: int = 0
    extra: Mapping[str, Scalar] = field(default_factory=dict)

    @property
    def node(self) -> str:
        if self.culprit_node is not None:
            return self.culprit_node
        return self.suspects[0] if self.suspects else "-"

    def to_event(self) -> Event:
        attrs: dict[str, Scalar] = {
            "job": self.job,
            "evidence": self.evidence,
            "hardware": self.hardware,
            "confidence": round(self.confidence, 3),
            "suspects": ",".join(self.suspects),
            "onset": round(self.onset, 3),
            "duration_s": round(max(0.0, self.time - self.onset), 1),
            "signal": self.signal,
            "summary": self.summary,
            "revision": self.revision,
            **self.extra,
        }
        if self.partition is not None:
            attrs["partition"] = self.partition
        if self.culprit_node is not None:
            attrs["culprit_node"] = self.culprit_node
        if self.culprit_gpu is not None:
            attrs["culprit_gpu"] = self.culprit_gpu
            attrs["gpu"] = self.culprit_gpu
        return Event(
            id=stable_id(
                SOURCE, self.kind, self.job, self.onset, self.culprit_node, self.culprit_gpu, self.time
            ),
            node=self.node,
            source=SOURCE,
            kind=self.kind,
            time=self.time,
            attrs=attrs,
        )
