"""The last stage: the handler carries the action out."""

from __future__ import annotations

from watchd.actions.handler import Attempt
from watchd.actions.outcome import ActionResult
from watchd.actions.runtime import Runtime
from watchd.actions.stages import Next


class Execute:
    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    async def __call__(self, attempt: Attempt, next: Next) -> ActionResult:
        return await attempt.handler.run(attempt, self._runtime)
