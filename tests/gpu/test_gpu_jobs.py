"""GPU process -> job: cgroup and environ parsing, and the resolver against a temp dir laid out like /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from watchd.clock import FakeClock
from watchd.gpu.jobs import JobRef, JobResolver, job_from_cgroup, job_from_environ, parse_job_label

POD_UID = "1234abcd-5678-90ef-1234-567890abcdef"
POD_UID_SYSTEMD = POD_UID.replace("-", "_")
CID = "3f2a9c1e7b5d4a0f8e6c2b1d9a7f5e3c1b0a9d8e7f6c5b4a3928171605f4e3d2"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v2, Slurm 22.05+ (slurmstepd.scope under system.slice)
        ("0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0\n", JobRef("slurm", "1234")),
        (
            "0::/system.slice/slurmstepd.scope/job_1234/step_batch/user/task_special\n",
            JobRef("slurm", "1234"),
        ),
        # several slurmds on one host: <nodename>_slurmstepd.scope
        ("0::/system.slice/gpu-3_slurmstepd.scope/job_42/step_extern/user/task_0\n", JobRef("slurm", "42")),
        # older Slurm cgroup v2 layout
        ("0::/slurm/uid_1000/job_1234/step_batch/task_0\n", JobRef("slurm", "1234")),
        # cgroup v1: many controllers, the job in some of them
        (
            "12:memory:/slurm/uid_1000/job_1234/step_0\n"
            "11:cpuset:/slurm/uid_1000/job_1234/step_0\n"
            "10:devices:/slurm/uid_1000/job_1234/step_0/task_0\n"
            "9:freezer:/slurm/uid_1000/job_1234/step_0\n"
            "4:cpu,cpuacct:/\n"
            "1:name=systemd:/system.slice/slurmd.service\n"
            "0::/system.slice/slurmd.service\n",
            JobRef("slurm", "1234"),
        ),
        # cgroup v1 with a node-name segment (multiple-slurmd builds)
        ("11:cpuset:/slurm_gpu-1/uid_0/job_77/step_batch/task_0\n", JobRef("slurm", "77")),
        # Kubernetes, systemd driver (pod UID with _ for -), containerd and CRI-O
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID_SYSTEMD}.slice/"
            f"cri-containerd-{CID}.scope\n",
            JobRef("k8s", POD_UID),
        ),
        (
            f"0::/kubepods.slice/kubepods-pod{POD_UID_SYSTEMD}.slice/crio-{CID}.scope\n",  # Guaranteed QoS
            JobRef("k8s", POD_UID),
        ),
        # Kubernetes, cgroupfs driver
        (f"0::/kubepods/besteffort/pod{POD_UID}/{CID}\n", JobRef("k8s", POD_UID)),
        (f"0::/kubepods/pod{POD_UID}/{CID}\n", JobRef("k8s", POD_UID)),
        (f"4:devices:/kubepods/burstable/pod{POD_UID}/{CID}\n1:name=systemd:/\n", JobRef("k8s", POD_UID)),
        # the agent in its own cgroup namespace sees other pods' paths relative to its own cgroup
        (
            f"0::/../../kubepods-besteffort-pod{POD_UID_SYSTEMD}.slice/cri-containerd-{CID}.scope\n",
            JobRef("k8s", POD_UID),
        ),
        # upper-case UID digits are normalized
        (f"0::/kubepods/besteffort/pod{POD_UID.upper()}/{CID}\n", JobRef("k8s", POD_UID)),
        # slurmd running in a pod (e.g. Slinky): the job nested under the pod wins over the pod
        (
            f"0::/kubepods.slice/kubepods-pod{POD_UID_SYSTEMD}.slice/cri-containerd-{CID}.scope/"
            "system.slice/slurmstepd.scope/job_9001/step_0/user/task_0\n",
            JobRef("slurm", "9001"),
        ),
    ],
)
def test_job_from_cgroup(text: str, expected: JobRef) -> None:
    assert job_from_cgroup(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0::/\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/slurmd.service\n",
        "0::/system.slice/slurmstepd.scope/system\n",  # slurmstepd's own cgroup, no job
        "0::/init.scope\n",
        "0::/system.slice/docker-0123abcd.scope\n",
        "12:memory:/docker/0123456789abcdef\n",
        "4:memory:/process_api/8ae84259711bb0323f018dbc5c6feecf\n",
        "0::/myjobs/job_12/x\n",  # job_<n> outside a Slurm hierarchy
        "0::/pod1234abcd-5678/x\n",  # pod<uid> outside kubepods
        "0::/kubepods.slice/kubepods-burstable.slice\n",  # the QoS slice itself
        "garbage\n\n::\nno colons at all",
    ],
)
def test_job_from_cgroup_none(text: str) -> None:
    assert job_from_cgroup(text) is None


def test_real_cgroup_files_of_this_machine_parse_to_none() -> None:
    for pid in ("self", "1", str(os.getpid())):
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        assert job_from_cgroup(text) is None, text


def test_job_from_environ() -> None:
    env = b"PATH=/usr/bin\0HOME=/home/u\0SLURM_JOB_ID=4321\0SLURM_JOBID=4321\0SLURM_STEP_ID=0\0"
    assert job_from_environ(env) == JobRef("slurm", "4321")
    assert job_from_environ(b"SLURM_JOBID=77\0USER=x") == JobRef("slurm", "77")  # older name, no final NUL
    # SLURM_JOB_ID wins wherever it stands
    assert job_from_environ(b"SLURM_JOBID=1\0SLURM_JOB_ID=2\0") == JobRef("slurm", "2")
    # not a job: absent, empty, non-numeric, or a different variable merely containing the name
    for data in (
        b"",
        b"PATH=/bin\0",
        b"SLURM_JOB_ID=\0",
        b"SLURM_JOB_ID=abc\0",
        b"MY_SLURM_JOB_ID=5\0",
        b"SLURM_JOB_ID_X=5\0",
        b"\xff\xfe=\x80\0",
    ):
        assert job_from_environ(data) is None, data


def test_label_round_trip() -> None:
    for ref in (JobRef("slurm", "1234"), JobRef("k8s", POD_UID)):
        assert parse_job_label(ref.label) == ref
        assert str(ref) == ref.label
    assert JobRef("slurm", "1234").label == "slurm:1234"
    assert JobRef("k8s", POD_UID).label == f"k8s:{POD_UID}"
    for bad in ("", "slurm", "slurm:", "slurm:x1", "pbs:12", "k8s:not-a-uid!"):
        assert parse_job_label(bad) is None


class FakeProc:
    """A temp dir laid out like /proc."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, pid: int, cgroup: str | None = None, environ: bytes | None = None) -> Path:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        if cgroup is not None:
            (d / "cgroup").write_text(cgroup)
        if environ is not None:
            (d / "environ").write_bytes(environ)
        return d


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


def test_resolver_cgroup_then_environ(proc: FakeProc) -> None:
    proc.add(100, "0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_0\n", b"SLURM_JOB_ID=999\0")
    proc.add(
        101, "0::/user.slice/user-1000.slice/session-1.scope\n", b"SLURM_JOB_ID=6\0"
    )  # proctrack/linuxproc
    proc.add(102, "0::/user.slice\n", b"HOME=/root\0")
    proc.add(103, f"0::/kubepods/besteffort/pod{POD_UID}/{CID}\n")
    r = JobResolver(proc.root, FakeClock())
    assert r.resolve(100) == JobRef("slurm", "5")  # cgroup first
    assert r.resolve(101) == JobRef("slurm", "6")
    assert r.resolve(102) is None
    assert r.resolve(103) == JobRef("k8s", POD_UID)  # no environ file at all
    assert r.resolve(104) is None  # no such process


def test_resolver_unreadable_environ_is_none(proc: FakeProc) -> None:
    d = proc.add(200, "0::/user.slice\n", b"SLURM_JOB_ID=6\0")
    (d / "environ").chmod(0)
    try:
        r = JobResolver(proc.root, FakeClock())
        if os.access(d / "environ", os.R_OK):  # root reads it anyway: the job is found
            assert r.resolve(200) == JobRef("slurm", "6")
        else:
            assert r.resolve(200) is None
    finally:
        (d / "environ").chmod(0o600)


def test_resolver_read_errors_give_none(proc: FakeProc, monkeypatch: pytest.MonkeyPatch) -> None:
    proc.add(300, "0::/user.slice\n", b"SLURM_JOB_ID=6\0")
    proc.add(301, "0::/user.slice\n", b"SLURM_JOB_ID=6\0")
    real_read_bytes = Path.read_bytes
    real_read_text = Path.read_text

    def read_bytes(self: Path) -> bytes:
        if self.parent.name == "300":
            raise PermissionError(13, "Permission denied", str(self))
        if self.parent.name == "301":
            raise ProcessLookupError(3, "No such process", str(self))
        return real_read_bytes(self)

    def read_text(self: Path, *a: object, **kw: object) -> str:
        if self.parent.name == "302":
            raise ProcessLookupError(3, "No such process", str(self))
        return real_read_text(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(Path, "read_text", read_text)
    proc.add(302, "0::/system.slice/slurmstepd.scope/job_5/step_0\n")
    r = JobResolver(proc.root, FakeClock())
    assert r.resolve(300) is None
    assert r.resolve(301) is None
    assert r.resolve(302) is None


def test_resolver_cache_ttl(proc: FakeProc) -> None:
    clock = FakeClock()
    proc.add(400, "0::/system.slice/slurmstepd.scope/job_1/step_0\n")
    r = JobResolver(proc.root, clock, ttl=30.0)
    assert r.resolve(400) == JobRef("slurm", "1")
    # the pid is reused by a process of another job: the cache answers until the TTL runs out
    proc.add(400, "0::/system.slice/slurmstepd.scope/job_2/step_0\n")
    clock.advance(29.0)
    assert r.resolve(400) == JobRef("slurm", "1")
    clock.advance(1.0)
    assert r.resolve(400) == JobRef("slurm", "2")
    # negative results are cached too
    assert r.resolve(401) is None
    proc.add(401, "0::/system.slice/slurmstepd.scope/job_3/step_0\n")
    assert r.resolve(401) is None
    r.forget(401)
    assert r.resolve(401) == JobRef("slurm", "3")


def test_resolver_cache_is_bounded(proc: FakeProc) -> None:
    clock = FakeClock()
    r = JobResolver(proc.root, clock, ttl=30.0, max_entries=10)
    for pid in range(1, 26):
        r.resolve(pid)
        clock.advance(0.1)
    assert len(r._cache) <= 10
    clock.advance(60)
    r.resolve(1000)
    assert len(r._cache) == 1  # expired entries went first


def test_jobs_for_majority(proc: FakeProc) -> None:
    for pid in (1, 2, 3):
        proc.add(pid, "0::/system.slice/slurmstepd.scope/job_10/step_0/user/task_0\n")
    proc.add(4, "0::/system.slice/slurmstepd.scope/job_11/step_0/user/task_0\n")
    proc.add(5, "0::/user.slice\n")  # a monitoring tool on the GPU, in no job
    proc.add(6, "0::/user.slice\n")
    proc.add(7, "0::/user.slice\n")
    r = JobResolver(proc.root, FakeClock())
    assert r.jobs_for([4, 1, 5, 2, 6, 3, 7]) == JobRef("slurm", "10")
    assert r.jobs_for([5, 6, 4]) == JobRef("slurm", "11")  # processes in no job do not vote
    assert r.jobs_for([4, 1]) == JobRef("slurm", "11")  # a tie goes to the first pid's job
    assert r.jobs_for([]) is None
    assert r.jobs_for([5, 6, 999]) is None
    assert r.job_counts([1, 2, 4, 5]) == {JobRef("slurm", "10"): 2, JobRef("slurm", "11"): 1}


def test_resolver_on_the_real_proc() -> None:
    r = JobResolver()  # /proc, system clock: this test process is in no job here
    if job_from_cgroup(Path("/proc/self/cgroup").read_text()) is None and "SLURM_JOB_ID" not in os.environ:
        assert r.resolve(os.getpid()) is None
    assert r.resolve(2**22 + 12345) is None  # beyond pid_max: no such process
