"""Compiled rules: predicates, templates and an index by event field, built once at load."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from watchd.events import Event, Scalar
from watchd.rules.match import Predicate, index_keys
from watchd.rules.model import ActionKind, Mode, RateLimit, RuleSpec
from watchd.rules.template import Template


@dataclass(frozen=True, slots=True)
class Rule:
    spec: RuleSpec
    source: str  # file (and line) the rule came from
    matches: Predicate
    unless: Predicate | None
    templates: tuple[Mapping[str, Any], ...]  # per action: param -> Template, or nested mapping of them
    order: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def stateful(self) -> bool:
        s = self.spec
        return s.count > 1 or bool(s.distinct) or s.for_ is not None or s.unless is not None or s.cooldown > 0


@dataclass(frozen=True, slots=True)
class PlannedAction:
    """One action a rule asks for, with its templates rendered for one event."""

    kind: ActionKind
    node: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    rule: str
    severity: str
    event: Event
    actions: tuple[PlannedAction, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    group: Mapping[str, Scalar] = field(default_factory=dict)
    count: int = 1
    mode: Mode | None = None
    rate_limit: RateLimit | None = None


def context(rule: Rule, event: Event, group: Mapping[str, Scalar], count: int) -> dict[str, Any]:
    fields: dict[str, Any] = dict(event.attrs)
    fields.update(id=event.id, node=event.node, source=event.source, kind=event.kind, time=event.time)
    return {
        **fields,
        "event": fields,
        "rule": rule.name,
        "severity": rule.spec.severity,
        "count": count,
        "group": dict(group),
    }


def _render(value: Any, ctx: Mapping[str, Any]) -> Any:
    if isinstance(value, Template):
        return value.render(ctx)
    if isinstance(value, dict):
        return {k: _render(v, ctx) for k, v in value.items()}
    return value


def plan(rule: Rule, event: Event, group: Mapping[str, Scalar] | None = None, count: int = 1) -> Decision:
    group = group if group is not None else {"node": event.node}
    ctx = context(rule, event, group, count)
    actions = tuple(
        PlannedAction(kind=spec.kind, node=event.node, params=_render(templates, ctx))
        for spec, templates in zip(rule.spec.actions, rule.templates, strict=True)
    )
    return Decision(
        rule=rule.name,
        severity=rule.spec.severity,
        event=event,
        actions=actions,
        labels=rule.spec.labels,
        group=group,
        count=count,
        mode=rule.spec.mode,
        rate_limit=rule.spec.rate_limit,
    )


class RuleIndex:
    """Finds the rules an event may match without trying every rule: by ``kind``, then by one more field
    the rule pins (``xid: {in: [...]}``). Candidates come back in file order."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        self._any_kind: list[Rule] = []
        self._by_kind: dict[Any, _KindIndex] = {}
        for rule in rules:
            keys = dict(index_keys(rule.spec.match))
            kinds = keys.pop("kind", None)
            if kinds is None:
                self._any_kind.append(rule)
                continue
            for kind in kinds:
                self._by_kind.setdefault(kind, _KindIndex()).add(rule, keys)

    def candidates(self, event: Event) -> list[Rule]:
        by_kind = self._by_kind.get(event.kind)
        found = by_kind.candidates(event) if by_kind is not None else []
        if self._any_kind:
            found = sorted([*found, *self._any_kind], key=lambda r: r.order)
        return found


class _KindIndex:
    def __init__(self) -> None:
        self.unkeyed: list[Rule] = []
        self.keyed: dict[str, dict[Any, list[Rule]]] = {}

    def add(self, rule: Rule, keys: Mapping[str, frozenset[Any]]) -> None:
        if not keys:
            self.unkeyed.append(rule)
            return
        # index on the field with the fewest values: the most selective one
        name, values = min(keys.items(), key=lambda kv: len(kv[1]))
        table = self.keyed.setdefault(name, {})
        for value in values:
            table.setdefault(value, []).append(rule)

    def candidates(self, event: Event) -> list[Rule]:
        found = list(self.unkeyed)
        for name, table in self.keyed.items():
            found.extend(table.get(event.get(name), ()))
        if len(self.keyed) > 1 or (self.keyed and self.unkeyed):
            found.sort(key=lambda r: r.order)
        return found
