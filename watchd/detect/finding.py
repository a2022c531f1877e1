"""What a detector concludes: a finding about one job, turned into an event the rules can match.

Finding events (``kind`` ``nccl_hang``, ``host_stall`` or ``straggler``, ``source`` ``detector``) are on the
culprit's node, or on the first suspect's when there is no culprit. Their attributes are their kind's class
in the model (:class:`~watchd.model.finding.Detection`'s: ``NcclHang``, ``HostStall``, ``Straggler``):
``job``, ``partition``, ``culprit_node``, ``culprit_gpu`` (absent when unknown), ``evidence`` (how the
culprit was found), ``hardware`` (true only with hardware attribution: the default rules drain only then),
``confidence`` (0-1), ``suspects`` (the nodes; comma-joined on the wire), ``onset`` (when the condition
began), ``duration_s``, ``signal`` (``nvml``, ``heartbeat`` or ``nvml+heartbeat``), ``summary`` (one
readable line) and detector-specific measurements (``extra``: ``gpus``, ``gpus_matching``, ``metric``,
``value``, ``job_median`` ...; :data:`~watchd.model.finding.MEASUREMENTS` names them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from watchd.model.events import Event, Scalar, stable_id
from watchd.model.finding import CLASSES, KINDS, MEASUREMENTS, SOURCE, Detection

__all__ = ["KINDS", "SOURCE", "Finding"]

_MEASUREMENTS = frozenset(MEASUREMENTS)


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

    def detection(self) -> Detection:
        """The finding's attributes as the rules see them."""
        measured = {k: v for k, v in self.extra.items() if k in _MEASUREMENTS}
        other = {k: v for k, v in self.extra.items() if k not in _MEASUREMENTS}
        return CLASSES[self.kind](
            job=self.job,
            evidence=self.evidence,
            hardware=self.hardware,
            confidence=round(self.confidence, 3),
            suspects=self.suspects,
            onset=round(self.onset, 3),
            duration_s=round(max(0.0, self.time - self.onset), 1),
            signal=self.signal,
            summary=self.summary,
            revision=self.revision,
            partition=self.partition,
            culprit_node=self.culprit_node,
            culprit_gpu=self.culprit_gpu,
            gpu=self.culprit_gpu,
            extra=other,
            **measured,  # type: ignore[arg-type]
        )

    def to_event(self) -> Event:
        return self.detection().to_event(
            id=stable_id(
                SOURCE, self.kind, self.job, self.onset, self.culprit_node, self.culprit_gpu, self.time
            ),
            node=self.node,
            source=SOURCE,
            kind=self.kind,
            time=self.time,
        )
