"""The shipped Prometheus alert rules, in both flavours (bare metal: deploy/prometheus/; the Prometheus
Operator's job names: deploy/kubernetes/alerts/): promtool accepts them and their unit tests pass, the two
differ only in job names, every alert is tested firing, and every alert links its section of
docs/runbooks.md (which has a section for each shipped alert and no other)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BARE = ROOT / "deploy" / "prometheus"
OPERATOR = ROOT / "deploy" / "kubernetes" / "alerts"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://github.com/watchd/watchd/blob/main/docs/runbooks.md#"


def rules(folder: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load((folder / "watchd-alerts.yaml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def promtool_run(promtool: str, folder: Path, *args: str) -> None:
    res = subprocess.run([promtool, *args], cwd=folder, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"promtool {' '.join(args)} in {folder}:\n{res.stdout}{res.stderr}"


@pytest.mark.real
@pytest.mark.parametrize("folder", [BARE, OPERATOR], ids=["bare-metal", "operator"])
def test_promtool_checks_and_unit_tests_pass(promtool: str, folder: Path) -> None:
    promtool_run(promtool, folder, "check", "rules", "watchd-alerts.yaml")
    promtool_run(promtool, folder, "test", "rules", "watchd-alerts.test.yaml")


@pytest.mark.real
def test_the_bare_metal_scrape_config_is_valid(promtool: str) -> None:
    promtool_run(promtool, BARE, "check", "config", "prometheus.yaml")
    config = yaml.safe_load((BARE / "prometheus.yaml").read_text())
    jobs = {s["job_name"] for s in config["scrape_configs"]}
    assert jobs == {"watchd-engine", "watchd-agent"}
    for scrape in config["scrape_configs"]:  # the dashboard's $cluster is a target label
        assert all("cluster" in s.get("labels", {}) for s in scrape["static_configs"]), scrape["job_name"]


def operator_flavour(text: str) -> str:
    """What deploy/prometheus/flavour.sh makes of a bare-metal file (kept in step with it)."""
    return re.sub(r'(job=~?"|job: )watchd-(engine|agent)', r"\1watchd/watchd-\2", text)


@pytest.mark.parametrize("name", ["watchd-alerts.yaml", "watchd-alerts.test.yaml"])
def test_the_flavours_differ_only_in_job_names(name: str) -> None:
    bare, operator = (BARE / name).read_text(), (OPERATOR / name).read_text()
    assert operator == operator_flavour(bare), (
        f"deploy/kubernetes/alerts/{name} is not the Operator's flavour of deploy/prometheus/{name}: "
        "edit the bare-metal file and run deploy/prometheus/flavour.sh"
    )
    assert bare != operator
    assert 'job="watchd-agent"' in bare and 'job="watchd/watchd-agent"' in operator


def test_the_flavour_script_writes_what_the_test_expects(tmp_path: Path) -> None:
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "kubernetes" / "alerts").mkdir(parents=True)
    for name in ("watchd-alerts.yaml", "watchd-alerts.test.yaml"):
        (tmp_path / "prometheus" / name).write_text((BARE / name).read_text())
    script = tmp_path / "prometheus" / "flavour.sh"
    script.write_text((BARE / "flavour.sh").read_text())
    subprocess.run(["sh", str(script)], check=True, timeout=30)
    for name in ("watchd-alerts.yaml", "watchd-alerts.test.yaml"):
        written = (tmp_path / "kubernetes" / "alerts" / name).read_text()
        assert written == operator_flavour((BARE / name).read_text())


def test_every_alert_is_tested_firing() -> None:
    tests = yaml.safe_load((BARE / "watchd-alerts.test.yaml").read_text())["tests"]
    fired = {
        case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")
    }
    names = [r["alert"] for r in rules(BARE)]
    assert len(names) == len(set(names))
    assert sorted(set(names) - fired) == [], "alerts without a test that sees them fire"
    # the alerts the docs promise are shipped
    for promised in ("WatchdStoreUnwritable", "WatchdFleetPollDown", "WatchdUntrustedXidLines"):
        assert promised in names


def runbook_sections() -> list[str]:
    return re.findall(r"^## (Watchd\w+)\s*$", RUNBOOKS.read_text(), re.M)


def test_every_alert_links_its_runbook_and_every_runbook_is_an_alert() -> None:
    sections = runbook_sections()
    names = [r["alert"] for r in rules(BARE)]
    for rule in rules(BARE):
        url = rule["annotations"].get("runbook_url", "")
        assert url == RUNBOOK_BASE + rule["alert"].lower(), rule["alert"]  # GitHub's anchor of "## Name"
        for key in ("summary", "description"):
            assert rule["annotations"].get(key), (rule["alert"], key)
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
    assert sorted(sections) == sorted(names), "docs/runbooks.md: one section per shipped alert"
    text = RUNBOOKS.read_text()
    for name in names:  # each section says what it means, what to check, and how to fix it
        body = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**Meaning**", "**Check**", "**Fix**"):
            assert part in body, (name, part)
