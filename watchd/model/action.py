"""The ``watchd_action`` kind: an action watchd completed, fed back to the rules on the acted node; and the
engine's news of actions to its subsystems (:mod:`watchd.subsystem`): :class:`ActionOutcome` (the feedback, at
once, before it is queued for the rules) and :class:`NodeReturned`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from watchd.model.events import Event, Scalar
from watchd.model.kinds import Attrs

__all__ = ["KIND", "SOURCE", "ActionFeedback", "ActionOutcome", "NodeReturned"]

KIND = "watchd_action"
SOURCE = "watchd"


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionFeedback(Attrs):
    KIND: ClassVar[str] = KIND

    action: str  # drain, requeue, resume, alert, webhook, log
    outcome: str  # drained, already_drained, requeued, dry_run, deduplicated, skipped, failed, ...
    rule: str  # the rule that decided it
    mode: str  # dry-run | enforce
    extra: Mapping[str, Scalar] = field(default_factory=dict)


class ActionOutcome(NamedTuple):
    """News: an action's outcome as the executor fed it back (its ``watchd_action`` event)."""

    event: Event


class NodeReturned(NamedTuple):
    """News: ``node`` is back in service at ``time`` through watchd (an operator's resume through it, a
    validation that passed)."""

    node: str
    time: float
