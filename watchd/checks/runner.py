"""Where checks run: one small protocol, a real runner per scheduler (Slurm: ``sbatch`` pinned to the node;
Kubernetes: a Job pinned to the node) and a faithful fake, built by name (:mod:`watchd.checks.registry`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from watchd.port import Verb, table

__all__ = [
    "RUNNER_VERBS",
    "Availability",
    "CheckJob",
    "CheckRunner",
    "JobHandle",
    "JobStatus",
    "RunOutput",
    "RunnerError",
]

JobStatus = Literal["completed", "failed", "timeout", "cancelled", "node_fail", "not_started", "lost"]


class RunnerError(Exception):
    """The scheduler could not be asked (the command failed, timed out, or answered something unreadable)."""


@dataclass(frozen=True, slots=True)
class CheckJob:
    check: str
    node: str
    argv: tuple[str, ...]
    time_limit_s: float
    run_id: str  # unique per run: names the job and its output file
    partition: str | None = None
    validation: bool = False  # runs inside the node's validation reservation
    peers: tuple[str, ...] = ()  # the other nodes of a multi-node run (nccl-pair): one job over all

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node, *self.peers)


@dataclass(frozen=True, slots=True)
class JobHandle:
    run_id: str
    node: str
    job_id: str  # the scheduler's id (Slurm job id, Kubernetes Job name)
    output: str = ""  # where the output is collected from (a path, a pod)
    submitted_at: float = 0.0
    time_limit_s: float = 0.0
    #: a secret the job prints first, binding its output to it (Slurm); kept with the run across restarts
    nonce: str = ""
    #: the other nodes of a multi-node run: one taken by another job before the run starts ends the wait
    #: (``not_started``) rather than holding it for the whole time limit
    peers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RunOutput:
    status: JobStatus
    output: str = ""
    exit_code: int | None = None
    detail: str = ""  # the scheduler's words (state, reason) when it did not complete
    duration_s: float | None = None
    job_id: str | None = None
    #: why the job's output was not taken (``check output refused: ...``: not the job's own, e.g. another
    #: user's file, a link, a FIFO; ``check output unreadable: ...``): the run can only be an ``error``
    unread: str = ""


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether a node may be checked now, and why not."""

    idle: bool
    why: str = ""
    partitions: tuple[str, ...] = ()
    drained_by_watchd: bool = False
    extra: Mapping[str, str] = field(default_factory=dict)


class CheckRunner(Protocol):
    name: str

    async def members(self, partitions: Sequence[str]) -> dict[str, list[str]]:
        """Each named partition (pool) and its nodes; every partition when ``partitions`` is empty."""
        ...

    async def availability(self, nodes: Sequence[str], within_s: float) -> dict[str, Availability]:
        """Whether each node is idle for a check lasting up to ``within_s``: Slurm: idle, not drained, not
        reserved now or within ``within_s``, no job on it or starting; Kubernetes: schedulable, no GPU pod."""
        ...

    async def submit(self, job: CheckJob) -> JobHandle:
        """Start ``job`` on its node (and its peers: one job over all of them); RunnerError when the
        scheduler refuses."""
        ...

    async def wait(self, handle: JobHandle) -> RunOutput:
        """Until the job ends (the runner enforces the time limit plus a grace: then it cancels the job and
        answers ``timeout``); its output, collected from the job."""
        ...

    async def cancel(self, handle: JobHandle) -> None: ...

    async def begin_validation(self, node: str, time_limit_s: float) -> None:
        """Make a node watchd drained runnable for its checks and for nothing else (Slurm: a maintenance
        reservation admitting only watchd's user, then the drain lifted)."""
        ...

    async def end_validation(self, node: str, passed: bool, reason: str) -> str:
        """Return the node to service (``passed``) or drain it again with ``reason``; undo what
        :meth:`begin_validation` did either way. Answers what was done (``resumed`` | ``drained``)."""
        ...

    async def abandon_validation(self, node: str) -> None:
        """Undo what :meth:`begin_validation` did and nothing else (the node was never let out of its drain,
        or is drained again): Slurm: the reservation removed."""
        ...

    async def lend(self, node: str, partners: Sequence[str]) -> None:
        """Let ``partners`` run in ``node``'s validation beside it (a pair check with a known-good node):
        Slurm: its reservation covers them too; ``()``: the node alone again. RunnerError where the runner
        cannot (Kubernetes: pair checks are Slurm's only)."""
        ...


def _runner_refused(why: str, *_args: object) -> None:
    raise RunnerError(why)


def _change(name: str, what: Callable[..., str]) -> Verb:
    return Verb(name, True, "validation", what, _runner_refused)


#: the check runner's verbs: every change validation makes to the cluster (the reservation and the lifted
#: drain, its checks' jobs, the resume or the new drain, a cancel) is asked through the gate right before
#: the call (refused, it raises RunnerError and touches nothing); reads and the checks of scheduled rounds
#: pass through
RUNNER_VERBS = table(
    Verb("members"),
    Verb("availability"),
    Verb("wait"),
    Verb(
        "submit",
        changes=True,
        capability="validation",
        what=lambda job: f"validation check {job.check} on {job.node}",
        refused=_runner_refused,
        asks=lambda job: bool(job.validation),  # a scheduled round's check is no change validation makes
    ),
    _change("cancel", lambda handle: f"cancel of check job {handle.job_id}"),
    _change("begin_validation", lambda node, time_limit_s: f"validation of {node}"),
    _change("end_validation", lambda node, passed, reason: f"end of the validation of {node}"),
    _change("abandon_validation", lambda node: f"end of the validation of {node}"),
    _change(
        "lend",
        lambda node, partners: f"{', '.join(partners) or 'no node'} lent to the validation of {node}",
    ),
)
