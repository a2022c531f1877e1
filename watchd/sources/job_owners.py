"""Whose a Slurm job is: the uid of the user it runs as, so that a file a user wrote is taken as that job's
only when the job is that user's (a folder named after a job id proves nothing: anyone can make one).

:class:`SlurmJobOwners` asks ``squeue --noheader --nodelist=<node> --states=all --format=%A %i %U`` (each
job's unique id, its label — ``<array job>_<task>`` for an array task, as the job-output source names it —
and its user's uid; the jobs on this node, running or ended within Slurm's ``MinJobAge``), at most once every
``ttl_s`` seconds, and only when asked: one call covers every dump of a poll. Every field is a number: no
user-chosen text is parsed.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from watchd.clock import Clock, SystemClock
from watchd.logs import get_logger

__all__ = ["FakeJobOwners", "JobOwner", "JobOwners", "SlurmJobOwners"]

_log = get_logger("watchd.source.job_owners")
_TIMEOUT_S = 10.0
_MAX_JOBS = 16_384
_LINE = re.compile(r"\s*([0-9]{1,12})\s+([0-9]{1,12}(?:_[0-9]{1,9})?)\s+([0-9]{1,10})\s*")


@dataclass(frozen=True, slots=True)
class JobOwner:
    job: str  # slurm:<id>, or slurm:<array job>_<task>
    uid: int  # the user the job runs as


class JobOwners(Protocol):
    def owner(self, job_id: str) -> JobOwner | None:
        """Slurm job ``job_id`` (its unique id, or its array label ``<array job>_<task>``) and its user; None
        when not known (blocking: called in a thread)."""
        ...


@dataclass
class FakeJobOwners:
    """What a test says: job id -> uid."""

    owners: Mapping[str, int] = field(default_factory=dict)

    def owner(self, job_id: str) -> JobOwner | None:
        uid = self.owners.get(job_id)
        return JobOwner(f"slurm:{job_id}", uid) if uid is not None else None


class SlurmJobOwners:
    def __init__(
        self,
        node: str,
        *,
        squeue: str = "squeue",
        env: Mapping[str, str] | None = None,
        ttl_s: float = 15.0,
        clock: Clock | None = None,
    ) -> None:
        self.node = node
        self._squeue = squeue
        self._env = {**os.environ, **(env or {})}
        self._ttl_s = ttl_s
        self._clock = clock or SystemClock()
        self._asked: float | None = None
        self._owners: dict[str, JobOwner] = {}
        self.errors = 0

    def owner(self, job_id: str) -> JobOwner | None:
        now = self._clock.monotonic()
        if self._asked is None or now - self._asked >= self._ttl_s:
            self._asked = now
            listing = self._list()
            if listing is not None:
                self._owners = listing
        return self._owners.get(job_id)

    def _list(self) -> dict[str, JobOwner] | None:
        args = (self._squeue, "--noheader", f"--nodelist={self.node}", "--states=all", "--format=%A %i %U")
        try:
            out = subprocess.run(
                args, capture_output=True, text=True, timeout=_TIMEOUT_S, env=self._env, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._failed(str(exc))
            return None
        if out.returncode != 0:
            self._failed(out.stderr.strip()[:300])
            return None
        owners: dict[str, JobOwner] = {}
        for line in out.stdout.splitlines()[:_MAX_JOBS]:
            m = _LINE.fullmatch(line)
            if m is not None:
                owners[m.group(1)] = owners[m.group(2)] = JobOwner(f"slurm:{m.group(2)}", int(m.group(3)))
        return owners

    def _failed(self, error: str) -> None:
        self.errors += 1
        if self.errors == 1:  # a node without Slurm: said once
            _log.warning("slurm_job_owners_unknown", command=self._squeue, error=error)
