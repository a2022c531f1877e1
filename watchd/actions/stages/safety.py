"""The safety limits of disruptive actions (the rule's rate limit and the blast-radius breaker); beyond them
the action is held for an operator, an alert fires, and everything else goes on."""

from __future__ import annotations

from watchd.actions.gates import Safety, held_pool
from watchd.actions.handler import Attempt
from watchd.actions.held import Hold
from watchd.actions.outcome import ActionResult, Outcome
from watchd.actions.stages import Next


class SafetyLimits:
    def __init__(self, safety: Safety, hold: Hold) -> None:
        self._safety = safety
        self._hold = hold

    async def __call__(self, attempt: Attempt, next: Next) -> ActionResult:
        attempt.gate = gate = self._safety.gate(attempt)
        if gate is not None and not attempt.handler.gate_at_dispatch and not (verdict := gate()).allowed:
            result = ActionResult(Outcome.HELD, verdict.reason)
        else:
            result = await next(attempt)
        if result.outcome == Outcome.HELD:
            return self._hold(attempt, result.detail, held_pool(gate))
        return result
