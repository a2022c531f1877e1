"""What one stateful rule remembers, by group: count windows, ``for`` holds, ``unless`` sightings and the
last firing (for ``cooldown``). The specification (watchd/rules/specification.py) and the generated fast
path both keep their memory in these tables; watchd/rules/persist.py turns them into data and back."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

GroupKey = tuple[Any, ...]

#: Groups kept per rule and table; beyond it the least recently inserted group is forgotten (and counted).
MAX_GROUPS = 100_000


@dataclass(slots=True)
class RuleState:
    """One rule's tables, by group key. Generated evaluators hold these very tables: a reload carries state
    by filling them (``take``), never by replacing them."""

    window: dict[GroupKey, deque[tuple[float, tuple[Any, ...]]]] = field(default_factory=dict)
    held_since: dict[GroupKey, list[float]] = field(default_factory=dict)  # [since, last seen]
    fired_hold: set[GroupKey] = field(default_factory=set)
    unless_seen: dict[GroupKey, tuple[float, str]] = field(default_factory=dict)  # (time, event id)
    last_fired: dict[GroupKey, float] = field(default_factory=dict)

    def take(self, other: RuleState) -> None:
        for table in ("window", "held_since", "fired_hold", "unless_seen", "last_fired"):
            mine = getattr(self, table)
            mine.clear()
            mine.update(getattr(other, table))
