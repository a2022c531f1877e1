"""What rule evaluation gives: a rule's decision for one event, and the actions it plans."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from watchd.model.events import Event, Scalar
from watchd.rules.limits import Mode, RateLimit


# Decisions and their actions are NamedTuples, immutable like a frozen dataclass but built ~4x faster: a rule
# engine under a flood of events makes several per event.
class PlannedAction(NamedTuple):
    """One action a rule asks for, with its templates rendered for one event."""

    kind: str  # an action kind of the handler table (watchd.actions.handlers)
    node: str
    params: Mapping[str, Any]


class Decision(NamedTuple):
    rule: str
    severity: str
    event: Event
    actions: tuple[PlannedAction, ...]
    labels: Mapping[str, str]
    group: Mapping[str, Scalar]
    count: int = 1  # type: ignore[assignment]  # shadows tuple.count, which nothing here uses
    mode: Mode | None = None
    rate_limit: RateLimit | None = None
