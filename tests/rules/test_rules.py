from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from watchd.errors import ConfigError
from watchd.model.events import Event
from watchd.rules import check_rules, json_schema, load_rules, parse_rule_file
from watchd.rules.durations import parse_duration
from watchd.rules.ruleset import Rule, plan

RULES = Path(__file__).parent.parent.parent / "rules"


def xid(n: int, node: str = "gpu-1", t: float = 0.0, eid: str | None = None, **attrs: Any) -> Event:
    base: dict[str, Any] = {"xid": n, "pci_bus_id": "0000:3b:00.0", "meaning": "GPU has fallen off the bus"}
    base.update(attrs)
    return Event(id=eid or f"e{n}-{t}-{node}", node=node, source="kmsg", kind="xid", time=t, attrs=base)


def rules_of(*specs: dict[str, Any]) -> tuple[Rule, ...]:
    import yaml

    rules, problems = parse_rule_file(yaml.safe_dump({"rules": list(specs)}), "t.yaml")
    assert not problems, [str(p) for p in problems]
    return tuple(rules)


def one(**spec: Any) -> Rule:
    return rules_of({"name": "r", "actions": ["log"], **spec})[0]


def problems_of(text: str) -> list[str]:
    return [str(p) for p in parse_rule_file(text, "mine.yaml")[1]]


@pytest.mark.parametrize("code", [48, 64, 74, 79, 95, 119, 140])
def test_default_rules_drain_and_requeue_fatal_xids(code: int) -> None:
    decisions = load_rules([]).engine().evaluate(xid(code))
    assert [d.rule for d in decisions] == ["xid-fatal-hardware"]
    assert [a.kind for a in decisions[0].actions] == ["drain", "requeue"]
    assert (
        decisions[0].actions[0].params["reason"] == f"Xid {code} GPU 0000:3b:00.0 GPU has fallen off the bus"
    )


@pytest.mark.parametrize("code", [13, 31, 43])
def test_default_rules_only_record_application_xids(code: int) -> None:
    decisions = load_rules([]).engine().evaluate(xid(code))
    assert [d.rule for d in decisions] == ["xid-application"]
    assert [a.kind for a in decisions[0].actions] == ["log"]


def test_unmatched_event_gives_no_decision() -> None:
    engine = load_rules([]).engine()
    assert engine.evaluate(xid(45)) == []
    other = Event(id="x", node="n", source="s", kind="gpu_health", time=0, attrs={"xid": 79})
    assert engine.evaluate(other) == []


def test_shipped_rules_file_is_the_embedded_one() -> None:
    assert load_rules([RULES]).names == load_rules([]).names  # rules/ links to the embedded pack


@pytest.mark.parametrize(
    ("cond", "value", "expected"),
    [
        ({"in": [1, 2]}, 2, True),
        ({"in": [1, 2]}, 3, False),
        ({"not_in": [1, 2]}, 3, True),
        ({"regex": "^fall"}, "fallen off", True),
        ({"regex": "^fall"}, "GPU fallen", False),
        ({"gt": 5}, 6, True),
        ({"ge": 5}, 5, True),
        ({"lt": 5}, 5, False),
        ({"le": 5}, 5, True),
        ({"gt": 5}, "6", False),
        ({"exists": True}, None, False),
        ({"exists": False}, None, True),
        (7, 7, True),
        (7, 8, False),
    ],
)
def test_operators(cond: object, value: object, expected: bool) -> None:
    rule = one(match={"field": cond})
    event = Event(id="1", node="n", source="s", kind="k", time=0, attrs={"field": value})  # type: ignore[dict-item]
    assert rule.matches(event) is expected


def test_any_is_or_and_keys_are_and() -> None:
    rule = one(match={"kind": "xid", "any": [{"xid": 79}, {"xid": 48}]})
    assert rule.matches(xid(79)) and rule.matches(xid(48))
    assert not rule.matches(xid(13))


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("match: {xid: {regex: '('}}", "3:26: rule 'bad': match: bad regex"),
        ("match: {xid: {between: [1, 2]}}", "3:18: rule 'bad': match: unknown operator"),
        ("match: {xid: {in: 5}}", "'in' takes a list"),
        ("match: {xid: {gt: x}}", "'gt' takes a number"),
        ("match: {xid: 1}\n    actions: [reboot]", "4:15: rule 'bad': actions.0: unknown action 'reboot'"),
        (
            "match: {xid: 1}\n    actions: [{drain: {reason: '{{ nonsense }}'}}]",
            "unknown field nonsense in template",
        ),
        ("match: {xid: 1}\n    actions: [{drain: {reason: '{{ xid '}}]", "template"),
        ("match: {xid: 1}\n    colour: red", "4:5: rule 'bad': colour: unknown key"),
        ("match: {xid: 1}\n    count: 3", "count > 1 needs a window"),
        ("match: {xid: 1}\n    window: 5 minutes\n    count: 2", "bad duration"),
    ],
)
def test_rule_errors_name_file_line_column(rule: str, message: str) -> None:
    text = f"rules:\n  - name: bad\n    {rule}\n"
    if "actions" not in rule:
        text += "    actions: [log]\n"
    found = problems_of(text)
    assert found and found[0].startswith("mine.yaml:"), found
    assert any(message in p for p in found), found


def test_all_problems_are_reported_not_just_the_first() -> None:
    text = (
        "rules:\n  - {name: a, match: {x: {regex: '('}}, actions: [log]}\n"
        "  - {name: b, match: {}, actions: [zap]}\n"
    )
    found = problems_of(text)
    assert len(found) == 2 and found[0].startswith("mine.yaml:2:") and found[1].startswith("mine.yaml:3:")


def test_duplicate_rule_names_rejected(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("rules:\n  - {name: same, match: {xid: 1}, actions: [log]}\n")
    (tmp_path / "b.yaml").write_text("rules:\n  - {name: same, match: {xid: 2}, actions: [log]}\n")
    with pytest.raises(ConfigError, match=r"b.yaml:2:1: duplicate rule name 'same' \(first at .*a.yaml:2\)"):
        load_rules([tmp_path])


def test_missing_rule_file() -> None:
    _, problems = check_rules([Path("/nonexistent/rules.yaml")])
    assert [str(p) for p in problems] == ["/nonexistent/rules.yaml:1:1: rule file not found"]


def test_templates_render_fields_and_refuse_internals() -> None:
    (rule,) = rules_of(
        {
            "name": "r",
            "match": {"kind": "xid"},
            "actions": [
                {"drain": {"reason": "Xid {{ xid }} on {{ node }} job {{ job }} {{ xid.__class__ }}"}}
            ],
        }
    )
    from watchd.rules import plan

    reason = plan(rule, xid(79, node="gpu-7")).actions[0].params["reason"]
    assert reason.startswith("Xid 79 on gpu-7 job ? ")
    assert "int" not in reason  # the sandbox gave nothing of the class away


@pytest.mark.parametrize(
    "source",
    [
        "{{ xid.__class__.__mro__ }}",
        "{{ ''.__class__.__subclasses__() }}",
        "{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
        "{{ (node ~ '') .__class__ }}",
        "{{ 'x' * 10**9 }}",  # a gigabyte per render
        "{{ [node] * 1000000 }}",
        "{{ 9 ** 999999 }}",
    ],
)
def test_jinja_templates_refuse_escapes_and_huge_values(source: str) -> None:
    """Templates that need Jinja itself (not the fast path): internals are refused (an error text, or
    ``?`` for an unsafe attribute) and values a template could blow up are bounded; never a raise, never a
    leak."""
    from watchd.rules.template import Template

    text = Template(source).render({"xid": 79, "node": "gpu-7"})
    assert text == "?" or (text.startswith("<template error: ") and len(text) < 200), text
    assert "<class" not in text and "built-in" not in text, text


def test_jinja_templates_still_compute_small_things() -> None:
    from watchd.rules.template import Template

    ctx = {"xid": 79, "node": "gpu-7", "value": 95.456}
    assert Template("{{ node | upper }} {{ '-' * 3 }} {{ value | round(1) }} {{ 2 ** 10 }}").render(ctx) == (
        "GPU-7 --- 95.5 1024"
    )


def test_durations() -> None:
    assert parse_duration("1h30m") == 5400 and parse_duration("28d") == 28 * 86400 and parse_duration(5) == 5
    for bad in ("5 minutes", "", "-1s", True):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_json_schema_describes_rules() -> None:
    schema = json_schema()
    rule = schema["$defs"]["RuleSpec"]
    assert {"name", "match", "actions", "group_by", "count", "window", "for", "unless"} <= set(
        rule["properties"]
    )


def test_json_schema_accepts_the_shipped_rules_and_refuses_what_the_loader_refuses() -> None:
    """What an editor checks against ``watchd rules schema`` agrees with the loader: every shipped rule
    file (and the benchmark's synthetic rules, which use every operator) is valid; typical mistakes are
    not."""
    import jsonschema
    import yaml

    from benchmarks.common import synthetic_rules_yaml

    validator = jsonschema.Draft202012Validator(json_schema())
    root = Path(__file__).resolve().parent.parent.parent
    files = sorted((root / "rules").glob("*.yaml"))  # links to the embedded defaults (watchd/data/rules)
    assert len(files) >= 5
    docs = [yaml.safe_load(f.read_text()) for f in files] + [yaml.safe_load(synthetic_rules_yaml(300))]
    for doc in docs:
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, errors

    def rule(**fields: object) -> dict[str, object]:
        return {"rules": [{"name": "r", "match": {"kind": "xid"}, "actions": ["log"], **fields}]}

    bad = [
        rule(window="5 minutes", count=2),
        rule(cooldown=-1),
        rule(match={"xid": {"between": [1, 2]}}),  # no such operator
        rule(match={"xid": {"gt": "ten"}}),
        rule(match={"any": {"xid": 79}}),  # any takes a list
        rule(actions=["reboot"]),
        rule(actions=[{"drain": {}, "log": {}}]),  # one action per item
        rule(actions=[{"drain": {"reson": "typo"}}]),
        rule(unless={"match": {"xid": {"exists": "yes"}}, "within": "10s"}),
        rule(severity="page"),
    ]
    for doc in bad:
        assert not validator.is_valid(doc), doc
        assert parse_rule_file(yaml.safe_dump(doc), "<bad>")[1], doc  # the loader refuses each of them too


# ------------------------------------------------------------------------------------ stateful evaluation


def run(rules: tuple[Rule, ...], *events: Event) -> list[tuple[float, str, str]]:
    """What the generated evaluators decide, checked against the interpreted reference on the way."""
    from watchd.rules import RuleEngine

    engines = RuleEngine(rules), RuleEngine(rules, indexed=False)
    got = [[(d.event.time, d.rule, d.event.node) for e in events for d in x.evaluate(e)] for x in engines]
    assert got[0] == got[1], f"generated {got[0]} != reference {got[1]}"
    return got[0]


def test_count_within_window_across_distinct_jobs_per_gpu() -> None:
    rules = rules_of(
        {
            "name": "app-xid-repeated",
            "match": {"kind": "xid", "xid": 13},
            "group_by": ["node", "pci_bus_id"],
            "count": 3,
            "window": "24h",
            "distinct": {"job": 2},
            "actions": [{"drain": {}}],
        }
    )
    same_job = [xid(13, t=h * 3600, job="1") for h in range(3)]
    assert run(rules, *same_job) == []  # three times, but always the same job: not hardware
    events = [xid(13, t=0, job="1"), xid(13, t=3600, job="1"), xid(13, t=7200, job="2")]
    assert run(rules, *events) == [(7200, "app-xid-repeated", "gpu-1")]
    spread = [xid(13, t=0, job="1"), xid(13, t=20 * 3600, job="2"), xid(13, t=30 * 3600, job="3")]
    assert run(rules, *spread) == []  # the first one left the 24 h window
    other_gpu = [
        xid(13, t=0, job="1"),
        xid(13, t=1, job="2", pci_bus_id="0000:9b:00.0"),
        xid(13, t=2, job="3"),
    ]
    assert run(rules, *other_gpu) == []  # per GPU: only two on each


def test_unless_suppresses_xid45_right_after_another_xid_on_the_gpu() -> None:
    rules = rules_of(
        {
            "name": "xid45-alone",
            "match": {"kind": "xid", "xid": 45},
            "group_by": ["node", "pci_bus_id"],
            "unless": {"match": {"kind": "xid", "xid": {"not_in": [45]}}, "within": "10s"},
            "actions": ["log"],
        }
    )
    assert run(rules, xid(45, t=100)) == [(100, "xid45-alone", "gpu-1")]
    assert run(rules, xid(13, t=100), xid(45, t=105)) == []
    assert run(rules, xid(13, t=100), xid(45, t=111)) == [(111, "xid45-alone", "gpu-1")]
    assert run(rules, xid(13, t=100, node="gpu-2"), xid(45, t=101)) == [(101, "xid45-alone", "gpu-1")]


def test_for_fires_once_when_held_and_resets_on_a_non_matching_event() -> None:
    rules = rules_of(
        {"name": "hot", "match": {"kind": "gpu_summary", "temp": {"gt": 90}}, "for": "5m", "actions": ["log"]}
    )

    def temp(t: float, value: int) -> Event:
        return Event(
            id=f"s{t}", node="gpu-1", source="nvml", kind="gpu_summary", time=t, attrs={"temp": value}
        )

    held = [temp(t, 95) for t in range(0, 601, 60)]
    assert run(rules, *held) == [(300, "hot", "gpu-1")]
    broken = [temp(0, 95), temp(120, 95), temp(180, 70), temp(240, 95), temp(480, 95), temp(540, 95)]
    assert run(rules, *broken) == [(540, "hot", "gpu-1")]
    # a group not seen matching for over 5 minutes starts over (a lost clear, blips far apart), and may
    # fire again after its new hold
    assert run(rules, temp(0, 95), temp(86_400, 95)) == []
    stale = [temp(0, 95), temp(200, 95), temp(501, 95), temp(700, 95), temp(801, 95)]
    assert run(rules, *stale) == [(801, "hot", "gpu-1")]
    again = [*held, temp(901, 95), temp(1000, 95), temp(1201, 95)]
    assert run(rules, *again) == [(300, "hot", "gpu-1"), (1201, "hot", "gpu-1")]


def test_cooldown_per_group() -> None:
    rules = rules_of({"name": "c", "match": {"kind": "xid"}, "cooldown": "1h", "actions": ["log"]})
    events = [xid(79, t=0), xid(79, t=60), xid(79, t=60, node="gpu-2"), xid(79, t=3601)]
    assert run(rules, *events) == [(0, "c", "gpu-1"), (60, "c", "gpu-2"), (3601, "c", "gpu-1")]


def test_index_keeps_file_order_and_finds_unindexed_rules() -> None:
    rules = rules_of(
        {"name": "a", "match": {"kind": "xid", "xid": {"in": [79, 48]}}, "actions": ["log"]},
        {"name": "b", "match": {"xid": {"gt": 0}}, "actions": ["log"]},
        {"name": "c", "match": {"kind": "xid"}, "actions": ["log"]},
        {"name": "d", "match": {"kind": "xid", "xid": 13}, "actions": ["log"]},
    )
    assert [r for _, r, _ in run(rules, xid(79))] == ["a", "b", "c"]
    assert [r for _, r, _ in run(rules, xid(13))] == ["b", "c", "d"]


def test_reload_keeps_state_of_unchanged_rules_only() -> None:
    from watchd.rules import RuleEngine

    spec = {"name": "w", "match": {"kind": "xid"}, "count": 2, "window": "1h", "actions": ["log"]}
    old = RuleEngine(rules_of(spec))
    assert old.evaluate(xid(79, t=0)) == []
    same = RuleEngine(rules_of(spec))
    same.carry_state_from(old)
    assert [d.rule for d in same.evaluate(xid(79, t=10))] == ["w"]
    changed = RuleEngine(rules_of({**spec, "count": 3}))
    changed.carry_state_from(old)
    assert changed.evaluate(xid(79, t=10)) == []


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
    from watchd.rules.ruleset import Context
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
    parameters the full-context reference rendering (``_render`` through ``Context``) gives."""
    from benchmarks.common import make_events, synthetic_rules_yaml
    from watchd.rules import load_rules, parse_rule_file
    from watchd.rules.ruleset import Context, _render, plan

    pack = load_rules([])
    synthetic, problems = parse_rule_file(synthetic_rules_yaml(300), "<syn>", len(pack.rules))
    assert not problems
    checked = 0
    for event in make_events(1500, gpus=80, seed=11):
        for rule in (*pack.rules, *synthetic):
            if not rule.matches(event):
                continue
            group = {f: event.get(f) for f in rule.spec.group_by} if rule.stateful else {"node": event.node}
            got = plan(rule, event, group, 2)
            ctx = Context(rule, event, group, 2)
            want = [_render(t, ctx) for t in rule.templates]
            assert [a.params for a in got.actions] == want, rule.name
            checked += 1
    assert checked > 1000


def test_indexed_engine_decides_exactly_as_trying_every_rule() -> None:
    """The index (kind, pinned field, regex gates), the shared ``unless`` checks and the shared sightings
    tables change nothing: pack plus synthetic rules (indexed, regex-gated, stateful, unless) over a varied
    stream give the same decisions as an engine that tries every rule and every ``unless`` with its whole
    match, each rule with its own tables."""
    from benchmarks.common import make_events, synthetic_rules_yaml
    from watchd.rules import RuleEngine, load_rules, parse_rule_file

    pack = load_rules([])
    synthetic, problems = parse_rule_file(synthetic_rules_yaml(400), "<syn>", len(pack.rules))
    assert not problems
    extra = rules_of(  # gates that must not merge (groups, flags) next to ones that do
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
    )
    rules = (*pack.rules, *synthetic, *(replace(r, order=10_000 + i) for i, r in enumerate(extra)))
    indexed, every = RuleEngine(rules), RuleEngine(rules, indexed=False)
    fired: Counter[str] = Counter()
    for event in make_events(6000, gpus=64, seed=5):
        want = every.evaluate(event)
        assert indexed.evaluate(event) == want, event
        fired.update(d.rule for d in want)
    assert sum(fired.values()) > 10_000
    names = ("g1", "g2", "g3", "g4", "g5", "g6", "u13", "u31", "s31", "s43", "s63")
    assert all(fired[name] > 0 for name in names), fired


def _reference_operator(op: str, arg: Any, value: Any) -> bool:
    import re

    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if op == "in":
        return value in arg
    if op == "not_in":
        return value not in arg
    if op == "regex":
        return value is not None and re.search(arg, str(value)) is not None
    if op == "exists":
        return (value is not None) == arg
    if number is None:
        return False
    return {"gt": number > arg, "ge": number >= arg, "lt": number < arg, "le": number <= arg}[op]


def _reference_match(match: dict[str, Any], e: Event) -> bool:
    """The documented semantics of a match (docs/rules.md), interpreted: what the generated code must give."""

    for key, cond in match.items():
        if key == "any":
            if not any(_reference_match(c, e) for c in cond):
                return False
            continue
        value = e.get(key)
        if not isinstance(cond, dict):
            if value != cond:
                return False
            continue
        if not all(_reference_operator(op, arg, value) for op, arg in cond.items()):
            return False
    return True


def test_generated_matches_agree_with_the_documented_semantics() -> None:
    import random

    from watchd.rules.match import compile_match

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
            assert got is _reference_match(m, e), (m, e)
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
