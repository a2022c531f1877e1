"""Rule evaluation over a stream of events: group_by, count within a sliding window, distinct values,
``for``, ``unless`` and cooldown. Pure: the only clock is the events' own observation time, so the same
timeline always gives the same decisions (that is what makes ``watchd rules test`` possible)."""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from watchd.model.events import Event, Scalar
from watchd.rules.evaluator import (
    FOR_STALE_S,
    GroupKey,
    KindRules,
    RuleState,
    compile_evaluator,
    compile_kind,
)
from watchd.rules.index import RuleIndex, ScanIndex
from watchd.rules.match import Predicate, match_kinds
from watchd.rules.persist import StateCopy, copy_state, fingerprint, is_empty, state_from_data
from watchd.rules.ruleset import Decision, Rule

#: Groups kept per rule; beyond it the least recently seen group is forgotten (and counted).
MAX_GROUPS = 100_000


def _bounded_set(table: dict[GroupKey, Any], key: GroupKey, value: Any, limit: int) -> int:
    """Insert as most recent; drop the least recent entry when over ``limit``. Returns how many dropped."""
    table.pop(key, None)
    table[key] = value
    if len(table) > limit:
        del table[next(iter(table))]
        return 1
    return 0


class RuleEngine:
    """Evaluates events against ``rules``. Each event kind the rules name gets one generated function
    (watchd/rules/evaluator.py): its ``unless`` sightings, the rule index's checks and the rules with
    ``for`` inline, then each matching rule's own generated evaluation, over this engine's state.

    ``indexed=False`` is the reference the compiled path must agree with: it tries every rule and every
    ``unless`` on its own, with its whole match, and interprets each rule's steps from its spec."""

    evaluate: Callable[[Event], list[Decision]]
    """Every decision an event triggers, in rule-file order."""

    def __init__(
        self, rules: tuple[Rule, ...], max_groups: int = MAX_GROUPS, *, indexed: bool = True
    ) -> None:
        self.rules = rules
        self._state: dict[str, RuleState] = {r.name: RuleState() for r in rules if r.stateful}
        self._unless_rules = _by_kind([r for r in rules if r.unless is not None], unless=True)
        self._for_rules = _by_kind([r for r in rules if r.spec.for_ is not None], unless=False)
        self._max_groups = max_groups
        self._fingerprints: dict[str, str] = {}
        self._by_name = {r.name: r for r in rules}
        self.groups_evicted = 0
        if indexed:
            _share_sightings(rules, self._state)
            self._compile()
        else:
            self._scan = ScanIndex(rules)
            self._plans: dict[str, _KindPlan] = {}
            self.evaluate = self._evaluate_reference

    def carry_state_from(self, old: RuleEngine) -> None:
        """After a reload: rules whose definition did not change keep their windows and cooldowns."""
        before = {r.name: r.spec for r in old.rules}
        for rule in self.rules:
            mine, theirs = self._state.get(rule.name), old._state.get(rule.name)
            if mine is not None and theirs is not None and before.get(rule.name) == rule.spec:
                mine.take(theirs)

    def snapshot(self) -> dict[str, tuple[str, StateCopy]]:
        """What each stateful rule remembers, with its rule's fingerprint (rules that remember nothing are
        left out): a copy, safe to turn into data (``persist.state_to_data``) elsewhere while evaluation
        goes on."""
        return {
            name: (self._fingerprint(name), copy_state(state))
            for name, state in self._state.items()
            if not is_empty(state)
        }

    def _fingerprint(self, name: str) -> str:
        fp = self._fingerprints.get(name)
        if fp is None:
            fp = self._fingerprints[name] = fingerprint(self._by_name[name])
        return fp

    def restore(self, saved: Mapping[str, tuple[str, Any]]) -> tuple[list[str], list[str]]:
        """Fill the tables of each rule whose definition is the one ``saved`` was taken under. Returns the
        rules restored and, as ``rule: reason``, the saved states left out (rule gone or changed, or
        unreadable)."""
        restored, skipped = [], []
        for rule in self.rules:
            mine, entry = self._state.get(rule.name), saved.get(rule.name)
            if mine is None or entry is None:
                continue
            if entry[0] != self._fingerprint(rule.name):
                skipped.append(f"{rule.name}: the rule changed since it was saved")
                continue
            try:
                mine.take(state_from_data(entry[1]))
            except ValueError as exc:
                skipped.append(f"{rule.name}: {exc}")
                continue
            restored.append(rule.name)
        gone = sorted(set(saved) - set(self._state))
        skipped += [f"{name}: no such stateful rule now" for name in gone]
        return restored, skipped

    @property
    def tracked_groups(self) -> int:
        return sum(len(s.window) + len(s.held_since) + len(s.last_fired) for s in self._state.values())

    def _evict(self, table: dict[GroupKey, Any]) -> None:
        del table[next(iter(table))]
        self.groups_evicted += 1

    def _compile(self) -> None:
        rules, state = self.rules, self._state
        evaluators = {
            r.name: compile_evaluator(r, state.get(r.name), self._evict, self._max_groups) for r in rules
        }
        # a rule with ``for`` is checked for every event of its kind (one that does not match ends a hold)
        index = RuleIndex([r for r in rules if r.spec.for_ is None], found=lambda r: evaluators[r.name])
        order = {evaluators[r.name]: r.order for r in rules}

        def plan(kind: str | None) -> Callable[[Event], list[Decision]]:
            return compile_kind(
                KindRules(
                    kind,
                    index,
                    tuple(
                        tuple((r, state[r.name]) for r in group)
                        for group in _unless_groups(_for_kind(self._unless_rules, kind), canonical=True)
                    ),
                    tuple((r, evaluators[r.name], state[r.name]) for r in _for_kind(self._for_rules, kind)),
                ),
                order,
                self._evict,
                self._max_groups,
            )

        named = index.kinds | {k for k in (*self._unless_rules, *self._for_rules) if isinstance(k, str)}
        kinds = {kind: plan(kind) for kind in named}
        other = plan(None)  # a kind no rule names: one function for all of them

        def evaluate(event: Event) -> list[Decision]:
            return kinds.get(event.kind, other)(event)

        self.evaluate = evaluate

    def _evaluate_reference(self, event: Event) -> list[Decision]:
        plan = self._plans.get(event.kind) or self._plan_reference(event.kind)
        now = event.time
        for unless, targets in plan.unless:
            if unless(event):
                for group_key, seen in targets:
                    self.groups_evicted += _bounded_set(
                        seen, group_key(event), (now, event.id), self._max_groups
                    )
        fired: list[Rule] = []
        self._scan.matching(event, fired)
        fired.sort(key=_order)
        decisions: list[Decision] = []
        for rule in fired:
            if not rule.stateful:
                decisions.append(rule.decide(event, {"node": event.node}, 1))
                continue
            decision = self._stateful(rule, event, now)
            if decision is not None:
                decisions.append(decision)
        matched = {id(r) for r in fired}
        for rule in plan.for_rules:
            if id(rule) not in matched:  # an event of the rule's kind that no longer matches ends a hold
                key = rule.group_key(event)
                self._state[rule.name].held_since.pop(key, None)
                self._state[rule.name].fired_hold.discard(key)
        return decisions

    def _plan_reference(self, kind: str) -> _KindPlan:
        unless = _unless_groups(_for_kind(self._unless_rules, kind), canonical=False)
        checks = tuple(
            (rules[0].unless, tuple((r.group_key, self._state[r.name].unless_seen) for r in rules))
            for rules in unless
        )
        plan = _KindPlan(checks, _for_kind(self._for_rules, kind))  # type: ignore[arg-type]
        self._plans[kind] = plan
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
            held = state.held_since.get(key)
            if held is None:
                held = [now, now]
                self.groups_evicted += _bounded_set(state.held_since, key, held, self._max_groups)
            elif now - held[1] > FOR_STALE_S:  # not seen for too long: a new hold
                held[0] = now
                state.fired_hold.discard(key)
            held[1] = now
            if now - held[0] < spec.for_ or key in state.fired_hold:
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
    """The reference path's per-kind lists: ``unless`` checks with (group key, sightings) per rule, and
    the rules with ``for``."""

    unless: tuple[tuple[Predicate, tuple[tuple[Callable[[Event], GroupKey], dict[GroupKey, Any]], ...]], ...]
    for_rules: tuple[Rule, ...]


def _share_sightings(rules: tuple[Rule, ...], state: Mapping[str, RuleState]) -> None:
    """Rules with equal ``unless`` matches and equal ``group_by`` would record the very same sightings:
    they share one table, so an event records it once rather than once per rule."""
    tables: dict[tuple[str, tuple[str, ...]], dict[GroupKey, tuple[float, str]]] = {}
    for rule in rules:
        if rule.spec.unless is not None:
            key = (_canonical(rule.spec.unless.match), tuple(rule.spec.group_by))
            state[rule.name].unless_seen = tables.setdefault(key, state[rule.name].unless_seen)


def _unless_groups(rules: tuple[Rule, ...], canonical: bool) -> tuple[tuple[Rule, ...], ...]:
    """Rules with ``unless`` grouped by their ``unless`` match: one group per distinct match (by content
    when ``canonical``, else one per rule); each match is checked once per event."""
    groups: dict[str, list[Rule]] = {}
    for rule in rules:
        assert rule.spec.unless is not None
        key = _canonical(rule.spec.unless.match) if canonical else rule.name
        groups.setdefault(key, []).append(rule)
    return tuple(tuple(g) for g in groups.values())


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


def _for_kind(table: Mapping[Any, tuple[Rule, ...]], kind: str | None) -> tuple[Rule, ...]:
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
