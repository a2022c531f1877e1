"""validate: run the checks' validation suite on a node watchd drained, and return it to service only on a
pass (else it stays drained with the new evidence). Started by an operator (``watchd node validate``) or by
``checks.auto_validate``; not a rule action.

Its steps change the cluster more than once (Slurm: a maintenance reservation, the drain lifted, the checks,
then the resume or a new drain), so a crash in between leaves work half done. Driven again from its intent
after a restart (or by the engine that took over the lead), it finds what the interrupted run left: every
check of its round passed -> the node is returned to service; anything else -> the drain is put back (its
checks still running are cancelled), and the reservation is removed either way. A node is never in service
without a pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from watchd.actions.handler import ActionParams, Handler
from watchd.actions.handlers.resume import refuse_marked
from watchd.actions.outcome import ActionResult, Outcome
from watchd.integrations.base import SchedulerError
from watchd.model.nodes import WATCHD_REASON_PREFIX, down_by_watchd, drained_by_watchd
from watchd.model.validation import Validation
from watchd.store import keys

if TYPE_CHECKING:
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.rules.decision import PlannedAction

#: the drain reason when a restart interrupted a validation after the drain was lifted
INTERRUPTED = "validate interrupted: an engine restart came before every check passed"

_OUTCOMES = {
    "resumed": Outcome.RESUMED,
    "drained": Outcome.DRAINED,
    "refused": Outcome.REFUSED,
    "failed": Outcome.FAILED,
    "interrupted": Outcome.INTERRUPTED,
    "not_checked": Outcome.NOT_CHECKED,
}


class ValidateParams(ActionParams):
    """The round its check runs are recorded under (how a restart finds them again)."""

    round: str = Field(..., description="validate:<id>")


class ValidateHandler(Handler):
    kind = "validate"
    params = ValidateParams
    rule_action = False
    cooldown_s = 0.0  # one validation of a node at a time; the operator may validate again right after

    def key(self, action: PlannedAction) -> str:
        return keys.action(self.kind, action.node)

    def describe(self, action: PlannedAction) -> str:
        return f"would validate {action.node} (the checks' suite; back in service only if every check passes)"

    def applies(self, runtime: Runtime) -> bool:
        return runtime.validation is not None

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        node, round_id = attempt.action.node, str(attempt.action.params["round"])
        validation = runtime.validation
        if validation is None:
            return ActionResult(Outcome.NO_CHECKS, "checks are not enabled (checks.enabled)")
        if runtime.scheduler is None:
            return ActionResult(Outcome.NO_SCHEDULER, "no scheduler is configured")
        try:
            st = (await runtime.scheduler.node_states([node])).get(node)
        except SchedulerError as exc:
            return ActionResult(Outcome.FAILED, str(exc))
        if not attempt.redrive and (marked := refuse_marked(node, runtime)) is not None:
            return marked  # a pass would return it to service: a lemon stays out until its mark is cleared
        if attempt.redrive:
            # drained (the drain never lifted, or someone drained it since): it stays as it is
            reason = None if st is None or st.drained else INTERRUPTED
            return _result(await validation.recover(node, round_id, reason), round_id)
        if st is None:
            return ActionResult(Outcome.FAILED, "unknown node")
        if down_by_watchd(st) and runtime.batcher is not None:
            # back from a reboot watchd asked for, down: drained again first, as validation expects it
            again = await runtime.batcher.drain(node, st.reason or "")
            if again.outcome != Outcome.DRAINED:
                return ActionResult(
                    Outcome.FAILED, f"could not drain it again after its reboot: {again.detail}"
                )
            st = (await runtime.scheduler.node_states([node])).get(node) or st
        if not st.drained:
            return ActionResult(Outcome.NOT_DRAINED, "the node is in service: `watchd checks run` checks it")
        if not drained_by_watchd(st, WATCHD_REASON_PREFIX):
            return ActionResult(Outcome.REFUSED, f"drained by someone else: {st.reason!r}")
        v = await validation.validate(node, round_id)
        if v.done == "resumed":
            v = Validation(v.done, v.passed, f"{v.detail}, was: {st.reason}", v.results)
        return _result(v, round_id)


def _result(v: Validation, round_id: str) -> ActionResult:
    data = {"round": round_id, "passed": v.passed, "results": [dict(r) for r in v.results]}
    return ActionResult(_OUTCOMES[v.done], v.detail, data)


HANDLER = ValidateHandler()
