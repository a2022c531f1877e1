"""The ``watchd_action`` kind: an action watchd completed, fed back to the rules on the acted node."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from watchd.model.events import Scalar
from watchd.model.kinds import Attrs

__all__ = ["KIND", "SOURCE", "ActionFeedback"]

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
