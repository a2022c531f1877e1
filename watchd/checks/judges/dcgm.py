"""The ``dcgm-diag`` kind: ``dcgmi diag -r LEVEL`` (table or ``-j`` JSON); a failed test or an error fails
the node, a warning only with ``fail_on_warn``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from watchd.checks.parsers import parse_dcgm
from watchd.checks.runner import RunOutput
from watchd.checks.verdict import Verdict, last_line, one_line
from watchd.model.events import Scalar

if TYPE_CHECKING:  # params imports the kinds table, which imports this module
    from watchd.checks.spec import BaselineView, SpecView

__all__ = ["dcgm_argv", "judge_dcgm"]


def dcgm_argv(spec: SpecView) -> list[str]:
    return ["dcgmi", "diag", "-r", str(spec.level), *(["-j"] if spec.json_output else [])]


def judge_dcgm(spec: SpecView, node: str, run: RunOutput, baselines: Sequence[BaselineView]) -> Verdict:
    report = parse_dcgm(run.output)
    failed = [t for t in report.tests if t.status == "fail"]
    warned = [t for t in report.tests if t.status == "warn"]
    skipped = [t for t in report.tests if t.status == "skip"]
    figures: dict[str, Scalar] = {
        "failed_tests": ",".join(t.name for t in failed) or None,
        "warned_tests": ",".join(t.name for t in warned) or None,
        "skipped_tests": ",".join(t.name for t in skipped) or None,
        "dcgm_version": report.version,
    }
    if failed:
        first = failed[0]
        why = next((m for m in first.messages if m and not m.startswith("info:")), "")
        names = ", ".join(t.name for t in failed)
        return Verdict(
            "failed",
            one_line(f"dcgm diag -r {spec.level} failed: {names}" + (f" ({why})" if why else "")),
            figures,
        )
    if report.errors:
        return Verdict("failed", one_line(f"dcgm diag: {report.errors[0]}"), figures)
    if warned and spec.fail_on_warn:
        return Verdict(
            "failed",
            one_line(f"dcgm diag -r {spec.level} warned: {', '.join(t.name for t in warned)}"),
            figures,
        )
    if not report.tests:
        if run.exit_code not in (None, 0):
            return Verdict(
                "failed", one_line(f"dcgm diag exit status {run.exit_code}: {last_line(run.output)}"), figures
            )
        return Verdict("error", "dcgm diag printed no results", figures)
    passed = sum(t.status == "pass" for t in report.tests)
    note = f", {len(skipped)} skipped" if skipped else ""
    note += f", {len(warned)} warned" if warned else ""
    return Verdict("passed", f"dcgm diag -r {spec.level}: {passed} passed{note}", figures)
