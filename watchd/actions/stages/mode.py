"""Dry-run decides and records, and touches no node: it says what would happen instead, the safety limits
included (counted in a window of its own). Actions that touch no node (alerts, webhooks, logs) still run."""

from __future__ import annotations

from watchd.actions.gates import Safety
from watchd.actions.handler import Attempt
from watchd.actions.outcome import ActionResult, Outcome
from watchd.actions.safety import Verdict
from watchd.actions.stages import Next


class DryRun:
    def __init__(self, safety: Safety) -> None:
        self._safety = safety

    async def __call__(self, attempt: Attempt, next: Next) -> ActionResult:
        detail = attempt.handler.describe(attempt.action) if attempt.mode == "dry-run" else None
        if detail is None:
            return await next(attempt)
        if (
            attempt.handler.follows_drain
            and attempt.after_drain is not None
            and not self._safety.drain_counted(attempt)
        ):  # the drain it follows would have been held: this requeue would not happen, and is not counted
            return ActionResult(Outcome.DRY_RUN, f"{detail}; not counted: the drain it follows would be held")
        gate = self._safety.gate(attempt)
        verdict = gate() if gate is not None else Verdict(True)
        if not verdict.allowed:  # dry-run holds nothing and pages nobody
            detail += f"; the safety limits would hold it: {verdict.reason}"
        return ActionResult(Outcome.DRY_RUN, detail)
