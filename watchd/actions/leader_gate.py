"""Leadership as one gate: asked before every side effect (scheduler calls, commands to the agents, alerts,
webhooks).

:meth:`LeaderGate.refusal` waits (bounded) for leadership, then confirms it with the authority (for the
database lease: the fencing token is still current), so a leader deposed while it waited, or paused past its
lease (SIGSTOP, a partition) and resumed, does nothing. :meth:`LeaderGate.now` is the refusal every gated
port (:func:`watchd.port.gated`: the scheduler, the fleet, the check runner, the commands to the agents)
asks right before each call that changes the cluster: the last moment watchd controls, after the drain
batcher's round and the breaker's count."""

from __future__ import annotations

from watchd.integrations.leadership import AlwaysLeader, Leadership
from watchd.model.commands import CommandResult
from watchd.port import Verb, table

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


#: the commands to the agents as a port: each one is asked through the gate right before it is queued, so a
#: deposed leader queues nothing (and hands nothing out: the command routes answer only while leading)
COMMAND_VERBS = table(
    Verb(
        "run",
        changes=True,
        capability="commands",
        what=lambda command, timeout_s, valid=None: f"{command.kind} on {command.node}",
        refused=lambda why, command, timeout_s, valid=None: CommandResult(command.id, NOT_LEADER, why),
    ),
)
