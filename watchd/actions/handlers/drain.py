"""drain: take the node out of service, with a reason that says why (coalesced into scheduler rounds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.outcome import ActionResult, Outcome
from watchd.logs import get_logger
from watchd.model.nodes import drain_reason
from watchd.store import keys
from watchd.store.connection import StoreError

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.rules.decision import PlannedAction


_log = get_logger("watchd.actions.drain")


class DrainParams(ActionParams):
    """Take the node out of service (Slurm: State=DRAIN with the reason, prefixed ``watchd:``)."""

    reason: str = Field("{{ kind }} on {{ node }}", description="template; shown by sinfo -R")
    replace_reason: bool = Field(
        False,
        description="a node watchd already drained for another reason gets this one instead, and is marked "
        "a lemon: no automatic remediation or return to service until an operator clears the mark",
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
        if replace and runtime.nodes is not None:
            # the lemon rule's verdict holds from its decision on, before the drain's round: a reset or a
            # validation of the node racing it finds the mark
            gpu, uuid = _gpu_of(attempt)
            why = drain_reason(reason)
            runtime.nodes.mark(action.node, "lemon", attempt.rule, why, attempt.now, gpu, uuid)
        result = await runtime.scheduled(
            self.kind, lambda _, rounds: rounds.drain(action.node, reason, attempt.gate, replace)
        )
        if result.outcome == Outcome.DRAINED and runtime.nodes is not None:
            try:  # a command issued under an older drain lapses
                runtime.nodes.drained(action.node, attempt.now)
            except StoreError as exc:  # the drain happened: it is not undone nor asked again for this
                _log.error("drain_generation_not_recorded", node=action.node, error=str(exc))
        return result


def _gpu_of(attempt: Attempt) -> tuple[str, str]:
    """The GPU slot (PCI bus id) and UUID the decision's event names, if it names one."""
    if attempt.decision is None:
        return "", ""
    attrs = attempt.decision.event.attrs
    return str(attrs.get("pci_bus_id") or ""), str(attrs.get("uuid") or "")


HANDLER = DrainHandler()
