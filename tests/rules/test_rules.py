from pathlib import Path
from typing import Any

import pytest

from tests.rules.rule_helpers import rules_of, xid
from watchd.errors import ConfigError
from watchd.model.events import Event
from watchd.rules import check_rules, json_schema, load_rules, parse_rule_file
from watchd.rules.durations import parse_duration
from watchd.rules.rule import Rule

RULES = Path(__file__).parent.parent.parent / "rules"


def one(**spec: Any) -> Rule:
    return rules_of({"name": "r", "actions": ["log"], **spec})[0]


def problems_of(text: str) -> list[str]:
    return [str(p) for p in parse_rule_file(text, "mine.yaml")[1]]


@pytest.mark.parametrize("code", [48, 64, 74, 79, 95, 119, 140])
def test_default_rules_drain_requeue_and_reboot_or_reset_fatal_xids(code: int) -> None:
    decisions = load_rules([]).engine().evaluate(xid(code))
    reset = code in (64, 95, 119, 140)  # the catalog's RESET_GPU bucket: the GPU is reset, not the node
    assert [d.rule for d in decisions] == ["xid-gpu-reset" if reset else "xid-fatal-hardware"]
    remedy = "gpu_reset" if reset else "reboot"
    assert [a.kind for a in decisions[0].actions] == ["drain", "requeue", remedy]
    assert (
        decisions[0].actions[0].params["reason"]
        == f"Xid{code} 3b:00 GPU has fallen off the bus (GPU 0000:3b:00.0)"
    )
    if reset:
        assert decisions[0].actions[2].params["gpu"] == "0000:3b:00.0"


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
        ("match: {xid: 1}\n    actions: [reimage]", "4:15: rule 'bad': actions.0: unknown action 'reimage'"),
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
        "{{ 'x' * (xid * 10**7) }}",  # a gigabyte per render (its size known only at render)
        "{{ [node] * (xid * 100000) }}",
        "{{ 9 ** (xid * 10000) }}",
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


@pytest.mark.parametrize(
    "source", ["{{ 'x' * 10**9 }}", "{{ [node] * 1000000 }}", "{{ 9 ** 999999 }}", "{{ (9 ** 99) ** 99 }}"]
)
def test_jinja_templates_with_literal_huge_values_refused_at_load(source: str) -> None:
    """The same values written with literals break a bound whatever the event: refused when loaded."""
    from watchd.rules.template import Template, TemplateError

    with pytest.raises(TemplateError, match="over the bound"):
        Template(source)


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
        rule(actions=["reimage"]),
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
    """What the engine (the generated fast path) decides, checked against the specification on the way."""
    from watchd.rules import Interpreter, RuleEngine

    engines = RuleEngine(rules), Interpreter(rules)
    got = [[(d.event.time, d.rule, d.event.node) for e in events for d in x.evaluate(e)] for x in engines]
    assert got[0] == got[1], f"generated {got[0]} != specification {got[1]}"
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
