"""log: record the event in the audit trail with a message; touches nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.outcome import ActionResult, Outcome

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime


class LogParams(ActionParams):
    """Record the event in the audit log with a message."""

    message: str = Field("{{ kind }} on {{ node }}", description="template")


class LogHandler(Handler):
    kind = "log"
    params = LogParams
    side_effect = False

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        return ActionResult(Outcome.LOGGED, str(attempt.action.params.get("message", "")))


HANDLER = LogHandler()
