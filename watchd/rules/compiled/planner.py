"""A rule's actions as generated code: one function per action ``(event, group, count) -> PlannedAction``
(its templates bound to the rule), one decider per rule, and the actions as one expression to inline into
a rule's evaluator. They must give what :func:`~watchd.rules.context.render_params` through the full
:class:`~watchd.rules.context.Context` gives (tests/rules/test_compiled_contract.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from watchd.model.events import TOP_LEVEL_FIELDS, Event, Scalar
from watchd.rules.compiled.codegen import Namespace
from watchd.rules.context import Context
from watchd.rules.decision import Decision, PlannedAction
from watchd.rules.model import ActionKind, RuleSpec
from watchd.rules.template import Template

if TYPE_CHECKING:
    from watchd.rules.rule_view import RuleView

#: ``(event, group, count) -> PlannedAction``: one action of one rule, its templates compiled.
Planner = Callable[[Event, Mapping[str, Scalar], int], PlannedAction]
#: ``(event, group, count) -> Decision``: the rule's decision for one event, its constants bound.
Decider = Callable[[Event, Mapping[str, Scalar], int], Decision]


def planner(
    rule: RuleView, kind: ActionKind, templates: Mapping[str, Any], group_keys: frozenset[str]
) -> Planner:
    """One action of the rule as one generated function ``(e, g, c) -> PlannedAction``: its parameters a
    dict display (a fresh dict, nested mappings too, as ``render_params`` makes) of rendered templates,
    fixed text and other values passed as they are. The source names only values bound in its namespace."""
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


def actions_source(rule: RuleView, ns: Namespace) -> str:
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


def group_builder(names: tuple[str, ...]) -> Callable[[tuple[Any, ...]], dict[str, Scalar]]:
    """``key -> {name: value}`` for a group key of ``names``, without a zip per call."""
    if len(names) == 1:
        (a,) = names
        return lambda key: {a: key[0]}
    if len(names) == 2:
        a, b = names
        return lambda key: {a: key[0], b: key[1]}
    return lambda key: dict(zip(names, key, strict=True))


def decider(spec: RuleSpec, planners: tuple[Planner, ...]) -> Decider:
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
