"""Whether a job is on this node by the node's own evidence, read before a GPU reset: NVML's process list
(:mod:`watchd.gpu.reset`) misses a job in its prolog or one whose CUDA context does not exist yet, and the
scheduler's word was read seconds before. Any of these refuses the reset:

- a Slurm job's cgroup: cgroup v2 ``system.slice/slurmstepd.scope/job_<id>`` (``<node>_slurmstepd.scope``
  with several slurmd on one host), cgroup v1 ``<controller>/slurm/uid_<uid>/job_<id>`` (``slurm_<node>``).
  Slurm creates it when the job's first step (its ``extern`` step with ``PrologFlags=Contain``) starts and
  removes it when the job ends; one left behind by a crash refuses too, which is the safe side;
- a ``slurmstepd: [<job>.<step>]`` process (the extern step's lives for the whole job);
- a process with ``SLURM_JOB_ID`` in its environment: the prolog (slurmd runs it with the job's id before any
  slurmstepd or cgroup of the job exists), the batch script, every task;
- a process in a Kubernetes pod (``kubepods`` in its cgroup) holding the GPU's ``/dev/nvidiaN`` open (every
  ``/dev/nvidiaN`` when the reset is of every GPU, or when the GPU's minor number is not known): a pod bound
  to the GPU before its CUDA context exists. The kubelet's pod-resources API would name the pods a device is
  allocated to even before one opens it; it is not asked (a gRPC socket and client for one check).

A process's environment and open files are readable by root only with ``CAP_SYS_PTRACE`` when the process is
another user's (a job's tasks, most pods); without it those two are not seen (counted in the log line
``job_evidence_unreadable``), while the cgroups, the ``slurmstepd`` processes and the prolog (root's) still
are. Blocking (it reads ``/proc``): called in a thread. The roots are parameters, so tests give fake trees."""

from __future__ import annotations

import os
import re
from pathlib import Path

from watchd.logs import get_logger

__all__ = ["JobEvidence"]

_log = get_logger("watchd.agent.job_evidence")

_STEPD = re.compile(rb"^slurmstepd: \[(\d+)(?:\.([\w-]+))?\]")
_DEVICE = re.compile(r"^/dev/nvidia(\d+)$")
_MINOR = re.compile(r"^Device Minor:\s*(\d+)", re.M)
_MAX_READ = 256 * 1024
#: what a refusal names at most
MAX_SHOWN = 5


class _Unreadable(Exception):
    """Not ours to read (EACCES, EPERM)."""


def _read(path: Path, limit: int = _MAX_READ) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except PermissionError as exc:
        raise _Unreadable(str(exc)) from None
    except OSError:  # gone meanwhile
        return b""


class JobEvidence:
    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        own_pid: int | None = None,
    ) -> None:
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root
        self._own = os.getpid() if own_pid is None else own_pid

    def find(self, gpu: str = "") -> list[str]:
        """What shows a job on this node now, each said in a few words (empty: nothing does). ``gpu``: the
        PCI bus id of the GPU to be reset ("" for every GPU)."""
        return [*self._slurm_cgroups(), *self._processes(self._minor(gpu))]

    def _slurm_cgroups(self) -> list[str]:
        root = self.cgroup_root
        found: dict[str, Path] = {}
        v2 = root.glob("system.slice/*slurmstepd.scope/job_*")
        v1 = root.glob("*/slurm*/uid_*/job_*")
        for path in sorted([*v2, *v1]):
            job = path.name.removeprefix("job_")
            if job.isdigit() and path.is_dir():
                found.setdefault(job, path)
        return [f"Slurm job {job}'s cgroup {path}" for job, path in found.items()]

    def _minor(self, gpu: str) -> int | None:
        """The device minor of GPU ``gpu`` (``/dev/nvidia<minor>``), as the driver says; None: not known."""
        if not gpu:
            return None
        text = _read(self.proc_root / "driver" / "nvidia" / "gpus" / gpu.lower() / "information")
        m = _MINOR.search(text.decode(errors="replace"))
        return int(m.group(1)) if m else None

    def _processes(self, minor: int | None) -> list[str]:
        found: list[str] = []
        try:
            pids = sorted(int(p.name) for p in self.proc_root.iterdir() if p.name.isdigit())
        except OSError:
            return found
        unreadable = 0
        for pid in pids:
            if pid == self._own:
                continue
            try:
                said = self._process(pid, minor)
            except _Unreadable:
                unreadable += 1
                continue
            if said is not None:
                found.append(said)
        if unreadable:
            _log.warning(
                "job_evidence_unreadable", processes=unreadable, hint="the agent lacks CAP_SYS_PTRACE"
            )
        return found

    def _process(self, pid: int, minor: int | None) -> str | None:
        proc = self.proc_root / str(pid)
        cmdline = _read(proc / "cmdline", 4096)
        if m := _STEPD.match(cmdline):
            step = f", step {m.group(2).decode()}" if m.group(2) else ""
            return f"slurmstepd of Slurm job {m.group(1).decode()} (pid {pid}{step})"
        comm = _read(proc / "comm", 64).decode(errors="replace").strip() or "?"
        env = dict(entry.split(b"=", 1) for entry in _read(proc / "environ").split(b"\0") if b"=" in entry)
        if job := env.get(b"SLURM_JOB_ID"):
            context = env.get(b"SLURM_SCRIPT_CONTEXT", b"").decode(errors="replace")
            what = f", its {context}" if context else ""
            return f"a process of Slurm job {job.decode(errors='replace')} (pid {pid}, {comm}{what})"
        if b"kubepods" in _read(proc / "cgroup", 8192):
            device = self._gpu_open(proc, minor)
            if device is not None:
                return f"a process of a Kubernetes pod holds {device} (pid {pid}, {comm})"
        return None

    def _gpu_open(self, proc: Path, minor: int | None) -> str | None:
        try:
            fds = list((proc / "fd").iterdir())
        except PermissionError as exc:
            raise _Unreadable(str(exc)) from None
        except OSError:
            return None
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            m = _DEVICE.match(target)
            if m and (minor is None or int(m.group(1)) == minor):
                return target
        return None
