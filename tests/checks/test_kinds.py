"""The table of check kinds (watchd/checks/kinds.py): every kind's judge puts in a verdict only the figures
its row declares, every declared figure reaches the ``check_result`` event with its type, and the config
knows the kinds by the table alone."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from watchd.checks.judge import judge, judge_peers
from watchd.checks.kinds import ALL_FIGURES, CHECK_KINDS, CheckKind, undeclared_figures
from watchd.checks.params import ChecksConfig, CheckSpec, PeersConfig
from watchd.checks.result_event import check_result
from watchd.checks.runner import RunOutput
from watchd.checks.verdict import Verdict
from watchd.model.check import CheckResult

DATA = Path(__file__).resolve().parent.parent / "data" / "checks"
RECORDED = {f"{p.parent.name}/{p.name}": p.read_text() for p in sorted(DATA.glob("*/*"))}
#: what any tool may leave behind besides its recorded outputs
ODD = {
    "empty": "",
    "blank lines": "\n \n",
    "garbage": "\x00\x01 not a tool's output\n" * 3,
    "dcgm warned": '{"DCGM Diagnostic": {"test_categories": [{"category": "Integration", "tests": '
    '[{"name": "pcie", "results": [{"entity_id": 0, "status": "Warn"}]}]}]}}',
}
STATUSES = [
    RunOutput("completed", exit_code=0, duration_s=1.5),
    RunOutput("failed", exit_code=1, duration_s=2.0),
    RunOutput("timeout", detail="past the limit"),
    RunOutput("not_started", detail="sbatch: error"),
    RunOutput("node_fail", detail="NODE_FAIL"),
]


def spec_of(kind: str, **params: object) -> CheckSpec:
    command = None if CHECK_KINDS[kind].default_argv is not None else ["/usr/sbin/site-check"]
    return CheckSpec.model_validate({"name": "c", "type": kind, "command": command, **params})


def slow(nccl_output: str, busbw: float) -> str:
    """A recorded nccl pass with the largest size's busbw (both columns) replaced."""
    return nccl_output.replace("470.73", f"{busbw:.2f}").replace("470.63", f"{busbw - 1:.2f}")


def runs() -> Iterator[tuple[str, RunOutput]]:
    """Every recorded output (each kind's own and the others') and odd ones, with each exit status."""
    for name, text in {**RECORDED, **ODD}.items():
        for code in (0, 1):
            yield name, RunOutput("completed" if code == 0 else "failed", text, code, duration_s=3.0)
    for status in STATUSES:
        yield status.status, status


@pytest.mark.parametrize("kind", sorted(CHECK_KINDS))
def test_each_kinds_judge_puts_only_declared_figures_in_its_verdicts(kind: str) -> None:
    baselines = ChecksConfig().baselines
    specs = [spec_of(kind), spec_of(kind, baseline_gbps=1000.0, fail_on_warn=True, json_output=True)]
    seen: set[str] = set()
    for spec in specs:
        for name, run in runs():
            verdict = judge(spec, "n1", run, baselines)
            assert undeclared_figures(CHECK_KINDS[kind], verdict.figures) == [], (kind, name)
            seen |= {k for k, v in verdict.figures.items() if v is not None}
    # and the declaration is not padded: the recorded outputs bring out every figure but those the round
    # adds (the peers' median, a pair's partners)
    peers_only = {"peers_median_gbps", "peers", "partners"}
    assert set(CHECK_KINDS[kind].carried) - peers_only <= seen, kind


def test_the_peers_comparison_adds_only_figures_the_compared_kind_declares() -> None:
    nccl = CHECK_KINDS["nccl"]
    spec = spec_of("nccl")
    text = RECORDED["nccl/h100-8gpu-single-node-pass.txt"]
    verdicts = {
        f"n{i}": judge(spec, f"n{i}", RunOutput("completed", slow(text, bw), 0), [])
        for i, bw in enumerate((470.0, 460.0, 465.0, 200.0))
    }
    compared = judge_peers(verdicts, PeersConfig(min_nodes=4))
    assert compared["n3"].outcome == "failed"
    for verdict in compared.values():
        assert undeclared_figures(nccl, verdict.figures) == []
        assert {"peers_median_gbps", "peers"} <= set(verdict.figures)


def test_an_undeclared_figure_is_found() -> None:
    """The checks above can fail: a judge that measures more than its row says is caught."""

    def judge_burn(spec: CheckSpec, node: str, run: RunOutput, baselines: object) -> Verdict:
        return Verdict("passed", "gpu-burn: 0 errors", {"gflops": 61_000.0, "burn_errors": 0})

    burn = CheckKind("gpu-burn", None, judge_burn, figures=("burn_errors",))
    verdict = burn.judge(spec_of("command"), "n1", RunOutput("completed", "", 0), [])
    assert undeclared_figures(burn, verdict.figures) == ["gflops"]


def carried_by_the_event(kind: CheckKind) -> list[str]:
    """The figures of ``kind`` that the ``check_result`` event has no field for."""
    return [f for f in kind.carried if f not in CheckResult.fields()]


def test_the_event_has_a_field_for_every_declared_figure() -> None:
    for kind in CHECK_KINDS.values():
        assert carried_by_the_event(kind) == [], kind.name
    assert set(ALL_FIGURES) <= set(CheckResult.fields())
    # and the check above can fail
    assert carried_by_the_event(dataclasses.replace(CHECK_KINDS["command"], figures=("made_up_figure",))) == [
        "made_up_figure"
    ]


@pytest.mark.parametrize("kind", sorted(CHECK_KINDS))
def test_every_figure_reaches_the_event_with_its_type(kind: str) -> None:
    spec = spec_of(kind, baseline_gbps=1000.0)
    for name, run in runs():
        verdict = judge(spec, "n1", run, [])
        event = check_result(spec, "n1", "r", "run-1", verdict, job="42", validation=False, time=1.0)
        typed = CheckResult.from_attrs(event.attrs)
        assert typed.extra == {}, (kind, name, typed.extra)  # a value of the wrong type would land there
        figures = {k: v for k, v in verdict.figures.items() if v is not None}
        assert {k: event.attrs[k] for k in figures} == figures, (kind, name)
        assert (typed.check_type, typed.outcome, typed.job) == (kind, verdict.outcome, "42")


def test_the_event_carries_only_the_kinds_figures() -> None:
    spec = spec_of("dcgm-diag")
    verdict = Verdict("passed", "ok", {"exit_status": 0, "busbw_gbps": 400.0, "dcgm_version": "4.4.2"})
    event = check_result(spec, "n1", "r", "run-1", verdict, job=None, validation=True, time=1.0)
    assert event.attrs == {
        "check": "c",
        "check_type": "dcgm-diag",
        "passed": True,
        "outcome": "passed",
        "evidence": "ok",
        "round": "r",
        "validation": True,
        "dcgm_version": "4.4.2",
        "exit_status": 0,
    }


def test_the_config_knows_the_kinds_from_the_table() -> None:
    for name, kind in CHECK_KINDS.items():
        spec = spec_of(name)
        assert spec.argv() and spec.argv() == kind.argv(spec)
        if kind.default_argv is None:  # a kind without a default: the check must give its command
            with pytest.raises(ValidationError, match=f"a check of type {name} needs a command"):
                ChecksConfig.model_validate({"items": [{"name": "x", "type": name}]})
    assert spec_of("dcgm-diag", level=3, json_output=True).argv() == ["dcgmi", "diag", "-r", "3", "-j"]
    assert spec_of("nccl", command=["/opt/all_reduce_perf", "-g", "4"]).argv() == [
        "/opt/all_reduce_perf",
        "-g",
        "4",
    ]
    assert {"nccl", "dcgm-diag", "command"} <= set(CHECK_KINDS)  # the shipped kinds (configs name them)
    known = ", ".join(sorted(CHECK_KINDS))
    with pytest.raises(
        ValidationError, match=re.escape(f"unknown check type 'no-such-kind' (known: {known})")
    ):
        ChecksConfig.model_validate({"items": [{"name": "x", "type": "no-such-kind"}]})


def test_a_site_command_is_configuration_only() -> None:
    cfg = ChecksConfig.model_validate(
        {"items": [{"name": "nhc", "type": "command", "command": ["/usr/sbin/nhc", "-t", "60"]}]}
    )
    (spec,) = cfg.items
    assert spec.argv() == ["/usr/sbin/nhc", "-t", "60"]
    assert judge(spec, "n", RunOutput("completed", "all good\n", 0), []).outcome == "passed"
    failed = judge(spec, "n", RunOutput("failed", "ERROR: eth0 down\n", 3), [])
    assert (failed.outcome, failed.evidence) == ("failed", "nhc: exit status 3: ERROR: eth0 down")


def test_docs_name_every_kind_and_figure() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "checks.md").read_text()
    section = docs.split("## Check kinds", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header
    rows = {line.split("|")[1].strip(" `") for line in table}
    assert rows == set(CHECK_KINDS)
    for kind in CHECK_KINDS.values():
        row = next(line for line in section.splitlines() if line.startswith(f"| `{kind.name}`"))
        assert [f for f in kind.figures if f"`{f}`" not in row] == [], kind.name


def test_the_docs_example_config_loads_strictly() -> None:
    import yaml

    from watchd.config import EngineConfig

    docs = (Path(__file__).resolve().parents[2] / "docs" / "checks.md").read_text()
    section = docs.split("## Configuration", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = EngineConfig.model_validate(yaml.safe_load(example))
    assert [c.name for c in config.checks.items] == ["nccl", "dcgm", "nhc"]
    assert config.checks.items[0].command == [
        "/opt/nccl-tests/build/all_reduce_perf",
        "-b",
        "8",
        "-e",
        "8G",
        "-f",
        "2",
        "-g",
        "8",
    ]
