"""Heartbeats count only from the job they name (issue 22): real processes, a real cgroup, real uids.

Each reporter is a separate process (the system's python3, standard library only) that connects to the
agent's heartbeat socket and posts one report. A Slurm-like cgroup v1 folder
``slurm_<test>/uid_65534/job_<n>`` is made under the ``pids`` hierarchy, a process is moved into it by
writing its pid to ``cgroup.procs`` (as slurmstepd does) and then drops to ``nobody`` with ``setpriv``.
Needs root and a writable cgroup hierarchy: skipped otherwise, a failure under CI.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import real_components_required
from watchd.agent.heartbeat_auth import ProcJobIdentity, identity_from_cgroup
from watchd.agent.heartbeat_server import HeartbeatServer
from watchd.agent.metrics import AgentMetrics
from watchd.agent.settings import HeartbeatConfig
from watchd.clock import SystemClock
from watchd.model.events import Event
from watchd.model.jobs import JobRef

pytestmark = pytest.mark.real

NOBODY = 65534
PIDS = Path("/sys/fs/cgroup/pids")

REPORTER = r"""
import json, socket, sys
path, job, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = json.dumps([{"job": job, "rank": r, "step": 1} for r in range(ranks)]).encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
s.sendall(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
data = b""
while chunk := s.recv(65536):
    data += chunk
head, _, rest = data.partition(b"\r\n\r\n")
print(json.dumps({"status": int(head.split()[1]), "body": json.loads(rest)}))
"""


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (to make a cgroup and drop to nobody)"
    if not shutil.which("setpriv"):
        return "setpriv (util-linux) not installed"
    if not (PIDS / "cgroup.procs").exists() or not os.access(PIDS, os.W_OK):
        return f"{PIDS} is not a writable cgroup v1 hierarchy"
    return None


@pytest.fixture
def job_cgroup() -> Iterator[tuple[Path, str]]:
    why = _why_not()
    if why is not None:
        if real_components_required():
            pytest.fail(f"real cgroup test required under CI but: {why}")
        pytest.skip(why)
    job = str(40000 + os.getpid() % 10000)
    top = PIDS / f"slurm_watchd_{uuid.uuid4().hex[:8]}"
    folder = top / f"uid_{NOBODY}" / f"job_{job}"
    folder.mkdir(parents=True)
    try:
        yield folder, job
    finally:
        for d in (folder, folder.parent, top):
            for pid in (d / "cgroup.procs").read_text().split():
                (PIDS / "cgroup.procs").write_text(pid)  # back to the root, so the folder can go
            d.rmdir()


@pytest.fixture
def sock() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="watchd-hb-"))  # pytest's tmp_path is root's alone (0700)
    os.chmod(folder, 0o755)  # nobody must reach the socket
    try:
        yield folder / "hb" / "heartbeat.sock"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report(
    sock: Path, job: str, *, cgroup: Path | None = None, uid: int | None = NOBODY, ranks: int = 1
) -> dict:
    """Run a reporter process: moved into ``cgroup`` first (by pid), then as ``uid`` (None: root)."""
    script = f"import sys; exec({REPORTER!r})"
    cmd = ["/usr/bin/python3", "-c", script, str(sock), job, str(ranks)]
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    if cgroup is not None:
        cmd = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def _serve(sock: Path, **kw: object) -> tuple[HeartbeatServer, list[Event]]:
    events: list[Event] = []
    config = HeartbeatConfig(socket=sock, socket_mode="0666", http_port=0, forward_interval_s=0.1, **kw)
    server = HeartbeatServer(config, "gpu-1", SystemClock(), AgentMetrics(), events.append)
    await server.start()
    return server, events


def rejected(server: HeartbeatServer, reason: str) -> float:
    return float(server._metrics.heartbeats_rejected.labels(reason)._value.get())


async def test_a_rank_in_its_jobs_cgroup_as_the_jobs_user_is_accepted(
    job_cgroup: tuple[Path, str], sock: Path
) -> None:
    folder, job = job_cgroup
    server, events = await _serve(sock)
    try:
        for claimed in (f"slurm:{job}", job):  # the label, or SLURM_JOB_ID as the job's environment has it
            got = await asyncio.to_thread(report, sock, claimed, cgroup=folder)
            assert got == {"status": 200, "body": {"accepted": 1}}, got
        assert {e.attrs["job"] for e in events} == {f"slurm:{job}", job}
    finally:
        await server.stop()


async def test_nobody_outside_the_job_claiming_it_is_rejected_and_counted(
    job_cgroup: tuple[Path, str], sock: Path
) -> None:
    folder, job = job_cgroup
    server, events = await _serve(sock)
    try:
        got = await asyncio.to_thread(report, sock, f"slurm:{job}", ranks=4)
        assert got["status"] == 403 and got["body"]["rejected"] == {"not_in_a_job": 4}
        # in the job's cgroup, but claiming another job
        got = await asyncio.to_thread(report, sock, "slurm:1", cgroup=folder)
        assert got["status"] == 403 and got["body"]["rejected"] == {"wrong_job": 1}
        # in the job's cgroup, as another user than the job's (root here; the job is nobody's)
        got = await asyncio.to_thread(report, sock, f"slurm:{job}", cgroup=folder, uid=None)
        assert got["status"] == 403 and got["body"]["rejected"] == {"wrong_uid": 1}
        assert events == []  # never evidence
        assert len(server.coalescer) == 0  # never a slot
        assert (rejected(server, "not_in_a_job"), rejected(server, "wrong_job")) == (4, 1)
        assert rejected(server, "wrong_uid") == 1
    finally:
        await server.stop()


async def test_junk_ranks_cannot_crowd_out_a_real_jobs_ranks(
    job_cgroup: tuple[Path, str], sock: Path
) -> None:
    folder, job = job_cgroup
    server, events = await _serve(sock, max_ranks=8)
    try:
        got = await asyncio.to_thread(report, sock, "slurm:777", ranks=1000)  # the flood of made-up ranks
        assert got["status"] == 403 and got["body"]["rejected"] == {"not_in_a_job": 1000}
        got = await asyncio.to_thread(report, sock, f"slurm:{job}", cgroup=folder, ranks=8)
        assert got == {"status": 200, "body": {"accepted": 8}}
        assert len(events) == 8
    finally:
        await server.stop()


async def test_verify_off_is_the_old_behaviour(sock: Path, job_cgroup: tuple[Path, str]) -> None:
    server, events = await _serve(sock, verify=False)
    try:
        got = await asyncio.to_thread(report, sock, "slurm:777")
        assert got == {"status": 200, "body": {"accepted": 1}}
        assert [e.attrs["job"] for e in events] == ["slurm:777"]
    finally:
        await server.stop()


def test_the_proc_identity_reads_this_process_and_never_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "31337")  # what a process says of itself does not count
    mine = ProcJobIdentity().identify(os.getpid())
    assert mine is not None and mine.job != JobRef("slurm", "31337")
    assert ProcJobIdentity().identify(2**22 + 12345) is None  # no such process


@pytest.mark.parametrize(
    ("text", "job", "uid"),
    [
        ("4:memory:/slurm/uid_1000/job_1234/step_0/task_0\n", JobRef("slurm", "1234"), 1000),
        ("0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n", JobRef("slurm", "77"), None),
        (
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_1111_2222_333344445555"
            ".slice/cri-containerd-abc.scope\n",
            JobRef("k8s", "1b2c3d4e-0000-1111-2222-333344445555"),
            None,
        ),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None, None),
    ],
)
def test_identity_from_cgroup(text: str, job: JobRef | None, uid: int | None) -> None:
    got = identity_from_cgroup(text)
    assert (got.job, got.job_uid) == (job, uid)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
