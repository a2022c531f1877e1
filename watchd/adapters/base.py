"""The scheduler interface the action executor talks to. One real and one fake implementation each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

DrainOutcome = Literal["drained", "already_drained", "skipped", "failed"]
ResumeOutcome = Literal["resumed", "not_drained", "refused", "failed"]

WATCHD_REASON_PREFIX = "watchd:"


def drain_reason(reason: str, prefix: str = WATCHD_REASON_PREFIX) -> str:
    """The reason as the scheduler will show it: one line, starting with watchd's prefix."""
    reason = " ".join(reason.split())  # one line: scontrol and sinfo -R show a single line
    return reason if reason.startswith(prefix) else f"{prefix} {reason}"


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    state: str  # base state, lower case: idle, allocated, mixed, down, unknown, ...
    flags: frozenset[str] = frozenset()  # upper case: DRAIN, NOT_RESPONDING, ...
    reason: str | None = None

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def down(self) -> bool:
        return self.state in ("down", "fail") or "FAIL" in self.flags


@dataclass(frozen=True, slots=True)
class DrainResult:
    node: str
    outcome: DrainOutcome
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ResumeResult:
    node: str
    outcome: ResumeOutcome
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RequeueResult:
    node: str
    requeued: tuple[str, ...] = ()
    not_requeueable: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)  # job id -> error

    @property
    def ok(self) -> bool:
        return not self.failed


class SchedulerError(Exception):
    """A scheduler call failed: the command, its exit status and stderr are in the message."""


class Scheduler(Protocol):
    """What watchd asks of a workload manager. Every method is safe to call twice (idempotent)."""

    name: str

    async def node_states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        """Current state of the named nodes; unknown names are left out."""
        ...

    async def drain(self, reasons: Mapping[str, str]) -> dict[str, DrainResult]:
        """Drain each node with its reason. A node already drained or down for a reason that does not
        carry watchd's prefix is never touched (outcome ``skipped``)."""
        ...

    async def requeue_jobs_on(self, node: str) -> RequeueResult:
        """Requeue the requeueable jobs running on ``node``; report the others."""
        ...

    async def resume(self, node: str) -> ResumeResult:
        """Return a node to service, only if watchd drained it (its reason carries watchd's prefix)."""
        ...
