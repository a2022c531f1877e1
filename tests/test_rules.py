from pathlib import Path

import pytest

from watchd.errors import ConfigError
from watchd.events import Event
from watchd.rules import load_rules, parse_rules

RULES = Path(__file__).parent.parent / "rules"


def xid(n: int, node: str = "gpu-1", **attrs: object) -> Event:
    base = {"xid": n, "pci_bus_id": "0000:3b:00.0", "meaning": "GPU has fallen off the bus"}
    base.update(attrs)  # type: ignore[arg-type]
    return Event(id=f"e{n}", node=node, source="kmsg", kind="xid", time=0.0, attrs=base)  # type: ignore[arg-type]


def one(rule: dict[str, object]) -> list[object]:
    return parse_rules({"rules": [{"name": "r", "actions": ["log"], **rule}]}, "t.yaml")  # type: ignore[return-value]


@pytest.mark.parametrize("code", [48, 64, 74, 79, 95, 119, 140])
def test_default_rules_drain_and_requeue_fatal_xids(code: int) -> None:
    decisions = load_rules([]).evaluate(xid(code))
    assert [d.rule for d in decisions] == ["xid-fatal-hardware"]
    kinds = [a.kind for a in decisions[0].actions]
    assert kinds == ["drain", "requeue"]
    reason = decisions[0].actions[0].params["reason"]
    assert reason == f"Xid {code} GPU 0000:3b:00.0 GPU has fallen off the bus"


@pytest.mark.parametrize("code", [13, 31, 43])
def test_default_rules_only_record_application_xids(code: int) -> None:
    decisions = load_rules([]).evaluate(xid(code))
    assert [d.rule for d in decisions] == ["xid-application"]
    assert [a.kind for a in decisions[0].actions] == ["log"]


def test_unmatched_event_gives_no_decision() -> None:
    assert load_rules([]).evaluate(xid(45)) == []
    other = Event(id="x", node="n", source="s", kind="gpu_health", time=0, attrs={"xid": 79})
    assert load_rules([]).evaluate(other) == []


def test_shipped_rules_file_is_the_embedded_one() -> None:
    assert load_rules([RULES / "xid.yaml"]).names == load_rules([]).names


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
    (rule,) = one({"match": {"field": cond}})
    event = Event(id="1", node="n", source="s", kind="k", time=0, attrs={"field": value})  # type: ignore[dict-item]
    assert rule.matches(event) is expected  # type: ignore[attr-defined]


def test_any_is_or_and_keys_are_and() -> None:
    (rule,) = one({"match": {"kind": "xid", "any": [{"xid": 79}, {"xid": 48}]}})
    assert rule.matches(xid(79)) and rule.matches(xid(48))  # type: ignore[attr-defined]
    assert not rule.matches(xid(13))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"match": {"xid": {"regex": "("}}}, "bad regex"),
        ({"match": {"xid": {"between": [1, 2]}}}, "unknown operator"),
        ({"match": {"xid": {"in": 5}}}, "'in' takes a list"),
        ({"match": {"xid": {"gt": "x"}}}, "'gt' takes a number"),
        ({"match": {"xid": 1}, "actions": ["reboot"]}, "actions.0"),
        ({"match": {"xid": 1}, "actions": [{"drain": {"reason": "{xid.__class__}"}}]}, "placeholders"),
        ({"match": {"xid": 1}, "colour": "red"}, "colour: unknown key"),
    ],
)
def test_rule_errors_name_the_rule(rule: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_rules({"rules": [{"name": "bad-rule", "actions": ["log"], **rule}]}, "mine.yaml")
    assert "mine.yaml" in str(err.value)


def test_duplicate_rule_names_rejected(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("rules:\n  - {name: same, match: {xid: 1}, actions: [log]}\n")
    (tmp_path / "b.yaml").write_text("rules:\n  - {name: same, match: {xid: 2}, actions: [log]}\n")
    with pytest.raises(ConfigError, match="duplicate rule name 'same'"):
        load_rules([tmp_path])


def test_missing_rule_file() -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_rules([Path("/nonexistent/rules.yaml")])


def test_template_fills_only_event_fields() -> None:
    (rule,) = parse_rules(
        {
            "rules": [
                {
                    "name": "r",
                    "match": {"kind": "xid"},
                    "actions": [{"drain": {"reason": "Xid {xid} on {node} {missing}"}}],
                }
            ]
        },
        "t",
    )
    from watchd.rules import plan

    (action,) = plan(rule.spec, xid(79, node="gpu-7"))
    assert action.params["reason"] == "Xid 79 on gpu-7 ?"
