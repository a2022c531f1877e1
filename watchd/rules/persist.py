"""A rule's memory (count windows, ``for`` holds, ``unless`` sightings, cooldowns) as plain JSON data, so
the engine can keep it in its state database: a restart neither forgets a 28-day lemon window nor resets a
cooldown. Pure: no I/O.

A saved state belongs to one rule definition: ``fingerprint`` changes whenever the rule's spec does, and a
state saved under another fingerprint is not restored (the same rule as a reload that changed it).
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any, NamedTuple

from watchd.rules.rule import Rule
from watchd.rules.rule_state import GroupKey, RuleState

#: Bumped when the layout below changes: a state in another layout is not restored.
LAYOUT = 1


def fingerprint(rule: Rule) -> str:
    # where a rule stands in the set (replaces) is no part of its definition: a rule saved before that field
    # existed, or a replacement that defines the same rule, keeps what it remembered
    spec = rule.spec.model_dump_json(by_alias=True, exclude={"replaces"})
    return hashlib.sha256(f"{LAYOUT}:{spec}".encode()).hexdigest()[:24]


def is_empty(state: RuleState) -> bool:
    return not (state.window or state.held_since or state.fired_hold or state.unless_seen or state.last_fired)


class StateCopy(NamedTuple):
    """A rule's tables, copied as they are at one moment: nothing in it changes when evaluation goes on."""

    window: dict[GroupKey, tuple[tuple[float, tuple[Any, ...]], ...]]
    held: dict[GroupKey, tuple[float, ...]]
    fired: frozenset[GroupKey]
    unless: dict[GroupKey, tuple[float, str]]
    last: dict[GroupKey, float]


def copy_state(state: RuleState) -> StateCopy:
    """The quick part, done where the state lives (the event loop): mostly C-level copies (~0.5 µs per
    group). Keys, window entries and sightings are tuples already, so they are shared, not copied."""
    return StateCopy(
        {k: tuple(w) for k, w in state.window.items()},
        {k: tuple(h) for k, h in state.held_since.items()},
        frozenset(state.fired_hold),
        dict(state.unless_seen),
        dict(state.last_fired),
    )


def state_to_data(state: StateCopy) -> dict[str, list[Any]]:
    """As JSON data, in insertion order (the order eviction follows); safe in another thread."""
    return {
        "window": [[list(k), [[t, list(v)] for t, v in w]] for k, w in state.window.items()],
        "held": [[list(k), list(h)] for k, h in state.held.items()],
        "fired": [list(k) for k in state.fired],
        "unless": [[list(k), list(s)] for k, s in state.unless.items()],
        "last": [[list(k), t] for k, t in state.last.items()],
    }


def state_from_data(data: Any) -> RuleState:
    """The inverse of :func:`state_to_data`; ValueError when ``data`` is not such a state."""
    if not isinstance(data, dict):
        raise ValueError("a rule state is an object")
    try:
        return RuleState(
            window={
                _key(k): deque((_time(t), tuple(_scalars(v))) for t, v in entries)
                for k, entries in data.get("window", [])
            },
            held_since={_key(k): [_time(h[0]), _time(h[1])] for k, h in data.get("held", [])},
            fired_hold={_key(k) for k in data.get("fired", [])},
            unless_seen={_key(k): (_time(s[0]), str(s[1])) for k, s in data.get("unless", [])},
            last_fired={_key(k): _time(t) for k, t in data.get("last", [])},
        )
    except (TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"malformed rule state: {exc}") from None


def _key(value: Any) -> GroupKey:
    return tuple(_scalars(value))


def _scalars(value: Any) -> list[Any]:
    if not isinstance(value, list) or not all(v is None or isinstance(v, str | int | float) for v in value):
        raise ValueError(f"expected a list of scalars, got {value!r}")
    return value


def _time(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a time, got {value!r}")
    return float(value)
