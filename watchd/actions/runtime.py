"""What handlers run with: the scheduler (and its drain rounds), the alert keeper, the webhook sender, and the
engine's services that change the cluster through actions too (the hot spares, validation)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from watchd.actions.alerting import AlertKeeper
from watchd.actions.audit import AuditRecord
from watchd.actions.drain_batcher import DrainBatcher
from watchd.actions.outcome import ActionResult, Outcome
from watchd.clock import Clock
from watchd.engine.metrics import EngineMetrics
from watchd.integrations.base import Scheduler, SchedulerError
from watchd.integrations.webhook.sender import WebhookSender
from watchd.model.commands import Command, CommandResult, Validity
from watchd.model.validation import Validation
from watchd.store.intents import Intent
from watchd.store.node_records import NodeRecords

SchedulerCall = Callable[[Scheduler, DrainBatcher], Awaitable[ActionResult]]


class SparePool(Protocol):
    """The hot spares as the ``spare`` and ``spare_release`` actions change them (the engine's fleet
    view). Every call that changes the cluster raises SchedulerError when the scheduler refuses."""

    @property
    def configured(self) -> bool:
        """Whether any partition keeps spares."""
        ...

    async def set_spares(self, partition: str, nodes: Sequence[str]) -> None:
        """Make ``nodes`` the partition's spares."""
        ...

    async def release_for(self, node: str) -> tuple[str, str] | None:
        """Hand one spare of ``node``'s partition back to scheduling (for the jobs requeued off ``node``):
        (partition, spare), or None when none is held there. The pool is not topped up in that partition
        while the jobs wait (the ``spare_release`` action's result says which, and until when)."""
        ...


class Validator(Protocol):
    """Validation of a node watchd drained (the engine's checks)."""

    async def validate(self, node: str, round_id: str) -> Validation:
        """Run the validation suite inside what the runner sets up for it; return the node to service only
        if every check passed, else drain it again with the new evidence."""
        ...

    async def recover(self, node: str, round_id: str, reason: str | None) -> Validation:
        """A validation a crash interrupted: its checks still running are cancelled and no reservation is
        left. ``reason`` None: the node is drained, and stays as it is; else it is returned to service if
        every check of ``round_id`` had passed, and drained again with ``reason`` if not."""
        ...


class AuditReader(Protocol):
    def recent(self, limit: int = 100, node: str | None = None) -> list[AuditRecord]:
        """The last ``limit`` records (of ``node`` when given), oldest first."""
        ...

    def since(self, time: float, limit: int) -> list[AuditRecord]:
        """The records after ``time`` (at most the first ``limit`` of them), oldest first."""
        ...


class CommandPath(Protocol):
    """The engine's commands to the agents (:class:`~watchd.actions.agent_commands.AgentCommands`)."""

    async def run(self, command: Command, timeout_s: float, valid: Validity | None = None) -> CommandResult:
        """Queue ``command`` for its node's agent; its result, or the engine's own outcome when none came in
        ``timeout_s`` (``expired``, ``unanswered``), ``valid`` said its reason no longer held when the
        agent asked (``withdrawn``), or it could not be queued (``not_queued``)."""
        ...

    def last_poll_s(self, node: str) -> float | None:
        """Seconds since the agent of ``node`` last asked for its commands (None: never, since the start)."""
        ...


class IntentReader(Protocol):
    def under(self, key: str, limit: int = 100) -> list[Intent]:
        """The last ``limit`` intents under ``key``, finished or not, oldest first."""
        ...


@dataclass(slots=True)
class Runtime:
    scheduler: Scheduler | None
    batcher: DrainBatcher | None
    alerts: AlertKeeper
    webhooks: WebhookSender | None
    clock: Clock
    metrics: EngineMetrics
    generator_url: str = ""
    #: attached by the engine once its services exist (they submit actions to the executor in turn)
    spares: SparePool | None = None
    validation: Validator | None = None
    #: the hot spares' ``keep_for_requeued_s``: how long a spare released for requeued jobs stays theirs
    keep_spare_s: float = 600.0
    #: the audit trail, for the limits that count what was done before (automatic remediations per node)
    audit: AuditReader | None = None
    #: the intents, for what an action must find again when it is driven again (a command's stable id)
    intents: IntentReader | None = None
    #: the commands to the agents (a GPU reset), attached by the engine
    commands: CommandPath | None = None
    #: what is held of each node: remediations claimed, marks, watchd's drain generation
    nodes: NodeRecords | None = None

    async def scheduled(self, kind: str, call: SchedulerCall) -> ActionResult:
        """One call to the scheduler, timed (``watchd_action_duration_seconds``); a SchedulerError is the
        outcome ``failed`` with its message."""
        if self.scheduler is None or self.batcher is None:
            return ActionResult(Outcome.NO_SCHEDULER, "no scheduler adapter is enabled")
        start = self.clock.monotonic()
        try:
            result = await call(self.scheduler, self.batcher)
        except SchedulerError as exc:
            result = ActionResult(Outcome.FAILED, str(exc))
        self.metrics.action_duration.labels(kind).observe(self.clock.monotonic() - start)
        return result
