"""A verdict as the ``check_result`` event the rules see (pure): the run's identity, its outcome and
evidence, and the figures its kind declares (:attr:`watchd.checks.kinds.CheckKind.carried`), nothing else."""

from __future__ import annotations

from typing import Any

from watchd.checks.kinds import CHECK_KINDS
from watchd.checks.params import CheckSpec
from watchd.checks.verdict import Verdict
from watchd.model import check as check_kind
from watchd.model.events import Event, Scalar, stable_id

__all__ = ["RunResult", "check_result", "run_result"]


def check_result(
    spec: CheckSpec,
    node: str,
    round_id: str,
    run_id: str,
    verdict: Verdict,
    *,
    job: str | None,
    validation: bool,
    time: float,
) -> Event:
    figures = {k: _scalar(verdict.figures.get(k)) for k in CHECK_KINDS[spec.type].carried}
    attrs = check_kind.CheckResult(
        check=spec.name,
        check_type=spec.type,
        passed=verdict.passed,
        outcome=verdict.outcome,
        evidence=verdict.evidence,
        round=round_id,
        validation=validation,
        job=job,
        **figures,  # type: ignore[arg-type]
    )
    return attrs.to_event(
        id=stable_id(check_kind.KIND, run_id, verdict.outcome), node=node, source=check_kind.SOURCE, time=time
    )


def _scalar(value: Any) -> Scalar:
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


class RunResult(dict[str, Any]):
    """One run as the API answers it: node, check, outcome, passed, evidence, job, figures."""


def run_result(event: Event) -> RunResult:
    """A ``check_result`` event as the API answers it."""
    a = event.attrs
    return RunResult(
        node=event.node,
        check=a.get("check"),
        outcome=a.get("outcome"),
        passed=a.get("passed"),
        evidence=a.get("evidence"),
        job=a.get("job"),
        busbw_gbps=a.get("busbw_gbps"),
    )
