"""resume: return the node to service, only if watchd drained it (never an admin's drain) and it carries no
mark (a lemon, or left for a person: an operator clears the mark first)."""

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
        if (refused := refuse_marked(node, runtime)) is not None:
            return refused

        async def call(scheduler: Scheduler, _: DrainBatcher) -> ActionResult:
            resumed = await scheduler.resume(node)
            return ActionResult(Outcome(resumed.outcome), resumed.detail)

        return await runtime.scheduled(self.kind, call)


def refuse_marked(node: str, runtime: Runtime) -> ActionResult | None:
    """``refused`` for a node with an open mark (a lemon, or left for a person): it stays out of service
    until an operator clears the mark (``watchd node unmark``), whoever asks to return it."""
    marks = runtime.nodes.open_marks(node) if runtime.nodes is not None else []
    if not marks:
        return None
    return ActionResult(
        Outcome.REFUSED,
        f"{marks[0].describe()}: stays out of service until an operator clears the mark (watchd node unmark "
        f"{node})",
        {"mark": marks[0].mark},
    )


HANDLER = ResumeHandler()
