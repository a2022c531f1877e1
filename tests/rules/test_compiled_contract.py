"""The generated fast path's contract: it decides exactly as the specification.

watchd/rules/compiled/ (generated matches, the rule index, each rule's evaluator, the planners and
templates) is an optimisation of watchd/rules/specification.py. Each test here runs both over the same input
and requires the same answer: hand-picked cases, the shipped pack with synthetic rules over long seeded
streams, and property-based (hypothesis) rule sets and timelines."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.common import make_events, synthetic_rules_yaml
from tests.rules.rule_helpers import rules_of, xid
from watchd.model.events import Event
from watchd.rules import Interpreter, RuleEngine, load_rules, parse_rule_file, plan
from watchd.rules.compiled.match import compile_match
from watchd.rules.context import Context, render_params
from watchd.rules.specification import matches


@pytest.mark.parametrize(
    "source",
    [
        "Xid {{ xid }} GPU {{ pci_bus_id }} {{ meaning }}",
        "{{event.node}} in {{ group.node }}: {{ missing }} {{ event.missing }} pid {{ pid }} n={{ count }}",
        "{{ rule }}/{{ severity }} at {{ time }} {{ flag }} {{ ratio }}",
        "plain text with a { brace }",
    ],
)
def test_fast_templates_render_exactly_as_jinja(source: str) -> None:
    from watchd.rules.template import _ENV, Template

    (rule,) = rules_of({"name": "r", "match": {"kind": "xid"}, "actions": ["log"]})
    event = xid(79, node="gpu-7", t=12.5, pid=None, flag=True, ratio=0.25)
    ctx = Context(rule, event, {"node": "gpu-7"}, 3)
    assert Template(source)._parts is not None  # the fast path is what is tested here
    assert Template(source).render(ctx) == _ENV.from_string(source).render(dict(ctx))
    # bound to the rule (the generated f-string, or the full context when an attribute is missing)
    bound = Template(source).bind(
        {"rule": "r", "severity": rule.spec.severity},
        frozenset({"id", "node", "source", "kind", "time"}),
        frozenset({"node"}),
        lambda e, g, c: Context(rule, e, g, c),
    )
    assert bound(event, {"node": "gpu-7"}, 3) == Template(source).render(ctx)


def test_compiled_planners_decide_exactly_as_the_reference_rendering() -> None:
    """Every action of the pack plus synthetic rules, over a varied stream: the compiled planners give the
    parameters the specification's rendering (``render_params`` through the full ``Context``) gives."""

    pack = load_rules([])
    synthetic, problems = parse_rule_file(synthetic_rules_yaml(300), "<syn>", len(pack.rules))
    assert not problems
    checked = 0
    for event in make_events(1500, gpus=80, seed=11):
        for rule in (*pack.rules, *synthetic):
            if not matches(rule.spec.match, event):
                continue
            group = {f: event.get(f) for f in rule.spec.group_by} if rule.stateful else {"node": event.node}
            got = plan(rule, event, group, 2)
            ctx = Context(rule, event, group, 2)
            want = [render_params(t, ctx) for t in rule.templates]
            assert [a.params for a in got.actions] == want, rule.name
            checked += 1
    assert checked > 1000


def test_the_engine_decides_as_the_specification_over_the_pack_and_synthetic_rules() -> None:
    """The index (kind, pinned field, regex gates), the shared ``unless`` checks and the shared sightings
    tables change nothing: pack plus synthetic rules (indexed, regex-gated, stateful, unless) over a varied
    stream give the same decisions as the specification, which tries every rule and every ``unless`` with
    its whole match, each rule with its own tables."""
    pack = load_rules([])
    synthetic, problems = parse_rule_file(synthetic_rules_yaml(400), "<syn>", len(pack.rules))
    assert not problems
    extra = rules_of(  # gates that must not merge (groups, flags) next to ones that do; after the others
        {"name": "g1", "match": {"process": {"regex": "^(py)thon3$"}}, "actions": ["log"]},
        {"name": "g2", "match": {"process": {"regex": "(?i)^PYTHON$"}}, "actions": ["log"]},
        {"name": "g3", "match": {"process": {"regex": "^torch"}, "kind": "xid"}, "actions": ["log"]},
        {"name": "g4", "match": {"process": {"regex": "run$"}}, "actions": ["log"]},
        {"name": "g5", "match": {"xid": {"regex": "^4"}}, "actions": ["log"]},
        {"name": "g6", "match": {"xid": {"regex": "3$"}, "kind": "xid"}, "actions": ["log"]},
        *(  # different unless matches of one kind: each checked for its own rule
            {
                "name": f"u{a}",
                "match": {"kind": "xid", "xid": a},
                "group_by": ["node"],
                "unless": {"match": {"kind": "xid", "xid": b}, "within": "10m"},
                "actions": ["log"],
            }
            for a, b in ((13, 31), (31, 13))
        ),
        *(  # one unless match (u31's too): s31 and s43 share u31's sightings, s63 (by GPU) has its own
            {
                "name": f"s{a}",
                "match": {"kind": "xid", "xid": a},
                "group_by": group_by,
                "unless": {"match": {"kind": "xid", "xid": 13}, "within": within},
                "actions": ["log"],
            }
            for a, group_by, within in (
                (31, ["node"], "10m"),
                (43, ["node"], "1s"),
                (63, ["node", "pci_bus_id"], "1s"),
            )
        ),
        first_order=10_000,
    )
    rules = (*pack.rules, *synthetic, *extra)
    indexed, every = RuleEngine(rules), Interpreter(rules)
    fired: Counter[str] = Counter()
    for event in make_events(6000, gpus=64, seed=5):
        want = every.evaluate(event)
        assert indexed.evaluate(event) == want, event
        fired.update(d.rule for d in want)
    assert sum(fired.values()) > 10_000
    names = ("g1", "g2", "g3", "g4", "g5", "g6", "u13", "u31", "s31", "s43", "s63")
    assert all(fired[name] > 0 for name in names), fired


def test_generated_matches_agree_with_the_specification() -> None:
    import random

    rng = random.Random(4)
    values = [None, 0, 1, 13, 79, 2.5, -1, True, False, "13", "gpu-1", "python3", "fallen off", ""]
    fields = ["xid", "pid", "process", "node", "kind", "flag", "missing"]

    def condition() -> Any:
        op = rng.choice(["eq", "in", "not_in", "regex", "exists", "gt", "ge", "lt", "le"])
        if op == "eq":
            return rng.choice(values)
        if op in ("in", "not_in"):
            return {op: rng.sample([v for v in values if v is not None], 3)}
        if op == "regex":
            return {op: rng.choice(["^gpu", "13", "off$", "python", "^1", "x|3"])}
        if op == "exists":
            return {op: rng.random() < 0.5}
        return {op: rng.choice([0, 1, 13, 2.5])}

    def match(depth: int = 0) -> dict[str, Any]:
        m: dict[str, Any] = {f: condition() for f in rng.sample(fields, rng.randint(0, 3))}
        if depth < 2 and rng.random() < 0.3:
            m["any"] = [match(depth + 1) for _ in range(rng.randint(1, 3))]
        return m

    outcomes: Counter[bool] = Counter()
    for _ in range(400):
        m = match()
        compiled = compile_match(m)
        for _ in range(15):
            attrs = {f: rng.choice(values) for f in ("xid", "pid", "process", "flag") if rng.random() < 0.8}
            e = Event(
                "e1", rng.choice(["gpu-1", "gpu-2"]), "kmsg", rng.choice(["xid", "gpu_health"]), 1.0, attrs
            )
            got = compiled(e)
            assert got is matches(m, e), (m, e)
            outcomes[got] += 1
    assert min(outcomes[True], outcomes[False]) > 500, outcomes


def test_generated_code_never_runs_text_from_a_rule() -> None:
    """Rule text that would be code if pasted into the generated source stays data: a field name that
    closes the expression matches nothing, template text with quotes and braces renders as itself."""
    hostile = "x') or True or ('"
    (rule,) = rules_of(
        {
            "name": "h",
            "match": {
                "kind": "xid",
                hostile: 1,
                "any": [{"message": {"regex": "'''\\); 1/0 #"}}, {hostile: 2}],
            },
            "actions": [{"log": {"message": "\"\"\"'{x} {{ node }} {__import__('os')}\\"}}],
        }
    )
    assert not rule.matches(xid(79))
    event = xid(79, node="gpu-3", **{hostile: 1, "message": "a '''); 1/0 # b"})
    assert rule.matches(event)
    [action] = plan(rule, event).actions
    assert action.params["message"] == "\"\"\"'{x} gpu-3 {__import__('os')}\\"


# ------------------------------------------------------------------ property-based: any rules, any timeline

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALUES: list[Any] = [
    0,
    1,
    13,
    31,
    45,
    79,
    2.5,
    -1,
    True,
    False,
    "13",
    "1",
    "2",
    "gpu-1",
    "python3",
    "fallen off",
    "",
]
REGEXES = ["^gpu", "13", "off$", "python", "^1", "x|3", "^(py)thon3$", "(?i)^PYTHON", "fallen off"]
FIELDS = ["kind", "node", "xid", "job", "process", "value", "gpu"]
ATTRS: dict[str, list[Any]] = {  # attribute -> values an event may carry (or not carry it at all)
    "xid": [13, 31, 45, 79, "13"],
    "job": ["1", "2", "3", None],
    "process": ["python3", "torchrun", "PYTHON", "fallen off"],
    "value": [0, 1, 2.5, 95, True],
    "gpu": [0, 1],
}
ACTIONS: list[list[Any]] = [
    ["log"],
    [{"log": {"message": "{{ node }}/{{ kind }} n={{ count }} job {{ job }} {{ group }} {{ event.xid }}"}}],
    [{"drain": {"reason": "{{ kind }} on {{ node }} x{{ count }} ({{ rule }})"}}, "requeue"],
    [{"alert": {"summary": "{{ rule }} {{ severity }} {{ gpu }}", "labels": {"gpu": "{{ gpu }}"}}}],
]

scalars = st.sampled_from(VALUES)
conditions = st.one_of(
    scalars,
    st.none(),
    st.builds(
        lambda op, vs: {op: vs}, st.sampled_from(["in", "not_in"]), st.lists(scalars, min_size=1, max_size=3)
    ),
    st.builds(lambda r: {"regex": r}, st.sampled_from(REGEXES)),
    st.builds(lambda b: {"exists": b}, st.booleans()),
    st.builds(
        lambda op, n: {op: n}, st.sampled_from(["gt", "ge", "lt", "le"]), st.sampled_from([0, 1, 13, 2.5, 79])
    ),
    st.just({"ge": 1, "le": 79}),
)
flat_matches = st.dictionaries(st.sampled_from(FIELDS), conditions, max_size=3)
any_matches = st.recursive(
    flat_matches,
    lambda inner: st.builds(
        lambda m, alternatives: {**m, "any": alternatives},
        flat_matches,
        st.lists(inner, min_size=1, max_size=3),
    ),
    max_leaves=6,
)


@st.composite
def timelines(draw: st.DrawFn) -> list[Event]:
    """Time-ordered events of two kinds on two nodes, attributes present or not, ids now and then reused
    (an event is no ``unless`` sighting against itself)."""
    events, t = [], 0.0
    for i in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0, 0, 1, 5, 10, 30, 60, 61, 120, 299, 300, 301, 3600]))
        attrs = {name: draw(st.sampled_from(values)) for name, values in ATTRS.items() if draw(st.booleans())}
        node = draw(st.sampled_from(["gpu-1", "gpu-2"]))
        kind = draw(st.sampled_from(["xid", "gpu_health"]))
        eid = draw(st.sampled_from([f"e{i}", f"e{i}", "same"]))
        events.append(Event(eid, node, "test", kind, t, {k: v for k, v in attrs.items() if v is not None}))
    return events


@st.composite
def rule_sets(draw: st.DrawFn) -> list[dict[str, Any]]:
    """1-5 rules using every step (count/window, distinct, for, unless, cooldown), group_by, mode and
    rate_limit."""
    specs = []
    for i in range(draw(st.integers(1, 5))):
        match = draw(st.one_of(st.just({}), any_matches))  # often empty: rules that fire, then their steps
        kind = draw(st.sampled_from([None, "xid", "gpu_health", {"in": ["xid", "gpu_health"]}]))
        if kind is not None:
            match["kind"] = kind
        spec: dict[str, Any] = {"name": f"r{i}", "match": match, "actions": draw(st.sampled_from(ACTIONS))}
        spec["group_by"] = draw(
            st.sampled_from([["node"], ["node", "gpu"], ["job"], ["node", "job"], ["kind"]])
        )
        steps = draw(st.sampled_from(["plain", "count", "distinct", "for"]))
        if steps in ("count", "distinct"):
            spec["window"] = draw(st.sampled_from([10, 60, 300, "1h"]))
            spec["count"] = draw(st.integers(1 if steps == "distinct" else 2, 4))
        if steps == "distinct":
            spec["distinct"] = {"job": draw(st.integers(1, 2))}
        if steps == "for":
            spec["for"] = draw(st.sampled_from([0, 30, 120, 600]))
        if draw(st.booleans()):
            spec["unless"] = {"match": draw(flat_matches), "within": draw(st.sampled_from([0, 10, 120]))}
        if draw(st.booleans()):
            spec["cooldown"] = draw(st.sampled_from([0, 30, 3600]))
        if draw(st.integers(0, 3)) == 0:
            spec.update(
                mode="dry-run", rate_limit={"max": 2, "per": "1h"}, severity="critical", labels={"a": "b"}
            )
        specs.append(spec)
    return specs


@PROPERTY
@given(any_matches, st.lists(timelines(), min_size=1, max_size=3))
def test_any_generated_match_agrees_with_the_specification(
    match: dict[str, Any], streams: list[list[Event]]
) -> None:
    compiled = compile_match(match)
    for event in (e for stream in streams for e in stream):
        assert compiled(event) is matches(match, event)


@PROPERTY
@given(rule_sets(), timelines(), st.sampled_from([1, 2, 3, 100_000]))
def test_the_engine_decides_and_remembers_as_the_specification(
    specs: list[dict[str, Any]], events: list[Event], max_groups: int
) -> None:
    """Any rule set over any timeline, tables bounded to a few groups or not: the same decisions (rules,
    actions with their rendered parameters, groups, counts), and afterwards the same memory."""
    from watchd.rules.persist import copy_state, is_empty

    rules = rules_of(*specs)
    engine, specification = RuleEngine(rules, max_groups), Interpreter(rules, max_groups)
    for event in events:
        assert engine.evaluate(event) == specification.evaluate(event), event
    remembered = {name: copy for name, (_, copy) in engine.snapshot().items()}
    assert remembered == {n: copy_state(s) for n, s in specification.state.items() if not is_empty(s)}


@PROPERTY
@given(rule_sets(), timelines(), st.sampled_from([70, 150, 400]))
def test_tables_bounded_by_key_bytes_forget_the_same_groups(
    specs: list[dict[str, Any]], events: list[Event], max_bytes: int
) -> None:
    """Issue 16 item 8: bounded by the bytes of their keys (a few groups' worth here), the engine and the
    specification still decide alike and remember the same groups afterwards."""
    from watchd.rules.persist import copy_state, is_empty

    rules = rules_of(*specs)
    engine = RuleEngine(rules, max_bytes=max_bytes)
    specification = Interpreter(rules, max_bytes=max_bytes)
    for event in events:
        assert engine.evaluate(event) == specification.evaluate(event), event
    remembered = {name: copy for name, (_, copy) in engine.snapshot().items()}
    assert remembered == {n: copy_state(s) for n, s in specification.state.items() if not is_empty(s)}
