"""spare: make a partition's hot spares these nodes (the engine's fleet view tops the pool up and trims it;
not a rule action)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.outcome import ActionResult, Outcome
from watchd.integrations.base import SchedulerError
from watchd.store import keys

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.rules.decision import PlannedAction


class SpareParams(ActionParams):
    """The spares a partition is to hold, and how they differ from what it held."""

    partition: str
    nodes: list[str] = Field(default_factory=list, description="in the order they were taken")
    taken: list[str] = Field(default_factory=list, description="idle nodes made spares")
    released: list[str] = Field(
        default_factory=list, description="spares handed back (over the count, unfit)"
    )


class SpareHandler(Handler):
    kind = "spare"
    params = SpareParams
    rule_action = False
    cooldown_s = 0.0  # one change per partition in flight; the next poll may change it again

    def key(self, action: PlannedAction) -> str:
        return keys.spares(str(action.params["partition"]))

    def describe(self, action: PlannedAction) -> str:
        return "would make " + _summary(action)

    def applies(self, runtime: Runtime) -> bool:
        return runtime.spares is not None

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        action = attempt.action
        if runtime.spares is None:
            return ActionResult(Outcome.SKIPPED, "no hot spares are configured")
        partition = str(action.params["partition"])
        nodes = names(action.params.get("nodes"))
        try:
            await runtime.spares.set_spares(partition, nodes)
        except SchedulerError as exc:
            return ActionResult(Outcome.FAILED, f"{_summary(action)}: {exc}")
        data = {
            "partition": partition,
            "spares": nodes,
            "taken": names(action.params.get("taken")),
            "released": names(action.params.get("released")),
        }
        return ActionResult(Outcome.CHANGED, _summary(action), data)


def names(value: object) -> list[str]:
    """A list parameter: a list of names, as the engine passes it, or the comma-joined form of the intents
    and audit records written before (and of an operator's call)."""
    if isinstance(value, list | tuple):
        return [str(n) for n in value if n]
    return [n for n in str(value or "").split(",") if n]


def _summary(action: PlannedAction) -> str:
    p = action.params
    text = f"spares of {p['partition']}: {', '.join(names(p.get('nodes'))) or 'none'}"
    if taken := names(p.get("taken")):
        text += f" (taken: {', '.join(taken)})"
    if released := names(p.get("released")):
        text += f" (released: {', '.join(released)})"
    return text


HANDLER = SpareHandler()
