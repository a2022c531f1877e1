"""The ``command`` kind: a site's own program (an NHC script, a burn-in wrapper), pure configuration: the
``command`` the check gives, judged by its exit status; on failure the last line it printed is the
evidence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from watchd.checks.runner import RunOutput
from watchd.checks.verdict import Verdict, last_line, one_line

if TYPE_CHECKING:  # params imports the kinds table, which imports this module
    from watchd.checks.spec import BaselineView, SpecView

__all__ = ["judge_exit_status"]


def judge_exit_status(
    spec: SpecView, node: str, run: RunOutput, baselines: Sequence[BaselineView]
) -> Verdict:
    if run.exit_code == 0:
        return Verdict("passed", f"{spec.name}: exit status 0")
    last = last_line(run.output)
    return Verdict(
        "failed", one_line(f"{spec.name}: exit status {run.exit_code}" + (f": {last}" if last else ""))
    )
