"""The node's own evidence of a job, read before a GPU reset from fake /proc and cgroup trees laid out as
Slurm and the kubelet lay out the real ones: a Slurm job's cgroup (v2 and v1), a slurmstepd, a job's prolog
(no slurmstepd, no cgroup yet: only its environment says it), a pod's process holding the GPU's device file.
The GPU reset refuses on any of them, naming it, before anything is touched; NVML saw no process."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import IO, Any

import pytest

from tests.harness.slurm import SlurmCluster
from tests.support import wait_for
from watchd.agent import job_evidence
from watchd.agent.gpu_reset import gpu_reset_executor
from watchd.agent.job_evidence import JobEvidence
from watchd.model.commands import Command
from watchd.sim.gpu import FakeGpuBackend
from watchd.sim.gpu_reset import for_backend
from watchd.sim.scenario import Scenario

GPU = "0000:2a:00.0"


class Host:
    """A fake /proc and /sys/fs/cgroup."""

    def __init__(self, root: Path) -> None:
        self.proc = root / "proc"
        self.cgroup = root / "cgroup"
        self.proc.mkdir(parents=True)
        self.cgroup.mkdir(parents=True)
        self.process(1, "systemd", cmdline=b"/sbin/init\0", cgroup="0::/init.scope\n")
        gpus = self.proc / "driver" / "nvidia" / "gpus"
        for bus, minor in (("0000:18:00.0", 0), (GPU, 1)):
            (gpus / bus).mkdir(parents=True)
            (gpus / bus / "information").write_text(f"Model: NVIDIA H100\nIRQ: 33\nDevice Minor: {minor}\n")

    def process(
        self,
        pid: int,
        comm: str,
        *,
        cmdline: bytes = b"",
        env: dict[str, str] | None = None,
        cgroup: str = "0::/system.slice/x.service\n",
        fds: tuple[str, ...] = (),
    ) -> None:
        proc = self.proc / str(pid)
        (proc / "fd").mkdir(parents=True)
        (proc / "comm").write_text(comm + "\n")
        (proc / "cmdline").write_bytes(cmdline or comm.encode() + b"\0")
        (proc / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in (env or {}).items()))
        (proc / "cgroup").write_text(cgroup)
        for n, target in enumerate(fds, 3):
            os.symlink(target, proc / "fd" / str(n))

    def evidence(self) -> JobEvidence:
        return JobEvidence(self.proc, self.cgroup, own_pid=99999)


def test_a_quiet_node_shows_nothing(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.process(500, "nvidia-persistenced", fds=("/dev/nvidia1", "/dev/nvidiactl"))  # not a job's
    host.process(501, "bash", env={"HOME": "/root", "PATH": "/usr/bin"})
    (host.cgroup / "system.slice" / "slurmstepd.scope").mkdir(parents=True)  # slurmd's, no job in it
    assert host.evidence().find(GPU) == []


def test_slurm_job_cgroups_v2_and_v1(tmp_path: Path) -> None:
    host = Host(tmp_path)
    (host.cgroup / "system.slice" / "slurmstepd.scope" / "job_4242" / "step_extern").mkdir(parents=True)
    (host.cgroup / "system.slice" / "gpu-3_slurmstepd.scope" / "job_77").mkdir(parents=True)  # multi-slurmd
    for controller in ("memory", "devices"):  # v1: one folder per controller, said once
        (host.cgroup / controller / "slurm" / "uid_1000" / "job_9001" / "step_0").mkdir(parents=True)
    found = host.evidence().find(GPU)
    assert found == [
        "Slurm job 9001's cgroup " + str(host.cgroup / "devices" / "slurm" / "uid_1000" / "job_9001"),
        "Slurm job 77's cgroup " + str(host.cgroup / "system.slice" / "gpu-3_slurmstepd.scope" / "job_77"),
        "Slurm job 4242's cgroup " + str(host.cgroup / "system.slice" / "slurmstepd.scope" / "job_4242"),
    ]


def test_a_slurmstepd_and_a_prolog_before_any_cgroup(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.process(600, "slurmstepd", cmdline=b"slurmstepd: [4242.extern]\0")
    prolog = {"SLURM_JOB_ID": "4243", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_USER": "ana"}
    host.process(601, "prolog.sh", cmdline=b"/bin/sh\0/etc/slurm/prolog.sh\0", env=prolog)
    assert host.evidence().find(GPU) == [
        "slurmstepd of Slurm job 4242 (pid 600, step extern)",
        "a process of Slurm job 4243 (pid 601, prolog.sh, its prolog_slurmd)",
    ]


def test_a_pod_holding_the_gpu_device_before_its_cuda_context(tmp_path: Path) -> None:
    host = Host(tmp_path)
    pod = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice/cri-ab.scope\n"
    host.process(700, "python3", cgroup=pod, fds=("/dev/nvidiactl", "/dev/nvidia1"))
    host.process(701, "python3", cgroup=pod, fds=("/dev/nvidia0",))  # another GPU's: not this one's
    assert host.evidence().find(GPU) == [
        "a process of a Kubernetes pod holds /dev/nvidia1 (pid 700, python3)"
    ]
    assert len(host.evidence().find("")) == 2, "resetting every GPU: any GPU's device counts"


async def test_the_reset_is_refused_naming_the_evidence(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.process(601, "prolog.sh", env={"SLURM_JOB_ID": "4243", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"})
    idle = FakeGpuBackend(Scenario.idle(gpus=2), time.time())  # NVML lists no process
    fake = for_backend(idle, delay_s=0.0)
    execute = gpu_reset_executor(fake, None, host.evidence())
    result = await execute(Command("c-1", "gpu-3", "gpu_reset", {"gpu": GPU}))
    assert result.outcome == "refused"
    assert result.detail == (
        "a job is on the node: a process of Slurm job 4243 (pid 601, prolog.sh, its prolog_slurmd): not reset"
    )
    assert fake.resets == []
    (host.proc / "601" / "environ").write_bytes(b"")  # the prolog ended; the job was requeued
    assert (await execute(Command("c-2", "gpu-3", "gpu_reset", {"gpu": GPU}))).outcome == "done"
    assert fake.resets == [(GPU,)]


def test_a_process_that_cannot_be_read_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = Host(tmp_path)
    host.process(800, "python3", env={"SLURM_JOB_ID": "5"})
    (host.cgroup / "system.slice" / "slurmstepd.scope" / "job_5").mkdir(parents=True)

    def as_without_cap_sys_ptrace(path: Path, mode: str = "r") -> IO[Any]:
        if Path(path).name == "environ":  # another user's, to an agent without CAP_SYS_PTRACE
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, mode)

    monkeypatch.setattr(job_evidence, "open", as_without_cap_sys_ptrace, raising=False)
    assert host.evidence().find(GPU) == [
        "Slurm job 5's cgroup " + str(host.cgroup / "system.slice" / "slurmstepd.scope" / "job_5")
    ]


@pytest.mark.slurm
@pytest.mark.real
def test_a_real_slurm_job_is_seen_on_this_host(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The test cluster's slurmd runs on this host: a real job's slurmstepd and its tasks are in the real
    /proc, as on a node (no cgroup plugin here; other tests' jobs may be seen too)."""
    job = slurm_cluster.submit("sleep 600", nodes=1)
    evidence = JobEvidence(Path("/proc"), tmp_path)

    def task_seen() -> bool:  # the batch script execs its sleep a moment after the job is RUNNING
        task = f"a process of Slurm job {job} (pid "
        return any(f.startswith(task) and ", sleep)" in f for f in evidence.find(""))

    def stepd_seen() -> bool:  # slurmctld says RUNNING before slurmd has started the job's slurmstepd
        return any(f.startswith(f"slurmstepd of Slurm job {job} (pid ") for f in evidence.find(""))

    try:
        slurm_cluster.wait_job_running(job)
        wait_for(stepd_seen, 10, "the job's slurmstepd seen")
        wait_for(task_seen, 10, "the job's task seen by its environment")
    finally:
        slurm_cluster.cancel(job)
