"""The rules' semantics, as docs/rules.md states them, interpreted: the specification of rule evaluation.

Everything here reads a rule as it was written (its ``match`` mapping, its steps) and one event, rule by
rule in file order: nothing is generated, indexed or shared between rules. It is slow and meant to be read.
The engine runs the generated fast path (watchd/rules/compiled/, :class:`~watchd.rules.rule_engine.
RuleEngine`), which must decide exactly as :class:`Interpreter` does: tests/rules/test_compiled_contract.py
is that contract. A change of semantics is made here and in docs/rules.md first; the fast path follows.

Sections of docs/rules.md and where they are interpreted:

- *Match*: :func:`check_match` (what is a valid match) and :func:`matches` (when one holds);
- *A rule* (``group_by``, ``count``/``window``, ``distinct``, ``for``, ``unless``, ``cooldown``):
  :meth:`Interpreter.evaluate` and its step methods;
- *Templates* (the context a template sees): :class:`~watchd.rules.context.Context` and
  :func:`~watchd.rules.context.render_params`.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from watchd.model.events import Event
from watchd.rules.context import Context, render_params
from watchd.rules.decision import Decision, PlannedAction
from watchd.rules.rule_state import MAX_GROUP_BYTES, MAX_GROUPS, GroupBound, GroupKey, RuleState

if TYPE_CHECKING:
    from watchd.rules.rule_view import RuleView

# ------------------------------------------------------------------------------------------------ Match

#: The operators of a field condition (docs/rules.md, *Match*).
OPERATORS = frozenset({"in", "not_in", "regex", "gt", "ge", "lt", "le", "exists"})
NUMERIC = frozenset({"gt", "ge", "lt", "le"})

Path = tuple[str | int, ...]


class MatchError(ValueError):
    """A problem in a match expression, at ``path`` inside it."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = path


def check_match(match: Mapping[str, Any], path: Path = ()) -> None:
    """Raise MatchError (with its path) at the first thing in ``match`` that is not a valid match: each key
    a field compared with a scalar (equality) or with a mapping of operators, or ``any`` with a non-empty
    list of matches."""
    for key, cond in match.items():
        here = (*path, key)
        if key == "any":
            if not isinstance(cond, list) or not cond or not all(isinstance(c, dict) for c in cond):
                raise MatchError(here, "'any' takes a non-empty list of matches")
            for i, alternative in enumerate(cond):
                check_match(alternative, (*here, i))
        elif isinstance(cond, dict):
            unknown = set(cond) - OPERATORS
            if unknown or not cond:
                raise MatchError(here, f"unknown operator {sorted(unknown)}; use one of {sorted(OPERATORS)}")
            for op, arg in cond.items():
                _check_operator(op, arg, (*here, op))
        elif not (cond is None or isinstance(cond, str | int | float | bool)):
            raise MatchError(here, "expected a value or an operator mapping")


def _check_operator(op: str, arg: Any, path: Path) -> None:
    if op in ("in", "not_in"):
        if not isinstance(arg, list) or not all(isinstance(a, str | int | float | bool) for a in arg):
            raise MatchError(path, f"'{op}' takes a list of values")
    elif op == "regex":
        if not isinstance(arg, str):
            raise MatchError(path, "'regex' takes a string")
        try:
            re.compile(arg)
        except re.error as exc:
            raise MatchError(path, f"bad regex {arg!r}: {exc}") from None
    elif op == "exists":
        if not isinstance(arg, bool):
            raise MatchError(path, "'exists' takes true or false")
    elif number(arg) is None:
        raise MatchError(path, f"'{op}' takes a number")


def number(value: Any) -> float | None:
    """A value as a number for ``gt``/``ge``/``lt``/``le``: ints and floats, never booleans."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def field(event: Event, name: str) -> Any:
    """A field of the event by name: ``kind``, ``node``, ``source``, ``id``, ``time``, else an attribute;
    None when absent (so ``field: null`` matches its absence)."""
    return event.get(name)


def matches(match: Mapping[str, Any], event: Event) -> bool:
    """Whether a valid ``match`` holds for ``event``: every key holds (AND); ``any`` holds when one of its
    matches does (OR); a field holds when it equals the scalar, or when each of its operators holds."""
    for key, cond in match.items():
        if key == "any":
            if not any(matches(alternative, event) for alternative in cond):
                return False
        elif isinstance(cond, dict):
            value = field(event, key)
            if not all(operator_holds(op, arg, value) for op, arg in cond.items()):
                return False
        elif field(event, key) != cond:
            return False
    return True


def operator_holds(op: str, arg: Any, value: Any) -> bool:
    """One operator of a field condition, for the field's ``value`` (None: absent)."""
    if op == "in":
        return value in arg  # a missing field: fails
    if op == "not_in":
        return value not in arg  # a missing field: holds
    if op == "regex":  # found anywhere in the value as text
        if value is None:
            return False
        return re.search(arg, value if isinstance(value, str) else str(value)) is not None
    if op == "exists":
        return (value is not None) is arg
    have, bound = number(value), float(arg)
    if have is None:  # non-numbers never hold
        return False
    return {"gt": have > bound, "ge": have >= bound, "lt": have < bound, "le": have <= bound}[op]


def match_kinds(match: Mapping[str, Any]) -> frozenset[str] | None:
    """The event kinds a match can hold for, when it says (``kind: xid`` or ``kind: {in: [...]}``); None:
    any kind. A ``for`` hold is ended by the events of these kinds that do not match."""
    kind = match.get("kind")
    if isinstance(kind, str):
        return frozenset({kind})
    if isinstance(kind, dict) and isinstance(kind.get("in"), list):
        return frozenset(str(k) for k in kind["in"])
    return None


# --------------------------------------------------------------------------------------------- A rule

#: A ``for`` hold ends when its group has not matched for this long (a lost clear, an agent gone quiet):
#: conditions are re-reported every 30 s while they hold.
FOR_STALE_S = 300.0


class Interpreter:
    """Evaluates events against ``rules`` by reading each rule's spec. The only clock is the events' own
    time. Tables hold at most ``max_groups`` groups per rule, and keys of at most ``max_bytes`` (as
    ``key_bytes`` counts them): beyond either the least recently inserted group is forgotten
    (``groups_evicted`` counts them)."""

    def __init__(
        self, rules: tuple[RuleView, ...], max_groups: int = MAX_GROUPS, max_bytes: int = MAX_GROUP_BYTES
    ) -> None:
        self.rules = tuple(sorted(rules, key=lambda r: r.order))  # decisions come in rule-file order
        self.state = {r.name: RuleState() for r in self.rules}
        self.max_groups = max_groups
        self._bound = GroupBound(max_groups, max_bytes)

    @property
    def groups_evicted(self) -> int:
        return self._bound.evicted

    def evaluate(self, event: Event) -> list[Decision]:
        """Every decision ``event`` triggers, in rule-file order.

        1. ``unless``: each rule whose ``unless.match`` holds records the event as a sighting of its group,
           before any rule is evaluated;
        2. each rule whose ``match`` holds takes its steps (``_steps``) and may decide;
        3. a rule with ``for`` whose match does not hold for an event of its kinds ends that group's hold.
        """
        for rule in self.rules:
            if rule.spec.unless is not None and matches(rule.spec.unless.match, event):
                sightings = self.state[rule.name].unless_seen
                self._remember(sightings, group_key(rule, event), (event.time, event.id))
        decisions = []
        for rule in self.rules:
            if matches(rule.spec.match, event):
                decision = self._steps(rule, event) if stateful(rule) else decide(rule, event)
                if decision is not None:
                    decisions.append(decision)
            elif rule.spec.for_ is not None and _of_its_kinds(rule, event):
                state, key = self.state[rule.name], group_key(rule, event)
                state.held_since.pop(key, None)
                state.fired_hold.discard(key)
        return decisions

    def _steps(self, rule: RuleView, event: Event) -> Decision | None:
        """A stateful rule's steps for a matching event, in its group: quiet after an ``unless`` sighting;
        then ``for`` (held long enough, once per hold) or ``count``/``distinct`` within ``window``; then
        ``cooldown``. None: the rule does not fire."""
        spec, state, key, now = rule.spec, self.state[rule.name], group_key(rule, event), event.time
        if spec.unless is not None:
            seen = state.unless_seen.get(key)  # (time, id); the event itself is no sighting against itself
            if seen is not None and seen[1] != event.id and 0 <= now - seen[0] <= spec.unless.within:
                return None
        count = 1
        if spec.for_ is not None:
            if not self._held(state, key, now, spec.for_):
                return None
        elif counted(rule):
            window = self._counted(rule, state, key, event)
            if window is None:
                return None
            count = len(window)
        if spec.cooldown > 0:
            last = state.last_fired.get(key)
            if last is not None and now - last < spec.cooldown:
                return None
            self._remember(state.last_fired, key, now)
        if counted(rule):
            state.window.pop(key, None)  # fired: the next firing needs a fresh count
        return decide(rule, event, dict(zip(spec.group_by, key, strict=True)), count)

    def _held(self, state: RuleState, key: GroupKey, now: float, hold: float) -> bool:
        """``for``: the group has matched since ``hold`` ago or longer, without a gap over FOR_STALE_S (a
        gap starts a new hold); true once per hold."""
        held = state.held_since.get(key)  # [since, last seen]
        if held is None:
            held = [now, now]
            self._remember(state.held_since, key, held, move=False)
        elif now - held[1] > FOR_STALE_S:
            held[0] = now
            state.fired_hold.discard(key)
        held[1] = now
        if now - held[0] < hold or key in state.fired_hold:
            return False
        state.fired_hold.add(key)
        return True

    def _counted(
        self, rule: RuleView, state: RuleState, key: GroupKey, event: Event
    ) -> deque[tuple[float, tuple[Any, ...]]] | None:
        """``count`` within ``window`` (an event exactly ``window`` old still counts) with ``distinct``
        non-null values: the group's window once it holds enough, else None."""
        spec, now = rule.spec, event.time
        window = state.window.get(key)
        if window is None:
            window = deque()
            self._remember(state.window, key, window, move=False)
        window.append((now, tuple(field(event, name) for name in spec.distinct)))
        assert spec.window is not None  # a counted rule has a window (the model checks it)
        while window[0][0] < now - spec.window:
            window.popleft()
        if len(window) < spec.count:
            return None
        for i, need in enumerate(spec.distinct.values()):
            if len({values[i] for _, values in window if values[i] is not None}) < need:
                return None
        return window

    def _remember(self, table: dict[GroupKey, Any], key: GroupKey, value: Any, move: bool = True) -> None:
        """Set ``table[key]`` as its most recent entry; forget the least recent beyond the bounds."""
        new = key not in table
        if move and not new:
            del table[key]
        table[key] = value
        if new:
            self._bound.added(table, key)


def stateful(rule: RuleView) -> bool:
    """Whether the rule keeps state per group (any of count/distinct, for, unless, cooldown)."""
    s = rule.spec
    return counted(rule) or s.for_ is not None or s.unless is not None or s.cooldown > 0


def counted(rule: RuleView) -> bool:
    """Whether the rule counts events within a window (``count`` > 1, or ``distinct``)."""
    return rule.spec.count > 1 or bool(rule.spec.distinct)


def group_key(rule: RuleView, event: Event) -> GroupKey:
    """The event's group for the rule: the values of its ``group_by`` fields."""
    return tuple(field(event, name) for name in rule.spec.group_by)


def _of_its_kinds(rule: RuleView, event: Event) -> bool:
    kinds = match_kinds(rule.spec.match)
    return kinds is None or event.kind in kinds


def decide(rule: RuleView, event: Event, group: Mapping[str, Any] | None = None, count: int = 1) -> Decision:
    """The rule's decision: its actions, their parameters rendered for the event (a rule without state
    groups by ``node`` alone), with the rule's constants."""
    spec = rule.spec
    group = {"node": event.node} if group is None else group
    ctx = Context(rule, event, group, count)
    actions = tuple(
        PlannedAction(action.kind, event.node, render_params(templates, ctx))
        for action, templates in zip(spec.actions, rule.templates, strict=True)
    )
    return Decision(
        spec.name, spec.severity, event, actions, spec.labels, group, count, spec.mode, spec.rate_limit
    )
