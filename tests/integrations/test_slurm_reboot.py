"""What Slurm 22.05 does with ``scontrol reboot ASAP nextstate=DOWN reason=...``, on the real test cluster
with its RebootProgram (tests/harness/slurm.py; the facts: tests/harness/REBOOT.md): the states a node goes
through, its new BootTime, the reason Slurm builds on ours, the job it waits for, and a reboot that does not
happen (slurmd back with the same boot time) ending DOWN, "reboot timed out".

A private two-node cluster: the session cluster's nodes are shared, and a reboot takes a node away."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from tests.harness.slurm import SlurmCluster, available
from tests.support import real_components_required

pytestmark = pytest.mark.slurm

REASON = "watchd: reboot test"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    ok, why = available()
    if not ok:
        if real_components_required():
            pytest.fail(f"Slurm test cluster required (CI / WATCHD_REQUIRE_SLURM=1) but unavailable: {why}")
        pytest.skip(why)
    # ReturnToService=1, as production clusters run: a DOWN node stays DOWN when its slurmd registers
    # (with 2, any registration brings it back). ResumeTimeout 5: a failed reboot times out within ~35 s.
    with SlurmCluster(real_nodes=2, reboot_timeout=5, return_to_service=1) as c:
        yield c


@pytest.fixture
def rc(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    cluster.configure_reboots()
    yield cluster
    cluster.configure_reboots()
    # a reboot still running: let it end (it times out at worst) before the reset
    wait_until(
        lambda: not any("REBOOT" in cluster.node_state(n) for n in cluster.real_node_names),
        60,
        "reboots ended",
    )
    cluster.reset_nodes()


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.1)


def sinfo(cluster: SlurmCluster, node: str) -> str:
    return cluster.run("sinfo", "-h", "-n", node, "-o", "%T|%E").stdout.strip()


def reboot(cluster: SlurmCluster, node: str, *extra: str) -> float:
    """``scontrol reboot ASAP nextstate=DOWN reason=REASON node``; the time it was asked (epoch, floored
    to Slurm's one-second clock)."""
    asked = float(int(time.time()))
    cluster.run("scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={REASON}", *extra, node)
    return asked


def slurmd_pids(cluster: SlurmCluster) -> dict[str, int]:
    out = subprocess.run(["pgrep", "-a", "-x", "slurmd"], capture_output=True, text=True, check=False).stdout
    pids = {}
    for line in out.splitlines():
        pid, *argv = line.split()
        if str(cluster.conf_path) in argv and "-N" in argv:
            pids[argv[argv.index("-N") + 1]] = int(pid)
    return pids


def test_idle_node_reboot_asap_nextstate_down(rc: SlurmCluster) -> None:
    before = rc.boot_time("gpu-1")
    pids = slurmd_pids(rc)
    asked = reboot(rc, "gpu-1")

    # requested, then issued at once (the node is idle): both carry DRAIN, and NextState=DOWN
    first = rc.node("gpu-1")
    assert first["State"] in ("IDLE+DRAIN+REBOOT_REQUESTED", "DOWN+DRAIN+REBOOT_ISSUED"), first
    assert first["NextState"] == "DOWN"
    wait_until(lambda: rc.node_state("gpu-1") == "DOWN+DRAIN+REBOOT_ISSUED", 10, "reboot issued")
    assert rc.reason("gpu-1") == f"{REASON} : reboot issued"
    assert sinfo(rc, "gpu-1") == f"reboot^|{REASON} : reboot issued"
    called = rc.wait_reboot_event("gpu-1", "called", after=asked)
    assert called["slurmd_pid"] == pids["gpu-1"]

    # slurmd gone: Slurm does not notice (a node told to reboot is not pinged)
    rc.wait_reboot_event("gpu-1", "stopped", after=asked)
    assert rc.node_state("gpu-1") == "DOWN+DRAIN+REBOOT_ISSUED"

    # back with a new boot time: DOWN (DRAIN gone), our reason kept with Slurm's suffixes
    rc.wait_reboot_event("gpu-1", "started", after=asked)
    wait_until(lambda: rc.node_state("gpu-1") == "DOWN", 15, "DOWN after the reboot")
    node = rc.node("gpu-1")
    assert "NextState" not in node
    assert rc.reason("gpu-1") == f"{REASON} : reboot issued : reboot complete"
    assert sinfo(rc, "gpu-1") == f"down|{REASON} : reboot issued : reboot complete"
    boot = rc.boot_time("gpu-1")
    assert before is not None and boot is not None
    assert boot >= asked > before
    # the other node's slurmd was not touched; gpu-1's is a new process
    after = slurmd_pids(rc)
    assert after["gpu-2"] == pids["gpu-2"] and after["gpu-1"] != pids["gpu-1"]
    assert rc.node_state("gpu-2") == "IDLE"

    # it stays DOWN (ReturnToService=1): no registration brings it back; RESUME does
    time.sleep(2)
    assert rc.node_state("gpu-1") == "DOWN"
    rc.resume("gpu-1")
    wait_until(lambda: rc.node_state("gpu-1") == "IDLE", 15, "IDLE after resume")
    assert rc.reason("gpu-1") is None
    again = rc.boot_time("gpu-1")
    assert again is not None and abs(again - boot) <= 1  # slurmctld's now - uptime: +-1 s


def test_busy_node_reboot_waits_for_the_job(rc: SlurmCluster) -> None:
    job = rc.submit("sleep 3", nodes=1, extra_args=["-w", "gpu-2"])
    rc.wait_job_running(job)
    asked = reboot(rc, "gpu-2")

    # the job runs on; the node drains and waits (sinfo: draining@), nothing else is placed on it
    assert rc.node_state("gpu-2") in ("MIXED+DRAIN+REBOOT_REQUESTED", "ALLOCATED+DRAIN+REBOOT_REQUESTED")
    assert sinfo(rc, "gpu-2") == f"draining@|{REASON}"
    assert rc.job(job)["JobState"] == "RUNNING"
    assert not [e for e in rc.reboot_events("gpu-2") if e["t"] >= asked]

    # the job ends as it would (not requeued, not killed), then the reboot is issued
    rc.wait_job_state(job, ["COMPLETED"], timeout=30)
    assert rc.job(job)["Restarts"] == "0"
    rc.wait_reboot_event("gpu-2", "started", after=asked)
    wait_until(lambda: rc.node_state("gpu-2") == "DOWN", 15, "DOWN after the reboot")
    assert rc.reason("gpu-2") == f"{REASON} : reboot issued : reboot complete"


def test_reboot_with_unchanged_boot_time_times_out(rc: SlurmCluster) -> None:
    rc.configure_reboots(modes={"gpu-1": "same-boot"})
    before = rc.boot_time("gpu-1")
    asked = reboot(rc, "gpu-1")
    started = rc.wait_reboot_event("gpu-1", "started", after=asked)
    time.sleep(1)
    # slurmd registered, with the old boot time: slurmctld still waits for the boot
    assert rc.node_state("gpu-1") == "DOWN+DRAIN+REBOOT_ISSUED"
    boot = rc.boot_time("gpu-1")
    assert before is not None and boot is not None and abs(boot - before) <= 1
    # ResumeTimeout (5 s here), checked every 30 s: DOWN, "reboot timed out"
    wait_until(lambda: rc.node_state("gpu-1") == "DOWN", 45, "the reboot timed out")
    assert rc.reason("gpu-1") == f"{REASON} : reboot issued : reboot timed out"
    assert time.time() - started["t"] >= 4
    rc.resume("gpu-1")
    wait_until(lambda: rc.node_state("gpu-1") == "IDLE", 15, "IDLE after resume")


def test_reboot_needs_administrator(rc: SlurmCluster) -> None:
    """A plain user is refused (AdminLevel=Administrator, SlurmUser or root may; an Operator may not:
    REBOOT.md). The node is left as it was."""
    res = subprocess.run(
        ["runuser", "-u", "daemon", "--", "scontrol", "reboot", "ASAP", "nextstate=DOWN", "gpu-1"],
        env={**os.environ, **rc.env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 1
    assert "Permission denied" in res.stderr
    assert rc.node_state("gpu-1") == "IDLE"
