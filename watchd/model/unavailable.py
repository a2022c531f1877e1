"""The ``node_unavailable`` kind: a node someone other than watchd took out of service (an
admin's drain, Node Health Check, the scheduler itself), seen by the engine's poll of the whole fleet, so
that rules and reports can see drains watchd did not make. Sent once per drain (node, reason and its
time), and again while it lasts (``reminder``, ``overdue``, with its age) once it is older than
``drains.alert_after_s`` (then for watchd's own drains too), on the node's name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from watchd.model.events import Scalar
from watchd.model.kinds import Attrs

__all__ = ["KIND", "SOURCE", "NodeUnavailable"]

KIND = "node_unavailable"
SOURCE = "watchd:fleet"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeUnavailable(Attrs):
    KIND: ClassVar[str] = KIND

    owner: str  # nhc | scheduler | admin | other (watchd's own drains are its actions, not this kind)
    reason_class: str  # a bounded label: nhc, not_responding, kill_task_failed, admin, ...
    reason: str  # the reason as the scheduler shows it ("" when none)
    state: str  # e.g. IDLE+DRAIN, DOWN+NOT_RESPONDING
    scheduler: str  # slurm | kubernetes | fake
    partition: str | None = None  # the node's first partition
    user: str | None = None  # who set the reason, when the scheduler says
    since: float | None = None  # when the reason was set (epoch seconds)
    age_s: float | None = None  # how long it has been out when this was sent
    reminder: bool | None = None  # True on the re-reports of a drain already reported
    overdue: bool | None = None  # out longer than drains.alert_after_s (watchd's own drains too)
    extra: Mapping[str, Scalar] = field(default_factory=dict)
