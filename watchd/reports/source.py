"""Where the report's accounting comes from: one small Protocol, a real Slurm source (``sacct``, ``sshare``,
``squeue``), a source for clusters without slurmdbd (``none``: only the pending jobs ``squeue`` still knows),
and a faithful fake that serves records from a JSON file or from memory; built by name from ``SOURCES``."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from watchd.errors import UsageError
from watchd.integrations.slurm.calls import count_call
from watchd.model.hostlist import expand_hostlist
from watchd.reports.model import Accounting, JobRecord, PendingJob, ShareRecord
from watchd.reports.parse import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SSHARE_FIELDS,
    parse_sacct,
    parse_squeue_pending,
    parse_sshare,
)


class AccountingSource(Protocol):
    name: str

    def fetch(self, start: float, end: float) -> Accounting:
        """The job runs that overlap ``[start, end)``, the fair-share tree and the pending jobs. Never
        raises for an unavailable accounting: ``available`` False and ``why`` say so."""
        ...


def _local(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _beside(command: str, name: str) -> str:
    """``name`` in the folder of ``command`` when that is a path (``/opt/slurm/bin/squeue`` -> its ``sacct``),
    else ``name`` (found on the PATH)."""
    folder = os.path.dirname(command)
    return os.path.join(folder, name) if folder else name


def unavailable_why(error: str) -> str:
    """Why accounting is unavailable, in words that do not send the operator to the wrong place: slurmdbd is
    named only when Slurm's answer is about it, not when the command did not run or found no slurm.conf."""
    lowered = error.lower()
    if "configuration file" in lowered or "not found" in lowered:
        return f"Slurm accounting unavailable ({error}): is slurm.slurm_conf the cluster's slurm.conf?"
    if "accounting storage is disabled" in lowered:
        return f"Slurm accounting unavailable ({error}): slurm.conf names no slurmdbd (AccountingStorageType)"
    if "slurmdbd" in lowered or "talking to the database" in lowered:
        return f"Slurm accounting unavailable ({error}): is slurmdbd running and reachable?"
    return f"Slurm accounting unavailable ({error})"


class SlurmAccounting:
    """``sacct -a -X -D`` (every run of every job in the window), ``sshare -a`` and ``squeue -t PD``.

    ``slurm_conf`` is the engine's ``slurm.slurm_conf`` (``SLURM_CONF`` of the commands; else the
    environment's, else Slurm's default); ``sacct`` and ``sshare`` are looked for beside ``squeue``."""

    name = "slurm"

    def __init__(
        self,
        *,
        timeout_s: float = 300.0,
        env: Mapping[str, str] | None = None,
        slurm_conf: Path | None = None,
        squeue: str = "squeue",
    ) -> None:
        self.timeout_s = timeout_s
        self.env = {**(env if env is not None else os.environ), "SLURM_TIME_FORMAT": "%s"}
        if slurm_conf is not None:
            self.env["SLURM_CONF"] = str(slurm_conf)
        self.squeue, self.sacct, self.sshare = squeue, _beside(squeue, "sacct"), _beside(squeue, "sshare")

    def _run(self, argv: list[str]) -> tuple[bool, str]:
        count_call(argv[0])
        try:
            res = subprocess.run(
                argv, env=self.env, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except FileNotFoundError:
            return False, f"{argv[0]} not found"
        except subprocess.TimeoutExpired:
            return False, f"{argv[0]} did not answer within {self.timeout_s:g} s"
        if res.returncode != 0:
            lines = (res.stderr or res.stdout).strip().splitlines()
            name = os.path.basename(argv[0])
            last = lines[-1].removeprefix(f"{name}: ") if lines else f"exit status {res.returncode}"
            conf = self.env.get("SLURM_CONF")  # which cluster it asked, for the operator reading the why
            return False, f"{name}{f' (SLURM_CONF={conf})' if conf else ''}: {last}"
        return True, res.stdout

    def fetch(self, start: float, end: float) -> Accounting:
        conf = self.env.get("SLURM_CONF")
        if conf and not os.path.exists(conf):  # else each command retries for a minute before it gives up
            return Accounting(
                available=False, why=unavailable_why(f"SLURM_CONF={conf}: not found"), source=self.name
            )
        pending: list[PendingJob] = []
        ok, out = self._run([self.squeue, "-h", "-a", "-t", "PD", "-O", SQUEUE_FORMAT])
        if ok:
            pending, _ = parse_squeue_pending(out)
        ok, out = self._run(
            [
                self.sacct,
                "-a",
                "-X",
                "-D",
                "-P",
                "-n",
                "-S",
                _local(start),
                "-E",
                _local(end),
                f"--format={SACCT_FIELDS}",
            ]
        )
        if not ok:
            return Accounting(
                available=False,
                why=unavailable_why(out),
                pending=tuple(pending),
                source=self.name,
            )
        jobs, _ = parse_sacct(out, expand_hostlist)
        shares: list[ShareRecord] = []
        ok, sh = self._run([self.sshare, "-a", "-P", "-n", "-o", SSHARE_FIELDS])
        if ok:
            shares, _ = parse_sshare(sh)
        return Accounting(
            available=True,
            why="" if ok else f"fair-share unavailable ({sh})",
            jobs=tuple(jobs),
            shares=tuple(shares),
            pending=tuple(pending),
            source=self.name,
        )


class NoAccounting:
    """A cluster without slurmdbd: the report falls back to what watchd observed itself."""

    name = "none"

    def fetch(self, start: float, end: float) -> Accounting:
        return Accounting(available=False, why="no accounting source configured", source=self.name)


class FakeAccounting:
    """Serves the records it was given, filtered to the window like sacct (a run that overlaps it)."""

    name = "fake"

    def __init__(
        self,
        jobs: list[JobRecord] | None = None,
        shares: list[ShareRecord] | None = None,
        pending: list[PendingJob] | None = None,
        *,
        available: bool = True,
        why: str = "",
    ) -> None:
        self.jobs = list(jobs or [])
        self.shares = list(shares or [])
        self.pending = list(pending or [])
        self.available = available
        self.why = why
        self.calls: list[tuple[float, float]] = []

    @classmethod
    def from_file(cls, path: Path) -> FakeAccounting:
        """A JSON document ``{"jobs": [...], "shares": [...], "pending": [...]}`` of the records' fields."""
        try:
            doc: dict[str, Any] = json.loads(path.read_text())
            return cls(
                [JobRecord(**{**j, "nodes": tuple(j.get("nodes", ()))}) for j in doc.get("jobs", [])],
                [ShareRecord(**s) for s in doc.get("shares", [])],
                [PendingJob(**p) for p in doc.get("pending", [])],
            )
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"{path}: not an accounting fixture: {exc}") from None

    def fetch(self, start: float, end: float) -> Accounting:
        self.calls.append((start, end))
        if not self.available:
            return Accounting(available=False, why=self.why, pending=tuple(self.pending), source=self.name)
        jobs = tuple(
            j
            for j in self.jobs
            if (j.start is None and j.submit < end)
            or (j.start is not None and j.start < end and (j.end is None or j.end >= start))
        )
        return Accounting(
            available=True,
            jobs=jobs,
            shares=tuple(self.shares),
            pending=tuple(self.pending),
            source=self.name,
        )


def build_source(
    name: str,
    *,
    fixture: Path | None = None,
    timeout_s: float = 300.0,
    slurm_conf: Path | None = None,
    squeue: str = "squeue",
) -> AccountingSource:
    """The source called ``name`` (``slurm``, ``none``, ``fake`` with a JSON ``fixture``); ``slurm_conf`` and
    ``squeue``: the engine config's ``slurm.slurm_conf`` and ``slurm.squeue``."""
    if name == "slurm":
        return SlurmAccounting(timeout_s=timeout_s, slurm_conf=slurm_conf, squeue=squeue)
    if name == "none":
        return NoAccounting()
    if name == "fake":
        if fixture is None:
            raise UsageError("the fake accounting source needs a fixture file (--fixture)")
        return FakeAccounting.from_file(fixture)
    raise UsageError(f"unknown accounting source {name!r}: use one of {', '.join(SOURCES)}")


SOURCES = ("slurm", "none", "fake")
