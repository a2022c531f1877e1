"""What ``watchd rules check`` and ``watchd rules test`` tell a site and its CI: every problem of a folder of
rules in one run (also those behind a rule's first one), in the files' order, with "did you mean" for an
unknown key; a key given twice refused; tests run over folders; ``--json`` and a JUnit XML report."""

from __future__ import annotations

import json
import shutil
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from watchd.cli import main

ROOT = Path(__file__).resolve().parents[2]

BROKEN_A = """\
    rules:
      - name: a1
        match: {kind: xid, xid: {regex: '('}}
        cooldown: banana
        actions: [{drain: {reason: "{{ nosuch }}"}}]
      - name: a2
        match: {kind: xid}
        for: 1x
        severty: warning
        actions: [{drain: {reasn: "x"}}]
    """
BROKEN_B = """\
    rules:
      - name: b1
        match: {kind: xid, xid: {ge: 1}}
        actions: [{log: {message: "{{ foo }}"}}, {drain: {reason: "{{ bar }}"}}]
        unless: {match: {kind: {regex: '['}}}
    """


def folder(tmp_path: Path, **files: str) -> Path:
    where = tmp_path / "rules"
    where.mkdir(exist_ok=True)
    for name, text in files.items():
        (where / f"{name}.yaml").write_text(textwrap.dedent(text))
    return where


def watchd(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_every_problem_of_a_folder_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Was: one problem per rule (a1's bad regex and template, b1's templates and its unless regex hid
    behind the first problem of their rule)."""
    rules = folder(tmp_path, a=BROKEN_A, b=BROKEN_B)
    code, out = watchd(capsys, "rules", "check", str(rules), "--no-defaults")
    a, b = rules / "a.yaml", rules / "b.yaml"
    assert code == 1
    assert out.splitlines() == [
        f"{a}:3:37: rule 'a1': match: bad regex '(': missing ), unterminated subpattern at position 0",
        f"{a}:4:15: rule 'a1': cooldown: bad duration 'banana': use e.g. 30s, 5m, 24h, 1h30m",
        f"{a}:5:32: rule 'a1': actions[0] drain.reason: unknown field nosuch in template",
        f"{a}:8:10: rule 'a2': for: bad duration '1x': use e.g. 30s, 5m, 24h, 1h30m",
        f"{a}:9:5: rule 'a2': severty: unknown key (did you mean 'severity'?)",
        f"{a}:10:24: rule 'a2': actions.0.drain.reasn: unknown key (did you mean 'reason'?)",
        f"{b}:4:31: rule 'b1': actions[0] log.message: unknown field foo in template",
        f"{b}:4:63: rule 'b1': actions[1] drain.reason: unknown field bar in template",
        f"{b}:5:13: rule 'b1': unless.within: Field required",
        f"{b}:5:36: rule 'b1': unless: bad regex '[': unterminated character set at position 0",
        f"10 problems in {rules}",
    ]
    code, out = watchd(capsys, "rules", "check", str(rules), "--no-defaults", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and len(doc["problems"]) == 10
    assert doc["problems"][4] == {
        "file": str(a),
        "line": 9,
        "column": 5,
        "message": "rule 'a2': severty: unknown key (did you mean 'severity'?)",
    }


def test_a_key_given_twice_is_refused_in_rules_and_tests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = folder(
        tmp_path,
        r="rules:\n  - name: x\n    match: {kind: xid}\n    match: {kind: gpu_health}\n    actions: [log]\n",
    )
    code, out = watchd(capsys, "rules", "check", str(rules / "r.yaml"), "--no-defaults")
    assert (
        code == 1
        and out.splitlines()[0]
        == f"{rules / 'r.yaml'}:4:5: duplicate key 'match' (first at line 3, column 5)"
    )
    test = tmp_path / "t.yaml"
    test.write_text("rule_files: [rules/r.yaml]\ntests: []\ntests: []\n")
    code, out = watchd(capsys, "rules", "test", str(test))
    assert code == 1 and f"{test}:3:1: duplicate key 'tests' (first at line 2, column 1)" in out


def test_rules_test_over_the_shipped_folder(capsys: pytest.CaptureFixture[str]) -> None:
    """Was: ``watchd rules test rules/`` failed (a folder is not a file). A folder's test files run, in its
    subfolders too; its rule files are not tests."""
    code, out = watchd(capsys, "rules", "test", str(ROOT / "rules"))
    assert code == 0, out
    shipped = sorted((ROOT / "rules" / "tests").glob("*.yaml"))
    ran = {line.split(":")[0].removeprefix("ok   ") for line in out.splitlines() if line.startswith("ok ")}
    assert ran == {str(p) for p in shipped}
    assert out.splitlines()[-1].endswith(" passed, 0 failed")


def test_json_and_junit_for_a_sites_ci(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules, ignore=shutil.ignore_patterns("tests"))
    tests = rules / "tests"
    tests.mkdir()
    shutil.copy(ROOT / "rules" / "tests" / "xid.yaml", tests / "xid.yaml")
    failing = textwrap.dedent(
        """\
        rule_files: [../xid.yaml]
        tests:
          - name: Xid 79 does nothing (wrong on purpose)
            events: ["0s gpu-1 xid xid=79 pci_bus_id=0000:3b:00.0"]
            expect: []
        """
    )
    (tests / "wrong.yaml").write_text(failing)
    (tests / "broken.yaml").write_text("rule_files: [../xid.yaml]\ntets: []\n")
    report = tmp_path / "junit.xml"
    code, out = watchd(capsys, "rules", "test", str(rules), "--json", "--junit", str(report))
    assert code == 1
    doc = json.loads(out)
    assert doc["ok"] is False and doc["failed"] == 1 and doc["files_with_errors"] == 1
    by_file = {Path(f["file"]).name: f for f in doc["files"]}
    assert set(by_file) == {"xid.yaml", "wrong.yaml", "broken.yaml"}
    assert all(t["passed"] for t in by_file["xid.yaml"]["tests"]) and by_file["xid.yaml"]["tests"]
    [wrong] = by_file["wrong.yaml"]["tests"]
    assert not wrong["passed"] and wrong["line"] == 3 and any("+" in line for line in wrong["report"])
    problem = by_file["broken.yaml"]["problems"][-1]
    assert problem["line"] == 2 and "tets: unknown key (did you mean 'tests'?)" in problem["message"]

    root = ET.parse(report).getroot()
    assert root.tag == "testsuites" and root.get("failures") == "1" and root.get("errors") == "1"
    suites = {Path(s.get("name", "")).name: s for s in root.iter("testsuite")}
    assert int(suites["xid.yaml"].get("tests", "0")) == len(by_file["xid.yaml"]["tests"])
    assert suites["xid.yaml"].get("failures") == "0"
    [case] = suites["wrong.yaml"].iter("testcase")
    failure = case.find("failure")
    assert case.get("line") == "3" and failure is not None and "drain" in (failure.text or "")
    error = suites["broken.yaml"].find("testcase/error")
    assert error is not None and "tets" in (error.text or "")
    assert int(root.get("tests", "0")) == sum(int(s.get("tests", "0")) for s in suites.values())


def test_an_empty_folder_is_a_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = watchd(capsys, "rules", "test", str(tmp_path))
    assert code == 1 and f"{tmp_path}:1:1: no rule test files in this folder" in out
