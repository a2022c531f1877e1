"""spare_release: hand a hot spare of the node's partition back to scheduling for the jobs just requeued off
it (follows a requeue that took jobs off a node; not a rule action). The result names the spare and the jobs:
the pool is not topped up in that partition while they wait to run again, up to ``keep_for_requeued_s``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.handlers.spare import names
from watchd.actions.outcome import ActionResult, Outcome
from watchd.integrations.base import SchedulerError
from watchd.store import keys

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.rules.decision import PlannedAction


class SpareReleaseParams(ActionParams):
    """The jobs requeued off the node."""

    jobs: list[str] = Field(default_factory=list, description="the job ids")


class SpareReleaseHandler(Handler):
    kind = "spare_release"
    params = SpareReleaseParams
    rule_action = False

    def key(self, action: PlannedAction) -> str:
        return keys.action(self.kind, action.node)

    def describe(self, action: PlannedAction) -> str:
        return f"would release a spare for the jobs requeued off {action.node}"

    def applies(self, runtime: Runtime) -> bool:
        return runtime.spares is not None and runtime.spares.configured

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        node = attempt.action.node
        jobs = names(attempt.action.params.get("jobs"))
        if runtime.spares is None:
            return ActionResult(Outcome.SKIPPED, "no hot spares are configured")
        try:
            released = await runtime.spares.release_for(node)
        except SchedulerError as exc:
            return ActionResult(Outcome.FAILED, str(exc))
        if released is None:
            return ActionResult(Outcome.NO_SPARE, f"no spare is held in the partition of {node}")
        partition, spare = released
        until = attempt.now + runtime.keep_spare_s
        data = {"partition": partition, "spare": spare, "jobs": jobs, "until": until}
        for_jobs = f"job {', '.join(jobs)}" if jobs else "the jobs"
        return ActionResult(Outcome.RELEASED, f"released {spare} for {for_jobs} requeued off {node}", data)


HANDLER = SpareReleaseHandler()
