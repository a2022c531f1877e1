"""The shipped rule pack: every rule file is valid and every rule test in rules/tests passes."""

import io
from pathlib import Path

import pytest

from watchd.rules import load_rules
from watchd.rules.commands import run_check, run_test
from watchd.xid.catalog import known_xids, lookup

ROOT = Path(__file__).parent.parent.parent
RULES = ROOT / "rules"
TESTS = sorted((RULES / "tests").glob("*.yaml"))


def test_rule_pack_is_valid() -> None:
    out = io.StringIO()
    assert run_check([RULES], out) == 0, out.getvalue()
    assert out.getvalue().startswith("ok: ")


@pytest.mark.parametrize("path", TESTS, ids=[p.name for p in TESTS])
def test_rule_pack_tests_pass(path: Path) -> None:
    out = io.StringIO()
    assert run_test([path], out) == 0, out.getvalue()
    assert out.getvalue().splitlines()[-1].endswith(" passed, 0 failed")


def test_every_rule_file_has_its_test_file() -> None:
    rule_files = {p.name for p in RULES.glob("*.yaml")}
    assert rule_files == {p.name for p in TESTS}


def test_every_rule_is_exercised_by_a_test() -> None:
    text = "\n".join(p.read_text() for p in TESTS)
    names = load_rules([RULES]).names
    assert [n for n in names if f"rule: {n}" not in text] == []


def test_bucketless_fallback_lists_follow_the_catalog() -> None:
    """xid-gpu-reset and xid-fatal-hardware judge events without a bucket by Xid number: each list must be
    the catalog's for the rule's buckets."""
    import yaml

    rules = {r["name"]: r for r in yaml.safe_load((RULES / "xid.yaml").read_text())["rules"]}
    reset = rules["xid-gpu-reset"]["match"]["any"]
    assert reset[0]["bucket"] == "RESET_GPU"
    assert set(reset[1]["xid"]["in"]) == {x for x in known_xids() if lookup(x).bucket == "RESET_GPU"}
    buckets = set(rules["xid-fatal-hardware"]["match"]["any"][0]["bucket"]["in"])
    fallback = set(rules["xid-fatal-hardware"]["match"]["any"][1]["xid"]["in"])
    assert fallback == {x for x in known_xids() if lookup(x).bucket in buckets}
    mechanicals = rules["xid-check-mechanicals"]["match"]["any"]
    assert mechanicals[0]["bucket"] == "CHECK_MECHANICALS"
    assert {mechanicals[1]["xid"]} == {x for x in known_xids() if lookup(x).bucket == "CHECK_MECHANICALS"}
    alert_buckets = set(rules["xid-fatal-hardware-alert"]["match"]["bucket"]["in"])
    assert alert_buckets == buckets | {"RESET_GPU", "CHECK_MECHANICALS"}  # paged too: a person must look
