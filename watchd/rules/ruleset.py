"""Compiled rules: predicates, templates, action renderers and group-key readers, built once at load."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from watchd.model.events import TOP_LEVEL_FIELDS, Event, Scalar
from watchd.rules.codegen import Namespace
from watchd.rules.match import Predicate, tuple_getter
from watchd.rules.model import ActionKind, Mode, RateLimit, RuleSpec
from watchd.rules.template import Template

#: ``(event, group, count) -> PlannedAction``: one action of one rule, its templates compiled.
Planner = Callable[[Event, Mapping[str, Scalar], int], "PlannedAction"]
#: ``(event, group, count) -> Decision``: the rule's decision for one event, its constants bound.
Decider = Callable[[Event, Mapping[str, Scalar], int], "Decision"]


@dataclass(frozen=True, slots=True)
class Rule:
    spec: RuleSpec
    source: str  # file (and line) the rule came from
    matches: Predicate
    unless: Predicate | None
    templates: tuple[Mapping[str, Any], ...]  # per action: param -> Template, or nested mapping of them
    order: int = 0
    # Derived at construction (not compared): what evaluation runs per event.
    stateful: bool = field(init=False, compare=False)
    group_key: Callable[[Event], tuple[Any, ...]] = field(init=False, compare=False)
    planners: tuple[Planner, ...] = field(init=False, compare=False)
    decide: Decider = field(init=False, compare=False)
    counted: bool = field(init=False, compare=False)  # count within a window, or distinct values
    distinct_values: Callable[[Event], tuple[Any, ...]] = field(init=False, compare=False)
    group_of: Callable[[tuple[Any, ...]], dict[str, Scalar]] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        s = self.spec
        counted = s.count > 1 or bool(s.distinct)
        stateful = counted or s.for_ is not None or s.unless is not None or s.cooldown > 0
        object.__setattr__(self, "counted", counted)
        object.__setattr__(self, "stateful", stateful)
        object.__setattr__(self, "group_key", tuple_getter(s.group_by))
        # plan() groups a stateless rule's decision by node alone, a stateful one's by group_by
        group_keys = frozenset(s.group_by) if stateful else frozenset({"node"})
        planners = tuple(
            _planner(self, a.kind, t, group_keys) for a, t in zip(s.actions, self.templates, strict=True)
        )
        object.__setattr__(self, "planners", planners)
        object.__setattr__(self, "decide", _decider(s, planners))
        distinct = tuple(s.distinct)
        object.__setattr__(self, "distinct_values", tuple_getter(distinct) if distinct else lambda e: ())
        object.__setattr__(self, "group_of", _group_builder(tuple(s.group_by)))

    @property
    def name(self) -> str:
        return self.spec.name


# Decisions and their actions are NamedTuples, immutable like a frozen dataclass but built ~4x faster: a rule
# engine under a flood of events makes several per event.
class PlannedAction(NamedTuple):
    """One action a rule asks for, with its templates rendered for one event."""

    kind: ActionKind
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


class Context(Mapping[str, Any]):
    """What templates see, resolved on demand: the event's fields, ``event`` (the same), ``rule``,
    ``severity``, ``count`` and ``group``. Built per decision, costs nothing until a template asks."""

    __slots__ = ("_count", "_event", "_fields", "_group", "_rule")

    def __init__(self, rule: Rule, event: Event, group: Mapping[str, Scalar], count: int) -> None:
        self._rule, self._event, self._group, self._count = rule, event, group, count
        self._fields: dict[str, Any] | None = None

    def fields(self) -> dict[str, Any]:
        if self._fields is None:
            e = self._event
            self._fields = {
                **e.attrs,
                "id": e.id,
                "node": e.node,
                "source": e.source,
                "kind": e.kind,
                "time": e.time,
            }
        return self._fields

    def __getitem__(self, name: str) -> Any:
        if name == "event":
            return self.fields()
        if name == "rule":
            return self._rule.name
        if name == "severity":
            return self._rule.spec.severity
        if name == "count":
            return self._count
        if name == "group":
            return dict(self._group)
        e = self._event
        if name in TOP_LEVEL_FIELDS:
            return getattr(e, name)
        if name in e.attrs:
            return e.attrs[name]
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        yield from self.fields()
        yield from ("event", "rule", "severity", "count", "group")

    def __len__(self) -> int:
        return len(self.fields()) + 5


def context(rule: Rule, event: Event, group: Mapping[str, Scalar], count: int) -> Context:
    return Context(rule, event, group, count)


def _render(value: Any, ctx: Mapping[str, Any]) -> Any:
    """Reference rendering of an action's parameters through the full context (what planners equal)."""
    if isinstance(value, Template):
        return value.render(ctx)
    if isinstance(value, dict):
        return {k: _render(v, ctx) for k, v in value.items()}
    return value


def _planner(
    rule: Rule, kind: ActionKind, templates: Mapping[str, Any], group_keys: frozenset[str]
) -> Planner:
    """One action of the rule as one generated function ``(e, g, c) -> PlannedAction``: its parameters a
    dict display (a fresh dict, nested mappings too, as ``_render`` makes) of rendered templates, fixed
    text and other values passed as they are. The source names only values bound in its namespace."""
    constants = {"rule": rule.name, "severity": rule.spec.severity}

    def slow_context(event: Event, group: Mapping[str, Scalar], count: int) -> Context:
        return Context(rule, event, group, count)

    ns = Namespace(new=tuple.__new__, PlannedAction=PlannedAction)

    def rendered(template: Template) -> str:
        if template.static_text is not None:
            return ns.bind(template.static_text)
        return f"{ns.bind(template.bind(constants, TOP_LEVEL_FIELDS, group_keys, slow_context))}(e, g, c)"

    source = f"def planned(e, g, c):\n    return {_action_source(ns, kind, templates, rendered)}\n"
    return ns.define(source, "planned", f"<planner {rule.name}>")  # type: ignore[no-any-return]


def actions_source(rule: Rule, ns: Namespace) -> str:
    """The rule's actions for one event as one expression over ``e``, ``g`` and ``c`` for a caller's
    generated code (``new`` and ``PlannedAction`` bound in ``ns``), every simple template an f-string in
    it: it raises KeyError where an attribute a template names is absent, and the caller then asks
    ``rule.planners`` (which render that as ``?``)."""
    constants = {"rule": rule.name, "severity": rule.spec.severity}
    group_keys = frozenset(rule.spec.group_by) if rule.stateful else frozenset({"node"})

    def rendered(template: Template) -> str:
        inline = template.inline(constants, TOP_LEVEL_FIELDS, group_keys, ns)
        if inline is not None:
            return inline
        slow = template.bind(constants, TOP_LEVEL_FIELDS, group_keys, lambda e, g, c: Context(rule, e, g, c))
        return f"{ns.bind(slow)}(e, g, c)"

    parts = [
        _action_source(ns, a.kind, t, rendered)
        for a, t in zip(rule.spec.actions, rule.templates, strict=True)
    ]
    return f"({', '.join(parts)},)" if parts else "()"


def _action_source(
    ns: Namespace, kind: ActionKind, templates: Mapping[str, Any], rendered: Callable[[Template], str]
) -> str:
    bound = ns.bind

    def display(params: Mapping[str, Any]) -> str:
        items = []
        for name, value in params.items():
            if isinstance(value, Template):
                items.append(f"{bound(name)}: {rendered(value)}")
            elif isinstance(value, dict):
                items.append(f"{bound(name)}: {display(value)}")
            else:
                items.append(f"{bound(name)}: {bound(value)}")
        return "{" + ", ".join(items) + "}"

    return f"new(PlannedAction, ({bound(kind)}, e.node, {display(templates)}))"


def _group_builder(names: tuple[str, ...]) -> Callable[[tuple[Any, ...]], dict[str, Scalar]]:
    """``key -> {name: value}`` for a group key of ``names``, without a zip per call."""
    if len(names) == 1:
        (a,) = names
        return lambda key: {a: key[0]}
    if len(names) == 2:
        a, b = names
        return lambda key: {a: key[0], b: key[1]}
    return lambda key: dict(zip(names, key, strict=True))


def _decider(spec: RuleSpec, planners: tuple[Planner, ...]) -> Decider:
    name, severity, labels, mode, limit = spec.name, spec.severity, spec.labels, spec.mode, spec.rate_limit
    new = tuple.__new__
    if len(planners) == 1:
        (one,) = planners

        def decide_one(event: Event, group: Mapping[str, Scalar], count: int) -> Decision:
            actions = (one(event, group, count),)
            return new(Decision, (name, severity, event, actions, labels, group, count, mode, limit))

        return decide_one

    def decide(event: Event, group: Mapping[str, Scalar], count: int) -> Decision:
        actions = tuple([p(event, group, count) for p in planners])
        return new(Decision, (name, severity, event, actions, labels, group, count, mode, limit))

    return decide


def plan(rule: Rule, event: Event, group: Mapping[str, Scalar] | None = None, count: int = 1) -> Decision:
    return rule.decide(event, group if group is not None else {"node": event.node}, count)
