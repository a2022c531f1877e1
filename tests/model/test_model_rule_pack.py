"""The shipped rule pack (watchd/data/rules, linked from rules/) against the vocabulary: every field its
matches, groups, distinct counts and templates read exists in the kind it matches (a renamed field fails
here, not as a template rendering ``?``), and its Xid buckets, Xid numbers and GPU conditions are the
model's table."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from watchd.model.conditions import (
    APPLICATION_XID_BUCKETS,
    ATTENTION_XID_BUCKETS,
    BUCKETS_BY_NAME,
    CONDITIONS,
    FATAL_XID_BUCKETS,
    GPU_CONDITIONS,
    HARDWARE_CONDITIONS,
    HARDWARE_XID_BUCKETS,
    LEGACY_APPLICATION_XIDS,
    NO_RULE,
    REPEATED_APPLICATION_XIDS,
    SLOWDOWN_CONDITIONS,
    XID_BUCKETS,
    Evidence,
)
from watchd.model.conditions import BY_NAME as BY_CONDITION
from watchd.model.events import TOP_LEVEL_FIELDS
from watchd.model.registry import ALL_KINDS, fields_of
from watchd.rules.template import Template
from watchd.xid.catalog import BUCKETS, known_xids, lookup
from watchd.xid.tables import buckets_markdown, conditions_markdown

ROOT = Path(__file__).resolve().parent.parent.parent
PACK = ROOT / "watchd" / "data" / "rules"
#: Names a template resolves itself (docs/rules.md, Templates); ``job`` is not among them here: it must be
#: a field of the kind (or one the engine adds).
_CONTEXT = {"event", "rule", "severity", "count", "group"}
_CONDITION_OPS = {"in", "not_in", "regex", "gt", "ge", "lt", "le", "exists"}


def _rules() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(PACK.glob("*.yaml")):
        for rule in yaml.safe_load(path.read_text())["rules"]:
            out.append((path.name, rule))
    return out


RULES = _rules()
BY_NAME = {rule["name"]: rule for _, rule in RULES}


def _kinds(match: dict[str, Any]) -> set[str]:
    kind = match["kind"]
    return set(kind["in"]) if isinstance(kind, dict) else {kind}


def _match_fields(match: dict[str, Any]) -> Iterator[str]:
    for key, value in match.items():
        if key == "any":
            for alternative in value:
                yield from _match_fields(alternative)
        elif key != "kind":
            yield key


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _template_fields(source: str, group_by: list[str]) -> Iterator[str]:
    for name in Template(source).names:
        if name not in _CONTEXT:
            yield name
    for owner, attr in re.findall(r"\b(event|group)\.([A-Za-z_][A-Za-z0-9_]*)", source):
        if owner == "event":
            yield attr
        else:
            assert attr in group_by, f"group.{attr} is not one of group_by {group_by}"


def _reads(rule: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, field) for every field the rule reads."""
    group_by = rule.get("group_by", ["node"])
    for f in _match_fields(rule["match"]):
        yield "match", f
    for f in group_by:
        yield "group_by", f
    for f in rule.get("distinct", {}):
        yield "distinct", f
    for action in rule["actions"]:
        params = action if isinstance(action, str) else next(iter(action.values()))
        for text in _strings(params):
            for f in _template_fields(text, group_by):
                yield "template", f


@pytest.mark.parametrize(("file", "rule"), RULES, ids=[r["name"] for _, r in RULES])
def test_every_field_the_pack_reads_is_declared_by_its_kind(file: str, rule: dict[str, Any]) -> None:
    kinds = _kinds(rule["match"])
    assert kinds <= ALL_KINDS
    for where, name in _reads(rule):
        for kind in kinds:
            known = fields_of(kind) | TOP_LEVEL_FIELDS
            assert name in known, f"{file}: {rule['name']}: {where} reads {name!r}, not a field of {kind}"
    unless = rule.get("unless")
    if unless is not None:
        for kind in _kinds(unless["match"]):
            for name in _match_fields(unless["match"]):
                assert name in fields_of(kind) | TOP_LEVEL_FIELDS, (rule["name"], name)


def test_the_field_check_catches_a_renamed_field() -> None:
    rule = {
        "match": {"kind": "gpu_health", "condition": "ecc_dbe"},
        "actions": [{"drain": {"reason": "GPU {{ gpu }} {{ evidense }}"}}],
    }
    assert ("template", "evidense") in set(_reads(rule))
    assert "evidense" not in fields_of("gpu_health")


def _in(value: Any) -> list[Any]:
    assert isinstance(value, dict) and set(value) <= _CONDITION_OPS, value
    return list(value.get("in", value.get("not_in", [])))


def _xids_of(buckets: frozenset[str]) -> list[int]:
    return sorted(x for x in known_xids() if lookup(x).bucket in buckets)


# ----------------------------------------------------------------------------------------- Xid classes


def _actions_of(name: str) -> list[str]:
    return [next(iter(a)) if isinstance(a, dict) else a for a in BY_NAME[name]["actions"]]


def test_fatal_hardware_rules_are_the_fatal_buckets() -> None:
    # a GPU reset for the bucket the catalog names for it (RESET_GPU); a reboot (which resets the GPU too)
    # for the others whose advice is a reset or a reboot (the workflow buckets of Xid 48 and NVLink ask for
    # more than a reset: counters checked, the reset-or-reboot); a person for the rest
    remediated = {b for b in FATAL_XID_BUCKETS if re.search(r"reset|reboot", BUCKETS_BY_NAME[b].action)}
    reset = {"RESET_GPU"}
    reboot = remediated - reset
    assert reset < remediated and reboot and remediated != FATAL_XID_BUCKETS
    for name, buckets, action in (
        ("xid-gpu-reset", reset, "gpu_reset"),
        ("xid-fatal-hardware", reboot, "reboot"),
    ):
        drain = BY_NAME[name]["match"]["any"]
        bucket = drain[0]["bucket"]
        assert ({bucket} if isinstance(bucket, str) else set(_in(bucket))) == buckets, name
        assert drain[1]["bucket"] == {"exists": False}
        assert _in(drain[1]["xid"]) == _xids_of(buckets)  # an event without a bucket: the same Xids
        assert _actions_of(name) == ["drain", "requeue", action], name
        assert set(re.findall(r"\b[A-Z][A-Z0-9_]{4,}\b", BY_NAME[name]["description"])) == buckets, name
    mechanicals = BY_NAME["xid-check-mechanicals"]["match"]["any"]
    assert {mechanicals[0]["bucket"]} == FATAL_XID_BUCKETS - remediated
    assert [mechanicals[1]["xid"]] == _xids_of(FATAL_XID_BUCKETS - remediated)
    assert set(_in(BY_NAME["xid-fatal-hardware-alert"]["match"]["bucket"])) == FATAL_XID_BUCKETS
    for bucket in FATAL_XID_BUCKETS:
        assert BUCKETS_BY_NAME[bucket].response == "drain + requeue + page"


def test_application_rules_are_the_application_class() -> None:
    logged = BY_NAME["xid-application"]["match"]["any"]
    assert {logged[0]["bucket"]} == APPLICATION_XID_BUCKETS
    assert _in(logged[1]["xid"]) == list(LEGACY_APPLICATION_XIDS)
    repeated = BY_NAME["app-xid-repeated"]["match"]["any"]
    assert {repeated[0]["bucket"]} == APPLICATION_XID_BUCKETS
    assert _in(repeated[1]["xid"]) == list(REPEATED_APPLICATION_XIDS)
    assert set(REPEATED_APPLICATION_XIDS) <= set(LEGACY_APPLICATION_XIDS)


def test_the_other_xid_rules_follow_the_table() -> None:
    assert BY_NAME["xid-informational"]["match"]["bucket"] == "IGNORE"
    assert BUCKETS_BY_NAME["IGNORE"].response == "log"
    assert set(_in(BY_NAME["xid-needs-attention"]["match"]["bucket"])) == ATTENTION_XID_BUCKETS
    for name in ("xid-nvlink5-fatal", "xid-nvlink5-other", "xid-nvlink5-undecoded"):
        assert BY_NAME[name]["match"]["bucket"] == "WORKFLOW_NVLINK5_ERR"
    assert BY_NAME["xid-45-alone"]["match"]["bucket"] == "WORKFLOW_XID_45"
    for name in ("xid-154-drain", "xid-154-imex", "xid-154-none", "xid-154-undecoded"):
        assert BY_NAME[name]["match"]["xid"] == 154 and lookup(154).bucket == "XID_154"


def test_every_bucket_has_a_rule_and_a_row() -> None:
    assert frozenset(b.name for b in XID_BUCKETS) == BUCKETS
    assert {lookup(x).bucket for x in known_xids()} | {"UNKNOWN"} == BUCKETS
    matched: set[str] = set()
    for _, rule in RULES:
        if "xid" not in _kinds(rule["match"]):
            continue
        for alternative in rule["match"].get("any", [rule["match"]]):
            bucket = alternative.get("bucket")
            if isinstance(bucket, str):
                matched.add(bucket)
            elif isinstance(bucket, dict) and "in" in bucket:
                matched |= set(bucket["in"])
    assert matched | {"XID_154"} == BUCKETS  # Xid 154 is matched by its number and recovery action


def test_the_detectors_hardware_xids_are_the_fatal_ones_and_three_more() -> None:
    """Unified without a change of behaviour: the detectors' set is the one detect/fleet.py had."""
    assert {
        "RESET_GPU",
        "RESTART_BM",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
        "XID_154",
        "CHECK_MECHANICALS",
        "CONTACT_SUPPORT",
    } == HARDWARE_XID_BUCKETS
    assert {"WORKFLOW_NVLINK5_ERR", "XID_154", "CONTACT_SUPPORT"} == HARDWARE_XID_BUCKETS - FATAL_XID_BUCKETS
    assert FATAL_XID_BUCKETS < HARDWARE_XID_BUCKETS
    assert {"RESTART_APP"} == APPLICATION_XID_BUCKETS


# ---------------------------------------------------------------------------------------- GPU conditions


def _health_rules() -> list[dict[str, Any]]:
    return [rule for _, rule in RULES if _kinds(rule["match"]) == {"gpu_health"}]


def _conditions_of(match: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    for alternative in match.get("any", [match]):
        condition = alternative.get("condition", match.get("condition"))
        found |= {condition} if isinstance(condition, str) else set(_in(condition))
    return found


def test_the_pack_drains_on_the_conditions_the_table_says() -> None:
    drained: set[str] = set()
    matched: set[str] = set()
    for rule in _health_rules():
        conditions = _conditions_of(rule["match"])
        matched |= conditions
        if any("drain" in a for a in rule["actions"] if isinstance(a, dict)):
            drained |= conditions
    assert matched <= set(CONDITIONS)
    # a condition the table says a rule acts on has one (NO_RULE: evidence for the detectors only)
    assert matched == {c.name for c in GPU_CONDITIONS if c.response != NO_RULE}
    assert drained == {c.name for c in GPU_CONDITIONS if c.drains}
    throttled = _conditions_of(BY_NAME["gpu-throttled-sustained"]["match"])
    assert throttled == SLOWDOWN_CONDITIONS


def test_the_pack_header_lists_every_condition_it_acts_on() -> None:
    header = (PACK / "gpu-health.yaml").read_text().split("\nrules:")[0]
    listed = re.search(r"#\s+condition\s+(.*?)#\s+gpu ", header, re.S)
    assert listed is not None
    assert set(re.findall(r"[a-z][a-z_]+", listed.group(1))) == {
        c.name for c in GPU_CONDITIONS if c.response != NO_RULE
    }


#: The conditions as detect/fleet.py classified them before the table (HARDWARE_CONDITIONS,
#: SLOWDOWN_CONDITIONS there): the table keeps every one where it was.
_BEFORE = {
    "gpu_lost": Evidence.HARDWARE,
    "ecc_dbe": Evidence.HARDWARE,
    "row_remap_failure": Evidence.HARDWARE,
    "row_remap_pending": Evidence.HARDWARE,
    "nvlink_down": Evidence.HARDWARE,
    "pcie_downtrain": Evidence.HARDWARE,
    "recovery_action": Evidence.HARDWARE,
    "hw_slowdown": Evidence.SLOWDOWN,
    "thermal_slowdown": Evidence.SLOWDOWN,
    "power_brake": Evidence.SLOWDOWN,
    "retired_pages_pending": Evidence.NONE,
    "pcie_replay_burst": Evidence.NONE,
    "nvlink_errors": Evidence.NONE,
}


def test_the_detectors_conditions_are_the_ones_they_had() -> None:
    for name, evidence in _BEFORE.items():
        assert BY_CONDITION[name].evidence is evidence, name
    assert HARDWARE_CONDITIONS & set(_BEFORE) == {n for n, e in _BEFORE.items() if e is Evidence.HARDWARE}
    assert SLOWDOWN_CONDITIONS & set(_BEFORE) == {n for n, e in _BEFORE.items() if e is Evidence.SLOWDOWN}
    # drained by the pack, yet no hardware evidence for the detectors: kept as it was, named here
    drained_not_evidence = {
        c.name for c in GPU_CONDITIONS if c.drains and c.evidence is not Evidence.HARDWARE
    }
    assert drained_not_evidence == {"retired_pages_pending"}


def test_the_docs_hold_the_table() -> None:
    """After a change of the table, paste ``python -m watchd.xid.tables`` into docs/rules.md."""
    docs = (ROOT / "docs" / "rules.md").read_text()
    assert conditions_markdown() in docs, "docs/rules.md: paste the output of python -m watchd.xid.tables"
    assert buckets_markdown() in docs, "docs/rules.md: paste the output of python -m watchd.xid.tables"
