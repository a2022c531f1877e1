"""resume: return the node to service, only if watchd drained it (never an admin's drain)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.outcome import ActionResult, Outcome
from watchd.integrations.base import Scheduler
from watchd.store import keys

if TYPE_CHECKING:
    from watchd.actions.drain_batcher import DrainBatcher
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.rules.decision import PlannedAction


class ResumeParams(ActionParams):
    """Return the node to service, only if watchd drained it."""


class ResumeHandler(Handler):
    kind = "resume"
    params = ResumeParams

    def key(self, action: PlannedAction) -> str:
        return keys.action(self.kind, action.node)

    def describe(self, action: PlannedAction) -> str:
        return f"would resume {action.node} (if watchd drained it)"

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        node = attempt.action.node

        async def call(scheduler: Scheduler, _: DrainBatcher) -> ActionResult:
            resumed = await scheduler.resume(node)
            return ActionResult(Outcome(resumed.outcome), resumed.detail)

        return await runtime.scheduled(self.kind, call)


HANDLER = ResumeHandler()
