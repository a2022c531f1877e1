"""gpu_reset: reset a GPU of a node watchd drained, once the node runs no job, through the node's own agent
(``nvidia-smi --gpu-reset``: the agent refuses while any process holds the GPU). The node stays out of
service; once the agent reports the reset done the engine announces ``node_gpu_reset`` and, with
``checks.auto_validate`` naming it (the default), validation returns the node to service only on a pass.

Like ``reboot``: only a node watchd drained (never someone else's drain), at most ``max_per_node``
automatic remediations of a node in ``window`` (reboots and resets together, held in the node's record),
never a marked node (a lemon, or one left for a person), nothing without checks to validate it after. A
node that still runs a job after
``wait_idle`` (one that could not be requeued): the node stays drained, left for a person
(``left_for_a_person``; the shipped rules page). An agent that refuses or fails the reset, or one that does
not answer within ``timeout``: ``not_reset``, the node stays drained and the rules say what next (the shipped
pack reboots it).

The command the engine queues for the agent has an id derived from the action's intent, so a re-drive after
a ``kill -9`` of the engine asks with the same id, and the agent, which runs an id at most once, answers what
it remembers; an agent restarted without that memory refuses the command, which the engine bound to the
agent's earlier run (:mod:`watchd.actions.agent_commands`): a GPU is never reset twice for one decision."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from pydantic import Field

from watchd.actions.handlers.remediation_guard import RemediationGuard, RemediationHandler, RemediationParams
from watchd.actions.outcome import ActionResult, Outcome
from watchd.model.commands import (
    DONE,
    FAILED,
    GPU_RESET,
    REFUSED,
    WITHDRAWN,
    Command,
    CommandResult,
    Validity,
)
from watchd.model.durations import Duration
from watchd.model.events import stable_id
from watchd.model.nodes import NodeState, describe, drained_by_watchd, refuse_reboot
from watchd.xid.pci import normalize_pci

if TYPE_CHECKING:
    from watchd.actions.drain_batcher import DrainBatcher
    from watchd.actions.handler import Attempt
    from watchd.actions.runtime import Runtime
    from watchd.integrations.base import Scheduler
    from watchd.rules.decision import PlannedAction

#: seconds between two reads of the node's state while its jobs end
IDLE_POLL_S = 2.0
#: job states of a node (Slurm's): it runs a job, or one is ending there
_BUSY_STATES = frozenset({"allocated", "mixed", "completing"})
_REFUSALS = {"not_drained": Outcome.NOT_DRAINED, "refused": Outcome.REFUSED, "failed": Outcome.FAILED}
_GUARD = RemediationGuard("a GPU reset", "not reset")


class GpuResetParams(RemediationParams):
    """Reset the node's GPU through its agent once the node runs no job; then it is validated."""

    gpu: str = Field(
        "",
        description="template: the PCI bus id of the GPU to reset, e.g. {{ pci_bus_id }}; empty: every GPU "
        "of the node",
    )
    wait_idle: Duration = Field(
        600.0,
        description="how long the node's jobs may take to end (after the requeue); then left for a person",
    )
    timeout: Duration = Field(
        600.0, description="how long the agent may take to fetch the command and report the reset"
    )


def runs_a_job(st: NodeState) -> bool:
    """Whether the scheduler says a job runs (or is ending) on the node (Slurm: ALLOCATED, MIXED,
    COMPLETING). A scheduler whose node states do not say (Kubernetes: ready/notready) reads as False: the
    agent's own check (no process holds the GPU) is then what guards the job."""
    return st.state in _BUSY_STATES or "COMPLETING" in st.flags


class GpuResetHandler(RemediationHandler):
    kind = GPU_RESET
    params = GpuResetParams

    def describe(self, action: PlannedAction) -> str:
        gpu = str(action.params.get("gpu") or "") or "every GPU"
        return f"would reset {gpu} of {action.node} through its agent once idle"

    async def run(self, attempt: Attempt, runtime: Runtime) -> ActionResult:
        node, params = attempt.action.node, attempt.action.params
        if (unvalidated := _GUARD.unvalidated(runtime)) is not None:
            return unvalidated
        if runtime.commands is None:
            return ActionResult(Outcome.FAILED, "this engine has no command path to its agents")
        gpu_text = str(params.get("gpu") or "").strip()
        gpu = normalize_pci(gpu_text) if gpu_text else ""
        if gpu is None:
            return ActionResult(Outcome.FAILED, f"gpu: {gpu_text!r} is not a PCI bus id (e.g. 0000:3b:00.0)")
        claim = _GUARD.claim(attempt, runtime, self.key(attempt.action))
        if isinstance(claim, ActionResult):
            return claim
        command_id, requested_at = self._command_id(attempt, runtime)
        args = {"gpu": gpu, "drain_generation": str(claim.generation)}
        command = Command(command_id, node, GPU_RESET, args, issued_at=requested_at)
        commands = runtime.commands
        wait_idle = float(params.get("wait_idle", 600.0))
        timeout = float(params.get("timeout", 600.0))

        async def call(scheduler: Scheduler, _: DrainBatcher) -> ActionResult:
            refusal = await _wait_until_idle(scheduler, node, wait_idle, runtime)
            if refusal is not None:
                return refusal
            if (marked := _GUARD.still_unmarked(node, runtime)) is not None:
                return marked
            answer = await commands.run(
                command, timeout, reason_holds(scheduler, node, claim.generation, runtime)
            )
            return _result(answer, command, requested_at)

        result = await runtime.scheduled(self.kind, call)
        _GUARD.settle(runtime, claim, result)
        return result

    def _command_id(self, attempt: Attempt, runtime: Runtime) -> tuple[str, float]:
        """The command's id and when the reset was decided, from the action's open intent: the same for
        every re-drive of it (the agent then recognises the id it ran)."""
        key = self.key(attempt.action)
        found = runtime.intents.under(key, limit=1) if runtime.intents is not None else []
        if found and found[-1].finished_at is None:
            intent = found[-1]
            return f"gpu-reset-{stable_id(intent.key, intent.id, repr(intent.decided_at))}", intent.decided_at
        return f"gpu-reset-{stable_id(key, attempt.event_id, repr(attempt.now))}", attempt.now


async def _wait_until_idle(
    scheduler: Scheduler, node: str, wait_s: float, runtime: Runtime
) -> ActionResult | None:
    """None once the scheduler says the node (drained by watchd) runs no job; else the outcome: refused as a
    reboot would be (not drained, someone else's drain), or left for a person after ``wait_s``."""
    clock = runtime.clock
    start, polls = clock.monotonic(), 0
    while True:
        st = (await scheduler.node_states([node])).get(node)
        refusal = refuse_reboot(st, node)
        if refusal is not None:
            return ActionResult(_REFUSALS[refusal.outcome], refusal.detail)
        assert st is not None
        if st.reboot_pending or st.down:
            return ActionResult(Outcome.REFUSED, f"the node is {describe(st)}: not reset")
        if not runs_a_job(st):
            return None
        # a fake clock in tests does not move: the polls count the time too
        waited = max(clock.monotonic() - start, polls * IDLE_POLL_S)
        if waited >= wait_s:
            return ActionResult(
                Outcome.LEFT_FOR_A_PERSON,
                f"still runs a job after {waited:.0f} s ({describe(st)}; one that could not be requeued?): "
                "not reset, left for a person",
            )
        polls += 1
        await asyncio.sleep(IDLE_POLL_S)


def reason_holds(scheduler: Scheduler, node: str, generation: int, runtime: Runtime) -> Validity:
    """The check of a reset command, asked right before its agent first gets it: the node is still out of
    service by the drain it was decided under (or inside watchd's validation), runs no job, carries no
    mark. Raises SchedulerError when the scheduler cannot say (the command is then kept back)."""

    async def check() -> str | None:
        st = (await scheduler.node_states([node])).get(node)
        if st is None:
            return "the scheduler no longer knows the node"
        if runtime.nodes is not None:
            if marks := runtime.nodes.open_marks(node):
                return marks[0].describe()
            now = runtime.nodes.generation(node)
            if now != generation:
                return f"drained again by watchd since (drain {generation} -> {now}): its own decision acts"
        if not (drained_by_watchd(st) or in_validation(st)):
            why = f": {st.reason}" if st.reason else ""
            return (
                f"no longer out of service by watchd ({describe(st)}{why}): resumed, or someone else's drain"
            )
        if runs_a_job(st):
            return f"a job was put on it ({describe(st)})"
        return None

    return check


def in_validation(st: NodeState) -> bool:
    """Inside a maintenance reservation, as watchd's validation puts a node (its drain lifted): still out of
    service."""
    return "MAINT" in st.flags


def _result(answer: CommandResult, command: Command, requested_at: float) -> ActionResult:
    data: dict[str, Any] = {"command": command.id, "requested_at": requested_at, **answer.data}
    gpus = command.args.get("gpu") or "every GPU"
    if answer.outcome == DONE:
        reset = ", ".join(str(g) for g in answer.data.get("gpus", [])) or gpus
        return ActionResult(
            Outcome.RESET, f"{reset} of {command.node} reset by its agent: {answer.detail}", data
        )
    if answer.outcome in (REFUSED, FAILED):
        verb = "refused" if answer.outcome == REFUSED else "failed"
        detail = f"the agent {verb} the reset of {gpus}: {answer.detail}"
        return ActionResult(Outcome.NOT_RESET, detail, {**data, "agent": answer.outcome})
    if answer.outcome == WITHDRAWN:
        return ActionResult(Outcome.WITHDRAWN, answer.detail, {**data, "agent": answer.outcome})
    if answer.outcome in ("expired", "unanswered"):
        said = "no GPU reset" if answer.outcome == "expired" else "no GPU reset confirmed"
        detail = f"{said}: {answer.detail}"
        return ActionResult(Outcome.NOT_RESET, detail, {**data, "agent": answer.outcome})
    return ActionResult(Outcome.FAILED, answer.detail, data)  # not queued, not the leader: tried again later


HANDLER = GpuResetHandler()
