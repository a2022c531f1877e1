"""requeue: put the requeueable jobs on the node back in the queue (only one job when the rule names it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import Field

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.handlers.spare_release import HANDLER as SPARE_RELEASE
from watchd.actions.outcome import ActionResult, Outcome
from watchd.integrations.base import RequeueResult, Scheduler
from watchd.store import keys

if TYPE_CHECKING:
    from watchd.actions.drain_batcher import DrainBatcher
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.rules.decision import PlannedAction

_UNKNOWN_JOB = "?"  # what a template renders for a field the event does not carry


class RequeueParams(ActionParams):
    """Requeue the requeueable jobs on the node (only ``job`` when given)."""

    job: str = Field(
        "",
        description="template, e.g. '{{ job }}' for a finding: requeue only this job; nothing when unknown",
    )


class RequeueHandler(Handler):
    kind = "requeue"
    params = RequeueParams
    disruptive = True
    follows_drain = True

    def key(self, action: PlannedAction) -> str:
        job = job_of(action)
        return keys.action(self.kind, action.node) if job is None else keys.requeue_job(action.node, job)

    def describe(self, action: PlannedAction) -> str:
        job = job_of(action)
        if job is None:
            return f"would requeue the jobs on {action.node}"
        return f"would requeue job {job} on {action.node}"

    def whole_node(self, action: PlannedAction) -> bool:
        """Whether it requeues every job on the node (not one named job)."""
        return job_of(action) is None

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        node, job = attempt.action.node, job_of(attempt.action)

        async def call(scheduler: Scheduler, _: DrainBatcher) -> ActionResult:
            if job == _UNKNOWN_JOB:
                return ActionResult(
                    Outcome.SKIPPED, "the requeue names a job, and the event does not say which"
                )
            return _result(await scheduler.requeue_jobs_on(node, job))

        return await runtime.scheduled(self.kind, call)

    def follow_ups(self, attempt: Attempt, result: ActionResult) -> Sequence[PlannedAction]:
        """Jobs that went back to the queue need somewhere to start: a hot spare is released for them."""
        from watchd.rules.decision import PlannedAction  # the rule schema imports this table

        jobs = result.data.get("requeued") or ()
        if attempt.mode != "enforce" or result.outcome not in (Outcome.REQUEUED, Outcome.PARTIAL) or not jobs:
            return ()
        return (PlannedAction(SPARE_RELEASE.kind, attempt.action.node, {"jobs": list(jobs)}),)


def job_of(action: PlannedAction) -> str | None:
    """The one job a requeue is limited to (``job`` param), or None for every job on the node."""
    job = str(action.params.get("job") or "").strip()
    return job or None


def _result(result: RequeueResult) -> ActionResult:
    parts = []
    if result.requeued:
        parts.append("requeued " + ",".join(result.requeued))
    if result.not_requeueable:
        parts.append("not requeueable " + ",".join(result.not_requeueable))
    if result.failed:
        parts.append("failed " + ", ".join(f"{j}: {e}" for j, e in result.failed.items()))
    if result.failed:
        outcome = Outcome.PARTIAL if result.requeued else Outcome.FAILED
    else:
        outcome = Outcome.REQUEUED if result.requeued else Outcome.NOTHING_TO_REQUEUE
    data = {
        "requeued": list(result.requeued),
        "not_requeueable": list(result.not_requeueable),
        "failed": dict(result.failed),
    }
    return ActionResult(outcome, "; ".join(parts) or "no jobs on the node", data)


HANDLER = RequeueHandler()
