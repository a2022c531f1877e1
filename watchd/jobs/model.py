"""What a job provider reports: running jobs and where they run. One interface, several providers
(Slurm ``squeue --states=RUNNING``, Kubernetes pods, a fake for tests)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One running job as its scheduler sees it.

    ``id`` is the job's label: ``slurm:<job id>`` (the same label the agents put in ``gpu_summary.job``), or
    ``k8s:<namespace>/<name>`` of the owning Job/JobSet/PyTorchJob. ``aliases`` are the other labels agents
    report for it (``k8s:<pod uid>`` of each of its pods). ``ranks`` maps a node to the first global rank
    placed on it, when the provider knows it (empty otherwise)."""

    id: str
    nodes: tuple[str, ...]
    source: str  # "slurm", "kubernetes", ...
    partition: str | None = None
    name: str | None = None
    user: str | None = None
    start_time: float | None = None
    ranks: Mapping[str, int] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()


class JobProviderError(Exception):
    """A provider could not list jobs (scheduler down, API error): the message says why."""


@runtime_checkable
class JobProvider(Protocol):
    """Lists the jobs running now. A provider's answer replaces its previous one wholesale: a job it no
    longer lists has finished (or been requeued) there."""

    name: str

    async def running_jobs(self) -> list[JobInfo]:
        """Raises JobProviderError when the jobs cannot be listed."""
        ...


@runtime_checkable
class OffersJobs(Protocol):
    """A scheduler that is not itself a JobProvider but knows the ones behind it (routing, the leader guard,
    Kubernetes whose jobs come from its pods)."""

    def job_providers(self) -> list[JobProvider]: ...


def job_providers_of(scheduler: Any) -> list[JobProvider]:
    """The job lists a configured scheduler offers: itself, the ones it names, or none."""
    if isinstance(scheduler, OffersJobs):
        return scheduler.job_providers()
    if isinstance(scheduler, JobProvider):
        return [scheduler]
    return []
