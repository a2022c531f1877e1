"""The fast path for a whole rule set: one generated function per event kind the rules name (and one for
every other kind), dispatched by the event's kind. Built over the engine's per-rule state tables."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from watchd.model.events import Event
from watchd.rules.compiled.evaluator import Evict, KindRules, compile_evaluator, compile_kind
from watchd.rules.compiled.index import RuleIndex
from watchd.rules.decision import Decision
from watchd.rules.rule import Rule
from watchd.rules.rule_state import GroupKey, RuleState
from watchd.rules.specification import match_kinds

_ANY = object()


def compile_rules(
    rules: tuple[Rule, ...], state: Mapping[str, RuleState], evict: Evict
) -> Callable[[Event], list[Decision]]:
    """``event -> decisions`` in rule-file order, over ``state`` (every stateful rule's tables; rules with
    the same ``unless`` match and ``group_by`` are made to share one table of sightings)."""
    share_sightings(rules, state)
    evaluators = {r.name: compile_evaluator(r, state.get(r.name), evict) for r in rules}
    # a rule with ``for`` is checked for every event of its kind (one that does not match ends a hold)
    index = RuleIndex([r for r in rules if r.spec.for_ is None], found=lambda r: evaluators[r.name])
    order = {evaluators[r.name]: r.order for r in rules}
    unless_rules = _by_kind([r for r in rules if r.unless is not None], unless=True)
    for_rules = _by_kind([r for r in rules if r.spec.for_ is not None], unless=False)

    def plan(kind: str | None) -> Callable[[Event], list[Decision]]:
        return compile_kind(
            KindRules(
                kind,
                index,
                tuple(
                    tuple((r, state[r.name]) for r in group)
                    for group in _unless_groups(_for_kind(unless_rules, kind))
                ),
                tuple((r, evaluators[r.name], state[r.name]) for r in _for_kind(for_rules, kind)),
            ),
            order,
            evict,
        )

    named = index.kinds | {k for k in (*unless_rules, *for_rules) if isinstance(k, str)}
    kinds = {kind: plan(kind) for kind in named}
    other = plan(None)  # a kind no rule names: one function for all of them

    def evaluate(event: Event) -> list[Decision]:
        return kinds.get(event.kind, other)(event)

    return evaluate


def share_sightings(rules: tuple[Rule, ...], state: Mapping[str, RuleState]) -> None:
    """Rules with equal ``unless`` matches and equal ``group_by`` would record the very same sightings:
    they share one table, so an event records it once rather than once per rule."""
    tables: dict[tuple[str, tuple[str, ...]], dict[GroupKey, tuple[float, str]]] = {}
    for rule in rules:
        if rule.spec.unless is not None:
            key = (_canonical(rule.spec.unless.match), tuple(rule.spec.group_by))
            state[rule.name].unless_seen = tables.setdefault(key, state[rule.name].unless_seen)


def _unless_groups(rules: tuple[Rule, ...]) -> tuple[tuple[Rule, ...], ...]:
    """Rules with ``unless`` grouped by their ``unless`` match (by content): each distinct match is checked
    once per event."""
    groups: dict[str, list[Rule]] = {}
    for rule in rules:
        assert rule.spec.unless is not None
        groups.setdefault(_canonical(rule.spec.unless.match), []).append(rule)
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
