"""The scheduler interface the action executor talks to. One real and one fake implementation each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

DrainOutcome = Literal["drained", "already_drained", "skipped", "failed", "held"]
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


def describe(st: NodeState) -> str:
    """A node's state as scontrol shows it, e.g. ``IDLE+DRAIN``."""
    return "+".join([st.state.upper(), *sorted(st.flags)])


def drained_by_watchd(st: NodeState, prefix: str = WATCHD_REASON_PREFIX) -> bool:
    return st.drained and st.reason is not None and st.reason.startswith(prefix)


def plan_drain(
    reasons: Mapping[str, str], states: Mapping[str, NodeState], prefix: str = WATCHD_REASON_PREFIX
) -> tuple[dict[str, DrainResult], dict[str, list[str]]]:
    """The safety decision every scheduler shares, before it touches anything.

    Returns the nodes settled without a change (unknown, already drained by watchd, or drained or down for
    someone else's reason: never touched) and the nodes to drain, grouped by their final reason."""
    settled: dict[str, DrainResult] = {}
    groups: dict[str, list[str]] = {}
    for node, reason in reasons.items():
        st = states.get(node)
        if st is None:
            settled[node] = DrainResult(node, "failed", "unknown node")
        elif drained_by_watchd(st, prefix):
            settled[node] = DrainResult(node, "already_drained", st.reason or "")
        elif st.drained or st.down:
            settled[node] = DrainResult(
                node, "skipped", f"node is {describe(st)} for reason {st.reason!r}, not set by watchd"
            )
        else:
            groups.setdefault(drain_reason(reason, prefix), []).append(node)
    return settled, groups


def refuse_resume(st: NodeState | None, node: str, prefix: str = WATCHD_REASON_PREFIX) -> ResumeResult | None:
    """Why a node must not be resumed by watchd, or None when it may (watchd drained it)."""
    if st is None:
        return ResumeResult(node, "failed", "unknown node")
    if not st.drained:
        return ResumeResult(node, "not_drained", describe(st))
    if not drained_by_watchd(st, prefix):
        return ResumeResult(node, "refused", f"drained by someone else: {st.reason!r}")
    return None


def job_selected(job: str | None, *names: str) -> bool:
    """Whether a job known by ``names`` (its labels, e.g. ``1234`` and ``slurm:1234``) is the ``job`` a
    requeue is limited to (every job when None)."""
    return job is None or job in names


class SchedulerError(Exception):
    """A scheduler call failed: the command, its exit status and stderr are in the message."""


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

    async def requeue_jobs_on(self, node: str, job: str | None = None) -> RequeueResult:
        """Requeue the requeueable jobs running on ``node`` (only ``job`` when given: its id as watchd
        labels it, ``slurm:1234`` or ``k8s:<namespace>/<name>``, or bare); report the others."""
        ...

    async def resume(self, node: str) -> ResumeResult:
        """Return a node to service, only if watchd drained it (its reason carries watchd's prefix)."""
        ...
