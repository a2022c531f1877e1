"""Follow the output files of the Slurm jobs running on this node.

Which jobs run here, whose they are and where they write come from the scheduler, in one call per poll:
``squeue --noheader --nodelist=<node> --states=RUNNING --Format=...`` with the job id, the user's uid, the
working folder, ``STDOUT``/``STDERR`` and the batch host. A job's user chooses its file names, and a name may
hold anything but a NUL, so every field is ended by a random token drawn for that call: no name can fake a
field boundary (``scontrol show job``'s ``Key=value`` text can be faked: ``--output='x StdOut=/etc/shadow'``).
Every ``poll_interval_s`` the set of followed files follows the answer: a new job's files are followed (from
their end when they exist already), a job that ended is released after a grace period
(:class:`~watchd.sources.followset.FollowSet`). Each file is read only if it belongs to the job's user and is
a regular file reached without a symbolic link at its end (:mod:`watchd.untrusted`); each line carries the
job (``slurm:<id>``).

A batch job's output is one file: its batch step writes it on the job's first node (the batch host), and
what the tasks of every node print through ``srun`` lands there too. So only the agent on the batch host
follows it — once per job, not once per node — and marks its lines ``gathered``: which node printed a line
is for the engine to tell from the line (NCCL's ``host:pid:tid``, the rank), not the reader's name
(:mod:`watchd.detect.attribution`). A job whose batch host squeue does not give is followed on every node.

The scheduler is asked through :class:`JobOutputs` (a real one running squeue, a fake for tests and the
simulator), registered by name in :data:`LISTERS`.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from watchd.logs import get_logger
from watchd.sources.base import LogLine, NothingToAcknowledge
from watchd.sources.followset import Followed, FollowSet

__all__ = ["LISTERS", "FakeJobOutputs", "JobOutput", "JobOutputSource", "JobOutputs", "SlurmJobOutputs"]

_log = get_logger("watchd.source.slurm_jobs")
_TIMEOUT_S = 10.0
_MAX_JOBS = 4096


@dataclass(frozen=True, slots=True)
class JobOutput:
    job: str  # slurm:<id>
    paths: tuple[Path, ...]
    uid: int | None = None  # the job's user: its files must belong to it (None: not checked)


class JobOutputs(Protocol):
    def running(self) -> list[JobOutput]:
        """The jobs running on this node now whose output files this node reads (those of the jobs whose
        batch host it is), with the files (blocking: called in a thread)."""
        ...


@dataclass
class FakeJobOutputs:
    """What a test says runs on the node."""

    jobs: list[JobOutput] = field(default_factory=list)

    def running(self) -> list[JobOutput]:
        return list(self.jobs)


#: squeue's --Format fields asked for, in order (JobArrayID: ``123`` or ``123_4``; JobID: the unique id)
FIELDS = (
    "JobArrayID",
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "UserID",
    "UserName",
    "Name",
    "WorkDir",
    "STDOUT",
    "STDERR",
    "BatchHost",
)
_JOB_LABEL = re.compile(r"\d{1,12}(?:_\d{1,9})?")


def squeue_format(token: str) -> str:
    """The ``--Format`` value that ends every field with ``token``."""
    return ",".join(f"{name}:{token}" for name in FIELDS)


def parse_squeue(text: str, token: str) -> list[dict[str, str]]:
    """The jobs of an answer to :func:`squeue_format`: one mapping per job, by field name. A row whose ids
    are not ids is left out."""
    parts = text.split(token)
    rows = []
    for start in range(0, len(parts) - len(FIELDS) + 1, len(FIELDS)):
        row = dict(zip(FIELDS, parts[start : start + len(FIELDS)], strict=True))
        row["JobArrayID"] = row["JobArrayID"].lstrip("\n")
        if _JOB_LABEL.fullmatch(row["JobArrayID"]) and row["JobID"].isdigit() and row["UserID"].isdigit():
            rows.append(row)
        else:
            _log.warning("squeue_row_unreadable", row=repr(row)[:300])
    return rows


def expand_path(pattern: str, fields: dict[str, str], node: str = "") -> str:
    """Expand the filename patterns Slurm leaves in STDOUT/STDERR (``%j %A %a %x %u %N %%``)."""
    if "%" not in pattern:
        return pattern
    values = {
        "j": fields.get("JobID", ""),
        "A": fields.get("ArrayJobID", fields.get("JobID", "")),
        "a": fields.get("ArrayTaskID", ""),
        "x": fields.get("Name", ""),
        "u": fields.get("UserName", ""),
        "N": node,
        "%": "%",
    }
    return re.sub(r"%(\d*)([jAaxuN%])", lambda m: values[m.group(2)].zfill(int(m.group(1) or 0)), pattern)


def output_paths(fields: dict[str, str], node: str) -> tuple[Path, ...]:
    """The files a batch job writes to: STDOUT (``slurm-%j.out`` in its working folder by default, or
    ``slurm-%A_%a.out`` for an array task) and STDERR (the same file when not set)."""
    array = fields.get("ArrayTaskID", "N/A") not in ("", "N/A")
    default = "slurm-%A_%a.out" if array else "slurm-%j.out"
    out: list[Path] = []
    for key in ("STDOUT", "STDERR"):
        value = fields.get(key, "")
        if value in ("", "(null)"):
            if out:
                continue  # stderr goes with stdout
            value = default
        path = Path(fields.get("WorkDir", "/"), expand_path(value, fields, node))  # absolute stays absolute
        if path.is_absolute() and path not in out:
            out.append(path)
    return tuple(out)


def read_here(fields: dict[str, str], node: str) -> bool:
    """Whether ``node`` reads the job's output: it is the job's batch host, or squeue did not say which."""
    return fields.get("BatchHost", "").strip() in ("", "N/A", "(null)", node)


class SlurmJobOutputs:
    """The real scheduler: one ``squeue`` per poll for the jobs on ``node``, their users and their files."""

    def __init__(
        self,
        node: str,
        *,
        squeue: str = "squeue",
        env: dict[str, str] | None = None,
    ) -> None:
        self.node = node
        self._squeue = squeue
        self._env = {**os.environ, **(env or {})}
        self._last: list[JobOutput] = []
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
        token = "\x1f" + secrets.token_hex(16)
        listing = self._run(
            self._squeue,
            "--noheader",
            f"--nodelist={self.node}",
            "--states=RUNNING",
            f"--Format={squeue_format(token)}",
        )
        if listing is None:
            return list(self._last)  # keep following what we follow
        out = [
            JobOutput(f"slurm:{row['JobArrayID']}", output_paths(row, self.node), int(row["UserID"]))
            for row in parse_squeue(listing, token)[:_MAX_JOBS]
            if read_here(row, self.node)
        ]
        self._last = out
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
        on_refused: Callable[[str], None] | None = None,
        on_skipped: Callable[[int], None] | None = None,
    ) -> None:
        self.name = "slurm-jobs"
        self.outputs = outputs
        self.poll_interval_s = poll_interval_s
        self.follow = FollowSet(
            max_files=max_files,
            poll_interval_s=follow_interval_s,
            grace_s=poll_interval_s if grace_s is None else grace_s,
            on_refused=on_refused,
            on_skipped=on_skipped,
        )

    async def _poll(self) -> None:
        while True:
            try:
                running = await asyncio.to_thread(self.outputs.running)
                self.follow.update(
                    [Followed(p, o.job, o.uid, gathered=True) for o in running for p in o.paths]
                )
            except Exception as exc:  # a lister bug must not stop the lines already followed
                _log.error("job_outputs_failed", error=str(exc) or type(exc).__name__)
            await asyncio.sleep(self.poll_interval_s)

    def lines(self) -> AsyncIterator[LogLine]:
        return self.follow.lines_while(self._poll, "slurm-jobs-poll")


LISTERS = {"slurm": SlurmJobOutputs, "fake": FakeJobOutputs}
