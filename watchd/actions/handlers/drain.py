"""drain: take the node out of service, with a reason that says why (coalesced into scheduler rounds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.outcome import ActionResult
from watchd.model.nodes import drain_reason
from watchd.store import keys

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.rules.decision import PlannedAction


class DrainParams(ActionParams):
    """Take the node out of service (Slurm: State=DRAIN with the reason, prefixed ``watchd:``)."""

    reason: str = Field("{{ kind }} on {{ node }}", description="template; shown by sinfo -R")
    replace_reason: bool = Field(
        False,
        description="a node watchd already drained for another reason gets this one instead (lemon nodes)",
    )


class DrainHandler(Handler):
    kind = "drain"
    params = DrainParams
    disruptive = True
    takes_node_out = True
    gate_at_dispatch = True  # inside the serial drain round, once the node is known to be in service

    def key(self, action: PlannedAction) -> str:
        if action.params.get("replace_reason"):
            return keys.drain_replacing_reason(action.node)
        return keys.action(self.kind, action.node)

    def describe(self, action: PlannedAction) -> str:
        return f"would drain {action.node}: {drain_reason(str(action.params.get('reason', '')))}"

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        action = attempt.action
        reason = str(action.params.get("reason", ""))
        replace = bool(action.params.get("replace_reason"))
        return await runtime.scheduled(
            self.kind, lambda _, rounds: rounds.drain(action.node, reason, attempt.gate, replace)
        )


HANDLER = DrainHandler()
