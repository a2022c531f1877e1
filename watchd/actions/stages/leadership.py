"""Only the leader acts: every side effect waits (bounded) for leadership, or fails with nothing done."""

from __future__ import annotations

from watchd.actions.handler import Attempt
from watchd.actions.leader_gate import LeaderGate
from watchd.actions.outcome import ActionResult, Outcome
from watchd.actions.stages import Next


class Leadership:
    def __init__(self, gate: LeaderGate) -> None:
        self._gate = gate

    async def __call__(self, attempt: Attempt, next: Next) -> ActionResult:
        if attempt.handler.side_effect:
            action = attempt.action
            refusal = await self._gate.refusal(f"{action.kind} of {action.node}")
            if refusal is not None:
                # a re-drive finishes what an earlier run left: not done here, it stays for the leader
                return ActionResult(Outcome.INTERRUPTED if attempt.redrive else Outcome.FAILED, refusal)
        return await next(attempt)
