"""The rule engine the daemon runs: events in, decisions out, through the generated fast path
(watchd/rules/compiled/), with the lifecycle of what the rules remember (carried over a reload, saved and
restored across a restart). Pure: the only clock is the events' own observation time, so the same timeline
always gives the same decisions (that is what makes ``watchd rules test`` possible). What it decides is
specified by watchd/rules/specification.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from watchd.model.events import Event
from watchd.rules.compiled.dispatch import compile_rules
from watchd.rules.decision import Decision
from watchd.rules.persist import StateCopy, copy_state, fingerprint, is_empty, state_from_data
from watchd.rules.rule import Rule
from watchd.rules.rule_state import MAX_GROUP_BYTES, MAX_GROUPS, GroupBound, RuleState


class RuleEngine:
    """Evaluates events against ``rules``. Each event kind the rules name gets one generated function: its
    ``unless`` sightings, the rule index's checks and the rules with ``for`` inline, then each matching
    rule's own generated evaluation, over this engine's state. Tables hold at most ``max_groups`` groups
    per rule, with keys of at most ``max_bytes``; beyond either the least recently inserted is forgotten
    (``groups_evicted`` counts them)."""

    evaluate: Callable[[Event], list[Decision]]
    """Every decision an event triggers, in rule-file order."""

    def __init__(
        self, rules: tuple[Rule, ...], max_groups: int = MAX_GROUPS, max_bytes: int = MAX_GROUP_BYTES
    ) -> None:
        self.rules = rules
        self._state: dict[str, RuleState] = {r.name: RuleState() for r in rules if r.stateful}
        self._fingerprints: dict[str, str] = {}
        self._by_name = {r.name: r for r in rules}
        self._bound = GroupBound(max_groups, max_bytes)
        self.evaluate = compile_rules(rules, self._state, self._bound.added)

    @property
    def groups_evicted(self) -> int:
        return self._bound.evicted

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


def decisions_for(rules: tuple[Rule, ...], events: list[Event]) -> list[Decision]:
    """Evaluate a whole timeline (used by ``watchd rules test`` and the benchmarks)."""
    engine = RuleEngine(rules)
    out: list[Decision] = []
    for event in sorted(events, key=lambda e: e.time):
        out.extend(engine.evaluate(event))
    return out


__all__ = ["RuleEngine", "decisions_for"]
