"""A validation a crash interrupted, finished by whoever leads (the ``validate`` action driven again): its
check runs still going are cancelled; then the node returns to service if every check of the suite passed in
its round, and is drained again if not (or left drained, when the drain was never lifted)."""

from __future__ import annotations

import contextlib

from watchd.checks.params import ChecksConfig
from watchd.checks.result_event import RunResult
from watchd.checks.runner import CheckRunner, JobHandle, RunnerError
from watchd.model.validation import Validation
from watchd.store.checks import CheckRuns

__all__ = ["recover_validation"]


async def recover_validation(
    config: ChecksConfig, store: CheckRuns, runner: CheckRunner, node: str, round_id: str, reason: str | None
) -> Validation:
    """A validation a crash interrupted (the ``validate`` action driven again): its runs still going are
    cancelled; ``reason`` None: the node is drained and stays so, only what the validation set up is
    undone; else it returns to service if every check of the suite passed in ``round_id``, and is drained
    again with ``reason`` if not."""
    specs = config.suite()
    runs = [r for spec in specs for r in store.in_round(spec.name, round_id)]
    for run in runs:
        spec = config.check(run.check)
        if run.finished_at is None and run.job_id and spec is not None:
            handle = JobHandle(
                run.run_id, run.node, run.job_id, run.job_output, run.started_at, spec.time_limit
            )
            with contextlib.suppress(RunnerError):
                await runner.cancel(handle)
    results = [
        RunResult(
            node=r.node,
            check=r.check,
            outcome=r.outcome,
            passed=r.outcome == "passed",
            evidence=r.evidence,
            job=r.job_id,
        )
        for r in runs
    ]
    passed = bool(specs) and all(
        any(r.check == s.name and r.outcome == "passed" for r in runs) for s in specs
    )
    try:
        if reason is None:
            await runner.abandon_validation(node)
            return Validation("drained", False, "interrupted before the drain was lifted: it stays", results)
        if passed:
            done = await runner.end_validation(node, True, "")
            return Validation(
                "resumed" if done == "resumed" else "drained",
                True,
                "finished after a restart: every check had passed",
                results,
            )
        await runner.end_validation(node, False, reason)
        return Validation("drained", False, reason, results)
    except RunnerError as exc:
        return Validation("interrupted", passed, f"not recovered: {exc}", results)
