"""A requeue after a drain in the same decision acts on what the drain left."""

from __future__ import annotations

from watchd.actions.handler import Attempt
from watchd.actions.outcome import DRAINED_BY_US, ActionResult, Outcome
from watchd.actions.stages import Next


class FollowTheDrain:
    async def __call__(self, attempt: Attempt, next: Next) -> ActionResult:
        drain = attempt.after_drain
        if not attempt.handler.follows_drain or drain is None:
            return await next(attempt)
        if drain == Outcome.DEDUPLICATED:
            return ActionResult(
                Outcome.DEDUPLICATED, "the drain it follows was already decided within the cooldown"
            )
        if drain == Outcome.INTERRUPTED:  # its re-drive requeues after it when its decision did
            return ActionResult(Outcome.SKIPPED, "the drain it follows was interrupted: it is driven again")
        if drain not in DRAINED_BY_US:
            return ActionResult(
                Outcome.SKIPPED, "the node was not drained by watchd, so its jobs are left alone"
            )
        attempt.check_safety = False  # the drain was the disruption: counted, never held a second time
        return await next(attempt)
