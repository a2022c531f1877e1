"""A job's output file is the job's user's choice, and the agent that follows it runs as root. On the real
Slurm test cluster, jobs submitted as an unprivileged user (uid 65534) point their output at ``/dev/zero`` and
``/dev/urandom``, swap it for a FIFO or for a link to a root-only file, hide a second ``StdOut=`` in its name,
and turn it into a 50 GiB sparse file — while a real ``watchd agent`` process (started from the CLI) follows
the node's jobs and ships to a real engine. What must hold: nothing of root's is read or shipped, the agent
stays small and responsive (a kernel Xid written meanwhile reaches the engine), each refusal is counted, and
an honest job's line still arrives."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import Daemon, agent_config
from tests.fault.common import rss_kib, start_engine, tracebacks
from tests.harness.slurm import SlurmCluster
from tests.support import wait_for
from tests.trainlog.wire import real_lines
from watchd.sources.slurm_jobs import SlurmJobOutputs

pytestmark = [pytest.mark.real, pytest.mark.slurm]

NODE = "gpu-4"
NOBODY = 65534
SECRET = "NCCL WARN NET/IB : Got completion from peer 10.66.66.66<4242> with error 4 (root-only-secret)"
TIMEOUT_LINE = next(line for _, line in real_lines() if "SeqNum=7753" in line)
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder the unprivileged user may write to, as a scratch file system is."""
    path = Path(tempfile.mkdtemp(prefix="watchd-users-files-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _as_nobody(cluster: SlurmCluster, script: str, output: str, name: str = "hostile") -> str:
    return cluster.submit(
        script,
        nodes=1,
        extra_args=["-w", NODE, f"--uid={NOBODY}", f"--output={output}", f"--job-name={name}"],
    )


def test_hostile_job_outputs_cost_the_agent_nothing(
    slurm_cluster: SlurmCluster, shared: Path, tmp_path: Path
) -> None:
    cluster = slurm_cluster
    cluster.reset_nodes([NODE])
    secret_dir = tmp_path / "root-only"
    secret_dir.mkdir(mode=0o700)
    secret = secret_dir / "out"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    injected = shared / "x StdOut="
    (injected / secret.parent.relative_to("/")).mkdir(parents=True)
    for folder in [injected, *injected.rglob("*")]:
        os.chown(folder, NOBODY, NOBODY)
    go = shared / "go"
    wait_go = f'while [ ! -e "{go}" ]; do sleep 0.2; done\n'

    engine = start_engine(tmp_path)
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    config = agent_config(NODE, engine.port, tmp_path / "token", kernel_log)
    config["sources"]["training"] = {
        "slurm_jobs": True,
        "slurm_node": NODE,
        "slurm_conf": str(cluster.conf_path),
        "slurm_poll_s": 0.5,  # the default 15 s only delays when files are picked up, not how they are read
    }
    agent = Daemon("agent", config, tmp_path, env={"PYTHONUNBUFFERED": "1"})
    jobs: list[str] = []
    try:
        agent.wait_ready()
        jobs += [
            _as_nobody(cluster, "sleep 600", "/dev/zero"),  # endless zeros: once 4.2 GiB in 10 s
            _as_nobody(cluster, "sleep 600", "/dev/urandom"),
            # the output swapped for a link to root's file, then for a FIFO (an open() would block)
            _as_nobody(
                cluster,
                f'echo start\n{wait_go}ln -sf "{secret}" "{shared}/link.out"\nsleep 600',
                f"{shared}/link.out",
            ),
            _as_nobody(
                cluster,
                f'echo start\n{wait_go}rm -f "{shared}/fifo.out"\nmkfifo "{shared}/fifo.out"\nsleep 600',
                f"{shared}/fifo.out",
            ),
        ]
        for job in jobs:
            cluster.wait_job_running(job)
        lister = SlurmJobOutputs(NODE, env=cluster.env)
        wait_for(lambda: len(lister.running()) == 4, timeout=10, what="4 jobs listed")
        time.sleep(1.5)  # the agent follows them
        go.write_text("")
        time.sleep(2.0)  # the swaps are seen (rotation: a new inode at the path)

        # the kernel's line still reaches the engine: nothing froze the agent's loop
        with open(kernel_log, "a") as f:
            f.write(XID + "\n")
        wait_for(
            lambda: _metric(engine.get("/metrics"), "watchd_events_received_total", kind="xid") >= 1,
            timeout=10,
            what="the Xid written while the hostile files are followed",
        )
        metrics = agent.get("/metrics")
        refused = "watchd_agent_files_refused_total"
        assert _metric(metrics, refused, source="slurm-jobs", reason="not_regular") >= 3, (
            metrics
        )  # 2 devices, fifo
        assert _metric(metrics, refused, source="slurm-jobs", reason="symlink") >= 1, metrics
        assert rss_kib(agent.proc.pid) < 200 * 1024, "the agent stayed small"
        assert agent.proc.poll() is None and tracebacks(agent) == 0
    except BaseException:
        agent.stop()  # a frozen or swollen agent must not outlive the test
        engine.stop()
        raise
    finally:
        for job in jobs:
            cluster.run("scancel", job, check=False)
        go.unlink(missing_ok=True)

    # a second StdOut= hidden in the file name, a folder swapped for a link to root's, a 50 GiB sparse file,
    # and an honest job whose timeout report must still arrive
    jobs = []
    try:
        fake_name = f"{injected}{secret}"  # .../x StdOut=/<tmp>/root-only/out
        jobs.append(
            _as_nobody(cluster, f"echo start\n{wait_go}sleep 600", fake_name, name=f"n StdOut={secret}")
        )
        (shared / "sub").mkdir()
        os.chown(shared / "sub", NOBODY, NOBODY)
        jobs.append(
            _as_nobody(
                cluster,
                f'echo start\n{wait_go}mv "{shared}/sub" "{shared}/sub.old"\n'
                f'ln -s "{secret_dir}" "{shared}/sub"\nsleep 600',
                f"{shared}/sub/out",
            )
        )
        jobs.append(
            _as_nobody(
                cluster,
                f'echo start\n{wait_go}truncate -s 0 "{shared}/sparse.out"\n'
                f'truncate -s 50G "{shared}/sparse.out"\nsleep 600',
                f"{shared}/sparse.out",
            )
        )
        jobs.append(
            _as_nobody(
                cluster, f"{wait_go}printf '%s\\n' '{TIMEOUT_LINE}'\nsleep 600", f"{shared}/honest.out"
            )
        )
        for job in jobs:
            cluster.wait_job_running(job)
        listed = {o.job: o for o in SlurmJobOutputs(NODE, env=cluster.env).running()}
        assert listed[f"slurm:{jobs[0]}"].paths == (Path(fake_name),), (
            "the name's StdOut= is part of the name"
        )
        assert listed[f"slurm:{jobs[0]}"].uid == NOBODY
        time.sleep(1.5)
        go.write_text("")
        wait_for(
            lambda: (
                _metric(engine.get("/metrics"), "watchd_events_received_total", kind="collective_timeout")
                >= 1
            ),
            timeout=15,
            what="the honest job's timeout report",
        )
        time.sleep(2.0)
        metrics = agent.get("/metrics")
        assert _metric(metrics, "watchd_agent_files_refused_total", source="slurm-jobs", reason="owner") >= 1
        assert _metric(metrics, "watchd_agent_log_bytes_skipped_total", source="slurm-jobs") > 1 << 30
        engine_metrics = engine.get("/metrics")
        assert (
            _metric(engine_metrics, "watchd_events_received_total", source="slurm-jobs", kind="nccl_warn")
            == 0
        )
        assert rss_kib(agent.proc.pid) < 200 * 1024
        assert SECRET not in agent.log_path.read_text(errors="replace")
        assert not re.search(r"Traceback", agent.log_path.read_text(errors="replace"))
    finally:
        for job in jobs:
            cluster.run("scancel", job, check=False)
        agent.stop()
        engine.stop()
        cluster.reset_nodes([NODE])
