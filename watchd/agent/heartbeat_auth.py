"""Who sent a heartbeat: evidence must come from the job it names (docs/security.md, "Heartbeats").

Two ways a report is verified:

* **Unix socket**: the kernel tells who is on the other end (``SO_PEERCRED``: pid, uid, gid). The peer's
  ``/proc/<pid>/cgroup`` must put it in the job the report names (Slurm ``job_<id>``, a Kubernetes pod), and
  where the cgroup path names the job's owner (Slurm's cgroup v1 ``uid_<n>`` segment) the peer's uid must be
  that owner's. The environment is never consulted: a process sets its own.
* **TCP on 127.0.0.1** (off by default): the request carries ``Authorization: Bearer <token>`` where the
  token is ``HMAC-SHA256(node secret, job label)`` in hex (:func:`job_token`); a Slurm prolog or the pod spec
  hands it to the job as ``WATCHD_HEARTBEAT_TOKEN`` (``watchd heartbeat-token <job>``).

The decision (:func:`judge`) is pure; :class:`ProcJobIdentity` is the one piece of I/O (reading ``/proc``),
behind the :class:`JobIdentity` protocol with a faithful fake, chosen from :data:`IDENTITIES` by name.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from watchd.gpu.jobs import job_from_cgroup
from watchd.model.jobs import JobRef

__all__ = [
    "IDENTITIES",
    "REASONS",
    "FakeJobIdentity",
    "JobIdentity",
    "Peer",
    "ProcJobIdentity",
    "ProcessIdentity",
    "Verdict",
    "job_token",
    "judge",
    "peer_credentials",
]

#: why a report was refused (the label of ``watchd_agent_heartbeats_rejected_total``)
REASONS = (
    "no_peer_credentials",  # the socket gave no SO_PEERCRED (not a Unix socket, or the peer vanished)
    "peer_unknown",  # the peer's /proc entry could not be read (it exited)
    "not_in_a_job",  # the peer runs in no Slurm job or pod cgroup
    "wrong_job",  # the peer runs in another job than the report names
    "wrong_uid",  # the peer's uid is not the job's owner
    "no_token",  # TCP without a bearer token
    "bad_token",  # TCP with a token that is not the job's
)

_UID_SEGMENT = re.compile(r"uid_(\d+)", re.ASCII)


@dataclass(frozen=True, slots=True)
class Peer:
    """The process on the other end of a Unix socket, as the kernel names it."""

    pid: int
    uid: int
    gid: int


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """What the node's cgroups say about one process."""

    job: JobRef | None  # the Slurm job or pod its cgroup puts it in
    job_uid: int | None = None  # the job's owner where the cgroup path names it (Slurm v1: uid_<n>)


@dataclass(frozen=True, slots=True)
class Verdict:
    """``owner``: the verified job (or pod) the report's rank is charged to; ``reason`` when refused."""

    owner: str | None
    reason: str | None = None
    verified_by: str = ""

    @property
    def ok(self) -> bool:
        return self.reason is None


class JobIdentity(Protocol):
    def identify(self, pid: int) -> ProcessIdentity | None:
        """The job ``pid`` runs in; None when the process cannot be read (gone)."""
        ...


def identity_from_cgroup(text: str) -> ProcessIdentity:
    """Pure: the job and (where named) its owner from the contents of ``/proc/<pid>/cgroup``."""
    job = job_from_cgroup(text)
    job_uid = None
    if job is not None and job.kind == "slurm":
        for line in text.splitlines():
            path = line.split(":", 2)[-1]
            if f"job_{job.id}" in path.split("/"):
                for seg in path.split("/"):
                    if m := _UID_SEGMENT.fullmatch(seg):
                        job_uid = int(m.group(1))
                break
    return ProcessIdentity(job, job_uid)


class ProcJobIdentity:
    """Reads ``<proc_root>/<pid>/cgroup`` (world-readable); never the environment."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root

    def identify(self, pid: int) -> ProcessIdentity | None:
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text(errors="replace")
        except OSError:
            return None
        return identity_from_cgroup(text)


class FakeJobIdentity:
    """pid -> identity from a table the test fills (what the real one would read from /proc)."""

    def __init__(self, table: Mapping[int, ProcessIdentity] | None = None) -> None:
        self.table = dict(table or {})

    def identify(self, pid: int) -> ProcessIdentity | None:
        return self.table.get(pid)


IDENTITIES: dict[str, Callable[[Path], JobIdentity]] = {
    "proc": ProcJobIdentity,
    "fake": lambda _root: FakeJobIdentity(),
}


def peer_credentials(sock: socket.socket | None) -> Peer | None:
    """SO_PEERCRED of a connected Unix socket; None for any other socket."""
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid) if pid > 0 else None


def job_token(secret: bytes, job: str) -> str:
    """The bearer token of ``job`` (its label as the report names it) on a node holding ``secret``."""
    return hmac.new(secret, job.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def _names(job: str, ref: JobRef) -> bool:
    """Does the report's ``job`` name ``ref``? ``slurm:1234`` or ``1234`` (Slurm's own SLURM_JOB_ID)."""
    return job == ref.label or job == ref.id


def judge(
    job: str,
    *,
    peer: Peer | None = None,
    identity: ProcessIdentity | None = None,
    tcp: bool = False,
    authorization: str | None = None,
    secret: bytes | None = None,
) -> Verdict:
    """Pure: may a report naming ``job`` count as evidence? Unix socket: ``peer`` and its ``identity``;
    TCP: ``authorization`` (the header) against ``secret``."""
    if tcp:
        if not authorization or not authorization.startswith("Bearer ") or secret is None:
            return Verdict(None, "no_token")
        given = authorization[len("Bearer ") :].strip().encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, job_token(secret, job).encode()):
            return Verdict(None, "bad_token")
        return Verdict(job, verified_by="token")
    if peer is None:
        return Verdict(None, "no_peer_credentials")
    if identity is None:
        return Verdict(None, "peer_unknown")
    ref = identity.job
    if ref is None:
        return Verdict(None, "not_in_a_job")
    if identity.job_uid is not None and peer.uid != identity.job_uid:
        return Verdict(None, "wrong_uid")
    if ref.kind == "k8s":
        # a pod runs ranks of a job the pod names in its own words (WATCHD_JOB_ID, torchrun's run id): the
        # report is bound to the pod; its ranks are capped per pod, so one pod cannot crowd out another
        return Verdict(f"{ref.label}/{job}", verified_by=f"pod {ref.id} uid {peer.uid}")
    if not _names(job, ref):
        return Verdict(None, "wrong_job")
    return Verdict(ref.label, verified_by=f"cgroup {ref.label} uid {peer.uid}")
