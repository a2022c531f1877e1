"""The executor's pipeline, in the style of Alertmanager's notify stages: one small stage per concern, each
behind the same one-method interface, assembled in one place (:mod:`watchd.actions.executor`).

A stage gets the attempt and the rest of the pipeline (``next``); it may answer without calling it (a
de-duplicated or held action), change the attempt first, or look at the result after."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from watchd.actions.handler import Attempt
from watchd.actions.outcome import ActionResult

Next = Callable[[Attempt], Awaitable[ActionResult]]


class Stage(Protocol):
    async def __call__(self, attempt: Attempt, next: Next) -> ActionResult: ...


class Pipeline:
    """Stages run in order; the last one answers without calling ``next``."""

    def __init__(self, *stages: Stage) -> None:
        self.stages = stages
        self._first = self._chain(0)

    async def run(self, attempt: Attempt) -> ActionResult:
        return await self._first(attempt)

    def _chain(self, i: int) -> Next:
        if i == len(self.stages):
            return _end
        stage, rest = self.stages[i], self._chain(i + 1)

        def step(attempt: Attempt) -> Awaitable[ActionResult]:
            return stage(attempt, rest)

        return step


async def _end(attempt: Attempt) -> ActionResult:
    raise AssertionError(f"the pipeline ended without an outcome for {attempt.action.kind}")
