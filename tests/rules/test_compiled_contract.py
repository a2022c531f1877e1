"""The generated fast path's contract: it decides exactly as the specification.

watchd/rules/compiled/ (generated matches, the rule index, each rule's evaluator, the planners and
templates) is an optimisation of watchd/rules/specification.py. Each test here runs both over the same input
and requires the same answer: hand-picked cases, the shipped pack with synthetic rules over long seeded
streams, and property-based (hypothesis) rule sets and timelines."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

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
