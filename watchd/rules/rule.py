"""A loaded rule: its spec, where it came from, its templates, and the generated functions the fast path
evaluates it with (built once, at load: watchd/rules/compiled/)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from watchd.model.events import Event, Scalar
from watchd.rules import specification
from watchd.rules.compiled.match import Predicate, tuple_getter
from watchd.rules.compiled.planner import Decider, Planner, decider, group_builder, planner
from watchd.rules.decision import Decision
from watchd.rules.model import RuleSpec


@dataclass(frozen=True, slots=True)
class Rule:
    spec: RuleSpec
    source: str  # file (and line) the rule came from
    matches: Predicate  # the generated form of spec.match
    unless: Predicate | None  # and of spec.unless.match
    templates: tuple[Mapping[str, Any], ...]  # per action: param -> Template, or nested mapping of them
    order: int = 0
    # Derived at construction (not compared): what the fast path runs per event.
    stateful: bool = field(init=False, compare=False)
    group_key: Callable[[Event], tuple[Any, ...]] = field(init=False, compare=False)
    planners: tuple[Planner, ...] = field(init=False, compare=False)
    decide: Decider = field(init=False, compare=False)
    counted: bool = field(init=False, compare=False)  # count within a window, or distinct values
    distinct_values: Callable[[Event], tuple[Any, ...]] = field(init=False, compare=False)
    group_of: Callable[[tuple[Any, ...]], dict[str, Scalar]] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        s = self.spec
        stateful = specification.stateful(self)
        object.__setattr__(self, "counted", specification.counted(self))
        object.__setattr__(self, "stateful", stateful)
        object.__setattr__(self, "group_key", tuple_getter(s.group_by))
        # a stateless rule's decision is grouped by node alone, a stateful one's by group_by
        group_keys = frozenset(s.group_by) if stateful else frozenset({"node"})
        planners = tuple(
            planner(self, a.kind, t, group_keys) for a, t in zip(s.actions, self.templates, strict=True)
        )
        object.__setattr__(self, "planners", planners)
        object.__setattr__(self, "decide", decider(s, planners))
        distinct = tuple(s.distinct)
        object.__setattr__(self, "distinct_values", tuple_getter(distinct) if distinct else lambda e: ())
        object.__setattr__(self, "group_of", group_builder(tuple(s.group_by)))

    @property
    def name(self) -> str:
        return self.spec.name


def plan(rule: Rule, event: Event, group: Mapping[str, Scalar] | None = None, count: int = 1) -> Decision:
    """The rule's decision for ``event`` (through its generated planners), whatever its steps would say."""
    return rule.decide(event, group if group is not None else {"node": event.node}, count)
