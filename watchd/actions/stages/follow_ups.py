"""What an action's outcome calls for next (a requeue that took jobs off a node: release a hot spare for
them) runs after it, each follow-up through the whole pipeline of its own: intent, mode, leadership, audit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from watchd.actions.handler import Attempt
from watchd.actions.handlers import handler_for
from watchd.actions.outcome import ActionResult
from watchd.actions.runtime import Runtime
from watchd.actions.stages import Next
from watchd.actions.trail import scalars
from watchd.clock import Clock


class FollowUps:
    def __init__(
        self, runtime: Runtime, clock: Clock, run: Callable[[Attempt], Awaitable[ActionResult]]
    ) -> None:
        self._runtime = runtime
        self._clock = clock
        self._run = run

    async def __call__(self, attempt: Attempt, next: Next) -> ActionResult:
        result = await next(attempt)
        for action in attempt.handler.follow_ups(attempt, result):
            handler = handler_for(action.kind)
            if not handler.applies(self._runtime):
                continue
            await self._run(
                Attempt(
                    action=action,
                    handler=handler,
                    mode=attempt.mode,
                    rule=attempt.rule,
                    event_id=attempt.event_id,
                    now=self._clock.now(),
                    params=scalars(action.params),
                    check_safety=False,  # what it follows was the disruption (or gave capacity back)
                    note=attempt.note,
                )
            )
        return result
