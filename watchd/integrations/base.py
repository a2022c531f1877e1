"""The scheduler interface the action executor talks to. One real and one fake implementation each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

# the node results every scheduler returns (DrainResult, ResumeResult, NodeState) are vocabulary; they are
# named here too because the Scheduler protocol speaks them
from watchd.model.nodes import DrainResult as DrainResult
from watchd.model.nodes import NodeState as NodeState
from watchd.model.nodes import RebootResult as RebootResult
from watchd.model.nodes import ResumeResult as ResumeResult
from watchd.model.nodes import plan_drain
from watchd.port import Verb, table


@dataclass(frozen=True, slots=True)
class RequeueResult:
    node: str
    requeued: tuple[str, ...] = ()
    not_requeueable: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)  # job id -> error

    @property
    def ok(self) -> bool:
        return not self.failed


def job_selected(job: str | None, *names: str) -> bool:
    """Whether a job known by ``names`` (its labels, e.g. ``1234`` and ``slurm:1234``) is the ``job`` a
    requeue is limited to (every job when None)."""
    return job is None or job in names


class SchedulerError(Exception):
    """A scheduler call failed: the command, its exit status and stderr are in the message."""


@dataclass(frozen=True, slots=True)
class Privileges:
    """``allowed``: True, False, or None when it could not be told; ``detail``: who the engine is to the
    scheduler, and what to do about a refusal."""

    allowed: bool | None
    detail: str


class Scheduler(Protocol):
    """What watchd asks of a workload manager. Every method is safe to call twice (idempotent)."""

    name: str

    async def node_states(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        """Current state of the named nodes; unknown names are left out."""
        ...

    async def pools(self) -> dict[str, list[str]]:
        """Each pool (Slurm partition) and its member nodes: the blast-radius breaker counts per pool."""
        ...

    async def drain(
        self, reasons: Mapping[str, str], states: Mapping[str, NodeState] | None = None
    ) -> dict[str, DrainResult]:
        """Drain each node with its reason. A node already drained or down for a reason that does not
        carry watchd's prefix is never touched (outcome ``skipped``). ``states``: node states the caller
        has just read (saves reading them again)."""
        ...

    async def apply_drain(self, groups: Mapping[str, Sequence[str]]) -> dict[str, DrainResult]:
        """Drain the nodes of a drain already planned (:func:`~watchd.model.nodes.plan_drain`, once, by the
        drain batcher): each group's nodes with its reason (final: watchd's prefix on it). Every node named
        is drained; a result for each."""
        ...

    async def requeue_jobs_on(self, node: str, job: str | None = None) -> RequeueResult:
        """Requeue the requeueable jobs running on ``node`` (only ``job`` when given: its id as watchd
        labels it, ``slurm:1234`` or ``k8s:<namespace>/<name>``, or bare); report the others."""
        ...

    async def resume(self, node: str) -> ResumeResult:
        """Return a node to service, only if watchd drained it (its reason carries watchd's prefix)."""
        ...

    async def reboot(self, node: str, reason: str) -> RebootResult:
        """Ask for ``node`` to be rebooted as soon as it runs no job, and to come back out of service with
        ``reason``: only a node watchd drained (its reason carries watchd's prefix). Asked again while the
        reboot is pending, it asks nothing more (``rebooting``)."""
        ...

    async def privileges(self) -> Privileges:
        """Whether the scheduler would let this engine change the cluster (drain, resume, requeue anyone's
        job, reservations or taints), found out without changing anything."""
        ...


#: the Scheduler's verbs: the reads, and the changes each asked through the gate right before the call (a
#: refused change fails with the reason and touches nothing)
SCHEDULER_VERBS = table(
    Verb("node_states"),
    Verb("pools"),
    Verb("privileges"),
    Verb(
        "drain",
        changes=True,
        capability="drain",
        what=lambda reasons, states=None: f"drain of {', '.join(sorted(reasons))}",
        refused=lambda why, reasons, states=None: {n: DrainResult(n, "failed", why) for n in reasons},
    ),
    Verb(
        "apply_drain",
        changes=True,
        capability="drain",
        what=lambda groups: f"drain of {', '.join(sorted(n for names in groups.values() for n in names))}",
        refused=lambda why, groups: {n: DrainResult(n, "failed", why) for ns in groups.values() for n in ns},
    ),
    Verb(
        "requeue_jobs_on",
        changes=True,
        capability="requeue",
        what=lambda node, job=None: f"requeue on {node}",
        refused=lambda why, node, job=None: RequeueResult(node, failed={job or "*": why}),
    ),
    Verb(
        "resume",
        changes=True,
        capability="resume",
        what=lambda node: f"resume of {node}",
        refused=lambda why, node: ResumeResult(node, "failed", why),
    ),
    Verb(
        "reboot",
        changes=True,
        capability="reboot",
        what=lambda node, reason: f"reboot of {node}",
        refused=lambda why, node, reason: RebootResult(node, "failed", why),
    ),
)


async def plan_and_drain(
    scheduler: Scheduler, reasons: Mapping[str, str], states: Mapping[str, NodeState] | None, prefix: str
) -> dict[str, DrainResult]:
    """A scheduler's :meth:`~Scheduler.drain`: the nodes' states (read unless given), the plan, and its
    :meth:`~Scheduler.apply_drain` for the nodes the plan drains."""
    if not reasons:
        return {}
    if states is None:
        states = await scheduler.node_states(list(reasons))
    results, groups = plan_drain(reasons, states, prefix)
    if groups:
        results.update(await scheduler.apply_drain(groups))
    return {n: results[n] for n in reasons}


class PlannedDrain:
    """A scheduler's :meth:`~Scheduler.drain` as :func:`plan_and_drain` over its own ``apply_drain``."""

    reason_prefix: str

    async def drain(
        self, reasons: Mapping[str, str], states: Mapping[str, NodeState] | None = None
    ) -> dict[str, DrainResult]:
        return await plan_and_drain(cast(Scheduler, self), reasons, states, self.reason_prefix)
