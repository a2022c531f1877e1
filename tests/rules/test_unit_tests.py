"""``watchd rules test`` (the rule unit-test runner) and ``watchd rules check|schema``."""

import io
import json
import textwrap
from pathlib import Path

import pytest

from watchd.rules import check_rules
from watchd.rules.commands import run_check, run_schema, run_test
from watchd.rules.unit_tests import format_duration, parse_event_line

RULES = textwrap.dedent(
    """\
    rules:
      - name: fatal
        severity: critical
        match: {kind: xid, xid: {in: [79, 48]}}
        actions:
          - drain: {reason: "Xid {{ xid }} GPU {{ pci_bus_id }}"}
          - requeue
      - name: app
        severity: info
        match: {kind: xid, xid: 13}
        actions:
          - log: {message: "app Xid {{ xid }}"}
      - name: repeated
        match: {kind: xid, xid: 13}
        group_by: [node, pci_bus_id]
        count: 3
        window: 1h
        distinct: {job: 2}
        actions:
          - alert: {summary: "Xid 13 x{{ count }} on {{ node }}"}
    """
)


def write(tmp_path: Path, test: str, name: str = "t.yaml") -> Path:
    (tmp_path / "rules.yaml").write_text(RULES)
    path = tmp_path / name
    path.write_text(textwrap.dedent(test))
    return path


def outcome_of(tmp_path: Path, test: str) -> tuple[int, str]:
    out = io.StringIO()
    code = run_test([write(tmp_path, test)], out)
    return code, out.getvalue()


PASSING = """\
    rule_files: [rules.yaml]
    defaults:
      xid: {pci_bus_id: "0000:3b:00.0"}
    tests:
      - name: Xid 79 drains and requeues
        events:
          - 0s gpu-1 xid xid=79
          - {at: 10m, node: gpu-2, kind: xid, attrs: {xid: 13, pci_bus_id: "0000:9b:00.0"}}
        expect:
          - at: 0s
            node: gpu-1
            rule: fatal
            action: drain
            severity: critical
            params: {reason: "Xid 79 GPU 0000:3b:00.0"}
          - {at: 0s, node: gpu-1, action: requeue}
          - {at: 10m, node: gpu-2, action: log, params: {message: "app Xid 13"}}
        expect_none:
          - {action: drain, node: gpu-2}
      - name: repeated across jobs, with a range
        events:
          - 0s..2m/1m gpu-1 xid xid=13 job=1
          - 3m gpu-1 xid xid=13 job="2"
        exhaustive: false
        expect:
          - {at: 3m, action: alert, params: {summary: "Xid 13 x4 on gpu-1"}}
"""


def test_passing_file(tmp_path: Path) -> None:
    code, out = outcome_of(tmp_path, PASSING)
    assert code == 0, out
    assert out.splitlines()[-1] == "2 passed, 0 failed"
    assert "ok   " in out and "Xid 79 drains and requeues" in out


def test_failing_expectation_prints_a_diff(tmp_path: Path) -> None:
    code, out = outcome_of(
        tmp_path,
        """\
        rule_files: [rules.yaml]
        tests:
          - name: wrong reason
            events:
              - 0s gpu-1 xid xid=79 pci_bus_id=0000:3b:00.0
            expect:
              - {at: 0s, node: gpu-1, action: drain, params: {reason: "Xid 79 lost"}}
              - {at: 0s, node: gpu-1, action: requeue}
              - {at: 1m, node: gpu-1, action: log}
        """,
    )
    assert code == 1
    lines = out.splitlines()
    assert lines[0].endswith("t.yaml:3: wrong reason") and lines[0].startswith("FAIL ")
    assert lines[1:] == [
        "  (-: expected, not decided   +: decided, not expected)",
        '  -  0s  *      drain    gpu-1  reason="Xid 79 lost"',
        '  +  0s  fatal  drain    gpu-1  reason="Xid 79 GPU 0000:3b:00.0"',
        "     0s  fatal  requeue  gpu-1",
        "  -  1m  *      log      gpu-1",
        "0 passed, 1 failed",
    ]


def test_an_unexpected_action_fails_unless_not_exhaustive(tmp_path: Path) -> None:
    test = """\
        rule_files: [rules.yaml]
        tests:
          - name: only the drain
            {extra}
            events: ["0s gpu-1 xid xid=48"]
            expect:
              - {action: drain, node: gpu-1}
        """
    code, out = outcome_of(tmp_path, test.replace("{extra}", ""))
    assert code == 1
    assert "  +  0s  fatal  requeue  gpu-1" in out
    code, out = outcome_of(tmp_path, test.replace("{extra}", "exhaustive: false"))
    assert code == 0, out


def test_expect_none_fails_when_the_action_happens_at_any_time(tmp_path: Path) -> None:
    code, out = outcome_of(
        tmp_path,
        """\
        rule_files: [rules.yaml]
        tests:
          - name: no drain on gpu-2
            exhaustive: false
            events:
              - 0s gpu-1 xid xid=13
              - 5h gpu-2 xid xid=79
            expect_none:
              - {action: drain, node: gpu-2}
        """,
    )
    assert code == 1
    assert "(!: decided, but expect_none forbids it)" in out
    assert "  !  5h  fatal  drain  gpu-2" in out


def test_an_expectation_with_a_wrong_time_fails(tmp_path: Path) -> None:
    code, out = outcome_of(
        tmp_path,
        """\
        rule_files: [rules.yaml]
        tests:
          - name: log at 1m
            events: ["1m gpu-1 xid xid=13"]
            expect: [{at: 2m, action: log}]
        """,
    )
    assert code == 1
    assert "  -  2m  *    log  *" in out and "  +  1m  app  log  gpu-1" in out


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "rule_files: [rules.yaml]\ntests:\n  - name: x\n    events: [0s gpu-1 xid]\n    colour: red\n",
            "t.yaml:5:5: test 'x': colour: unknown key",
        ),
        (
            "rule_files: [rules.yaml]\ntests:\n  - name: x\n    events: [5 minutes gpu-1 xid]\n",
            "t.yaml:4:14: test 'x': events[0]: bad duration '5'",
        ),
        (
            "rule_files: [rules.yaml]\ntests:\n  - name: x\n    events: ['0s gpu-1 xid xid']\n",
            "t.yaml:4:14: test 'x': events[0]: event '0s gpu-1 xid xid': expected key=value, got 'xid'",
        ),
        (
            "rule_files: [nope.yaml]\ntests:\n  - name: x\n    events: [0s gpu-1 xid]\n",
            "t.yaml:1:14: rule_files[0]: rule file not found",
        ),
        (
            "rule_files: [rules.yaml]\ntests:\n  - name: x\n    events: [0s gpu-1 xid]\n    expect:\n"
            "      - {at: soon, action: drain}\n",
            "t.yaml:6:14: test 'x': expect.0.at: bad duration 'soon'",
        ),
        (
            "rule_files: [rules.yaml]\ntests:\n  - name: x\n    events: [0s gpu-1 xid]\n    expect:\n"
            "      - {action: reimage}\n",
            "t.yaml:6:18: test 'x': expect.0.action: Input should be",
        ),
        (
            "rule_files: [rules.yaml]\ntests:\n  - name: x\n    events: [0s gpu-1 xid]\n    expect:\n"
            "      - {action: drain, rule: fatl}\n",
            "t.yaml:6:31: test 'x': expect[0]: no rule named 'fatl'",
        ),
        (
            "rule_files: [rules.yaml]\ntests:\n  - name: x\n    events:\n"
            "      - {at: 1h, node: n, kind: xid, atrs: {}}\n",
            "t.yaml:5:38: test 'x': events[0]: atrs: unknown key",
        ),
        (
            "rule_files: [rules.yaml]\ntests:\n  - name: x\n    events:\n      - 0s n xid message=a: b\n",
            "t.yaml:5:9: test 'x': events[0]: YAML read this event line as a mapping",
        ),
        (
            "rule_files: [rules.yaml]\ntests:\n  - name: x\n    events: ['0s n xid node=m']\n",
            "node is not an attribute",
        ),
        ("rule_files: [rules.yaml]\ntests: [{name: x, events: [0s n xid]}\n", "t.yaml:3:1: invalid YAML"),
        ("tests: []\n", "t.yaml:1:1: rule_files: Field required"),
    ],
)
def test_bad_test_file_is_reported_with_positions(tmp_path: Path, body: str, message: str) -> None:
    code, out = outcome_of(tmp_path, body)
    assert code == 1
    expected = (
        f"{tmp_path / 't.yaml'}:{message.removeprefix('t.yaml:')}"
        if message.startswith("t.yaml:")
        else message
    )
    assert expected in out, out
    assert out.splitlines()[-1] == "0 passed, 0 failed, 1 file with errors"


def test_problems_in_the_rule_files_are_reported(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("rules:\n  - {name: r, match: {x: {regex: '('}}, actions: [log]}\n")
    path = tmp_path / "t.yaml"
    path.write_text("rule_files: [bad.yaml]\ntests:\n  - {name: x, events: [0s n k]}\n")
    out = io.StringIO()
    assert run_test([path], out) == 1
    assert f"{tmp_path / 'bad.yaml'}:2:" in out.getvalue() and "bad regex" in out.getvalue()


def test_missing_test_file_and_no_files(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_test([tmp_path / "none.yaml"], out) == 1
    assert f"{tmp_path / 'none.yaml'}:1:1: test file not found" in out.getvalue()
    out = io.StringIO()
    assert run_test([], out) == 1


def test_event_line_notation() -> None:
    e = parse_event_line(
        '1h30m gpu-1 xid xid=79 ok=true r=0.5 s="a \\"b\\" c" q=\'x y\' n=null id=e1 source=kmsg'
    )
    assert e.times == (5400.0,) and e.node == "gpu-1" and e.kind == "xid"
    assert e.attrs == {"xid": 79, "ok": True, "r": 0.5, "s": 'a "b" c', "q": "x y", "n": None}
    assert e.id == "e1" and e.source == "kmsg"
    assert parse_event_line('0s n k job="12" pci=0000:3b:00.0').attrs == {"job": "12", "pci": "0000:3b:00.0"}
    assert parse_event_line("0s..1m/30s n k").times == (0.0, 30.0, 60.0)
    for bad in ("0s n", "0s n k x", "0s n k a=1 a=2", "1m..0s/1s n k", "0s..1m/0s n k"):
        with pytest.raises(ValueError):
            parse_event_line(bad)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 1.5, 59, 600, 5400, 86400 * 28 + 1)] == [
        "0s",
        "1.5s",
        "59s",
        "10m",
        "1h30m",
        "28d1s",
    ]


def test_run_test_over_several_files_counts_all(tmp_path: Path) -> None:
    good = write(tmp_path, PASSING, "good.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "rule_files: [rules.yaml]\ntests:\n  - {name: x, events: ['0s n xid xid=79'], expect: []}\n"
    )
    out = io.StringIO()
    assert run_test([good, bad], out) == 1
    assert out.getvalue().splitlines()[-1] == "2 passed, 1 failed"


# ------------------------------------------------------------------------------------- check and schema


def checked(path: Path) -> tuple[int, list[str]]:
    """``watchd rules check PATH``: its exit code and its lines."""
    out = io.StringIO()
    return run_check([path], out), out.getvalue().splitlines()


def test_check_ok_and_problems(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    out = io.StringIO()
    assert run_check([tmp_path], out, defaults=False) == 0
    assert out.getvalue() == "ok: 3 rules in 1 file\n"
    out = io.StringIO()
    assert run_check([tmp_path], out) == 0
    pack = len(check_rules([])[0])
    assert out.getvalue() == (
        f"ok: 3 rules in 1 file, with {pack} default rules (0 replaced, 0 disabled): {pack + 3} active\n"
    )
    (tmp_path / "more.yaml").write_text(
        "rules:\n  - {name: a, match: {x: {regex: '('}}, actions: [log]}\n"
        "  - {name: b, match: {}, actions: [zap]}\n"
        "  - {name: c, match: {}, actions: [{log: {message: '{{ xid | nofilter }}'}}]}\n"
    )
    rc, lines = checked(tmp_path)
    assert rc == 1
    assert lines[0].startswith(f"{tmp_path / 'more.yaml'}:2:") and "bad regex" in lines[0]
    assert lines[1].startswith(f"{tmp_path / 'more.yaml'}:3:") and "unknown action 'zap'" in lines[1]
    assert lines[2].startswith(f"{tmp_path / 'more.yaml'}:4:") and "No filter named 'nofilter'" in lines[2]
    assert lines[3] == f"3 problems in {tmp_path}"


def test_check_embedded_defaults_and_missing_file(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_check([], out) == 0 and out.getvalue().startswith("ok: ")
    out = io.StringIO()
    assert run_check([tmp_path / "x.yaml"], out) == 1
    assert out.getvalue().splitlines() == [
        f"{tmp_path / 'x.yaml'}:1:1: rule file not found",
        f"1 problem in {tmp_path / 'x.yaml'}",
    ]


def test_schema_is_json() -> None:
    out = io.StringIO()
    assert run_schema(out) == 0
    schema = json.loads(out.getvalue())
    assert schema["title"] == "watchd rule file" and "RuleSpec" in schema["$defs"]


def test_a_name_taken_by_a_broken_rule_is_a_duplicate_too(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(
        "rules:\n  - {name: a, match: {x: {regex: '('}}, actions: [log]}\n"
        "  - {name: a, match: {kind: xid}, actions: [log]}\n"
        "  - {name: b, match: {kind: xid}, actions: [log]}\n"
        "  - {name: b, match: {kind: xid}, actions: [log]}\n"
    )
    rc, lines = checked(tmp_path)
    assert rc == 1 and "bad regex" in lines[0]
    dupes = [x for x in lines if "duplicate rule name" in x]
    assert dupes == [  # each clash once: b (two valid rules) by the check across files, a here
        f"{tmp_path / 'r.yaml'}:3:5: duplicate rule name 'a' (first at {tmp_path / 'r.yaml'}:2)",
        f"{tmp_path / 'r.yaml'}:5:1: duplicate rule name 'b' (first at {tmp_path / 'r.yaml'}:4)",
    ]
