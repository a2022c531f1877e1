"""A node's incidents, read from the audit trail: each one record from the first evidence to the return to
service. Pure: plain code over the trail's records.

An incident opens when watchd takes the node out of service (a drain that drained it), gathers every action on
the node after that (the requeue, the reboot or GPU reset, the validation, the alerts, an operator's steps),
and closes when the node is back in service (a resume, or a validation that passed and resumed it). A node
left for a person (too many automatic remediations in the window, or a drain that replaced its reason: the
lemon rule's) stays open with that state. Dry-run
records open nothing: nothing was taken out of service."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from watchd.actions.audit import AuditRecord

__all__ = ["Incident", "Step", "incidents"]

IncidentState = Literal["open", "returned", "left_for_a_person"]

#: outcomes that take a node out of service, and those that put it back
_OUT = {("drain", "drained")}
_BACK = {("resume", "resumed"), ("validate", "resumed")}
#: the actions that count as automatic remediations of a node, with the outcome that means one was done
REMEDIATIONS = {"reboot": "rebooting", "gpu_reset": "reset"}
#: outcomes of a remediation that mean no more automatic steps: a person takes over
LEFT_FOR_A_PERSON = "left_for_a_person"


@dataclass(frozen=True, slots=True)
class Step:
    time: float
    action: str
    outcome: str
    detail: str
    rule: str
    event_id: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "action": self.action,
            "outcome": self.outcome,
            "detail": self.detail,
            "by": self.rule,
            "event_id": self.event_id,
        }


@dataclass(slots=True)
class Incident:
    node: str
    opened_at: float
    #: what took the node out: the drain's reason, and the rule and event behind it
    evidence: str
    rule: str
    event_id: str
    steps: list[Step] = field(default_factory=list)
    closed_at: float | None = None
    state: IncidentState = "open"

    @property
    def remediations(self) -> int:
        return sum(1 for s in self.steps if REMEDIATIONS.get(s.action) == s.outcome)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "state": self.state,
            "opened_at": self.opened_at,
            "closed_at": self.closed_at,
            "duration_s": None if self.closed_at is None else round(self.closed_at - self.opened_at, 3),
            "evidence": self.evidence,
            "rule": self.rule,
            "event_id": self.event_id,
            "steps": [s.to_dict() for s in self.steps],
        }


def incidents(records: Iterable[AuditRecord]) -> list[Incident]:
    """The incidents of the nodes in ``records`` (oldest first), in the order they opened."""
    out: list[Incident] = []
    open_by_node: dict[str, Incident] = {}
    for rec in sorted(records, key=lambda r: r.time):
        if rec.mode != "enforce":
            continue
        step = Step(rec.time, rec.action, rec.outcome, rec.detail, rec.rule, rec.event_id)
        current = open_by_node.get(rec.node)
        if current is None:
            if (rec.action, rec.outcome) not in _OUT:
                continue
            current = Incident(rec.node, rec.time, rec.detail, rec.rule, rec.event_id)
            open_by_node[rec.node] = current
            out.append(current)
        current.steps.append(step)
        replaced = rec.action == "drain" and rec.outcome == "drained" and rec.params.get("replace_reason")
        if rec.outcome == LEFT_FOR_A_PERSON or replaced:  # the lemon rule's drain: a person's matter
            current.state = "left_for_a_person"
        if (rec.action, rec.outcome) in _BACK:
            current.closed_at, current.state = rec.time, "returned"
            del open_by_node[rec.node]
    return out
