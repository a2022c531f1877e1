"""Which job does a GPU process belong to? ``/proc/<pid>/cgroup`` first (world-readable), then
``/proc/<pid>/environ`` (readable only by the process owner or root).

The parsing functions are pure; :class:`JobResolver` does the small amount of I/O, against an injectable proc
root (tests lay out a temp dir like ``/proc``), with a short per-pid cache.

Shapes understood (each path is split into ``/`` segments, so a cgroup namespace prefix such as ``/../..``,
seen when the agent runs in its own cgroup namespace with ``hostPID``, does no harm):

- Slurm: a ``job_<n>`` segment below a segment that names Slurm (``slurm``, ``slurm_<node>``,
  ``slurmstepd.scope``, ``<node>_slurmstepd.scope``), for cgroup v1 (``12:memory:/slurm/uid_1000/job_1234/…``)
  and v2 (``0::/system.slice/slurmstepd.scope/job_1234/step_0/…``).
- Kubernetes, systemd driver: ``kubepods[-<qos>]-pod<uid with _ for ->.slice``; cgroupfs driver: ``pod<uid>``
  below a ``kubepods`` segment.

When a path holds both (slurmd running inside a pod, its jobs nested under the pod's cgroup), the deepest
match wins: the Slurm job, not the slurmd pod.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from watchd.clock import Clock, SystemClock
from watchd.model.jobs import JobRef, parse_job_label

__all__ = ["JobRef", "JobResolver", "job_from_cgroup", "job_from_environ", "parse_job_label"]

_SLURM_JOB_RE = re.compile(r"job_(\d+)", re.ASCII)
# systemd cgroup driver: kubepods-pod<uid>.slice (Guaranteed) or kubepods-<qos>-pod<uid>.slice, dashes -> _.
_K8S_SYSTEMD_RE = re.compile(r"kubepods(?:-[a-z]+)?-pod([0-9a-fA-F][0-9a-fA-F_]{7,63})\.slice", re.ASCII)
# cgroupfs driver: /kubepods[/<qos>]/pod<uid>/<container>
_K8S_CGROUPFS_RE = re.compile(r"pod([0-9a-fA-F][0-9a-fA-F-]{7,63})", re.ASCII)


def _job_from_path(path: str) -> tuple[int, JobRef] | None:
    """The deepest job named by one cgroup path, with its segment index."""
    best: tuple[int, JobRef] | None = None
    seen_slurm = False
    seen_kubepods = False
    for depth, seg in enumerate(path.split("/")):
        if not seg:
            continue
        found: JobRef | None = None
        if seen_slurm and (m := _SLURM_JOB_RE.fullmatch(seg)):
            found = JobRef("slurm", m.group(1))
        elif m := _K8S_SYSTEMD_RE.fullmatch(seg):
            found = JobRef("k8s", m.group(1).replace("_", "-").lower())
        elif seen_kubepods and (m := _K8S_CGROUPFS_RE.fullmatch(seg)):
            found = JobRef("k8s", m.group(1).lower())
        if found is not None:
            best = (depth, found)
        if seg.startswith("slurm") or "_slurmstepd" in seg:
            seen_slurm = True
        if seg.startswith("kubepods"):
            seen_kubepods = True
    return best


def job_from_cgroup(text: str) -> JobRef | None:
    """The job named by the contents of ``/proc/<pid>/cgroup`` (v1, v2 or hybrid), or None.

    Each line is ``<hierarchy-id>:<controllers>:<path>``; the first line (in file order) whose path names a
    job decides. Blank or malformed lines are skipped, never an error.
    """
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hit = _job_from_path(parts[2].strip())
        if hit is not None:
            return hit[1]
    return None


_ENV_KEYS = (b"SLURM_JOB_ID", b"SLURM_JOBID")


def job_from_environ(data: bytes) -> JobRef | None:
    """The Slurm job named by the contents of ``/proc/<pid>/environ`` (NUL-separated ``KEY=VALUE``): from
    ``SLURM_JOB_ID``, else the older ``SLURM_JOBID``. None when neither holds a job id."""
    env: dict[bytes, bytes] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in _ENV_KEYS and key not in env:
            env[key] = value.strip()
    for key in _ENV_KEYS:
        value = env.get(key, b"")
        if value.isdigit():
            return JobRef("slurm", value.decode("ascii"))
    return None


class JobResolver:
    """pid -> job, reading ``<proc_root>/<pid>/cgroup`` and, failing that, ``<proc_root>/<pid>/environ``.

    Results (None included) are cached per pid for ``ttl`` seconds of ``clock.monotonic()``: a process does
    not change jobs, and the TTL bounds the harm of pid reuse. Unreadable or vanished processes give None;
    this never raises for a process that cannot be read.

    NVML reports host pids: in a container the agent needs the host's pid namespace (``hostPID: true``) and
    ``/proc`` of the host for this to find anything.
    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        clock: Clock | None = None,
        *,
        ttl: float = 30.0,
        max_entries: int = 8192,
    ) -> None:
        self.proc_root = proc_root
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.ttl = ttl
        self.max_entries = max_entries
        self._cache: dict[int, tuple[float, JobRef | None]] = {}

    def resolve(self, pid: int) -> JobRef | None:
        now = self._clock.monotonic()
        hit = self._cache.get(pid)
        if hit is not None and hit[0] > now:
            return hit[1]
        job = self._read(pid)
        self._make_room(pid, now)
        self._cache[pid] = (now + self.ttl, job)
        return job

    def jobs_for(self, pids: Iterable[int]) -> JobRef | None:
        """The job most of ``pids`` (one GPU's compute processes) belong to; processes in no job do not vote.
        A tie goes to the job of the earliest pid in ``pids``; None when no process is in a job."""
        counts = self.job_counts(pids)
        return counts.most_common(1)[0][0] if counts else None

    def job_counts(self, pids: Iterable[int]) -> Counter[JobRef]:
        """How many of ``pids`` belong to each job (in order of first appearance)."""
        counts: Counter[JobRef] = Counter()
        for pid in pids:
            job = self.resolve(pid)
            if job is not None:
                counts[job] += 1
        return counts

    def forget(self, pid: int) -> None:
        self._cache.pop(pid, None)

    def _make_room(self, pid: int, now: float) -> None:
        """Make room before inserting: drop expired entries, then the oldest ones."""
        self._cache.pop(pid, None)
        if len(self._cache) < self.max_entries:
            return
        for key in [k for k, (exp, _) in self._cache.items() if exp <= now]:
            del self._cache[key]
        while len(self._cache) >= self.max_entries:
            del self._cache[next(iter(self._cache))]

    def _read(self, pid: int) -> JobRef | None:
        base = self.proc_root / str(pid)
        try:
            job = job_from_cgroup((base / "cgroup").read_text(encoding="utf-8", errors="replace"))
        except (FileNotFoundError, ProcessLookupError):
            return None  # the process is gone
        except OSError:
            job = None  # unreadable here (e.g. hidepid): environ may still tell
        if job is not None:
            return job
        try:
            return job_from_environ((base / "environ").read_bytes())
        except OSError:  # PermissionError (another user's process), FileNotFoundError, ProcessLookupError
            return None
