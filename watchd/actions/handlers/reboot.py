"""reboot: reboot a node watchd drained, once it runs no job, so that it comes back out of service; the
engine sees it return (a new boot) and validates it, and only a pass puts it back in service.

Slurm: ``scontrol reboot ASAP nextstate=DOWN Reason="watchd: ..."`` (no job starts there meanwhile, a
running one ends first, and the node comes back DOWN with the reason). Kubernetes: the node annotation
``watchd.io/reboot-requested`` for the site's reboot daemon. At most ``max_per_node`` automatic remediations
of a node in ``window``: beyond, it is left for a person (outcome ``left_for_a_person``; the shipped rules
page). Asked again while its reboot is pending (a re-drive after a crash), it asks nothing more: a node is
never rebooted twice for one request."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from watchd.actions.handlers.remediation_guard import RemediationGuard, RemediationHandler, RemediationParams
from watchd.actions.outcome import ActionResult, Outcome
from watchd.model.nodes import down_by_watchd, drain_reason

if TYPE_CHECKING:
    from watchd.actions.drain_batcher import DrainBatcher
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.integrations.base import Scheduler
    from watchd.rules.decision import PlannedAction

_OUTCOMES = {
    "rebooting": Outcome.REBOOTING,
    "not_drained": Outcome.NOT_DRAINED,
    "refused": Outcome.REFUSED,
    "failed": Outcome.FAILED,
}


_GUARD = RemediationGuard("a reboot", "not rebooted")


class RebootParams(RemediationParams):
    """Reboot the node once it runs no job; it comes back out of service and is validated."""

    reason: str = Field("reboot after {{ kind }}", description="template; the node's reason until it is back")


class RebootHandler(RemediationHandler):
    kind = "reboot"
    params = RebootParams

    def describe(self, action: PlannedAction) -> str:
        return f"would reboot {action.node} once idle: {drain_reason(str(action.params.get('reason', '')))}"

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        node, params = attempt.action.node, attempt.action.params
        if (unvalidated := _GUARD.unvalidated(runtime)) is not None:
            return unvalidated
        claim = _GUARD.claim(attempt, runtime, self.key(attempt.action))
        if isinstance(claim, ActionResult):
            return claim
        reason = str(params.get("reason", ""))

        async def call(scheduler: Scheduler, _: DrainBatcher) -> ActionResult:
            data: dict[str, Any] = {"requested_at": attempt.now}
            if attempt.redrive:  # asked before a crash? then pending, or back down from it: never again
                st = (await scheduler.node_states([node])).get(node)
                if st is not None and (st.reboot_pending or down_by_watchd(st)):
                    data["boot_id"] = st.boot_id if st.reboot_pending else None
                    return ActionResult(Outcome.REBOOTING, "asked before the engine restarted", data)
            if (marked := _GUARD.still_unmarked(node, runtime)) is not None:
                return marked
            result = await scheduler.reboot(node, reason)
            if result.outcome == "rebooting":
                data["boot_id"] = result.boot_id
            return ActionResult(_OUTCOMES[result.outcome], result.detail, data)

        result = await runtime.scheduled(self.kind, call)
        _GUARD.settle(runtime, claim, result)
        return result


HANDLER = RebootHandler()
