"""Follow the output files of the Slurm jobs running on this node (issue 19).

Which jobs run here and where they write come from the scheduler: ``squeue --noheader --nodelist=<node>
--states=RUNNING --format=%i`` lists the jobs, and ``scontrol --oneliner show job <id>`` gives each one's
``StdOut=`` and ``StdErr=`` paths (asked once per job). Every ``poll_interval_s`` the set of followed files
follows the answer: a new job's files are followed (from their end when they exist already), a job that
ended is released after a grace period (:class:`~watchd.sources.followset.FollowSet`). Each line carries
the job (``slurm:<id>``).

The scheduler is asked through :class:`JobOutputs` (a real one running the Slurm commands, a fake for tests
and the simulator), registered by name in :data:`LISTERS`.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from watchd.logs import get_logger
from watchd.sources.base import LogLine, NothingToAcknowledge
from watchd.sources.followset import Followed, FollowSet

__all__ = ["LISTERS", "FakeJobOutputs", "JobOutput", "JobOutputSource", "JobOutputs", "SlurmJobOutputs"]

_log = get_logger("watchd.source.slurm_jobs")
_TIMEOUT_S = 10.0
_MAX_CACHE = 4096


@dataclass(frozen=True, slots=True)
class JobOutput:
    job: str  # slurm:<id>
    paths: tuple[Path, ...]


class JobOutputs(Protocol):
    def running(self) -> list[JobOutput]:
        """The jobs running on this node now and their output files (blocking: called in a thread)."""
        ...


@dataclass
class FakeJobOutputs:
    """What a test says runs on the node."""

    jobs: list[JobOutput] = field(default_factory=list)

    def running(self) -> list[JobOutput]:
        return list(self.jobs)


_FIELD = re.compile(r"(?:^|\s)(JobId|JobName|UserId|StdOut|StdErr|ArrayJobId|ArrayTaskId)=(\S*)")


def parse_scontrol_job(text: str) -> dict[str, str]:
    """The fields of one ``scontrol --oneliner show job`` line that locate its output."""
    return {m.group(1): m.group(2) for m in _FIELD.finditer(text)}


def expand_path(pattern: str, fields: dict[str, str]) -> str:
    """Expand the filename patterns Slurm may leave in StdOut/StdErr (``%j %A %a %x %u``)."""
    if "%" not in pattern:
        return pattern
    user = fields.get("UserId", "").split("(", 1)[0]
    values = {
        "j": fields.get("JobId", ""),
        "A": fields.get("ArrayJobId", fields.get("JobId", "")),
        "a": fields.get("ArrayTaskId", ""),
        "x": fields.get("JobName", ""),
        "u": user,
        "%": "%",
    }
    return re.sub(r"%(\d*)([jAaxu%])", lambda m: values[m.group(2)].zfill(int(m.group(1) or 0)), pattern)


class SlurmJobOutputs:
    """The real scheduler: ``squeue`` for the jobs on ``node``, ``scontrol`` once per job for its files."""

    def __init__(
        self,
        node: str,
        *,
        squeue: str = "squeue",
        scontrol: str = "scontrol",
        env: dict[str, str] | None = None,
    ) -> None:
        self.node = node
        self._squeue = squeue
        self._scontrol = scontrol
        self._env = {**os.environ, **(env or {})}
        self._paths: dict[str, tuple[Path, ...]] = {}
        self.errors = 0

    def _run(self, *args: str) -> str | None:
        try:
            out = subprocess.run(
                args, capture_output=True, text=True, timeout=_TIMEOUT_S, env=self._env, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.errors += 1
            _log.warning("slurm_query_failed", command=args[0], error=str(exc))
            return None
        if out.returncode != 0:
            self.errors += 1
            _log.warning("slurm_query_failed", command=args[0], error=out.stderr.strip()[:300])
            return None
        return out.stdout

    def running(self) -> list[JobOutput]:
        listing = self._run(
            self._squeue, "--noheader", f"--nodelist={self.node}", "--states=RUNNING", "--format=%i"
        )
        if listing is None:
            return [JobOutput(j, p) for j, p in self._paths.items()]  # keep following what we follow
        ids = [i.strip() for i in listing.split() if i.strip()]
        out = []
        for ident in ids[:_MAX_CACHE]:
            job = f"slurm:{ident}"
            paths = self._paths.get(job)
            if paths is None:
                text = self._run(self._scontrol, "--oneliner", "show", "job", ident)
                if text is None:
                    continue
                fields = parse_scontrol_job(text)
                found = []
                for key in ("StdOut", "StdErr"):
                    value = fields.get(key)
                    if value and value.startswith("/"):
                        path = Path(expand_path(value, fields))
                        if path not in found:
                            found.append(path)
                paths = tuple(found)
            out.append(JobOutput(job, paths))
        self._paths = {o.job: o.paths for o in out}
        return out


class JobOutputSource(NothingToAcknowledge):
    def __init__(
        self,
        outputs: JobOutputs,
        *,
        poll_interval_s: float = 15.0,
        follow_interval_s: float = 0.5,
        max_files: int = 64,
        grace_s: float | None = None,
    ) -> None:
        self.name = "slurm-jobs"
        self.outputs = outputs
        self.poll_interval_s = poll_interval_s
        self.follow = FollowSet(
            max_files=max_files,
            poll_interval_s=follow_interval_s,
            grace_s=poll_interval_s if grace_s is None else grace_s,
        )

    async def _poll(self) -> None:
        while True:
            try:
                running = await asyncio.to_thread(self.outputs.running)
            except Exception as exc:  # a lister bug must not stop the lines already followed
                _log.error("job_outputs_failed", error=str(exc) or type(exc).__name__)
            else:
                self.follow.update([Followed(p, o.job) for o in running for p in o.paths])
            await asyncio.sleep(self.poll_interval_s)

    def lines(self) -> AsyncIterator[LogLine]:
        return self.follow.lines_while(self._poll, "slurm-jobs-poll")


LISTERS = {"slurm": SlurmJobOutputs, "fake": FakeJobOutputs}
