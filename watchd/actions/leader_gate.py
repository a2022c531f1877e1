"""Leadership as one gate: asked before every side effect (scheduler calls, commands to the agents, alerts,
webhooks).

:meth:`LeaderGate.refusal` waits (bounded) for leadership, then confirms it with the authority (for the
database lease: the fencing token is still current), so a leader deposed while it waited, or paused past its
lease (SIGSTOP, a partition) and resumed, does nothing. :class:`GatedScheduler` asks the gate again right
before each call that changes the cluster (drain, requeue, resume, reboot): the last moment watchd controls,
after the drain batcher's round and the breaker's count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from watchd.integrations.base import (
    DrainResult,
    NodeState,
    Privileges,
    RebootResult,
    RequeueResult,
    ResumeResult,
    Scheduler,
)
from watchd.integrations.leadership import AlwaysLeader, Leadership
from watchd.model.commands import Command, CommandResult, Validity

#: the outcome of a command a deposed leader did not queue
NOT_LEADER = "not_leader"


class LeaderGate:
    def __init__(self, leadership: Leadership | None = None) -> None:
        self.leadership: Leadership = leadership or AlwaysLeader()

    async def refusal(self, what: str) -> str | None:
        """None once this engine leads (waiting up to the takeover time) and the authority confirms it;
        otherwise why ``what`` was not done."""
        lead = self.leadership
        if await lead.wait_leader(lead.takeover_wait_s) and await lead.confirm():
            return None
        return self._refused(what)

    async def now(self, what: str) -> str | None:
        """Right before acting, without waiting: None when the authority confirms this engine leads now."""
        if await self.leadership.confirm():
            return None
        return self._refused(what)

    def _refused(self, what: str) -> str:
        holder = self.leadership.holder or "nobody"
        return f"{what}: not the leader (the lease is held by {holder}); nothing done"


class GatedScheduler:
    """``scheduler`` with every change (drain, requeue, resume) asked through the gate right before the call;
    a refused change fails with the reason and touches nothing. Reads pass through."""

    def __init__(self, scheduler: Scheduler, gate: LeaderGate) -> None:
        self.inner = scheduler
        self.name = scheduler.name
        self._gate = gate

    async def node_states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        return await self.inner.node_states(nodes)

    async def pools(self) -> dict[str, list[str]]:
        return await self.inner.pools()

    async def privileges(self) -> Privileges:
        return await self.inner.privileges()

    async def drain(
        self, reasons: Mapping[str, str], states: Mapping[str, NodeState] | None = None
    ) -> dict[str, DrainResult]:
        refusal = await self._gate.now(f"drain of {', '.join(sorted(reasons))}")
        if refusal is not None:
            return {node: DrainResult(node, "failed", refusal) for node in reasons}
        return await self.inner.drain(reasons, states)

    async def requeue_jobs_on(self, node: str, job: str | None = None) -> RequeueResult:
        refusal = await self._gate.now(f"requeue on {node}")
        if refusal is not None:
            return RequeueResult(node, failed={job or "*": refusal})
        return await self.inner.requeue_jobs_on(node, job)

    async def resume(self, node: str) -> ResumeResult:
        refusal = await self._gate.now(f"resume of {node}")
        if refusal is not None:
            return ResumeResult(node, "failed", refusal)
        return await self.inner.resume(node)

    async def reboot(self, node: str, reason: str) -> RebootResult:
        refusal = await self._gate.now(f"reboot of {node}")
        if refusal is not None:
            return RebootResult(node, "failed", refusal)
        return await self.inner.reboot(node, reason)


class CommandPathLike(Protocol):
    async def run(
        self, command: Command, timeout_s: float, valid: Validity | None = None
    ) -> CommandResult: ...

    def last_poll_s(self, node: str) -> float | None: ...


class GatedCommands:
    """The commands to the agents with each one asked through the gate right before it is queued: a deposed
    leader queues nothing (and hands nothing out: the command routes answer only while leading)."""

    def __init__(self, commands: CommandPathLike, gate: LeaderGate) -> None:
        self.inner = commands
        self._gate = gate

    async def run(self, command: Command, timeout_s: float, valid: Validity | None = None) -> CommandResult:
        refusal = await self._gate.now(f"{command.kind} on {command.node}")
        if refusal is not None:
            return CommandResult(command.id, NOT_LEADER, refusal)
        return await self.inner.run(command, timeout_s, valid)

    def last_poll_s(self, node: str) -> float | None:
        return self.inner.last_poll_s(node)
