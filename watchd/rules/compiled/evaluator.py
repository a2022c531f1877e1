"""A rule's whole evaluation of one event it matches, as one generated function ``event -> Decision | None``
built per engine over that engine's state for the rule: only the steps the rule uses (``unless``, ``for``,
count within a window, distinct values, cooldown), with its group key, group and actions inline; and one
function per event kind that runs the ``unless`` checks, the index and the evaluators of the rules found.

They must decide exactly as the specification's ``Interpreter`` (watchd/rules/specification.py) does:
tests/rules/test_compiled_contract.py. Like all generated code here (watchd/rules/compiled/codegen.py), the
source never holds a rule's text: every value is bound in the namespace.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from watchd.model.events import Event
from watchd.rules.compiled.codegen import Namespace
from watchd.rules.compiled.index import RuleIndex
from watchd.rules.compiled.match import Source
from watchd.rules.compiled.planner import actions_source
from watchd.rules.decision import Decision, PlannedAction
from watchd.rules.rule import Rule
from watchd.rules.rule_state import GroupKey, RuleState
from watchd.rules.specification import FOR_STALE_S

Evaluator = Callable[[Event], "Decision | None"]
#: Told that a key was just inserted into a table (as its newest): drops the least recently inserted
#: entries beyond the bounds, by count and by bytes of keys, and counts them (rule_state.GroupBound.added).
Evict = Callable[[dict[GroupKey, Any], GroupKey], None]


def compile_evaluator(rule: Rule, state: RuleState | None, evict: Evict) -> Evaluator:
    """``state`` is the rule's (None for a stateless rule); ``evict`` bounds its tables after each new key."""
    spec = rule.spec
    ns = Namespace(
        new=tuple.__new__, Decision=Decision, PlannedAction=PlannedAction, deque=deque, evict=evict
    )
    bind = ns.bind
    lines = ["def evaluate(e):"]
    body = lines.append
    if state is None:
        body(f"    g = {{{bind('node')}: e.node}}")
        body("    c = 1")
    else:
        src = Source(ns)
        body("    a = e.attrs")
        body("    now = e.time")
        body(f"    key = {src.key(spec.group_by)}")
        if spec.unless is not None:
            body(f"    seen = {bind(state.unless_seen)}.get(key)")
            within = bind(spec.unless.within)
            body(f"    if seen is not None and seen[1] != e.id and 0 <= now - seen[0] <= {within}:")
            body("        return None")
        body("    c = 1")
        if spec.for_ is not None:
            held, fired = bind(state.held_since), bind(state.fired_hold)
            body(f"    h = {held}.get(key)")
            body("    if h is None:")
            body(f"        h = {held}[key] = [now, now]")
            body(f"        evict({held}, key)")
            body(f"    elif now - h[1] > {bind(FOR_STALE_S)}:  # not seen for too long: a new hold")
            body("        h[0] = h[1] = now")
            body(f"        {fired}.discard(key)")
            body("    else:")
            body("        h[1] = now")
            body(f"    if now - h[0] < {bind(spec.for_)} or key in {fired}:")
            body("        return None")
            body(f"    {fired}.add(key)")
        elif rule.counted:
            windows = bind(state.window)
            body(f"    w = {windows}.get(key)")
            body("    if w is None:")
            body(f"        w = {windows}[key] = deque()")
            body(f"        evict({windows}, key)")
            body(f"    w.append((now, {src.key(tuple(spec.distinct))}))")
            body(f"    horizon = now - {bind(spec.window)}")
            body("    while w[0][0] < horizon:")
            body("        w.popleft()")
            body(f"    if len(w) < {bind(spec.count)}:")
            body("        return None")
            for i, need in enumerate(spec.distinct.values()):
                body(f"    if len({{v[{i}] for _, v in w if v[{i}] is not None}}) < {bind(need)}:")
                body("        return None")
            body("    c = len(w)")
        if spec.cooldown > 0:
            last = bind(state.last_fired)
            body(f"    last = {last}.get(key)")
            body(f"    if last is not None and now - last < {bind(spec.cooldown)}:")
            body("        return None")
            body("    if last is None:")
            body(f"        {last}[key] = now")
            body(f"        evict({last}, key)")
            body("    else:")
            body(f"        del {last}[key]")
            body(f"        {last}[key] = now")
        if rule.counted:
            body(f"    {bind(state.window)}.pop(key, None)  # fired: the next firing needs a fresh count")
        group = ", ".join(f"{bind(name)}: key[{i}]" for i, name in enumerate(spec.group_by))
        body(f"    g = {{{group}}}")
    body("    try:")
    body(f"        actions = {actions_source(rule, ns)}")
    body("    except KeyError:  # an attribute a template names is absent: the planners render it '?'")
    body(f"        actions = tuple([p(e, g, c) for p in {bind(rule.planners)}])")
    constants = ", ".join(bind(v) for v in (spec.name, spec.severity))
    body(
        f"    return new(Decision, ({constants}, e, actions, {bind(spec.labels)}, g, c, "
        f"{bind(spec.mode)}, {bind(spec.rate_limit)}))"
    )
    return ns.define("\n".join(lines) + "\n", "evaluate", f"<rule {spec.name}>")  # type: ignore[no-any-return]


class KindRules(NamedTuple):
    """What an event of one kind (None: a kind no rule names) is checked against."""

    kind: str | None
    rule_index: RuleIndex  # rules without ``for``; it appends their evaluators
    unless: tuple[tuple[tuple[Rule, RuleState], ...], ...]  # rules with ``unless``, by equal ``unless`` match
    for_rules: tuple[tuple[Rule, Evaluator, RuleState], ...]


def compile_kind(
    rules: KindRules, order: Mapping[Evaluator, int], evict: Evict
) -> Callable[[Event], list[Decision]]:
    """One function ``event -> decisions`` (in rule-file order, ``order`` giving each evaluator's place) for
    events of one kind: each distinct ``unless`` match checked once and its sightings recorded for every
    rule it serves; the index's checks; the rules with ``for`` (a non-matching event ends a hold); then
    the evaluators of the rules that matched."""
    src = Source(Namespace(evict=evict))
    bind = src.bind
    lines = ["def evaluate(e):", "    a = e.attrs"]
    add = lines.append
    for group in rules.unless:
        first = group[0][0]
        assert first.spec.unless is not None and first.unless is not None
        add(f"    if {src.condition(first.spec.unless.match, first.unless)}:")
        recorded: set[int] = set()
        for rule, state in group:
            if id(state.unless_seen) in recorded:  # a table rules share (dispatch.py): recorded once
                continue
            recorded.add(id(state.unless_seen))
            seen = bind(state.unless_seen)
            add(f"        k = {src.key(rule.spec.group_by)}")
            add(f"        if {seen}.pop(k, None) is None:")
            add(f"            {seen}[k] = (e.time, e.id)")
            add(f"            evict({seen}, k)")
            add("        else:")
            add(f"            {seen}[k] = (e.time, e.id)")
    lines += ["    out = []", "    add = out.append", *rules.rule_index.source(rules.kind, src)]
    for rule, evaluator, state in rules.for_rules:
        add(f"    if {src.condition(rule.spec.match, rule.matches)}:")
        add(f"        add({bind(evaluator)})")
        add("    else:  # an event of the rule's kind that no longer matches ends a hold")
        add(f"        k = {src.key(rule.spec.group_by)}")
        add(f"        {bind(state.held_since)}.pop(k, None)")
        add(f"        {bind(state.fired_hold)}.discard(k)")
    lines += [
        f"    if len(out) > 1: out.sort(key={bind(order.__getitem__)})",
        "    decisions = []",
        "    for f in out:",
        "        d = f(e)",
        "        if d is not None: decisions.append(d)",
        "    return decisions",
    ]
    return src.ns.define("\n".join(lines) + "\n", "evaluate", "<rules by kind>")  # type: ignore[no-any-return]
