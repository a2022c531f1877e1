"""Rule evaluation over a stream of events: group_by, count within a sliding window, distinct values,
``for``, ``unless`` and cooldown. Pure: the only clock is the events' own observation time, so the same
timeline always gives the same decisions (that is what makes ``watchd rules test`` possible)."""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from watchd.events import Event, Scalar
from watchd.rules.index import Index, RuleIndex, ScanIndex
from watchd.rules.match import Predicate, match_kinds
from watchd.rules.ruleset import Decision, Rule

GroupKey = tuple[Any, ...]

#: Groups kept per rule; beyond it the least recently seen group is forgotten (and counted).
MAX_GROUPS = 100_000


@dataclass(slots=True)
class _RuleState:
    window: dict[GroupKey, deque[tuple[float, tuple[Any, ...]]]] = field(default_factory=dict)
    held_since: dict[GroupKey, float] = field(default_factory=dict)
    fired_hold: set[GroupKey] = field(default_factory=set)
    unless_seen: dict[GroupKey, tuple[float, str]] = field(default_factory=dict)
    last_fired: dict[GroupKey, float] = field(default_factory=dict)


def _bounded_set(table: dict[GroupKey, Any], key: GroupKey, value: Any, limit: int) -> int:
    """Insert as most recent; drop the least recent entry when over ``limit``. Returns how many dropped."""
    table.pop(key, None)
    table[key] = value
    if len(table) > limit:
        del table[next(iter(table))]
        return 1
    return 0


class RuleEngine:
    """``indexed=False`` tries every rule and every ``unless`` on its own, with its whole match: the reference
    the index and the shared ``unless`` checks must agree with."""

    def __init__(
        self, rules: tuple[Rule, ...], max_groups: int = MAX_GROUPS, *, indexed: bool = True
    ) -> None:
        self.rules = rules
        self._index: Index = RuleIndex(rules) if indexed else ScanIndex(rules)
        self._indexed = indexed
        self._unless_rules = _by_kind([r for r in rules if r.unless is not None], unless=True)
        self._for_rules = _by_kind([r for r in rules if r.spec.for_ is not None], unless=False)
        self._state: dict[str, _RuleState] = {r.name: _RuleState() for r in rules if r.stateful}
        self._kinds: dict[str, _KindPlan] = {}
        self._max_groups = max_groups
        self.groups_evicted = 0

    def carry_state_from(self, old: RuleEngine) -> None:
        """After a reload: rules whose definition did not change keep their windows and cooldowns."""
        before = {r.name: r.spec for r in old.rules}
        for rule in self.rules:
            if rule.name in self._state and before.get(rule.name) == rule.spec and rule.name in old._state:
                self._state[rule.name] = old._state[rule.name]
        self._kinds.clear()  # they hold the states replaced above

    @property
    def tracked_groups(self) -> int:
        return sum(len(s.window) + len(s.held_since) + len(s.last_fired) for s in self._state.values())

    def evaluate(self, event: Event) -> list[Decision]:
        """Every decision this event triggers, in rule-file order."""
        kind = self._kinds.get(event.kind) or self._plan_kind(event.kind)
        now = event.time
        for unless, targets in kind.unless:
            if unless(event):
                for group_key, seen in targets:
                    self.groups_evicted += _bounded_set(
                        seen, group_key(event), (now, event.id), self._max_groups
                    )
        fired: list[Rule] = []
        self._index.matching(event, fired)
        if len(fired) > 1:
            fired.sort(key=_order)
        decisions: list[Decision] = []
        for rule in fired:
            if not rule.stateful:
                decisions.append(rule.decide(event, {"node": event.node}, 1))
                continue
            decision = self._stateful(rule, event, now)
            if decision is not None:
                decisions.append(decision)
        if kind.holds:
            self._end_holds(kind.holds, {id(r) for r in fired}, event)
        return decisions

    @staticmethod
    def _end_holds(holds: tuple[tuple[Rule, _RuleState], ...], fired: set[int], event: Event) -> None:
        for rule, state in holds:  # an event of the rule's kind that no longer matches ends a hold
            if id(rule) not in fired:
                key = rule.group_key(event)
                state.held_since.pop(key, None)
                state.fired_hold.discard(key)

    def _plan_kind(self, kind: str) -> _KindPlan:
        """What every event of ``kind`` checks besides the index: ``unless`` matches (each distinct one
        once), and the rules with ``for`` whose hold a non-matching event of the kind ends."""
        unless: dict[str, tuple[Predicate, list[tuple[Any, Any]]]] = {}
        for rule in _for_kind(self._unless_rules, kind):
            assert rule.unless is not None and rule.spec.unless is not None
            key = _canonical(rule.spec.unless.match) if self._indexed else rule.name
            target = (rule.group_key, self._state[rule.name].unless_seen)
            unless.setdefault(key, (rule.unless, []))[1].append(target)
        holds = tuple((r, self._state[r.name]) for r in _for_kind(self._for_rules, kind))
        plan = _KindPlan(tuple((check, tuple(t)) for check, t in unless.values()), holds)
        self._kinds[kind] = plan
        return plan

    def _stateful(self, rule: Rule, event: Event, now: float) -> Decision | None:
        spec = rule.spec
        state = self._state[spec.name]
        key = rule.group_key(event)
        if spec.unless is not None:
            seen = state.unless_seen.get(key)
            if seen is not None and seen[1] != event.id and 0 <= now - seen[0] <= spec.unless.within:
                return None
        count = 1
        if spec.for_ is not None:
            since = state.held_since.get(key)
            if since is None:
                since = now
                self.groups_evicted += _bounded_set(state.held_since, key, now, self._max_groups)
            if now - since < spec.for_ or key in state.fired_hold:
                return None
            state.fired_hold.add(key)
        elif rule.counted:
            window = state.window.get(key)
            if window is None:
                window = deque()
                self.groups_evicted += _bounded_set(state.window, key, window, self._max_groups)
            window.append((now, rule.distinct_values(event)))
            horizon = now - spec.window  # type: ignore[operator]  # a counted rule has a window
            while window[0][0] < horizon:
                window.popleft()
            if len(window) < spec.count:
                return None
            if spec.distinct:
                for i, need in enumerate(spec.distinct.values()):
                    if len({values[i] for _, values in window if values[i] is not None}) < need:
                        return None
            count = len(window)
        if spec.cooldown > 0:
            last = state.last_fired.get(key)
            if last is not None and now - last < spec.cooldown:
                return None
            self.groups_evicted += _bounded_set(state.last_fired, key, now, self._max_groups)
        if rule.counted:
            state.window.pop(key, None)  # fired: the next firing needs a fresh count
        return rule.decide(event, rule.group_of(key), count)


_ANY = object()


@dataclass(frozen=True, slots=True)
class _KindPlan:
    unless: tuple[tuple[Predicate, tuple[tuple[Any, Any], ...]], ...]  # (match, ((group key, seen), ...))
    holds: tuple[tuple[Rule, _RuleState], ...]


def _canonical(value: Any) -> str:
    """Equal for equal matches whatever their key order (1, 1.0 and true stay apart)."""
    if isinstance(value, Mapping):
        return (
            "{"
            + ",".join(f"{k!r}:{_canonical(v)}" for k, v in sorted(value.items(), key=lambda kv: repr(kv[0])))
            + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + ",".join(_canonical(v) for v in value) + "]"
    return f"{type(value).__name__}:{value!r}"


_order = operator.attrgetter("order")


def _by_kind(rules: list[Rule], unless: bool) -> dict[Any, tuple[Rule, ...]]:
    """Rules by the event kind their (unless) match can hold for; ``_ANY`` for those of any kind."""
    table: dict[Any, list[Rule]] = {}
    for rule in rules:
        match = rule.spec.unless.match if unless and rule.spec.unless is not None else rule.spec.match
        for kind in match_kinds(match) or (_ANY,):
            table.setdefault(kind, []).append(rule)
    return {k: tuple(v) for k, v in table.items()}


def _for_kind(table: Mapping[Any, tuple[Rule, ...]], kind: str) -> tuple[Rule, ...]:
    if not table:
        return ()
    return table.get(kind, ()) + table.get(_ANY, ())


def decisions_for(rules: tuple[Rule, ...], events: list[Event]) -> list[Decision]:
    """Evaluate a whole timeline (used by ``watchd rules test`` and the benchmarks)."""
    engine = RuleEngine(rules)
    out: list[Decision] = []
    for event in sorted(events, key=lambda e: e.time):
        out.extend(engine.evaluate(event))
    return out


__all__ = ["GroupKey", "RuleEngine", "Scalar", "decisions_for"]
