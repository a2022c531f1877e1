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
#: And the bytes of their keys (as :func:`key_bytes` counts them) per rule and table: long keys (a node name
#: or a PCI address as long as the wire allows) cannot make the count cap cost gigabytes.
MAX_GROUP_BYTES = 16 * 1024 * 1024
_KEY_OVERHEAD = 64  # the tuple, its table slot and the value kept, roughly


def key_bytes(key: GroupKey) -> int:
    """What a group key costs, as the bound counts it: deterministic (the interpreter and the generated
    evaluator must forget the same groups), the text of its strings plus a fixed overhead."""
    n = _KEY_OVERHEAD
    for value in key:
        n += len(value) if isinstance(value, str) else 8
    return n


class GroupBound:
    """Bounds the tables of one rule engine by count (``max_groups``) and by the bytes of their keys
    (``max_bytes``), forgetting the least recently inserted group first; ``evicted`` counts them. The
    interpreter and the generated evaluator call :meth:`added` at the same points, so they forget alike.

    The bytes per table are an upper estimate kept from inserts (keys deleted elsewhere stay counted),
    recomputed exactly whenever it passes ``max_bytes``; eviction then goes down to ``max_bytes``."""

    def __init__(self, max_groups: int = MAX_GROUPS, max_bytes: int = MAX_GROUP_BYTES) -> None:
        self.max_groups = max_groups
        self.max_bytes = max_bytes
        self.evicted = 0
        self._bytes: dict[int, int] = {}  # id(table) -> bytes of its keys (an upper estimate)

    def added(self, table: dict[GroupKey, Any], key: GroupKey) -> None:
        """``key`` was just inserted into ``table`` as its most recent group (it was not there before)."""
        tid = id(table)
        size = self._bytes.get(tid, 0) + key_bytes(key)
        if size > self.max_bytes:
            size = sum(key_bytes(k) for k in table)
        while len(table) > 1 and (len(table) > self.max_groups or size > self.max_bytes):
            oldest = next(iter(table))  # never the group just inserted: it is the newest
            del table[oldest]
            size -= key_bytes(oldest)
            self.evicted += 1
        self._bytes[tid] = size


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
